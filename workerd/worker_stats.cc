// workerd/worker_stats.cc: see worker_stats.h.
#include "workerd/worker_stats.h"

#include <cctype>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "workerd/serving_mode.h"
#include "workerd/speculation/speculation_config.h"

namespace dhs {
namespace {

// A steady_clock time as CLOCK_MONOTONIC microseconds (the timelines' clock, common/request_timeline.h).
int64_t NowMicros(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::unique_ptr<wire::LatencyHistogramT> ToWireHistogram(const LatencyHistogram& h) {
  auto w = std::make_unique<wire::LatencyHistogramT>();
  w->bounds_us = h.bounds_us;
  w->counts = h.counts;
  w->sum_us = h.sum_us;
  return w;
}

}  // namespace

std::string FailureReason(const absl::Status& error) {
  std::string name = absl::StatusCodeToString(error.code());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

void WorkerRecorder::Submitted(RequestId id, RequestId client_id, uint64_t client_identity, TimePoint submitted,
                               uint64_t resumed_tokens, std::string detail) {
  timelines_.Open(id, client_id, client_identity, gpu_, EpochOfNodeRequestId(id));
  timelines_.Add(id, TimelineEntry{NowMicros(submitted), TimelineEvent::kSubmitted, resumed_tokens,
                                   std::move(detail), ""});
}

void WorkerRecorder::Token(RequestId id, bool first, TimePoint since, TimePoint now) {
  if (first) {  // its first token (a resume: its first new one)
    stats_.ttft.Observe(MicrosSince(since, now));
    timelines_.Add(id, TimelineEntry{NowMicros(now), TimelineEvent::kFirstToken, 0, "", ""});
  } else {
    stats_.tpot.Observe(MicrosSince(since, now));
  }
  ++stats_.tokens_generated;
}

void WorkerRecorder::CountFailure(const absl::Status& error) {
  ++stats_.failed_requests;
  ++stats_.failures[FailureReason(error)];
}

void WorkerRecorder::EndTimeline(RequestId id, uint64_t tokens, const absl::Status& error,
                                 std::chrono::steady_clock::time_point now) {
  timelines_.Add(id, TimelineEntry{NowMicros(now), TimelineEvent::kEnd, tokens, error.ok() ? "ok" : error.ToString(),
                                   ""});
  timelines_.End(id);
}

void WorkerRecorder::Ended(RequestId id, uint64_t tokens, const absl::Status& error,
                           std::chrono::steady_clock::time_point now) {
  if (!error.ok()) CountFailure(error);
  ++stats_.finished_requests;
  EndTimeline(id, tokens, error, now);
}

void WorkerRecorder::Refused(RequestId id, uint64_t tokens, const absl::Status& error,
                             std::chrono::steady_clock::time_point now) {
  CountFailure(error);
  EndTimeline(id, tokens, error, now);
}

WorkerStats WorkerRecorder::Snapshot(const StatsParts& parts) const {
  WorkerStats s = stats_;
  if (parts.hier != nullptr) s.census = parts.hier->TotalCensus();
  if (parts.hier != nullptr) s.host_integrity = parts.hier->host_integrity();
  if (parts.resume != nullptr) {
    s.rows_imported = parts.resume->rows_imported;
    s.rows_recomputed = parts.resume->rows_recomputed;
    s.resume_us_max = parts.resume->resume_us_max;
  }
  if (parts.rounds != nullptr) {
    s.spec_rounds = parts.rounds->rounds;
    s.spec_round_tokens = parts.rounds->round_tokens;
    s.spec_proposed = parts.rounds->proposed;
    s.spec_accepted = parts.rounds->accepted;
    s.spec_propose_us = parts.rounds->propose_us;
    s.spec_width_rounds = parts.rounds->width_rounds;
  }
  if (parts.agent != nullptr) {
    s.reclaims_obeyed = parts.agent->reclaims_obeyed;
    s.pages_reclaimed = parts.agent->pages_reclaimed;
    s.pages_populated = parts.agent->pages_populated;
    s.pages_kept = parts.agent->pages_kept;
    s.pages_backed_up = parts.agent->pages_backed_up;
  }
  return s;
}

std::string WorkerRecorder::TimelineJson(uint64_t client_request) const {
  return TimelinesToJson(timelines_.FindClient(client_request), absl::StrCat("worker/", gpu_)).dump();
}

namespace {

// The counters of `s` that are plain copies (request counts, resume, speculation, integrity, histograms).
void CopyCounters(const WorkerStats& s, wire::WorkerStatsReplyT& r) {
  r.census_direct = s.census.direct;
  r.census_hot = s.census.hot;
  r.census_host = s.census.host;
  r.bytes_recovered = s.census.bytes_recovered;
  r.reclaims_obeyed = s.reclaims_obeyed;
  r.pages_reclaimed = s.pages_reclaimed;
  r.pages_populated = s.pages_populated;
  r.pages_kept = s.pages_kept;
  r.pages_backed_up = s.pages_backed_up;
  r.finished_requests = s.finished_requests;
  r.failed_requests = s.failed_requests;
  r.tokens_generated = s.tokens_generated;
  r.prefix_blocks_imported = s.prefix_blocks_imported;
  r.prefix_blocks_computed = s.prefix_blocks_computed;
  r.prefix_lookups = s.prefix_lookups;
  r.prefix_hits_host = s.prefix_hits_host;
  r.prefix_hits_worker = s.prefix_blocks_imported;  // the row cache, the host tier's front (issue 24)
  r.prefill_tokens_saved = s.prefill_tokens_saved;
  r.prefix_shared_pages_granted = s.prefix_shared_pages_granted;
  r.submits_refused = s.submits_refused;
  r.waiting_requests_peak = s.waiting_requests_peak;
  r.requests_resumed = s.requests_resumed;
  r.rows_recomputed = s.rows_recomputed;
  r.rows_imported = s.rows_imported;
  r.resume_us_max = s.resume_us_max;
  r.spec_rounds = s.spec_rounds;
  r.spec_round_tokens = s.spec_round_tokens;
  r.spec_proposed = s.spec_proposed;
  r.spec_accepted = s.spec_accepted;
  r.spec_propose_us = s.spec_propose_us;
  r.spec_width_rounds = s.spec_width_rounds;
  r.resumed_outputs_dropped = s.resumed_outputs_dropped;
  r.host_pages_checksummed = s.host_integrity.pages_checksummed;
  r.host_pages_verified = s.host_integrity.pages_verified;
  r.host_bytes_verified = s.host_integrity.bytes_verified;
  r.host_page_mismatches = s.host_integrity.mismatches;
  r.ttft = ToWireHistogram(s.ttft);
  r.tpot = ToWireHistogram(s.tpot);
  r.admission_wait = ToWireHistogram(s.admission_wait);
  for (const auto& [reason, count] : s.failures) {
    auto rc = std::make_unique<wire::ReasonCountT>();
    rc->reason = reason;
    rc->count = count;
    r.failures.push_back(std::move(rc));
  }
  r.requests_cancelled = s.requests_cancelled;
  r.token_commits_deferred = s.commits_deferred;
  r.token_records_refused = s.records_refused;
}

}  // namespace

wire::WorkerStatsReplyT StatsReplyOf(const WorkerStats& s, const StatsFacts& facts) {
  const WorkerConfig& config = *facts.config;
  const WorkerGeometry& geometry = *facts.geometry;
  wire::WorkerStatsReplyT r;
  r.gpu = config.gpu;
  r.mode = std::string(WorkerModeName(config.mode));
  CopyCounters(s, r);
  r.active_requests = facts.active_requests;
  r.waiting_requests = facts.waiting_requests;
  r.capacity_pages = geometry.capacity_pages;
  r.page_bytes = geometry.page_bytes;
  r.speculate = std::string(spec::SpeculateModeName(config.speculation.mode));
  // The reservations declared to memd (Hello): the drafter's ring is checked equal at Create, the staging arenas are
  // the KV hierarchy's (HierarchicalKvAccess::staging_bytes, sized by the same geometry).
  r.draft_ring_bytes = geometry.speculation.draft_ring_bytes;
  r.staging_bytes = static_cast<uint64_t>(facts.staging_bytes);
  r.resumed_outputs_waiting = facts.resumed_outputs_waiting;
  r.epoch = static_cast<uint32_t>(facts.epoch);
  return r;
}

}  // namespace dhs
