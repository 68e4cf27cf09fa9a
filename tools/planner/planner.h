// tools/planner/planner.h: the capacity planner behind `dhsctl plan` (issue 14; brief §6 and §8; docs/planner.md).
//
// A pure library: no sockets, no clocks, no files (the CLI reads the description file and hands its text here).
// A Topology (a preset or a JSON description) plus a context length and optional budgets form a PlanInput;
// Compute turns it into a Plan of figures. Every size is in bytes, every count in rows, tokens or sessions, as the
// field names say. The formulas, their sources and the choices made where the brief leaves a parameter open are in
// docs/planner.md.
//
// Thread-safety: free functions over values; no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/worker_shape.h"
#include "nlohmann/json.hpp"

namespace dhs::planner {

// The model and node shape the planner needs (brief §8 table, §6 drafter and staging).
struct Topology {
  std::string name;                      // preset name or the description's "name" (informational)
  uint64_t payload_layers = 0;           // L_pay: payload layers (sources), each with its own rows
  uint64_t index_producers = 0;          // L_idx: indexer layers, one index key per position each (stay on GPU)
  uint64_t top_k = 0;                    // k: rows one selection returns
  uint64_t payload_row_bytes = 0;        // d_KV: bytes of one stored payload row of one layer
  uint64_t index_key_bytes = 0;          // d_idx: bytes of one index key of one indexer layer
  uint64_t page_rows = 0;                // p: rows (positions) per page
  uint64_t hot_rows = 0;                 // B: hot-cache rows per request and payload layer
  uint64_t tail_rows = 0;                // tail rows per request and payload layer
  uint64_t metadata_bytes_per_hot_slot = 0;  // GPU metadata per hot slot and index producer (docs/planner.md)
  double selections_per_token = 0;       // selections (resolver calls with a fresh top-k) per decoded token
  double rows_per_selection = 0;         // payload rows fetched per selected position (follower layers per selection)
  uint64_t drafter_window = 0;           // W: prior positions the drafter reads
  uint64_t k_max = 0;                    // K_max: target queries per verification round (anchor + proposals)
  uint64_t draft_bytes_per_row = 0;      // bytes of one draft-ring row (all draft layers together)
  uint64_t live_payload_layers = 0;      // χ: payload sources live at once in a layer group (staging arenas)
  uint64_t slots = 0;                    // N: request slots per GPU (sizes the per-GPU ring and staging)
  // false: sessions without speculation (a worker with --speculate off): K_max, W, the draft row and χ may be 0 and
  // every draft-ring and staging figure is 0 (hierarchical_with_drafter = hierarchical).
  bool speculation = true;
};

// The names of the built-in presets: "glm5-like", "dsv4flash-like".
std::vector<std::string> PresetNames();

// The brief §8 preset `name`, with the choices of docs/planner.md where §8 is silent.
// Errors: NOT_FOUND naming the preset and the known names.
absl::StatusOr<Topology> Preset(std::string_view name);

// The shape a running worker declared in its Hello (memd's `status` view, "worker" of a GPU; common/worker_shape.h),
// as a topology (docs/planner.md, "Live"): L_pay = payload_sources, d_KV = page_bytes / (p * L_pay), L_idx, d_idx, k,
// p, B, T, N as declared; selections_per_token = L_idx and rows_per_selection = fetched_rows_per_token / L_idx;
// W, K_max, draft_bytes_per_row, χ = staging_arenas as declared, speculation = K_max > 0; metadata 0 (workerd's
// declared pages count no metadata: SessionRequiredPages). `name`: "worker of GPU <gpu> (<mode>)" or `name` if given.
// Errors: FAILED_PRECONDITION when the worker declared no shape (an older workerd), INVALID_ARGUMENT when its page is
// not p * L_pay * d_KV for a whole d_KV or it declares no payload source, page row or indexer.
absl::StatusOr<Topology> TopologyFromWorker(const WorkerShape& worker, std::string name);

// A topology from a JSON description (an object; keys are the Topology field names; docs/planner.md lists them).
// Every Topology field except `name` (default "custom"), `metadata_bytes_per_hot_slot` (default 16) and `speculation`
// (a boolean, default true) is required.
// Errors: INVALID_ARGUMENT naming the key for malformed JSON, a missing or unknown key, or a value of the wrong type
// (integers must be non-negative whole numbers, the two rates non-negative finite numbers). Range checks are
// Validate's.
absl::StatusOr<Topology> TopologyFromJson(std::string_view text);

struct PlanInput {
  Topology topology;
  uint64_t context_tokens = 0;           // n: tokens of context per session, >= 1
  std::optional<uint64_t> hbm_bytes;     // KV budget of one GPU, bytes: gives sessions per GPU
  std::optional<uint64_t> host_bytes;    // host-tier budget of one host, bytes: gives sessions per host
  double miss_rate = 0.1;                // μ: share of selected rows recovered from host, in [0, 1]
  std::optional<double> tpot_base_ms;    // per-token latency without the drafter, ms (with tpot_spec_ms)
  std::optional<double> tpot_spec_ms;    // per-token latency with the drafter, ms (with tpot_base_ms)
};

// Sessions of one GPU's budget, per serving mode.
struct SessionsPerGpu {
  uint64_t resident = 0;
  uint64_t hierarchical = 0;
  uint64_t hierarchical_with_drafter = 0;
};

// Brief §6, "when speculation pays": N_spec / N_base > TPOT_spec / TPOT_base.
struct SpeculationVerdict {
  uint64_t sessions_base = 0;            // N_base = sessions_per_gpu.hierarchical
  uint64_t sessions_spec = 0;            // N_spec = sessions_per_gpu.hierarchical_with_drafter
  double sessions_ratio = 0;             // N_spec / N_base
  double tpot_ratio = 0;                 // TPOT_spec / TPOT_base
  double break_even_tpot_spec_ms = 0;    // TPOT_base * N_spec / N_base: speculation pays below this
  bool pays = false;                     // sessions_ratio > tpot_ratio (strict)
};

struct Plan {
  PlanInput input;
  uint64_t padded_context_tokens = 0;    // n_pad = p * ceil(n / p), tokens (rows per layer)
  uint64_t metadata_bytes_per_session = 0;     // metadata_bytes_per_hot_slot * B * L_idx
  uint64_t resident_bytes_per_session = 0;     // n_pad * (L_pay * d_KV + L_idx * d_idx)
  uint64_t hierarchical_bytes_per_session = 0; // n_pad * L_idx * d_idx + (B + tail) * L_pay * d_KV + metadata
  uint64_t draft_ring_rows = 0;                // R_d = p * ceil((W + K_max + p - 1) / p), rows per request slot
  uint64_t draft_ring_bytes_per_session = 0;   // R_d * draft_bytes_per_row
  uint64_t draft_ring_bytes_per_gpu = 0;       // N * R_d * draft_bytes_per_row
  uint64_t staging_bytes_per_gpu = 0;          // M_stage = χ * N * K_max * k * d_KV
  uint64_t staging_bytes_per_session = 0;      // M_stage / N = χ * K_max * k * d_KV
  uint64_t staging_bytes_one_arena_per_layer = 0;  // L_pay * N * K_max * k * d_KV (the layout χ arenas avoid)
  uint64_t hierarchical_with_drafter_bytes_per_session = 0;  // hierarchical + ring + M_stage / N
  double resident_over_hierarchical = 0;       // resident / hierarchical
  double resident_over_hierarchical_with_drafter = 0;
  std::optional<SessionsPerGpu> sessions_per_gpu;   // floor(hbm_bytes / per-session bytes), with hbm_bytes
  uint64_t host_bytes_per_session = 0;         // n_pad * (L_pay * d_KV + L_idx * d_idx): payload and index keys
  std::optional<uint64_t> sessions_per_host;   // floor(host_bytes / host_bytes_per_session), with host_bytes
  double host_bytes_per_token = 0;             // μ * selections_per_token * k * rows_per_selection * d_KV
  std::optional<SpeculationVerdict> speculation;  // with hbm_bytes and both TPOT figures
};

// INVALID_ARGUMENT naming the field for: context_tokens 0; any of payload_layers, index_producers, top_k,
// payload_row_bytes, index_key_bytes, page_rows, hot_rows, slots 0; k_max 0 with speculation; hot_rows < top_k
// (a single selection must fit the hot cache, brief §5); tail_rows not a multiple of page_rows; live_payload_layers >
// payload_layers (χ = 0 is allowed: no staging arenas, workerd --staging-arenas 0); selections_per_token or rows_per_selection not finite and > 0; miss_rate outside [0, 1];
// hbm_bytes or host_bytes 0; only one of the TPOT figures, or one not finite and > 0; TPOT figures without hbm_bytes.
absl::Status Validate(const PlanInput& input);

// The figures of brief §8 and §6 for `input`. Errors: Validate's; OUT_OF_RANGE naming the figure when one does not
// fit in 64 bits; RESOURCE_EXHAUSTED when hbm_bytes holds no hierarchical session or host_bytes no host session
// (the message gives the per-session figure).
absl::StatusOr<Plan> Compute(const PlanInput& input);

// The plan as JSON: every figure under the field name above (sizes in bytes, absent figures null), plus "input".
nlohmann::json PlanToJson(const Plan& plan);

// ---- live: what a running memd would admit now (`dhsctl plan --live`, issue 14; docs/planner.md, "Live") ----

// One GPU of memd's live state, in memd's pages (the fields of `dhsctl --json status`, memd/state_dump.h).
struct LiveGpu {
  uint32_t gpu = 0;
  uint64_t pages = 0;                  // M
  uint64_t reserve_pages = 0;          // M_res
  uint64_t free_pages = 0;             // free (lendable = free - M_res)
  uint64_t reclaimable_pages = 0;      // a_r of the victim candidates: what deficits can reclaim now
  uint64_t reclaiming_pages = 0;       // held by reclaims in flight (free once retired)
  uint64_t slots = 0;                  // N of the worker's Hello; 0 = unlimited
  uint64_t slots_used = 0;
  uint64_t queued = 0;                 // admissions queued (FIFO: served before a new one)
  uint64_t queued_required_pages = 0;
  uint64_t queued_host_pages = 0;
  std::optional<WorkerShape> worker = std::nullopt;  // its worker's Hello's shape ("worker"; null: none)
};

struct LiveState {
  uint64_t page_bytes = 0;             // memd's pool page (a host page: payload rows, then index keys), bytes
  uint64_t host_reusable_pages = 0;    // host pool pages free to assign now
  std::vector<LiveGpu> gpus;
  std::vector<uint32_t> fenced_gpus;   // GPUs memd shows fenced ("up": false; left out of `gpus`)
};

// Parses the JSON of memd's `status` view (an IntrospectReply, the text `dhsctl --json status` prints), fenced GPUs
// left out. Errors: INVALID_ARGUMENT naming the missing or malformed key (a "worker" object must have every
// WorkerShape field; a memd that sends none gives worker = nullopt).
absl::StatusOr<LiveState> LiveStateFromStatusJson(std::string_view text);
// memd's "worker" object of one GPU as a WorkerShape (the inverse of memd's rendering, memd/state_dump.cc).
// Errors: INVALID_ARGUMENT naming the missing or malformed key.
absl::StatusOr<WorkerShape> WorkerShapeFromJson(const nlohmann::json& worker);

struct LiveGpuPlan {
  uint32_t gpu = 0;
  // lendable + reclaimable + reclaiming - queued_required (>= 0): GPU pages new sessions can have, pages
  uint64_t available_pages = 0;
  std::optional<uint64_t> free_slots;  // N - used - queued (>= 0); none when N is unlimited
  uint64_t sessions = 0;               // min(floor(available_pages / required_pages_per_session), free_slots)
};

struct LivePlan {
  uint64_t page_bytes = 0;      // memd's pool page: a host page, p * (L_pay * d_KV + L_idx * d_idx), bytes
  uint64_t gpu_page_bytes = 0;  // a GPU page, p * L_pay * d_KV, bytes
  bool resident = false;        // sessions of a resident-mode worker (LiveOptions::resident)
  // SessionRequiredPages (common/worker_shape.h), what workerd declares in AdmitRequest.required_pages for context n:
  // ceil((B + T) / p) + ceil(n * L_idx * d_idx / gpu_page_bytes) [+ ceil(n / p) resident]
  // + ceil(draft_ring_bytes_per_session / gpu_page_bytes) + ceil(staging_bytes_per_session / gpu_page_bytes)
  uint64_t required_pages_per_session = 0;
  uint64_t speculation_pages_per_session = 0;  // the last two terms (0 without speculation)
  uint64_t host_pages_per_session = 0;      // n_pad / p: one host page per context page (memd assigns at the grant)
  std::vector<LiveGpuPlan> gpus;
  uint64_t host_available_pages = 0;        // host_reusable - sum of queued_host (>= 0)
  uint64_t sessions_by_host = 0;            // floor(host_available_pages / host_pages_per_session)
  uint64_t sessions_now = 0;                // min(sum of gpus[].sessions, sessions_by_host)
};

struct LiveOptions {
  bool resident = false;        // the sessions are a resident-mode worker's (the whole context on GPU too)
  std::optional<uint32_t> gpu;  // count this GPU only (`--gpu`); none: every registered GPU
};

// What memd would admit now, in sessions of `plan`'s shape (one per request: the required pages workerd declares on
// the GPU, SessionRequiredPages, speculation share included when the topology speculates; a host page per context
// page). Errors: FAILED_PRECONDITION when memd's page differs from the topology's host page (p * (L_pay * d_KV +
// L_idx * d_idx) bytes: the payload rows, then the index keys) or no worker registered a GPU yet; NOT_FOUND when
// options.gpu is not a registered, unfenced GPU.
absl::StatusOr<LivePlan> ComputeLive(const Plan& plan, const LiveState& live, const LiveOptions& options = {});

// The live figures as JSON (under "live" of `dhsctl plan --live --json`) and as table lines.
nlohmann::json LivePlanToJson(const LivePlan& live);
std::string LivePlanToTable(const LivePlan& live);

// The plan as an aligned text table: one line per figure, bytes also in GiB/MiB.
std::string PlanToTable(const Plan& plan);

}  // namespace dhs::planner
