// workerd/worker_stats.h: the worker's stats recorder (issue 23: stats recording, one room of the old Worker): the
// counters since start (WorkerStats), the latency histograms (issue 22, docs/operations.md "Worker metrics"), failures
// by reason, and the request timelines behind `dhsctl request` (common/request_timeline.h). The rooms report events to
// it (a request submitted, granted, a token, an end); the counters other rooms keep themselves (the agent's, the
// resume importer's, the speculative rounds', the prefix importer's, the KV store's census and integrity) are gathered
// into a snapshot only when asked (Snapshot), and StatsReplyOf renders a WorkerStatsReply from a snapshot.
//
// No sockets, no decisions: what it records never changes what the worker does. Clocks: the times are passed in.
// Thread-safety: none; the worker thread drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/prometheus.h"
#include "common/request_timeline.h"
#include "dhs_generated.h"
#include "workerd/geometry.h"
#include "workerd/kv/hierarchical_kv_access.h"
#include "workerd/residency_agent.h"
#include "workerd/resume_import.h"
#include "workerd/speculative_rounds.h"
#include "workerd/worker_request.h"

namespace dhs {

// Counters since start (WorkerStatsReply).
struct WorkerStats {
  Census census;                 // summed over groups
  uint64_t reclaims_obeyed = 0;
  uint64_t pages_reclaimed = 0;
  uint64_t pages_populated = 0;
  uint64_t pages_kept = 0;
  uint64_t pages_backed_up = 0;
  uint64_t finished_requests = 0;
  uint64_t failed_requests = 0;
  uint64_t tokens_generated = 0;
  uint64_t prefix_blocks_imported = 0;  // prepared-prefix blocks imported from the row cache (not computed)
  uint64_t prefix_blocks_computed = 0;  // prepared-prefix blocks computed (and offered to the cache)
  // Issue 24 (prefix sharing): blocks of the chains first admissions named, blocks granted whole as memd's shared
  // host pages, prefill tokens saved (shared host rows imported + row-cache blocks' rows), shared pages granted.
  uint64_t prefix_lookups = 0;
  uint64_t prefix_hits_host = 0;
  uint64_t prefill_tokens_saved = 0;
  uint64_t prefix_shared_pages_granted = 0;
  uint64_t submits_refused = 0;         // submits refused with "submit queue full"
  uint64_t requests_resumed = 0;        // interrupted requests of an earlier epoch resumed (Resume)
  uint64_t rows_recomputed = 0;         // rows those resumed requests recomputed from their tokens, rows
  uint64_t rows_imported = 0;           // rows they imported from host instead (pages with a confirmed host copy)
  uint64_t resume_us_max = 0;           // the longest resume (Resume to its first new token), us
  uint64_t commits_deferred = 0;        // steps whose tokens went to memd with a later step (one message in flight)
  uint64_t records_refused = 0;  // requests whose tokens memd refused alone (TokenLedger): their record stops there
  uint32_t waiting_requests_peak = 0;   // the most requests waiting for their grant at once
  uint64_t memd_aways = 0;              // times memd died under this worker (MemdAway::Enter)
  uint64_t tokens_while_away = 0;       // tokens generated while memd was away (held from clients until it was back)
  uint64_t paused_while_away = 0;       // requests paused while memd was away (held-token or tail bound)
  uint64_t resumed_outputs_dropped = 0; // resumed outputs dropped unclaimed (config.resumed_outputs bound)
  // Host-page integrity (issue 22; HierarchicalKvAccess::host_integrity):
  HostIntegrityCounters host_integrity;  // pages checksummed / verified (bytes) / mismatched
  uint64_t requests_cancelled = 0;      // requests ended by their client's Cancel (issue 22)
  // Speculation (--speculate; workerd/speculative_rounds.h RoundCounters):
  uint64_t spec_rounds = 0;          // verified rounds (K_r >= 2)
  uint64_t spec_round_tokens = 0;    // tokens those rounds emitted: sum of A_r + 1
  uint64_t spec_proposed = 0;        // proposals verified: sum of K_r - 1
  uint64_t spec_accepted = 0;        // proposals accepted: sum of A_r
  uint64_t spec_propose_us = 0;      // time in Proposer::Propose, us (the synthetic proposer's target steps)
  std::vector<uint64_t> spec_width_rounds;  // [K] = rounds of K_r = K queries (index 0 and 1 unused)
  // Metrics (issue 22; docs/operations.md "Worker metrics"), us:
  LatencyHistogram ttft = MakeLatencyHistogram();            // submit (a resume: its start) to its first token
  LatencyHistogram tpot = MakeLatencyHistogram();            // between a request's consecutive tokens
  LatencyHistogram admission_wait = MakeLatencyHistogram();  // submit to AdmitGrant
  std::map<std::string, uint64_t> failures;  // failed_requests by reason (FailureReason), sums to failed_requests
};

// The reason label of a failed request: its status code's name in lower case ("unavailable", "resource_exhausted",
// "invalid_argument", ...).
std::string FailureReason(const absl::Status& error);

// The worker's timeline bound (common/request_timeline.h): the latest 1024 requests, 8 events each (it records at most
// submitted, first_token and end per request).
inline constexpr TimelineLimits kWorkerTimelineLimits{1024, 8};

// Microseconds from `from` to `to` (steady clock).
inline uint64_t MicrosSince(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(to - from).count());
}

