#include "common/worker_metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/prometheus.h"

#include <utility>
#include <vector>

namespace dhs {
namespace {

LatencyHistogram FromWire(const std::unique_ptr<wire::LatencyHistogramT>& w) {
  if (w == nullptr) return MakeLatencyHistogram();
  LatencyHistogram h;
  h.bounds_us = w->bounds_us;
  h.counts = w->counts;
  h.sum_us = w->sum_us;
  for (uint64_t c : h.counts) h.count += c;
  return h;
}

// RenderWorkerPrometheus's page: the text so far and the gpu="G" label every series carries.
struct WorkerPage {
  std::string out;
  std::string gpu;  // gpu="G"
  // One series of metric `name` (a HELP and a TYPE line, then name{gpu="G"} v).
  void One(absl::string_view name, absl::string_view type, absl::string_view help, uint64_t v) {
    AppendMetricHeader(out, name, type, help);
    absl::StrAppend(&out, name, "{", gpu, "} ", v, "\n");
  }
  // One series per value of `label`: name{gpu="G",label="k"} v, in the order given.
  void By(absl::string_view name, absl::string_view type, absl::string_view help, absl::string_view label,
          std::initializer_list<std::pair<absl::string_view, uint64_t>> values) {
    AppendMetricHeader(out, name, type, help);
    for (const auto& [k, v] : values) absl::StrAppend(&out, name, "{", gpu, ",", label, "=\"", k, "\"} ", v, "\n");
  }
};

// RenderWorkerPrometheus's phases, each appending its part of the page in the order docs/operations.md lists it.

// The worker's info, epoch, pool shape, census, recoveries and tokens.
void AppendWorkerShape(const wire::WorkerStatsReplyT& s, WorkerPage& page) {
  AppendMetricHeader(page.out, "dhs_worker_info", "gauge",
                     "Always 1; the labels say the worker's KV mode and speculation.");
  absl::StrAppend(&page.out, "dhs_worker_info{", page.gpu, ",mode=\"", s.mode, "\",speculate=\"",
                  s.speculate.empty() ? "off" : s.speculate, "\"} 1\n");
  page.One("dhs_worker_epoch", "gauge", "The worker's epoch (memd's HelloReply).", s.epoch);
  page.One("dhs_worker_capacity_pages", "gauge", "M, the GPU's KV pool capacity, pages.", s.capacity_pages);
  page.One("dhs_worker_page_bytes", "gauge", "Bytes per page.", s.page_bytes);
  page.By(
      "dhs_worker_census_rows_total", "counter",
      "Selected rows by how the resolver found them (brief section 5): direct (tail or ready map), hot (hot cache), "
      "host (recovered from the host tier), rows.",
      "tier", {{"direct", s.census_direct}, {"hot", s.census_hot}, {"host", s.census_host}});
  page.One("dhs_worker_recovered_rows_total", "counter",
           "Rows recovered from the host tier (= census tier host), rows.", s.census_host);
  page.One("dhs_worker_recovered_bytes_total", "counter", "Host to device bytes of those recoveries, bytes.",
           s.bytes_recovered);
  page.One("dhs_worker_tokens_total", "counter", "Tokens generated, tokens.", s.tokens_generated);
  page.One("dhs_worker_token_commits_deferred_total", "counter",
           "Steps whose tokens went to memd with a later step's (one TokensCommitted in flight), steps.",
           s.token_commits_deferred);
  page.One("dhs_worker_token_records_refused_total", "counter",
           "Requests whose tokens memd refused alone (their record stops at what memd acknowledged), requests.",
           s.token_records_refused);
}

// The requests: active, waiting, finished, failed by reason, resumed (rows, longest resume, outputs waiting).
void AppendWorkerRequests(const wire::WorkerStatsReplyT& s, WorkerPage& page) {
  page.One("dhs_worker_requests_active", "gauge", "Requests granted and not finished.", s.active_requests);
  page.One("dhs_worker_requests_waiting", "gauge", "Requests submitted and not started (waiting for their grant).",
           s.waiting_requests);
  page.One("dhs_worker_requests_waiting_peak", "gauge", "The most requests waiting for their grant at once.",
           s.waiting_requests_peak);
  page.One("dhs_worker_requests_finished_total", "counter", "Requests that ended (ok or failed).", s.finished_requests);
  AppendMetricHeader(page.out, "dhs_worker_requests_failed_total", "counter",
                     "Requests that ended with an error after acceptance, by reason (the status code's name).");
  for (const auto& f : s.failures) {
    if (f == nullptr) continue;
    absl::StrAppend(&page.out, "dhs_worker_requests_failed_total{", page.gpu, ",reason=\"", f->reason, "\"} ", f->count,
                    "\n");
  }
  page.One("dhs_worker_requests_resumed_total", "counter", "Interrupted requests of an earlier epoch resumed.",
           s.requests_resumed);
  page.By("dhs_worker_resume_rows_total", "counter",
          "Rows of resumed requests' histories: imported from host copies or recomputed from their tokens, rows.",
          "kind", {{"imported", s.rows_imported}, {"recomputed", s.rows_recomputed}});
  AppendMetricHeader(page.out, "dhs_worker_resume_seconds_max", "gauge",
                     "The longest resume (Resume to the request's first new token), seconds.");
  absl::StrAppend(&page.out, "dhs_worker_resume_seconds_max{", page.gpu, "} ", SecondsText(s.resume_us_max), "\n");
  page.One("dhs_worker_resumed_outputs_waiting", "gauge", "Finished resumed outputs waiting for their client.",
           s.resumed_outputs_waiting);
  page.One("dhs_worker_resumed_outputs_dropped_total", "counter", "Resumed outputs dropped unclaimed (the bound).",
           s.resumed_outputs_dropped);
}

// The pages: reclaims obeyed, pages by what happened to them, prepared-prefix blocks.
void AppendWorkerPages(const wire::WorkerStatsReplyT& s, WorkerPage& page) {
  page.One("dhs_worker_reclaims_total", "counter", "ReclaimOrders carried out to ReadersDone.", s.reclaims_obeyed);
  page.By("dhs_worker_pages_total", "counter",
          "GPU pages by what happened to them: reclaimed (handed back by reclaims), populated (published by "
          "PopulateOrders), kept (imported history kept on GPU without a host backup), backed_up (host backups "
          "completed), pages.",
          "kind",
          {{"reclaimed", s.pages_reclaimed},
          {"populated", s.pages_populated},
          {"kept", s.pages_kept},
          {"backed_up", s.pages_backed_up}});
  page.By("dhs_worker_prefix_blocks_total", "counter",
          "Prepared-prefix blocks imported from the worker's row cache or computed, blocks.", "kind",
          {{"imported", s.prefix_blocks_imported}, {"computed", s.prefix_blocks_computed}});
}

// The clients' back-pressure: submits refused, bytes queued, streams refused, replies dropped.
void AppendWorkerClients(const wire::WorkerStatsReplyT& s, WorkerPage& page) {
  page.One("dhs_worker_submits_refused_total", "counter",
           "Submits answered RESOURCE_EXHAUSTED (submit queue full, or the client does not read).", s.submits_refused);
  page.One("dhs_worker_client_queued_bytes", "gauge", "Replies waiting for clients that do not read now, bytes.",
           s.client_queued_bytes);
  page.One("dhs_worker_client_queued_peak_bytes", "gauge", "The most such bytes at once, bytes.",
           s.client_queued_peak_bytes);
  page.One("dhs_worker_client_streams_refused_total", "counter",
           "Requests failed because their client did not read (its reply buffer full).", s.client_streams_refused);
  page.One("dhs_worker_client_replies_dropped_total", "counter",
           "ErrorReply / WorkerStatsReply dropped (buffer full) and replies queued for a client that was gone.",
           s.client_replies_dropped);
}

// Speculative rounds (brief section 6).
void AppendWorkerSpeculation(const wire::WorkerStatsReplyT& s, WorkerPage& page) {
  page.One("dhs_worker_spec_rounds_total", "counter", "Verified speculative rounds (K_r >= 2).", s.spec_rounds);
  page.One("dhs_worker_spec_round_tokens_total", "counter", "Tokens those rounds emitted (sum of A_r + 1), tokens.",
           s.spec_round_tokens);
  page.One("dhs_worker_spec_proposed_total", "counter", "Proposals verified (sum of K_r - 1).", s.spec_proposed);
  page.One("dhs_worker_spec_accepted_total", "counter", "Proposals accepted (sum of A_r).", s.spec_accepted);
}

// The latency histograms: TTFT, TPOT, admission wait.
void AppendWorkerHistograms(const wire::WorkerStatsReplyT& s, WorkerPage& page) {
  const std::pair<const char*, const char*> histograms[] = {
      {"dhs_worker_ttft_seconds", "Submit (a resume: its start) to the request's first token, seconds."},
      {"dhs_worker_tpot_seconds",
       "Time between a request's consecutive tokens, one observation per token after its first, seconds."},
      {"dhs_worker_admission_wait_seconds", "Submit to AdmitGrant (the allocation wait, brief section 4), seconds."}};
  const std::unique_ptr<wire::LatencyHistogramT>* wires[] = {&s.ttft, &s.tpot, &s.admission_wait};
  for (size_t i = 0; i < 3; ++i) {
    AppendMetricHeader(page.out, histograms[i].first, "histogram", histograms[i].second);
    AppendHistogram(page.out, histograms[i].first, page.gpu, FromWire(*wires[i]));
  }
}

}  // namespace

std::string RenderWorkerPrometheus(const wire::WorkerStatsReplyT& s) {
  WorkerPage page{"", absl::StrFormat("gpu=\"%d\"", s.gpu)};
  AppendWorkerShape(s, page);
  AppendWorkerRequests(s, page);
  AppendWorkerPages(s, page);
  AppendWorkerClients(s, page);
  AppendWorkerSpeculation(s, page);
  AppendWorkerHistograms(s, page);
  return std::move(page.out);
}

}  // namespace dhs

