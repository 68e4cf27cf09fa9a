// tools/replay/node_client.h: the seam between the replay driver and the serving node (memd + workerd).
// The replay owns this interface; the node-facing implementation (ZeroMQ + FlatBuffers, brief §3) is written
// against it by whoever connects the node, and tests use a scripted fake.
//
// Thread-safety: a NodeClient is used by one thread (the ReplayDriver's); implementations need not be
// thread-safe. The value types here are plain data.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs::replay {

// What picks a request's tenant in a tenant mix (dhs-replay --tenant-by, RequestTenant): its session (every turn of a
// conversation under one tenant), or its trace index (each row by itself: a repeated row under another tenant).
enum class TenantKey { kSession, kTraceIndex };

// What to prefill: the trace carries no text, only lengths and prefix-block ids (brief §10). The node (or
// SynthesizePrompt below) turns this into `input_tokens` byte tokens (vocabulary 256, brief §11) such that
// requests with equal leading hash ids get equal leading tokens, so shared prefixes stay shared.
struct PromptRef {
  int64_t trace_index = 0;        // the request's row in the trace (seeds tokens not covered by hash ids)
  int64_t input_tokens = 0;       // prompt length, tokens (>= 1)
  int64_t block_tokens = 512;     // tokens per hash block (>= 1)
  std::vector<int64_t> hash_ids;  // prefix-block ids; block b covers tokens [b * block_tokens, (b+1) * block_tokens)
  // Issue 26 (sessions across nodes): explicit prompt bytes, e.g. a chat turn's history, the previous answer and the
  // new tokens. Non-empty: they are the prompt (input_tokens must equal their size; hash_ids are not used) and
  // SynthesizePrompt returns them.
  std::string tokens;
};

// Sampling of the generated tokens. Greedy by default, so that resident and hierarchical runs can be compared
// token for token (brief §7).
struct Sampling {
  bool greedy = true;
  double temperature = 1.0;  // used when !greedy
  uint64_t seed = 0;         // used when !greedy; the driver sets it to the trace index
};

struct SubmitRequest {
  RequestId request = 0;       // unique for the run; the driver uses first_request_id + trace index
  PromptRef prompt;
  int64_t max_new_tokens = 0;  // tokens to generate (>= 1); the node finishes the request after that many
  Sampling sampling;
};

// Why a request's stream ended (issue 22; the report counts them, docs/replay.md "End reasons"). Names: EndReasonName.
enum class EndReason {
  kNone,            // not ended (yet)
  kFinished,        // all its tokens came
  kFailed,          // the worker failed it (TokenEvent::error says why)
  kRejected,        // the worker refused its submit (ErrorReply)
  kCancelled,       // cancelled (NodeClient::Cancel) and the worker released it
  kTimeout,         // cancelled by the driver's timeout (DriverOptions::request_timeout_ms / idle_timeout_ms)
  kWorkerStopping,  // the worker stopped (SIGTERM) and ended it for good ("worker stopping")
  kWorkerGone,      // the worker's connection closed before it ended the request (killed, crashed, hung)
};
// "not_ended", "finished", "failed", "rejected", "cancelled", "timeout", "worker_stopping", "worker_gone".
std::string_view EndReasonName(EndReason reason);

// One report from the node about one request. A request gets any number of events with tokens, the last one
// with `finished` (or with a non-empty `error`, which also ends it).
struct TokenEvent {
  RequestId request = 0;
  std::vector<int32_t> tokens;    // tokens produced since the previous event (byte values 0..255); may be
                                  // several at once (speculative decoding commits A_r + 1 per round, brief §6)
  std::vector<uint64_t> logits_digests;  // one per token when the node reports them (64-bit digest of the
                                         // logits that produced the token), else empty
  bool finished = false;          // no more events for this request
  std::string error;              // non-empty: the request failed (it is then finished); text for the report
  double allocation_wait_ms = 0;  // total time so far that the request waited for its required allocation
                                  // (admission queue, brief §4), ms; non-decreasing across its events
  EndReason end_reason = EndReason::kNone;  // set on the event that ends the request (finished or error)
  // Issue 22: the time from the previous event's tokens to these tokens as the node produced them, ms (the worker's
  // own stamps, TokenChunk.since_submit_us, so a client that reads late does not squeeze the stream); -1 when the node
  // gives none for this gap (the request's first tokens, the first after a re-attach, a node without stamps): the
  // driver then uses its own receipt times.
  double token_interval_ms = -1;
};

