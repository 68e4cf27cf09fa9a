// memd/state_dump.h: the snapshot of memd's state that dhsctl shows, and the ONE rendering of it.
//
// StateDump is a plain value filled by ResidencyManager::Dump(). The daemon's introspection reply, dhsctl and the
// tests render it with the same functions: DumpToJson / DumpToTable for a view, RenderPrometheus for metrics.
// Units: every *_pages field counts pages; host coverage = history pages with a complete host copy / history pages.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"
#include "common/worker_shape.h"
#include "memd/gpu_page_table.h"
#include "memd/request_state.h"
#include "nlohmann/json.hpp"

namespace dhs::memd {

// Pages [first, first + count) of one GPU, all in `state` and held by `owner` (kNoOwner when free).
struct PageRun {
  PageIndex first = 0;
  uint32_t count = 0;
  PageState state = PageState::kFree;
  RequestId owner = kNoOwner;
};

struct GpuDump {
  GpuId gpu = 0;
  // false: fenced (its worker died or hung; no page accounting until a new Hello); epoch = accepted registrations
  // of this GPU (1 after the first Hello, +1 per re-registration after a fence).
  bool up = true;
  uint32_t epoch = 0;
  uint32_t pages = 0;             // M
  uint32_t required_pages = 0;    // M_req
  uint32_t optional_pages = 0;    // M_opt = pending + ready + reclaiming
  uint32_t reserve_pages = 0;     // M_res
  uint32_t free_pages = 0;
  uint32_t pending_pages = 0;     // optional-pending
  uint32_t ready_pages = 0;       // optional-ready
  uint32_t reclaiming_pages = 0;
  std::vector<RequestId> queue;   // queued admissions, head first
  uint32_t reclaims_in_flight = 0;
  // What `dhsctl plan --live` reads (docs/planner.md, "Live"): pages a deficit could reclaim now (a_r of the victim
  // candidates: admitted, not reclaiming, not backed off), the Hello's request slots N (0: unlimited) and those in
  // use, and what the queued admissions will take first (their required pages and one host page per context page).
  uint32_t reclaimable_pages = 0;
  uint32_t request_slots = 0;
  uint32_t used_slots = 0;
  uint64_t queued_required_pages = 0;
  uint64_t queued_host_pages = 0;
  // Speculation memory (issue 13; brief §6, §8 "with a drafter"): the Hello's totals for the worker's N slots, bytes
  // (draft rings N * R_d * draft_bytes_per_row; staging M_stage = χ * N * K_max * k * d_KV), and the sums of the
  // shares of the requests holding their required pages now (admitted, reclaiming): pages (part of M_req) and bytes.
  uint64_t declared_draft_ring_bytes = 0;
  uint64_t declared_staging_bytes = 0;
  uint32_t draft_ring_pages = 0;
  uint32_t staging_pages = 0;
  uint64_t draft_ring_bytes = 0;
  uint64_t staging_bytes = 0;
  // The shape its worker's latest accepted Hello declared (issue 14; common/worker_shape.h), for `dhsctl plan --live`
  // without --preset / --file. Introspection only: filled by the daemon (Daemon::Introspect), not by the core, which
  // never reads it. Absent (JSON "worker": null) before a Hello or from a worker that declares none.
  std::optional<WorkerShape> worker;
  // Issue 26: its worker's model fingerprint (Hello.model_fingerprint; 0 = not known): JSON "model", 16 hex digits
  // (a string: a JSON number would lose bits), or null when 0.
  uint64_t model_fingerprint = 0;
  // Page rows, filled only for the `pages` view of this GPU (DumpScope): pages [page_from, page_from + n) as
  // page_states / page_owners (n = page_states.size(), at most the view's count), or with runs, page_runs: maximal
  // runs of consecutive pages of one state and owner, the first starting at page_from, at most the view's count.
  PageIndex page_from = 0;
  std::vector<PageState> page_states;  // page_states[i]: state of page page_from + i
  std::vector<RequestId> page_owners;  // page_owners[i]: owner of page page_from + i; kNoOwner when free
  std::vector<PageRun> page_runs;
};

struct RequestDump {
  RequestId request = 0;
  GpuId gpu = 0;
  SlotIndex slot = kNoSlot;      // chosen at the grant; kNoSlot while queued (JSON null, "-" in the table)
  RequestState state = RequestState::kQueued;
  uint32_t required_pages = 0;
  uint32_t optional_pages = 0;   // a_r
  uint32_t history_pages = 0;    // complete history pages (imported + completed tail pages)
  uint32_t host_pages = 0;       // history pages with a complete host copy or covered by the worker's tail
  uint32_t tail_pages = 0;       // history pages covered by the worker's tail, host copy not confirmed written yet
  int64_t admitted_at_us = 0;    // injected clock; queued requests: time queued
  int32_t reclaim_rank = -1;     // 0-based place in the reclaim order among a_r > 0 requests; -1 none
  // Its slot's speculation share as its admission declared it (issue 13), part of required_pages: its draft ring
  // (R_d * draft_bytes_per_row bytes) and staging reservation (M_stage / N bytes), pages = ceil(bytes / page bytes).
  uint32_t draft_ring_pages = 0;
  uint32_t staging_pages = 0;
  uint64_t draft_ring_bytes = 0;
  uint64_t staging_bytes = 0;
  // The history pages whose host copy is complete and confirmed written (HostCopyWritten / BackupComplete), as
  // (history page, host page of segment 0), ascending history page. Rendered in the `request N` view only (JSON
  // "host_copies": [[page, host page], ...]); fault-injection checks (dhs-replay's host_rows_lost) digest those pages.
  std::vector<std::pair<uint32_t, PageIndex>> host_copies;
  // The tokens its resume record holds (RequestRecordStore: committed by TokensCommitted; absent: no record), filled by
  // the daemon (the core keeps no records). Rendered in the `request N` view only (JSON "record_tokens", null when
  // absent): the worker streams tokens ahead of an unacknowledged commit, so this may be below what its client got.
  std::optional<uint32_t> record_tokens;
};

struct HostDump {
  uint32_t pages = 0;
  uint64_t page_bytes = 0;
  uint32_t reusable_pages = 0;
  uint32_t allocated_pages = 0;
  uint32_t pinned_pages = 0;
  uint32_t freed_pinned_pages = 0;  // freed while pinned, reusable after the copy completes
};

// How much ResidencyManager::Dump fills: kFull everything (every page of every GPU: O(M) per GPU, for tests at small
// M); kCounts (the daemon's metrics snapshot on every tick, all RenderPrometheus reads) leaves out what costs O(M) or
// O(requests): page rows and requests (request_count still says how many there are). O(GPUs + queued + reclaims in
// flight), independent of M.
enum class DumpDetail : uint8_t { kFull = 0, kCounts = 1 };

// Bounds of the `pages GPU` view (issue 12: an H200 has ~2.5M pages, a node 8 GPUs): rows per reply (pages, or runs
// with --runs) by default and at most. A reply of kMaxPageRows rows is about 2.2 MB of text, 5 MB of JSON.
inline constexpr uint32_t kDefaultPageRows = 1000;
inline constexpr uint32_t kMaxPageRows = 65536;

// What ResidencyManager::Dump fills for one view (DumpScopeOf): the counts (as kCounts) always, plus what the view
// shows: the requests (O(requests + their history pages)), one request, or at most page_count page rows of one GPU
// from page_from (O(page_count); runs: O(pages the runs cover), bounded by M).
struct DumpScope {
  bool all_requests = false;
  std::optional<RequestId> request;  // this request only (absent from requests when unknown)
  std::optional<GpuId> page_gpu;     // page rows of this GPU only
  PageIndex page_from = 0;
  uint32_t page_count = 0;           // rows: pages, or runs when page_runs
  bool page_runs = false;
  bool prefix_chains = false;        // issue 24: the host tier's chains (PrefixDump::chains)
};

// The content-addressed host tier (issue 24, memd/prefix_pages.h): shown (status view, Prometheus) only when enabled,
// so a memd with --prefix-sharing off renders exactly what it did before.
struct PrefixDump {
  bool enabled = false;
  std::string eviction_policy;
  uint32_t tenant_quota_pages = 0;   // 0: none
  uint32_t writing_pages = 0;        // being written by their first request (not importable)
  uint32_t shared_pages = 0;         // held by >= 1 request
  uint32_t cached_pages = 0;         // held by none, kept until an admission needs the room
  uint64_t lookups = 0, hits = 0, misses = 0, content_mismatches = 0;  // shareable pages looked up at grants
  uint64_t stored = 0, abandoned = 0, evictions = 0, quota_refusals = 0, adopted = 0;
  // The stored pages grouped by block chain (tenant, chain up to a block), ascending (tenant, blocks, chain); only in
  // the `prefixes` view (DumpScope::prefix_chains). Adopted pages (chain unknown) are one row each, blocks 0.
  struct Chain {
    uint64_t tenant = 0;      // the tenant salt's hash (0: unknown)
    uint64_t chain = 0;       // the block chain hash (0: unknown)
    uint32_t blocks = 0;      // chain length (0: unknown)
    uint32_t pages = 0;       // stored pages of the chain's last block
    uint32_t shared = 0, cached = 0, writing = 0;  // of them, by state
    uint32_t holders = 0;     // distinct requests holding any of them
    int64_t last_use_us = 0;  // the latest use of any of them (memd's clock, microseconds)
  };
  std::vector<Chain> chains;
  // Issue 24, per-tier counts (memd's tier is `host`; the worker's row cache, tier `worker`, is counted by workerd):
  uint64_t hit_rows = 0;    // prefill tokens (rows) the host tier's hits saved
  uint64_t hit_bytes = 0;   // host bytes the hits did not allocate again: hits x host page bytes
  uint32_t stored_blocks = 0;  // blocks the KV event stream announces stored now (0 with the stream off)
};

// Issue 26: the cluster tier (memd/cluster_tier.h; docs/cluster_tier.md): filled by the daemon, rendered in the
// `status` and `prefixes` views and by RenderPrometheus (dhs_memd_cluster_*). Units: pages and bytes (page values'
// payloads for hits and imports, key + value for published bytes).
struct ClusterDump {
  bool configured = false;       // memd --cluster-store given
  std::string store;             // the store spec as given
  std::string health;            // the publisher's view of the store: "up", "down", "probing"
  std::string reachable;         // its latest contact answered: "yes", "no", "not yet" (ClusterTier: start PING,
                                 // publish and lookup batches)
  uint32_t queue_depth = 0;      // pages queued to publish (not counting the batch in flight)
  uint64_t queue_bytes = 0;      // their key + value bytes
  uint64_t offered = 0;          // pages offered to the queue
  uint64_t published = 0;        // pages the store confirmed (SET answered OK)
  uint64_t published_bytes = 0;  // their key + value bytes
  uint64_t publish_failed = 0;   // pages of batches the store did not confirm (not retried)
  std::vector<std::pair<std::string, uint64_t>> shed;     // by reason: queue_full, bytes_full, too_large, store_down
  uint64_t lookups = 0;          // pages asked of the store (GET keys)
  uint64_t hits = 0;             // found and checked
  uint64_t hit_bytes = 0;        // their payload bytes
  uint64_t imported = 0;         // hits copied into the host pool as cached shared pages (then granted as host hits)
  uint64_t imported_bytes = 0;
  // Issue 26 (sessions across nodes): of lookups / hits / imported, the pages asked by a session address (a next
  // turn's history pages beyond its prefix pages); the rest are prefix pages.
  uint64_t session_lookups = 0, session_hits = 0, session_imported = 0;
  std::vector<std::pair<std::string, uint64_t>> misses;   // by reason (absent, timeout, unavailable, store_error,
                                                          // bad_value, no_room, store_down, no_geometry, after_gap)
  std::vector<std::pair<std::string, uint64_t>> bad_values;  // bad_value misses by PageValueError
};

struct StateDump {
  std::string policy;
  int64_t now_us = 0;
  std::vector<GpuDump> gpus;          // ascending gpu
  std::vector<RequestDump> requests;  // ascending request id (queued ones included); empty with kCounts
  size_t request_count = 0;           // requests known (queued ones included): requests.size() of a full dump
  HostDump host;
  PrefixDump prefix;  // issue 24
  ClusterDump cluster;  // issue 26: filled by the daemon (the core knows nothing of the store)
};

// Event and order counters since start (monotonic), exported to Prometheus.
struct Counters {
  uint64_t events = 0;            // event calls of the daemon's inbound messages (RegisterGpu ... Complete)
  uint64_t event_errors = 0;      // events refused with a non-OK status
  uint64_t ticks = 0;             // Populate() and RetryBackups() calls of the daemon's timer (not events)
  uint64_t admissions = 0;        // Admit events accepted
  uint64_t grants = 0;
  uint64_t waits = 0;
  uint64_t rejects = 0;
  uint64_t completions = 0;
  uint64_t reclaims_started = 0;
  uint64_t reclaims_retired = 0;
  uint64_t reclaims_failed = 0;   // aborted by a failed backup (host pool full or copy error)
  uint64_t pages_retired = 0;
  uint64_t backups_ordered = 0;
  uint64_t backups_failed = 0;
  uint64_t populates_ordered = 0;
  uint64_t populates_failed = 0;
  uint64_t stale_reports = 0;     // readers-done of a reclaim already retired or cancelled by a completion
  uint64_t host_writes = 0;       // history pages confirmed written by HostCopyWritten
  uint64_t host_write_failures = 0;  // history pages HostCopyWritten reported failed
  uint64_t deferred_backups = 0;  // reclaim backups answered deferred (BackupComplete.deferred_pages)
  uint64_t keeps_lost = 0;        // kept pages written to host outside a reclaim (keep failed): GPU page freed
  uint64_t fences = 0;            // FenceGpu events (a worker died or hung)
  uint64_t reregistrations = 0;   // RegisterGpu of a fenced GPU (a new epoch)
  uint64_t requests_interrupted = 0;  // admitted requests of a fenced GPU (kept their confirmed host pages)
  uint64_t admissions_fenced = 0;     // queued admissions of a fenced GPU, rejected (UNAVAILABLE)
  uint64_t host_pages_lost = 0;   // host pages without a confirmed host copy freed by a fence (rows only on the GPU)
  uint64_t resumes = 0;           // interrupted requests taken over by a resume admission (Admit with resume_of)
  uint64_t host_pages_resumed = 0;  // kept host pages those resumes took over (imported by the worker, not recomputed)
  uint64_t requests_adopted = 0;    // interrupted requests adopted from a dead memd's journal (AdoptHostPages)
  uint64_t host_pages_adopted = 0;  // their confirmed host pages
  uint64_t requests_reported = 0;   // live requests of surviving workers taken back as admitted (AdoptGpu)
  uint64_t reports_refused = 0;     // reports AdoptGpu refused (the request stays as it was)
  uint64_t host_pages_held = 0;     // the other host pages, held until ReleaseHeldPages (the adoption's grace period)
};

// Counters of the daemon around the core (memd/daemon.h), rendered with the core's by RenderPrometheus.
struct DaemonCounters {
  uint64_t messages = 0;       // inbound messages that reached a handler
  uint64_t hellos = 0;         // accepted Hellos
  uint64_t send_failures = 0;  // orders and replies that could not be sent to a live worker (each fenced it)
  uint64_t refused_peers = 0;  // worker-only messages refused (PERMISSION_DENIED): not from that GPU's worker
  uint64_t workers = 0;        // GPUs whose worker said Hello and is not fenced (gauge)
  uint64_t workers_lost = 0;   // workers fenced: dead peer (socket monitor), heartbeat timeout or failed send
  uint64_t fenced_refused = 0; // messages refused FAILED_PRECONDITION "fenced" (from a fenced worker's old epoch)
  uint64_t foreign_request_ids = 0;  // request-scoped messages refused (INVALID_ARGUMENT): a request id outside the
                                    // range of the sender's GPU (GpuOfNodeRequestId, common/types.h)
  // Issue 24, the KV event stream (memd/kv_events.h; rendered only when it is on):
  bool kv_events = false;
  uint64_t kv_events_published = 0;  // events handed to the socket (sequence numbers used by sent batches)
  uint64_t kv_events_dropped = 0;    // events of batches dropped at the high-water mark (a consumer sees a gap)
  uint64_t kv_event_subscriptions = 0;  // subscribe messages seen from consumers
  ClusterDump cluster;  // issue 26 (rendered only when configured)
};

// A view of the dump: "status", "gpus", "requests", "request <id>", "pages <gpu> [from F] [count N] [runs]", "queue".
struct DumpView {
  enum class Kind { kStatus, kGpus, kRequests, kRequest, kPages, kQueue, kPrefixes };  // kPrefixes: issue 24
  Kind kind = Kind::kStatus;
  RequestId request = 0;  // kRequest
  GpuId gpu = 0;          // kPages
  PageIndex from = 0;     // kPages: first page shown (runs: where the first run starts)
  uint32_t count = kDefaultPageRows;  // kPages: rows at most, 1..kMaxPageRows
  bool runs = false;      // kPages: run-length rows (first page, count, state, owner) instead of one row per page
};
// Errors: InvalidArgument for an unknown view, a missing/bad number, or a count outside 1..kMaxPageRows.
absl::StatusOr<DumpView> ParseDumpView(std::string_view text);
// The part of the state `view` shows (what the daemon asks the core for).
DumpScope DumpScopeOf(const DumpView& view);

// JSON of one view. Unknown request/GPU in a view: {"error": "..."}.
nlohmann::json DumpToJson(const StateDump& dump, const DumpView& view);
// Fixed-width text table of one view (what `dhsctl` prints), one row per line, ending in '\n'.
std::string DumpToTable(const StateDump& dump, const DumpView& view);
// Prometheus text exposition (format 0.0.4): dhs_memd_gpu_pages{gpu="0",kind="required"} etc., the core's counters
// and the daemon's (the one place memd's metrics are rendered).
std::string RenderPrometheus(const StateDump& dump, const Counters& counters, const DaemonCounters& daemon = {});

}  // namespace dhs::memd