namespace dhs {
namespace {

// The scalar counters and gauges of the reply, by wire name, in schema order.
std::vector<std::pair<const char*, uint64_t>> Scalars(const wire::WorkerStatsReplyT& s) {
  return {{"gpu", s.gpu},
          {"epoch", s.epoch},
          {"census_direct", s.census_direct},
          {"census_hot", s.census_hot},
          {"census_host", s.census_host},
          {"bytes_recovered", s.bytes_recovered},
          {"reclaims_obeyed", s.reclaims_obeyed},
          {"pages_reclaimed", s.pages_reclaimed},
          {"pages_populated", s.pages_populated},
          {"pages_kept", s.pages_kept},
          {"pages_backed_up", s.pages_backed_up},
          {"active_requests", s.active_requests},
          {"waiting_requests", s.waiting_requests},
          {"finished_requests", s.finished_requests},
          {"failed_requests", s.failed_requests},
          {"tokens_generated", s.tokens_generated},
          {"token_commits_deferred", s.token_commits_deferred},
          {"token_records_refused", s.token_records_refused},
          {"capacity_pages", s.capacity_pages},
          {"page_bytes", s.page_bytes},
          {"prefix_blocks_imported", s.prefix_blocks_imported},
          {"prefix_blocks_computed", s.prefix_blocks_computed},
          {"submits_refused", s.submits_refused},
          {"waiting_requests_peak", s.waiting_requests_peak},
          {"client_queued_bytes", s.client_queued_bytes},
          {"client_queued_peak_bytes", s.client_queued_peak_bytes},
          {"client_streams_refused", s.client_streams_refused},
          {"client_replies_dropped", s.client_replies_dropped},
          {"requests_resumed", s.requests_resumed},
          {"rows_recomputed", s.rows_recomputed},
          {"resume_us_max", s.resume_us_max},
          {"rows_imported", s.rows_imported},
          {"spec_rounds", s.spec_rounds},
          {"spec_round_tokens", s.spec_round_tokens},
          {"spec_proposed", s.spec_proposed},
          {"spec_accepted", s.spec_accepted},
          {"spec_propose_us", s.spec_propose_us},
          {"staging_bytes", s.staging_bytes},
          {"draft_ring_bytes", s.draft_ring_bytes},
          {"resumed_outputs_waiting", s.resumed_outputs_waiting},
          {"resumed_outputs_dropped", s.resumed_outputs_dropped}};
}

std::vector<std::pair<const char*, const std::unique_ptr<wire::LatencyHistogramT>*>> Histograms(
    const wire::WorkerStatsReplyT& s) {
  return {{"ttft", &s.ttft}, {"tpot", &s.tpot}, {"admission_wait", &s.admission_wait}};
}

}  // namespace

nlohmann::json WorkerStatsToJson(const wire::WorkerStatsReplyT& s) {
  nlohmann::json j;
  j["mode"] = s.mode;
  j["speculate"] = s.speculate.empty() ? "off" : s.speculate;
  for (const auto& [name, v] : Scalars(s)) j[name] = v;
  j["spec_width_rounds"] = s.spec_width_rounds;
  nlohmann::json failures = nlohmann::json::object();
  for (const auto& f : s.failures) {
    if (f != nullptr) failures[f->reason] = f->count;
  }
  j["failures"] = std::move(failures);
  for (const auto& [name, w] : Histograms(s)) {
    const LatencyHistogram h = FromWire(*w);
    j[name] = {{"bounds_us", h.bounds_us}, {"counts", h.counts}, {"sum_us", h.sum_us}, {"count", h.count}};
  }
  return j;
}

std::string WorkerStatsToTable(const wire::WorkerStatsReplyT& s) {
  std::string out = absl::StrFormat("%-28s %s\n%-28s %s\n", "mode", s.mode, "speculate",
                                    s.speculate.empty() ? "off" : s.speculate);
  for (const auto& [name, v] : Scalars(s)) absl::StrAppendFormat(&out, "%-28s %d\n", name, v);
  for (const auto& f : s.failures) {
    if (f != nullptr) absl::StrAppendFormat(&out, "%-28s %d\n", absl::StrCat("failed[", f->reason, "]"), f->count);
  }
  for (const auto& [name, w] : Histograms(s)) {
    const LatencyHistogram h = FromWire(*w);
    absl::StrAppendFormat(&out, "%-28s count %d, sum %s s, mean %s s\n", name, h.count, SecondsText(h.sum_us),
                          SecondsText(h.count == 0 ? 0 : h.sum_us / h.count));
  }
  return out;
}

}  // namespace dhs
