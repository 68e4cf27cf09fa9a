// libdhs/embedded_shape.h: the shape of one GPU's worker as libdhs declares it (issue 25): EmbeddedConfig (the C++
// form of dhs_worker_config), its checks, the KV layout and region it gives, the Hello it sends memd (contract §1) and
// the required pages of a request (brief §8). Pure: no sockets, no clocks, no allocation but the returned values.
//
// ONE construction of the Hello: libdhs's EmbeddedWorker sends HelloOf(config), and workerd's MakeHello
// (workerd/geometry.h) maps its model and flags to an EmbeddedConfig (EmbeddedConfigOf) and calls HelloOf too, so the
// built-in model's worker declares itself through the same shape an engine declares (issue 25, "workerd uses it":
// whatever workerd's Hello says, an engine can say through dhs_worker_config).
//
// Thread-safety: plain values and functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "common/worker_shape.h"
#include "dhs_generated.h"
#include "workerd/kv/layout.h"
#include "workerd/serving_mode.h"

namespace dhs::lib {

// The shape an engine declares (dhs_worker_config, validated by CheckShape).
struct EmbeddedConfig {
  std::string run_dir;  // memd's run directory (EmbeddedWorker::Open connects there; not part of the shape)
  GpuId gpu = 0;
  WorkerMode mode = WorkerMode::kAdaptive;  // kHisparse, kAdaptive or kResident
  uint32_t sources = 1;                     // S
  uint32_t row_bytes = 0;                   // d_KV
  uint32_t indexers = 0;                    // L_idx
  uint32_t index_key_bytes = 0;             // d_idx
  uint32_t page_rows = 64;                  // p
  uint32_t top_k = 0;                       // k
  uint32_t hot_rows = 0;                    // B
  uint32_t tail_rows = 0;                   // T
  uint32_t slots = 1;                       // N
  uint64_t hbm_budget_bytes = 0;
  uint32_t connect_timeout_ms = 5000;
  uint8_t* engine_pool = nullptr;  // the engine's KV pool memory (nullptr: the library allocates it), not owned
  uint64_t engine_pool_bytes = 0;
  uint64_t model_fingerprint = 0;  // Hello.model_fingerprint (issue 26): the engine's model, 0 = not said
  // The group of each source (dhs_worker_config.source_groups, ABI 1.3): empty = every source its own group; else
  // `sources` entries numbered in order of first use (brief §5: an index producer's followers share its group).
  std::vector<uint32_t> source_groups;
  // Staging arenas of speculative verification (dhs_worker_config ABI 1.5; brief §6 "Staging"): χ arenas of
  // round_queries * k rows of d_KV bytes per slot (M_stage = χ * N * K_max * k * d_KV, spec::StagingReservationBytes).
  // 0: none (a round's union must fit the hot cache). With arenas: χ >= the largest group's sources.
  // round_queries = K_max, the most queries of one speculative round, 1 <= K_max <= T - p + 1 (a held round's rows
  // fit the tail); ABI 1.8: also without arenas (Hello.k_max: the rounds' bound, declared), 0 = no rounds declared.
  // The arenas follow the KV pool in the same region (RegionLayout).
  uint32_t staging_arenas = 0;  // χ
  uint32_t round_queries = 0;   // K_max
  // ABI 1.8 (what workerd's Hello declared beyond the above; docs/protocol.md "Speculation memory", dhsctl plan):
  // the layers that read each source (Hello.sources[].consumers): empty = 1 each, else `sources` entries, each >= 1.
  std::vector<uint32_t> source_consumers;
  // Rows fetched per generated token (Hello.fetched_rows_per_token: a selection costs a row of every source of its
  // group, summed over the layers that select): not said = S (one selection per source; the C ABI's 0).
  std::optional<uint32_t> fetched_rows_per_token;
  // A drafter's KV ring in GPU memory the engine holds per slot (brief §8 "with a drafter"; 0 rows: no drafter):
  // R_d rows of draft_bytes_per_row bytes each; memd counts each admission's slot share R_d * draft_bytes_per_row
  // inside its required pages and the worker's N shares (Hello.draft_ring_bytes). drafter_window = W, the prior
  // positions the drafter reads (shown; 0 without a drafter).
  uint32_t draft_ring_rows = 0;
  uint64_t draft_bytes_per_row = 0;
  uint32_t drafter_window = 0;
  std::string device_name = "libdhs cpu";  // Hello.device_name (C++ only; the C ABI's worker says "libdhs cpu")
};
inline constexpr uint64_t kEnginePoolAlignment = 64;  // DHS_POOL_ALIGNMENT
// The region's bound (a single GPU's memory today is below it): CheckShape refuses a shape whose region passes it.
inline constexpr uint64_t kMaxRegionBytes = uint64_t{1} << 40;  // 1 TiB
inline constexpr uint32_t kMaxStagingArenas = 1024;  // χ at most (workerd's --staging-arenas range)

// The one region an engine addresses (dhs_pool_desc; a location is a byte offset into it): the KV pool
// (KvLayout::pool_bytes; resident mode: the budget's whole pages) at 0, then the staging arenas (M_stage bytes, 0
// without) at staging_offset = the KV pool's bytes rounded up to kEnginePoolAlignment. bytes = staging_offset +
// staging_bytes (without arenas: the KV pool's).
struct RegionLayout {
  uint64_t kv_bytes = 0;
  uint64_t staging_offset = 0;
  uint64_t staging_bytes = 0;
  uint64_t bytes = 0;
};

// OK, or INVALID_ARGUMENT "dhs_worker_config: ..." naming the field and its bound (run_dir is the connection's, not
// the shape's: EmbeddedWorker::Open checks it). The bounds: gpu <
// 65536; S in [1, 4096]; d_KV a positive multiple of 4, <= 1 MiB; L_idx <= 4096, d_idx a positive multiple of 4 (<= 64
// KiB) with indexers, else 0; p in [1, 2^20]; 1 <= k <= B <= 2^31; T a positive multiple of p, <= 2^31; N in [1,
// 4096]; the groups and consumers as above; arenas in [the largest group's sources, kMaxStagingArenas] and K_max in [1, T - p + 1];
// K_max without arenas <= T - p + 1; a drafter's ring rows and row bytes both set or both 0 (its slot share's pages
// <= 2^31), W only with a ring; M = budget / (p * S * d_KV) in [1, 2^32 - 1]; the region <= kMaxRegionBytes.
absl::Status CheckShape(const EmbeddedConfig& config);
// The KV layout of `config` (unchecked: CheckShape first): uniform d_KV, groups from source_groups, M optional pages.
KvConfig KvConfigOf(const EmbeddedConfig& config);
// The region of `config` (CheckShape's errors; KvLayout::Create's and StagingReservationBytes's).
absl::StatusOr<RegionLayout> RegionOf(const EmbeddedConfig& config);
// The Hello (contract §1) a worker of `config` sends (CheckShape's errors): its GPU pages, host pages, sources,
// serving mode, k, B, T, the speculation memory (draft ring: N * R_d * draft_bytes_per_row bytes; staging: M_stage),
// K_max, the model fingerprint and device name. pid is the caller's process.
absl::StatusOr<wire::HelloT> HelloOf(const EmbeddedConfig& config);
// The inputs of SessionRequiredPages (common/worker_shape.h, brief §8) for a request of a worker of `config` whose
// region is `region` (unchecked): p, the page's bytes, B, T, L_idx, d_idx, resident, the slot's draft ring
// (R_d * draft_bytes_per_row) and staging share (M_stage / N, exact).
SessionPagesInput SessionPagesOf(const EmbeddedConfig& config, const RegionLayout& region);

}  // namespace dhs::lib