// Node-wide figures for the report, read once at the end of a run.
struct Census {  // how selected rows resolved (brief §5), counts of rows
  int64_t direct = 0;
  int64_t hot = 0;
  int64_t host = 0;
};

struct GpuMemoryUse {  // one GPU's KV pools (brief §4)
  GpuId gpu = 0;
  int64_t capacity_pages = 0;        // M
  int64_t peak_required_pages = 0;   // max M_req seen
  int64_t peak_optional_pages = 0;   // max M_opt seen
  int64_t reserve_pages = 0;         // M_res
  int64_t page_bytes = 0;            // bytes per page (all sources of the pool)
  int64_t peak_used_bytes = 0;       // max (M_req + M_opt) * page_bytes seen
};

struct NodeStats {
  int64_t sessions_admitted_max = 0;  // high-water mark of admitted sessions, all GPUs together
  Census census;                      // summed over sources, layers and GPUs
  int64_t reclaims = 0;               // requests whose optional history was reclaimed (brief §4)
  int64_t repopulated_pages = 0;      // pages published again by population (brief §4)
  int64_t prefix_blocks_imported = 0; // prepared-prefix blocks imported from the worker's row cache
  int64_t prefix_blocks_computed = 0; // prepared-prefix blocks computed by the worker
  int64_t host_bytes_recovered = 0;   // issue 27: host -> device bytes of the worker's recoveries (bytes_recovered)
  // Issue 24 (prefix sharing): the worker's prefix lookups by tier, blocks (WorkerStatsReply.prefix_*), prefill tokens
  // saved, shared host pages granted; memd's host pool sampled with the sessions admitted then (bytes per session =
  // (allocated - cached prefix) host pages * host page bytes / admitted sessions, over samples with a session) and its
  // shared + cached prefix pages at the end.
  int64_t prefix_lookups = 0;
  int64_t prefix_hits_host = 0;
  int64_t prefix_hits_worker = 0;
  int64_t prefill_tokens_saved = 0;
  int64_t prefix_shared_pages_granted = 0;
  int64_t host_pages_shared = 0;             // memd's shared + cached prefix pages at the last sample
  double host_bytes_per_session_mean = 0;    // over samples
  double host_bytes_per_session_peak = 0;
  int64_t host_pages_held_peak = 0;          // max over samples of memd's allocated - cached prefix host pages
  int64_t host_pages_allocated_peak = 0;     // max over samples of memd's allocated host pages (cached ones included)
  // Issue 26: memd's cluster tier (its status view's "cluster", memd --cluster-store; memd/state_dump.h ClusterDump),
  // pages and bytes: the run's totals across memd restarts (tools/replay/cluster_counters.h ClusterTally: a restarted
  // memd counts from 0 again, so each earlier memd's last sample is added); nullopt when memd reports no cluster tier.
  struct ClusterCounters {
    int64_t lookups = 0, hits = 0, imported = 0, published = 0;
    int64_t published_bytes = 0, imported_bytes = 0;
    int64_t session_imported = 0;  // of imported: pages found by a session key (sessions across nodes)
    // Issue 26 review (F4): why lookups missed and publishing lost pages.
    int64_t offered = 0;         // pages offered to the publish queue
    int64_t publish_failed = 0;  // pages of publish batches the store did not confirm (not retried)
    std::map<std::string, int64_t> misses;  // pages looked up and not imported, by memd's reason: absent, timeout,
                                            // unavailable, store_error, bad_value (the store's answer), no_room,
                                            // store_down, no_geometry, after_gap (memd's; docs/cluster_tier.md)
    std::map<std::string, int64_t> shed;    // pages not queued to publish, by reason: queue_full, bytes_full,
                                            // too_large, store_down
    // Not memd's counters but dhs-replay's view of them (empty / 0 in one sample): memd's store health ("up",
    // "down", "probing") at the last sample, the samples by the health they showed, and the memd restarts seen (a
    // sample from another memd than the previous one's: ClusterTally).
    std::string health;
    std::map<std::string, int64_t> health_samples;
    std::string reachable;  // memd's "reachable" at the last sample: its latest contact with the store answered
                            // ("yes", "no", "not yet"; "" when memd gives none)
    int64_t memd_restarts_seen = 0;
    // Adds o's counters, reasons, health samples and restarts; the health becomes the worse of the two (down, then
    // probing, then up; "" counts as none), reachable too (no, then "not yet", then yes). Used to add up nodes.
    ClusterCounters& operator+=(const ClusterCounters& o);
    // misses[reason] (0 when memd gave no such reason).
    int64_t miss(const std::string& reason) const;
    int64_t shed_of(const std::string& reason) const;
  };
  std::optional<ClusterCounters> cluster;
  std::vector<GpuMemoryUse> gpus;     // one entry per GPU, ascending gpu id
  // Speculation (the worker's WorkerStatsReply; 0 / empty when off):
  std::string speculate;              // the worker's --speculate
  int64_t spec_rounds = 0;            // verified rounds
  int64_t spec_round_tokens = 0;      // tokens they emitted (sum of A_r + 1)
  int64_t spec_proposed = 0;          // proposals verified
  int64_t spec_accepted = 0;          // proposals accepted
  int64_t spec_propose_us = 0;        // proposer time, us
  std::vector<int64_t> spec_width_rounds;  // [K] = rounds of K queries
  int64_t staging_bytes = 0;          // staging arenas reserved, bytes
  int64_t draft_ring_bytes = 0;       // draft rings reserved, bytes
};

