// workerd/geometry.h: the configuration of one worker and the sizes derived from it (brief §8): WorkerConfig, the
// geometry (page bytes, M, B, T, the KV layout, the speculation memory), the Hello that announces them to memd
// (contract §1), and the pages a request needs on GPU before it may start (AdmitRequest.required_pages). One formula,
// used by the worker and by dhs-replay (which sizes its node with it).
//
// Thread-safety: plain values and functions; ComputeGeometry reads the drafter's file (--drafter-weights) when the
// speculation mode has a drafter, nothing else does I/O.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "libdhs/embedded_shape.h"
#include "dhs_generated.h"
#include "workerd/kv/layout.h"
#include "workerd/model/config.h"
#include "workerd/resumed_outputs.h"
#include "workerd/serving_mode.h"  // WorkerMode, its names
#include "workerd/speculation/speculation_config.h"

namespace dhs {

struct WorkerConfig {
  GpuId gpu = 0;
  WorkerMode mode = WorkerMode::kAdaptive;
  uint64_t hbm_budget_bytes = uint64_t{64} << 20;  // GPU KV budget, bytes: M = budget / page_bytes
  uint32_t slots = 8;                // N request slots
  uint32_t hot_rows = 0;             // B per slot and source; 0 = max(64, 4 * (k + local_window))
  uint32_t tail_rows = 0;            // T per slot and source, a multiple of p; 0 = 2 * p
  uint32_t page_rows = 64;           // p
  uint64_t max_context_tokens = 131072;  // prompt + max_new_tokens limit per request, tokens
  uint64_t prefix_cache_bytes = uint64_t{256} << 20;  // prepared-prefix row cache (prefix_cache.h), bytes; 0 = off
  uint32_t submit_queue = 256;       // requests waiting for their grant at most; a submit beyond gets
                                     // RESOURCE_EXHAUSTED "submit queue full (N)" (issue 12: bounded, not a flood)
  uint32_t prefill_chunk = 0;        // prompt tokens fed per request and step; 0 = auto: min(B / (k + window),
                                     // T - p + 1) in every mode, so one step's selections fit the hot cache and its
                                     // rows the tail (ValidateGeometry) and the modes interleave prefill with decode
                                     // alike
  uint32_t away_held_tokens = 4096;  // memd away (issue 11): a request whose tokens held back from its client (not
                                     // yet in memd's record) reach this pauses until memd is back, tokens
  spec::SpeculationConfig speculation;  // --speculate, --block, ... (workerd/speculation/speculation_config.h)
  // χ (--staging-arenas, brief §6 "Staging", §8: 4 live payload layers): staging arenas of speculative verification,
  // used when speculation is on and the mode is hierarchical; 0 = none (a round's union must then fit the hot cache).
  uint32_t staging_arenas = 4;
  ResumedOutputLimits resumed_outputs;  // resumed outputs no client re-attached to (workerd/resumed_outputs.h)
};

// The sizes derived from the model and the config (brief §8).
struct WorkerGeometry {
  uint64_t page_bytes = 0;       // GPU page: p * sum of d_KV over payload sources (contract "Units")
  // Host page: page_bytes + p * sum over indexers of idx_dim * 4 (the payload rows, then the positions' index keys;
  // KvLayout::host_page_bytes). memd's host pool page size (memd --page-bytes).
  uint64_t host_page_bytes = 0;
  uint32_t capacity_pages = 0;   // M
  uint32_t hot_rows = 0;         // B
  uint32_t tail_rows = 0;        // T
  uint32_t prefill_chunk = 0;    // tokens
  // The widest speculative round, queries, the same in every mode (so the modes differ in memory only): the tail must
  // hold a page plus the round's rows (a rejected row never pushes an unbacked page out of the tail), T - p + 1; with
  // staging arenas (speculation on, χ > 0) that is all, min(K_max = --block, T - p + 1), since the rows of a round's
  // union beyond the hot cache go to a staging arena; without, also B / (k + window) (the union must fit the hot
  // cache): then the same bound as the default prefill chunk (ValidateGeometry).
  uint32_t max_block = 1;
  // Staging arenas (brief §6): χ (0 when speculation is off, --staging-arenas 0 or resident mode: no arena) and
  // M_stage = χ * N * K_max * k * d_KV bytes (spec::StagingReservationBytes, K_max = --block), allocated once at
  // worker start on the device (HierarchicalKvAccess).
  uint32_t staging_arenas = 0;
  int64_t staging_bytes = 0;
  KvConfig kv;                   // the hierarchical layout (optional_pages = M)
  // Speculation memory (issue 13; brief §6 "Staging", "Draft KV ring", §8 "with a drafter"): required allocations
  // declared to memd, the totals in the Hello and each slot's share in every AdmitRequest (inside required_pages).
  // All 0 with --speculate off; the draft ring 0 without a drafter (synthetic mode). The staging totals are
  // staging_arenas / staging_bytes above.
  struct Speculation {
    int64_t draft_ring_rows = 0;       // R_d = p * ceil((W + K_max + p - 1) / p) rows per slot (the drafter's W)
    int64_t draft_bytes_per_row = 0;   // the drafter's ring row, bytes (all its layers)
    int64_t drafter_window = 0;        // W: prior positions the drafter reads (0 without a drafter)
    uint64_t draft_ring_bytes = 0;     // N * R_d * draft_bytes_per_row, bytes
    uint64_t slot_draft_ring_bytes = 0;  // R_d * draft_bytes_per_row: one slot's share, bytes
    uint64_t slot_staging_bytes = 0;     // staging_bytes / N = χ * K_max * k * d_KV: one slot's share, bytes
    uint32_t draft_ring_pages = 0;     // ceil(slot_draft_ring_bytes / page_bytes), per request
    uint32_t staging_pages = 0;        // ceil(slot_staging_bytes / page_bytes), per request
  } speculation;
};
// Bytes of one host page for `model` at p = page_rows: p * (sum of d_KV over payload sources + sum over indexers of
// idx_dim * 4) (WorkerGeometry.host_page_bytes; memd --page-bytes of a node serving this model).
uint64_t HostPageBytes(const model::ModelConfig& model, uint32_t page_rows);

// The geometry rules (issue 22), in one place: a geometry that passes serves every prompt the limits admit (any
// length up to --max-context, a chunk starting anywhere in a page), one that fails is refused at start with the rule's
// formula and numbers. `g` holds the resolved sizes (defaults applied): kv.page_rows p, hot_rows B, tail_rows T,
// prefill_chunk C, max_block, page_bytes; k and the local window w come from `model`. Rules, in this order:
//   p > 0; T a positive multiple of p; N = slots > 0; gpu < kMaxGpus; C > 0;
//   hisparse / adaptive only (resident keeps every row on GPU: no hot cache, no tail reuse):
//     B >= k + w                 one query's selection fits the hot cache;
//     C <= T - p + 1             the tail rule: a step's C rows are appended to the T-slot tail before it reads them,
//                                and tail slot t mod T is reused only once row t - T has a host copy, which its page
//                                gets only when every source holds all p of its rows; a chunk may start p - 1 rows
//                                into a page (after a prepared prefix, a resume's host run, a decode), so
//                                C + p - 1 <= T ("tail of request N is full: page j has no host copy yet" otherwise);
//     C * (k + w) <= B           one step's selections of one request stay protected in the hot cache;
//   1 <= M = hbm_budget / page_bytes <= 2^32 - 1;
//   speculation (spec::CheckSpeculation): K_max = --block <= max_block = min(K_max, T - p + 1) with staging arenas,
//     else min(B / (k + w), T - p + 1) (a round of K_r queries is a step of K_r rows and K_r selections).
// Errors: INVALID_ARGUMENT naming the rule, e.g. "worker: prefill chunk C = 100 > T - p + 1 = 128 - 64 + 1 = 65: ...".
// ComputeGeometry calls it; every program that starts or sizes a worker goes through ComputeGeometry (workerd,
// dhs-replay's budget, dhs-node's page size check, the planner's workerd presets).
absl::Status ValidateGeometry(const model::ModelConfig& model, const WorkerConfig& config, const WorkerGeometry& g);

// With --speculate fixed / confidence the drafter's config is read from --drafter-weights (its W and ring row bytes
// size the draft ring). Defaults: B = max(64, 4 (k + w)), T = 2p, C = min(B / (k + w), T - p + 1) (at least 1).
// Errors: INVALID_ARGUMENT (every rule of ValidateGeometry, with its formula and numbers; a staging reservation or
// draft ring whose size overflows), the drafter file's errors (spec::DrafterModel::Load: NOT_FOUND, INVALID_ARGUMENT,
// ...) prefixed with "--drafter-weights FILE: ".
absl::StatusOr<WorkerGeometry> ComputeGeometry(const model::ModelConfig& model, const WorkerConfig& config);

// This worker's shape as libdhs declares an engine's (libdhs/embedded_shape.h; issue 25, "workerd uses it"): its
// sizes from `geometry` (ComputeGeometry's), the model's sources, row and key bytes, k, its KV groups (numbered in
// order of first use), each source's consumers (the layers with that source), the rows fetched per token (each layer
// with an indexer fetches a row of every source of its layer's group), the staging arenas, K_max = --block with any
// --speculate mode but off, and the drafter's ring (R_d, its row bytes, W). run_dir is left empty (not the shape's),
// the model fingerprint 0 (the Model's, not its config's: the caller sets it). Resident mode declares B = max(B, k)
// (it reads no hot cache; the shape requires k <= B).
lib::EmbeddedConfig EmbeddedConfigOf(const model::ModelConfig& model, const WorkerConfig& config,
                                     const WorkerGeometry& geometry, std::string_view device_name);

// The Hello of this worker (contract §1), with its shape for `dhsctl plan --live` (issue 14: serving mode, L_idx,
// d_idx, k, B, T, fetched rows per token, W, K_max, draft bytes per row; common/worker_shape.h): libdhs's
// HelloOf(EmbeddedConfigOf(...)), the one construction of a worker's Hello. Errors: INVALID_ARGUMENT (a shape
// libdhs's bounds refuse, lib::CheckShape: e.g. more than 64 staging arenas, a region above 1 TiB).
absl::StatusOr<wire::HelloT> MakeHello(const model::ModelConfig& model, const WorkerConfig& config,
                                       const WorkerGeometry& geometry, std::string_view device_name);

// GPU pages request needs granted before it starts (AdmitRequest.required_pages): its hot cache and tail, ceil(B + T
// / p), plus its index keys, ceil(context * indexers * index-key bytes / page bytes), plus, in resident mode, its
// whole context, ceil(context / p), plus, with speculation, its slot's share of the draft ring and staging arenas
// (geometry.speculation.draft_ring_pages + staging_pages, brief §8 "with a drafter"), in every mode.
// `context_tokens`: input + max_new_tokens. The arithmetic is SessionRequiredPages (common/worker_shape.h), the one
// `dhsctl plan --live` uses too.
uint32_t RequiredPages(const model::ModelConfig& model, const WorkerGeometry& geometry, WorkerMode mode,
                       uint64_t context_tokens);

}  // namespace dhs