// The counters the other rooms keep, read into a snapshot (WorkerRecorder::Snapshot).
struct StatsParts {
  const HierarchicalKvAccess* hier = nullptr;  // census and host integrity; nullptr in resident mode
  const ResumeCounters* resume = nullptr;
  const RoundCounters* rounds = nullptr;
  const ResidencyStats* agent = nullptr;
};

// What a WorkerStatsReply says beside the counters (StatsReplyOf).
struct StatsFacts {
  const WorkerConfig* config = nullptr;
  const WorkerGeometry* geometry = nullptr;
  uint32_t active_requests = 0;
  uint32_t waiting_requests = 0;
  int64_t staging_bytes = 0;             // HierarchicalKvAccess::staging_bytes(), 0 in resident mode
  uint32_t resumed_outputs_waiting = 0;  // RequestBook::detached_outputs()
  uint64_t epoch = 1;                    // RequestBook::epoch()
};

class WorkerRecorder {
 public:
  explicit WorkerRecorder(GpuId gpu) : gpu_(gpu) {}

  // The plain counters the rooms count themselves (submits refused, memd aways, requests resumed, ...).
  WorkerStats& counts() { return stats_; }
  const WorkerStats& stats() const { return stats_; }

  using TimePoint = std::chrono::steady_clock::time_point;
  // Request `id` (client id `client_id`, client identity `client_identity`: SubmitRequest.client, an engine's session)
  // entered the worker at `submitted` (a Submit, or a Resume: `detail` says of what; `resumed_tokens` were committed
  // before it): its timeline opens with kSubmitted. libdhs's EmbeddedWorker calls it too (an engine's request).
  void Submitted(RequestId id, RequestId client_id, uint64_t client_identity, TimePoint submitted,
                 uint64_t resumed_tokens, std::string detail);
  // Its AdmitGrant came at `granted`: the admission-wait histogram.
  void Granted(TimePoint submitted, TimePoint granted) { stats_.admission_wait.Observe(MicrosSince(submitted, granted)); }
  // Request `id` produces a token at `now`: its first (`first`; a resume: its first new one; `since` = its submit)
  // goes to the TTFT histogram and its timeline (kFirstToken), a later one (`since` = its previous token) to TPOT.
  void Token(RequestId id, bool first, TimePoint since, TimePoint now);
  // The same for workerd's WorkerRequest r (r.times; Token before the token is appended to r.out).
  void Submitted(const WorkerRequest& r, uint64_t client_identity, std::string detail) {
    Submitted(r.id, r.client_id, client_identity, r.times.submitted, static_cast<uint64_t>(r.out.resumed),
              std::move(detail));
  }
  void Granted(const WorkerRequest& r) { Granted(r.times.submitted, r.times.granted); }
  void Token(const WorkerRequest& r, TimePoint now) {
    const bool first = r.out.generated.size() == static_cast<size_t>(r.out.resumed);
    Token(r.id, first, first ? r.times.submitted : r.times.last_token, now);
  }
  // Request `id` ended (finished, or failed with `error`) after `tokens` tokens at `now`: finished_requests, a
  // failure by reason, its timeline's kEnd.
  void Ended(RequestId id, uint64_t tokens, const absl::Status& error, std::chrono::steady_clock::time_point now);
  // Request `id`'s report was refused by memd after a re-Hello (ended with `error`, resumed elsewhere): a failure by
  // reason and its timeline's kEnd; not a finished request.
  void Refused(RequestId id, uint64_t tokens, const absl::Status& error, std::chrono::steady_clock::time_point now);

  // The counters, with those of `parts` filled in.
  WorkerStats Snapshot(const StatsParts& parts) const;
  // TimelinesToJson of the timelines of client id `client_request` (at most kWorkerTimelineLimits), as
  // WorkerStatsReply.timeline_json.
  std::string TimelineJson(uint64_t client_request) const;
  const RequestTimelines& timelines() const { return timelines_; }

 private:
  void CountFailure(const absl::Status& error);
  void EndTimeline(RequestId id, uint64_t tokens, const absl::Status& error, std::chrono::steady_clock::time_point now);

  GpuId gpu_;
  WorkerStats stats_;
  RequestTimelines timelines_{kWorkerTimelineLimits};  // the serving side of `dhsctl request` (issue 22)
};

// The WorkerStatsReply of snapshot `s` (the serving core's part; ServingFrontend adds its back-pressure counters).
wire::WorkerStatsReplyT StatsReplyOf(const WorkerStats& s, const StatsFacts& facts);

}  // namespace dhs
