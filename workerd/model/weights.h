// workerd/model/weights.h: the tensors of the built-in model (names, shapes) and their seeded generator.
//
// Tensor names (all F32, row-major, matrices [out, in]); D = d_model, H = n_heads, F = d_ff:
//   tok_emb [256, D]; final_norm [D]; lm_head [256, D]
//   layers.{l}.attn_norm [D], .w_qc [H*d_c, D], .w_qr [H*d_r, D], .w_o [D, H*d_c], .mlp_norm [D], .w_up [F, D],
//   .w_down [D, F]                                             (every layer)
//   layers.{l}.kv_norm [D], .w_dkv [d_c, D], .w_kr [d_r, D]   (layers that write a payload row: write/producer/follower)
//   layers.{l}.idx_wq [h_I*d_I, D], .idx_ww [h_I, D], .idx_wk [d_I, D]   (layers with an indexer: write/reindex/producer)
// A weights file also carries __metadata__ {"format": "dhs-model/1", "preset", "seed", "config": ModelConfig JSON}.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "workerd/model/config.h"
#include "workerd/model/safetensors.h"

namespace dhs::model {

inline constexpr std::string_view kWeightsFormat = "dhs-model/1";

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor the model with `config` needs, in a fixed order (the file layout order of GenerateWeights).
std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& config);

// All tensors of `config` drawn from `seed` (std::mt19937_64, a fixed bits-to-float map: the same seed gives the same
// bytes on every platform), plus the metadata. Norm gains are 1 +- 0.1; matrices uniform in +-sqrt(3 / fan_in);
// tok_emb uniform in +-1. Error: INVALID_ARGUMENT when the config does not validate.
absl::StatusOr<SafetensorsWriter> GenerateWeights(const ModelConfig& config, uint64_t seed);

// The generator GenerateWeights uses, for any tensor list (the drafter's too, workerd/speculation/drafter_model.h): draws
// every tensor of `specs` in order from std::mt19937_64(seed) with the same rules (1-D tensors are gains 1 +- 0.1,
// "tok_emb" uniform in +-1, other matrices uniform in +-sqrt(3 / fan_in)) and adds them to `writer`.
// Error: INVALID_ARGUMENT from SafetensorsWriter::AddF32 (a duplicate name).
absl::Status AddSeededTensors(std::span<const TensorSpec> specs, uint64_t seed, SafetensorsWriter& writer);

}  // namespace dhs::model
