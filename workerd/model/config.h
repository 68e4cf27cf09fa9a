// workerd/model/config.h: the configuration of the built-in sparse-attention model (brief §8, §11) and its presets.
//
// Owns: ModelConfig (shapes and per-layer topology), the small-scale presets `dsv4flash-like` and `glm5-like`, the
// benchmark preset `bench-wide`, validation, and the JSON form stored in a weights file's `__metadata__`.
// Thread-safety: plain values; const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs::model {

// A token id of the byte vocabulary: 0..255.
using Token = int32_t;
inline constexpr int kVocab = 256;

// The role of one layer towards KV sources (brief §2, §5).
//   kWrite:    first consumer of its source: computes the payload row of every new position, appends it, runs its own
//              indexer and top-k, fetches its selection. (shared-source topology)
//   kReuse:    later consumer of a source: inherits the previous consumer's selection and rows; no Append, no Fetch.
//   kReindex:  later consumer of a source: its own indexer computes a fresh top-k over the same source; Fetch again.
//   kProducer: index producer (shared-index topology): runs the indexer once for its group and computes the payload
//              rows of every layer of the group (itself and its followers) from the group's input hidden state; one
//              Fetch over all the group's sources with one selection per query.
//   kFollower: payload layer of the preceding producer's group: own source and own bytes, no indexer, no Fetch.
enum class LayerKind { kWrite, kReuse, kReindex, kProducer, kFollower };

std::string_view LayerKindName(LayerKind kind);
absl::StatusOr<LayerKind> ParseLayerKind(std::string_view name);

struct LayerSpec {
  LayerKind kind = LayerKind::kWrite;
  SourceId source = 0;  // the KV source this layer's attention reads

  bool has_indexer() const {
    return kind == LayerKind::kWrite || kind == LayerKind::kReindex || kind == LayerKind::kProducer;
  }
  // True when the layer owns the projections of a payload row (w_dkv, w_kr, kv_norm).
  bool writes_row() const {
    return kind == LayerKind::kWrite || kind == LayerKind::kProducer || kind == LayerKind::kFollower;
  }
};

struct ModelConfig {
  std::string preset;         // preset name, informational ("" for a custom config)
  int d_model = 64;           // hidden width D
  int d_ff = 128;             // MLP width
  int n_heads = 2;            // attention heads (MLA-style: each head queries the shared latent row)
  int d_c = 32;               // compressed latent part of a payload row (floats)
  int d_r = 8;                // rotary part of a payload row (floats, even)
  int idx_heads = 2;          // indexer heads h_I
  int idx_dim = 16;           // indexer head dim d_I (also the index key width)
  int top_k = 16;             // k: selection length (positions)
  int local_window = 0;       // 0: off; else each query also attends to its last `local_window` positions
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  std::vector<LayerSpec> layers;

  int n_layers() const { return static_cast<int>(layers.size()); }
  // d_KV: bytes of one payload row, fp32 latent + rotary parts (brief §8): 4 * (d_c + d_r).
  size_t row_bytes() const { return 4u * static_cast<size_t>(d_c + d_r); }
  // d_idx: bytes of one index key (fp32), kept resident by the model (brief §8).
  size_t index_key_bytes() const { return 4u * static_cast<size_t>(idx_dim); }
  // Number of KV sources: max source id + 1 (sources are numbered densely from 0).
  int n_sources() const;
  // Number of layers with an indexer (L_idx of brief §8).
  int n_indexers() const;

  // Checks shapes (positive, d_r even, top_k >= 1, local_window >= 0) and topology: sources numbered densely from 0;
  // a kWrite is the first consumer of its source; kReuse/kReindex follow a kWrite of the same source; a kFollower
  // follows a kProducer or kFollower; producer/follower layers each have a source no other layer reads.
  // Errors: INVALID_ARGUMENT naming the field or layer.
  absl::Status Validate() const;

  // JSON text of this config (stored in the weights file's __metadata__ under "config") and its inverse.
  std::string ToJson() const;
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json);
};

// The small-scale presets mirroring brief §8: "dsv4flash-like" (1.33 MiB of weights), "glm5-like"; and
// "bench-wide": dsv4flash-like's topology, k, window, indexer and row sizes (d_c, d_r: same d_KV, so the memd/worker
// geometry is unchanged) with d_model 1024 and d_ff 1536, i.e. 109.3 MiB of fp32 weights (114,647,040 bytes), far
// above a CPU's last-level cache: a decode step streams the weights once for the whole batch, as on a GPU, so
// batching raises throughput (the mode benchmark's regime). Error: NOT_FOUND (unknown name).
// THE list of preset names (the model owns the vocabulary; workerd --preset, dhs-gen-weights --preset, dhs-replay
// --preset, dhs-node's [[worker]] preset and the planner's workerd:NAME ask it), and the default one (workerd's and
// dhs-replay's --preset). Header constants: a tool that only checks a name links nothing.
inline constexpr std::string_view kPresetNames[] = {"dsv4flash-like", "glm5-like", "bench-wide"};
inline constexpr std::string_view kDefaultPreset = kPresetNames[0];
absl::StatusOr<ModelConfig> PresetConfig(std::string_view name);
// kPresetNames as strings, in order (CLI11 IsMember, help texts).
inline std::vector<std::string> PresetNames() { return {std::begin(kPresetNames), std::end(kPresetNames)}; }

}  // namespace dhs::model
