// workerd/speculation/drafter_model.h: the built-in drafter's network (brief §6 "Draft KV ring", §8 "with a drafter"; issue
// 13): a few layers of windowed attention over its own KV, conditioned on the target's final hidden state (EAGLE-like),
// whose KV rows live in a DraftRing (draft_ring.h). The proposer around it is drafter.h.
//
// Per position t (D = d_model, Dt = target_d_model, H heads of head_dim d_h, W = window):
//   1. input x = tok_emb[token_t] + w_in · RMSNorm(f_{t-1}, feat_norm), where the feature f_{t-1} (Dt floats) is the
//      target's final hidden state at t-1 (model::StepOutput::hidden) when the target fed t-1, else the drafter's own
//      prediction of it (step 4); position 0 has no feature (x = tok_emb[token_0]).
//   2. per layer l: xn = RMSNorm(x, attn_norm); q, k, v = w_q·xn, w_k·xn, w_v·xn (H*d_h each), RoPE on each head
//      of q and k at t; [k, v] is the layer's part of the ring row of t; per head, softmax((q·k_s) / sqrt(d_h)) over
//      the positions s = max(0, t-W+1) .. t (the last W positions, t included; max-subtracted, ascending s) weights
//      the v_s; x += w_o · concat_h(o); then x += w_down · SiLU(w_up · RMSNorm(x, mlp_norm)).
//   3. h = RMSNorm(x, final_norm); logits = lm_head · h (kVocab floats).
//   4. predicted feature f_t = w_feat · h (Dt floats), the input of t+1 while the target has not fed t.
// Ring row of one position: for each layer, k (H*d_h floats) then v (H*d_h floats): draft_bytes_per_row =
// 4 * n_layers * 2 * H * d_h. Every projection is a kernels::MatMul (fixed-order Dot), attention sums in ascending
// position order: a query's results depend only on its own inputs and rows, never on the batch (brief §11).
//
// Weights: safetensors (workerd/model/safetensors.h), all F32, matrices [out, in]:
//   tok_emb [256, D]; feat_norm [Dt]; w_in [D, Dt]; layers.{l}.attn_norm [D], .w_q / .w_k / .w_v [H*d_h, D],
//   .w_o [D, H*d_h], .mlp_norm [D], .w_up [F, D], .w_down [D, F]; final_norm [D]; lm_head [256, D]; w_feat [Dt, D]
// __metadata__: format "dhs-drafter/1", seed, config (DrafterConfig JSON: layers, W, K_max, d_model of the target it
// pairs with, ...). Generated like the target's (model::AddSeededTensors: same seed, same bytes).
// Thread-safety: a DrafterModel is immutable; Forward may run concurrently on disjoint rings.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "workerd/model/config.h"
#include "workerd/model/safetensors.h"
#include "workerd/model/weights.h"
#include "workerd/speculation/draft_ring.h"

namespace dhs::spec {

inline constexpr std::string_view kDrafterFormat = "dhs-drafter/1";

struct DrafterConfig {
  int target_d_model = 64;  // Dt: width of the target's final hidden state (model::ModelConfig::d_model)
  int d_model = 64;         // D
  int n_layers = 2;
  int n_heads = 2;
  int head_dim = 32;        // d_h, even (RoPE)
  int d_ff = 128;
  int window = 32;          // W: positions a query attends to (itself and the W - 1 before it)
  int k_max = 8;            // K_max: queries per round (anchor included) the drafter is deployed with by default
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;

