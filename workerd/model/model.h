// workerd/model/model.h: the built-in sparse-attention model (brief §11) and its batched forward step.
//
// Owns: Model (config + weights, immutable after load) and ModelSession (one request's model-side state: its
// position n_r and its index keys, which stay resident for the whole history, brief §8). Payload rows live in the
// KvAccess the caller passes (workerd/kv_access.h); the model appends them and reads them back through Fetch.
// Thread-safety: a Model is immutable; Step may run concurrently on disjoint sessions and KvAccess objects.
// A ModelSession is used by one thread at a time.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "workerd/kv_access.h"
#include "workerd/model/config.h"
#include "workerd/model/safetensors.h"

namespace dhs::model {

class Model;

class ModelSession {
 public:
  ModelSession(ModelSession&&) = default;
  ModelSession& operator=(ModelSession&&) = default;

  RequestId request() const { return request_; }
  // n_r: positions fed so far (the next token is fed at this position).
  Position position() const { return position_; }
  // Index keys of indexer number `indexer` (0 .. n_indexers-1, layer order): position() * idx_dim floats.
  std::span<const float> index_keys(int indexer) const { return index_keys_[indexer]; }
  // True after a Step failed half-way (the KV store may hold some of the step's rows): the session must be released.
  bool broken() const { return broken_; }

 private:
  friend class Model;
  ModelSession(const Model* model, RequestId request, int n_indexers)
      : model_(model), request_(request), index_keys_(n_indexers) {}

  const Model* model_;
  RequestId request_;
  Position position_ = 0;
  std::vector<std::vector<float>> index_keys_;
  bool broken_ = false;
  Position verify_from_ = -1;  // BeginVerification's n + 1 until EndVerification; -1 outside a round
};

// One request of a batched step: feed `tokens` at positions n .. n+q-1 (n = session->position(), q = tokens.size()).
// want_hidden: also return the final hidden state of every fed token (StepOutput::hidden); off by default (no cost).
struct StepInput {
  ModelSession* session = nullptr;
  std::span<const Token> tokens;
  bool want_hidden = false;
};

// Logits of every fed token: tokens.size() * 256 floats, row j = the distribution after token j (position n+j).
// hidden (only when the input asked for it, else left empty): tokens.size() * d_model floats, row j = the final hidden
// state of position n+j, RMSNorm(h, final_norm): the vector lm_head reads (logits row j = lm_head · hidden row j, with
// the same kernels::Dot). Like the logits it is bit-identical whatever the batch composition or chunking. A drafter
// conditioned on the target (workerd/speculation/drafter.h) reads it.
struct StepOutput {
  std::vector<float> logits;
  std::vector<float> hidden;
};

class Model {
 public:
  // Builds the model from a parsed weights file: the config comes from __metadata__ "config", every tensor of
  // ModelTensorSpecs(config) must be present with dtype F32 and its shape, and no other tensor may be present.
  // Errors: INVALID_ARGUMENT (no/invalid config, wrong dtype/shape, unexpected tensor), NOT_FOUND (missing tensor);
  // messages name the tensor.
  static absl::StatusOr<std::unique_ptr<Model>> FromSafetensors(const SafetensorsFile& file);
  // Loads and builds from a safetensors file path. Errors: as SafetensorsFile::Load and FromSafetensors.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path);

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  // The model's fingerprint (issue 26: the cluster tier keys pages by it, so that two models of one KV geometry never
  // read each other's pages): XXH3-64 (libxxhash) of the canonical config JSON (ModelConfig::ToJson), then of every
  // tensor of ModelTensorSpecs(config) in that order as its name and its F32 bytes (little-endian, as stored). The
  // same weights give the same value in every process and build; any changed weight or config field changes it
  // (up to 64-bit collisions). Never 0.
  uint64_t fingerprint() const { return fingerprint_; }

  // A new request at position 0. The session refers to this model, which must outlive it.
  ModelSession NewSession(RequestId request) const;

  // One batched forward pass. For each input the tokens are fed causally (query j sees positions <= n+j); each layer
  // appends its payload rows (Append, in position order) and fetches its selections (one Fetch per write/reindex
  // layer and per producer, none for Reuse/follower layers; brief §5), then calls ReadersDone after the last layer
  // that reads them. out[b].logits is resized to q_b * 256. Every projection runs as one weight-stationary
  // kernels::MatMul over all queries of the step (each weight matrix is streamed once per step for the whole batch);
  // every output element is the same fixed-order kernels::Dot, so results are bit-identical whatever the batch
  // composition, and feeding q tokens at once equals feeding them one by one (batch-invariant numerics, brief §11).
  // Errors: INVALID_ARGUMENT (out.size() != batch.size(), null/foreign/duplicate session, no tokens, token outside
  // 0..255), FAILED_PRECONDITION (a broken session), or the KvAccess's error: then every session of the batch is
  // marked broken.
  absl::Status Step(std::span<StepInput> batch, KvAccess& kv, std::span<StepOutput> out) const;