// The node as the replay sees it.
class NodeClient {
 public:
  virtual ~NodeClient() = default;

  // Hands a request to the node; returns once the node has it queued (not when admitted). A non-OK status
  // means the node cannot be used any more (transport failure); the driver then ends the run with it.
  // Per-request failures come back as a TokenEvent with `error`.
  virtual absl::Status Submit(const SubmitRequest& request) = 0;

  // Issue 22: asks the node to end `request` now (the worker releases its slot and pages). Its end still comes as a
  // TokenEvent: end_reason kCancelled, or its own end when it ended first. Asking again, or for a request that has
  // ended, changes nothing. Non-OK: as Submit.
  virtual absl::Status Cancel(RequestId request, std::string_view reason) = 0;

  // Waits up to timeout_ms (>= 0) for events and returns those available (possibly none). Non-OK: as Submit.
  virtual absl::StatusOr<std::vector<TokenEvent>> Poll(double timeout_ms) = 0;

  // Node-wide figures of this run (counters relative to the start of the run, peaks seen during it). Called once,
  // after the last request ended.
  virtual absl::StatusOr<NodeStats> Stats() = 0;

  // Issue 27: starts the sampled peaks over (sessions_admitted_max, gpus, the host pool's peaks and means), so that a
  // later Stats() reports the peaks of a measured window only (the prepared-prefix workload's sessions, not its
  // preparation); the worker's counters are not touched. Called between phases, with no request of this client in
  // flight. A node that samples memd first waits (bounded) until memd holds no admitted session of the phase that
  // ended (a request's end reaches the client before memd has its Complete). Non-OK: as Submit. The default keeps
  // no peaks: nothing to do.
  virtual absl::Status RestartPeaks() { return absl::OkStatus(); }
};

// A deterministic prompt for a PromptRef: `input_tokens` bytes from common/prompt_tokens.h's SyntheticPromptTokens
// (the generator the worker uses to expand a prepared prefix, so both prefill paths see the same tokens): token j of
// hash block b is PrefixBlockToken(hash_ids[b], j); tokens after the last hash block are PrivateToken(trace_index,
// position), so different requests differ there. Equal leading hash ids -> equal leading bytes. Pure function.
std::string SynthesizePrompt(const PromptRef& prompt);

// The worker's counters (census, reclaims, repopulated pages, prefix blocks) accumulate over the worker's life.
// Returns `now` with those counters replaced by now - baseline, i.e. this run's share when `baseline` was read as
// the run began (--connect to a worker that served before). sessions_admitted_max and gpus are memd peaks sampled
// during the run and are kept from `now`. When any counter of `now` is below the baseline the worker restarted
// during the run and `now` (its totals since that restart) is returned unchanged. Pure function.
NodeStats WorkerCountersSince(const NodeStats& now, const NodeStats& baseline);
// Adds the worker counters of `from` (census, reclaims, pages, prefix blocks, speculation counters and widths) to
// `into`: the counts of a worker that died, kept for the run's totals (a restarted worker counts from 0 again).
void AddWorkerCounters(NodeStats& into, const NodeStats& from);

// The prompt's hash ids as the wire's unsigned ids.
std::vector<uint64_t> HashIdsOf(const PromptRef& prompt);

}  // namespace dhs::replay