  int64_t row_floats() const { return int64_t{n_layers} * 2 * n_heads * head_dim; }
  int64_t draft_bytes_per_row() const { return 4 * row_floats(); }  // bytes of one ring row (all layers)
  // Every size in [1, 2^16] (window and k_max in [1, 2^20]), head_dim even, rope_theta > 0, norm_eps > 0.
  // Error: INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
  std::string ToJson() const;
  // Error: INVALID_ARGUMENT (not a JSON object, a missing or mistyped field, or Validate).
  static absl::StatusOr<DrafterConfig> FromJson(std::string_view json);
};

// The tensors of `config`, in file order.
std::vector<model::TensorSpec> DrafterTensorSpecs(const DrafterConfig& config);

// Every tensor drawn from `seed` (model::AddSeededTensors) plus the metadata. Error: INVALID_ARGUMENT (Validate).
absl::StatusOr<model::SafetensorsWriter> GenerateDrafterWeights(const DrafterConfig& config, uint64_t seed);

// One position fed to the drafter: the token at `position` of `slot`'s ring and the feature f_{position-1}
// (target_d_model floats; empty = none, only at position 0 or for a test).
struct DrafterQuery {
  SlotIndex slot = 0;
  Position position = 0;
  model::Token token = 0;
  std::span<const float> feature;
};

struct DrafterOutput {
  std::vector<float> logits;    // Q * kVocab: row i = the drafter's logits of the token after query i
  std::vector<float> features;  // Q * target_d_model: row i = predicted feature f_{position_i}
  std::vector<float> hidden;    // Q * d_model: row i = h (step 3), what lm_head and w_feat read
};

class DrafterModel {
 public:
  // Builds from a parsed file: __metadata__ "format" must be kDrafterFormat and "config" a valid DrafterConfig; every
  // tensor of DrafterTensorSpecs F32 with its shape and finite values, no other tensor. Errors: INVALID_ARGUMENT
  // (format, config, dtype, shape, a NaN or infinity, unexpected tensor), NOT_FOUND (missing tensor); messages name
  // the tensor or field.
  static absl::StatusOr<std::unique_ptr<DrafterModel>> FromSafetensors(const model::SafetensorsFile& file);
  // Errors: as SafetensorsFile::Load, then FromSafetensors.
  static absl::StatusOr<std::unique_ptr<DrafterModel>> Load(const std::string& path);

  const DrafterConfig& config() const { return config_; }
  // The weights and metadata as a file image writer (save; FromSafetensors(Parse(Serialize())) gives the same model).
  model::SafetensorsWriter ToSafetensors() const;
  // A copy with new output layers (lm_head [256, D], w_feat [Dt, D]; drafter_distill.h fits them) and one more
  // __metadata__ entry. Error: INVALID_ARGUMENT on a wrong size.
  absl::StatusOr<std::unique_ptr<DrafterModel>> WithOutputLayers(std::span<const float> lm_head,
                                                                 std::span<const float> w_feat,
                                                                 const std::string& meta_key,
                                                                 const std::string& meta_value) const;

  // One batched forward pass. Preconditions (the proposer's duty, unchecked): tokens in [0, kVocab); features empty
  // or target_d_model floats; ring holds geometry.total_rows() * row_floats floats; the queries of one slot have
  // increasing consecutive positions spanning at most K_max (so no row a query reads is overwritten in the call),
  // and the ring rows of every earlier position a query reads (from max(0, t-W+1)) hold that position's row.
  // Writes the queries' rows at geometry.Row(slot, position); out.logits and out.features are resized and filled.
  void Forward(std::span<const DrafterQuery> queries, const DraftRingGeometry& geometry, std::span<float> ring,
               DrafterOutput& out) const;

  ~DrafterModel();
  struct Weights;  // opaque (drafter_model.cc)

 private:
  struct Scratch;
  DrafterModel(DrafterConfig config, std::unique_ptr<Weights> weights, std::map<std::string, std::string> metadata);
  void Embed(std::span<const DrafterQuery> queries, Scratch& s) const;
  void AttentionLayer(int l, std::span<const DrafterQuery> queries, const DraftRingGeometry& geometry,
                      std::span<float> ring, Scratch& s) const;
  void Attend(int l, const DrafterQuery& query, const float* q, const DraftRingGeometry& geometry,
              std::span<const float> ring, float* o) const;
  void MlpLayer(int l, Scratch& s) const;

  DrafterConfig config_;
  std::unique_ptr<Weights> weights_;
  std::map<std::string, std::string> metadata_;  // the file's __metadata__, kept for ToSafetensors
};

}  // namespace dhs::spec