  // Prefill without logits: feeds `tokens` so that their rows and index keys exist (a "prepared prefix" import).
  // Errors: as Step.
  absl::Status ImportPrefix(ModelSession& session, std::span<const Token> tokens, KvAccess& kv) const;

  // Imports history computed earlier for the same leading tokens (a cached prepared-prefix block, brief §10) instead
  // of computing it: with n = session.position(), appends rows[s] (tokens * row_bytes bytes: positions n ..
  // n+tokens-1) position by position, every source s = 0 .. n_sources-1 at each position (so a hierarchical store
  // completes, and backs up, each page on all sources before its tail slot is needed again), extends indexer i's keys by keys[i]
  // (tokens * idx_dim floats, layer order), then position += tokens. When rows and keys were captured from an
  // ImportPrefix/Step of the same tokens after the same history, the session and the KV store end bit-identical to
  // that computation (the caller guarantees the provenance; workerd/prefix_cache.h keys it by the whole chain).
  // Errors: INVALID_ARGUMENT (tokens 0, foreign session, rows.size() != n_sources, keys.size() != n_indexers, a
  // wrong size), FAILED_PRECONDITION (broken session), or the KvAccess's Append error: the session is then broken.
  absl::Status ImportRows(ModelSession& session, uint32_t tokens, std::span<const std::vector<uint8_t>> rows,
                          std::span<const std::vector<float>> keys, KvAccess& kv) const;

  // Imports history whose payload rows are already in `kv`'s store (a resumed request's pages imported from host,
  // HierarchicalKvAccess::ImportHostRows) and whose index keys were kept with them: with n = session.position(),
  // extends indexer i's keys by keys[i] (tokens * idx_dim floats, positions n .. n+tokens-1), then position +=
  // tokens. Nothing is computed or appended. When the keys are those an ImportPrefix/Step of the same tokens after the
  // same history computed, the session ends bit-identical to that computation.
  // Errors: INVALID_ARGUMENT (foreign session, keys.size() != n_indexers, a wrong size), FAILED_PRECONDITION (broken).
  absl::Status ImportKeys(ModelSession& session, uint32_t tokens, std::span<const std::vector<float>> keys) const;

  // A speculative round (brief §6; workerd/speculation.h). Before the Step that feeds the round's K_r tokens
  // (anchor at n = session.position(), proposals after it; query j sees positions <= n + j, each with its own
  // selection), BeginVerification marks the rows from n + 1 on as unverified in `kv` (KvAccess::HoldUnverified: no
  // page holding one is backed up or kept). After acceptance, EndVerification keeps positions 0 .. length-1
  // (length = n'_r = n + A_r + 1, spec::CommitRound) and drops the rest: the session's position becomes `length`, its
  // index keys of later positions are erased, and kv.CommitVerified(request, length) drops their rows and completes
  // the pages the kept rows finished. The model's positions have one row each (m = 1), so every kept row joins history.
  // Errors: INVALID_ARGUMENT (foreign session; length outside [held n + 1, position()]), FAILED_PRECONDITION (broken
  // session; EndVerification without BeginVerification), or the KvAccess's error (the session is then broken).
  absl::Status BeginVerification(ModelSession& session, KvAccess& kv) const;
  absl::Status EndVerification(ModelSession& session, Position length, KvAccess& kv) const;

  // --- test seam, off by default (no hook): when set, called at the end of every successful Step with the batch and
  // its outputs, before the caller digests or samples the logits. Tests flip one bit of one logit the model produced
  // to show that the exactness check reports it (tests/tools/replay_flip_test.cc). Set it only while no Step runs.
  using LogitsHook = std::function<void(std::span<const StepInput> batch, std::span<StepOutput> out)>;
  void SetLogitsHookForTest(LogitsHook hook) { logits_hook_ = std::move(hook); }

 private:
  struct LayerWeights;
  struct Weights;
  struct Plan;
  struct Scratch;

  Model(ModelConfig config, std::unique_ptr<Weights> weights, uint64_t fingerprint);
  absl::Status Run(std::span<StepInput> batch, KvAccess& kv, std::span<StepOutput> out) const;
  // The steps of Run, in order (model.cc); `Scratch` is one step's queries and buffers.
  absl::Status ValidateStep(std::span<StepInput> batch) const;
  void Embed(Scratch& s) const;
  absl::Status AppendRows(int layer, KvAccess& kv, Scratch& s) const;
  absl::Status IndexAndFetch(int layer, KvAccess& kv, Scratch& s) const;
  void Attend(int layer, Scratch& s) const;
  void Mlp(int layer, Scratch& s) const;
  void Logits(Scratch& s, std::span<StepOutput> out) const;

  ModelConfig config_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Plan> plan_;
  uint64_t fingerprint_ = 0;
  LogitsHook logits_hook_;  // test seam (see SetLogitsHookForTest); empty in production

 public:
  ~Model();
};

}  // namespace dhs::model
