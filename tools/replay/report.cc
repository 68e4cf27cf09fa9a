// tools/replay/report.cc: report figures, JSON/CSV/summary, sweep CSV and plot (see report.h).
#include "tools/replay/report.h"

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

extern char** environ;

#ifndef DHS_REPLAY_PLOT_SCRIPT
#define DHS_REPLAY_PLOT_SCRIPT "tools/replay/plot_sweep.py"
#endif

namespace dhs::replay {
namespace {

using nlohmann::json;

std::optional<Percentiles> P50P99(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  return Percentiles{*PercentileNearestRank(values, 50), *PercentileNearestRank(values, 99)};
}

template <typename T>
json OrNull(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json PercentilesJson(const std::optional<Percentiles>& p) {
  if (!p) return json{{"p50", nullptr}, {"p99", nullptr}};
  return json{{"p50", p->p50}, {"p99", p->p99}};
}

// CSV cells: numbers with enough digits to read back; empty for null; RFC 4180 quoting for text.
std::string Cell(double v) { return absl::StrFormat("%.6g", v); }
std::string Cell(int64_t v) { return absl::StrCat(v); }
std::string Cell(const std::optional<double>& v) { return v ? Cell(*v) : ""; }
std::string Cell(const std::optional<int64_t>& v) { return v ? Cell(*v) : ""; }
std::string Cell(const std::optional<uint64_t>& v) { return v ? absl::StrCat(*v) : ""; }
std::string Cell(const std::optional<bool>& v) { return v ? (*v ? "true" : "false") : ""; }
std::string Cell(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}
std::optional<double> P(const std::optional<Percentiles>& p, bool p99) {
  if (!p) return std::nullopt;
  return p99 ? p->p99 : p->p50;
}

absl::Status WriteFile(std::string_view path, std::string_view text) {
  std::ofstream out{std::string(path), std::ios::binary | std::ios::trunc};
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", std::string(path)));
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", std::string(path)));
  return absl::OkStatus();
}

std::string Fixed(const std::optional<double>& v, int digits) {
  return v ? absl::StrFormat("%.*f", digits, *v) : "n/a";
}

}  // namespace

absl::StatusOr<double> PercentileNearestRank(std::vector<double> values, double p) {
  if (values.empty()) return absl::InvalidArgumentError("percentile of no values");
  if (!(p >= 0 && p <= 100)) return absl::InvalidArgumentError(absl::StrCat("percentile ", p, " outside [0, 100]"));
  std::sort(values.begin(), values.end());
  // p * N is exact for the integer-valued p used here, so the division gives an exact integer when it is one.
  const auto n = static_cast<double>(values.size());
  const auto rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(p * n / 100.0)));
  return values[static_cast<size_t>(std::min<int64_t>(rank, static_cast<int64_t>(values.size())) - 1)];
}

ReplayReport BuildReport(const DriverResult& result, const RunSettings& settings,
                         std::optional<bool> exact_match) {
  ReplayReport r;
  r.settings = settings;
  r.requests_total = static_cast<int64_t>(result.requests.size());
  std::vector<double> ttft, tpot;
  double wait_sum = 0, ttft_sum = 0;
  for (const RequestTiming& t : result.requests) {
    if (t.served()) ++r.requests_served;
    const EndReason why = t.end_ms < 0                       ? EndReason::kNone
                          : t.end_reason != EndReason::kNone ? t.end_reason
                          : t.served()                       ? EndReason::kFinished
                                                             : EndReason::kFailed;
    ++r.end_reasons[std::string(EndReasonName(why))];
    if (!t.served()) {
      r.failures.push_back(RequestFailure{t.request, t.trace_index, std::string(EndReasonName(why)),
                                          t.end_ms < 0 && t.error.empty() ? "did not end" : t.error});
    }
    r.output_tokens += t.tokens;
    if (auto v = t.ttft_ms()) {
      ttft.push_back(*v);
      ttft_sum += *v;
      wait_sum += t.allocation_wait_ms;
    }
    if (auto v = t.tpot_ms()) tpot.push_back(*v);
  }
  r.requests_failed = r.requests_total - r.requests_served;
  r.elapsed_s = result.elapsed_ms / 1000.0;
  r.output_tokens_per_s = r.elapsed_s > 0 ? static_cast<double>(r.output_tokens) / r.elapsed_s : 0.0;
  r.ttft_ms = P50P99(ttft);
  r.tpot_ms = P50P99(tpot);
  if (ttft_sum > 0) r.allocation_wait_share = wait_sum / ttft_sum;
  const NodeStats& s = result.stats;
  r.sessions_admitted_max = s.sessions_admitted_max;
  const int64_t rows = s.census.direct + s.census.hot + s.census.host;
  if (rows > 0) {
    const auto total = static_cast<double>(rows);
    r.census = CensusShares{s.census.direct / total, s.census.hot / total, s.census.host / total};
  }
  r.reclaims = s.reclaims;
  r.repopulated_pages = s.repopulated_pages;
  r.prefix_blocks_imported = s.prefix_blocks_imported;
  r.prefix_blocks_computed = s.prefix_blocks_computed;
  r.host_bytes_recovered = s.host_bytes_recovered;  // issue 27
  r.prefix_lookups = s.prefix_lookups;  // issue 24
  r.prefix_hits_host = s.prefix_hits_host;
  r.prefix_hits_worker = s.prefix_hits_worker;
  r.prefill_tokens_saved = s.prefill_tokens_saved;
  r.host_pages_shared = s.host_pages_shared;
  r.host_bytes_per_session_mean = s.host_bytes_per_session_mean;
  r.host_bytes_per_session_peak = s.host_bytes_per_session_peak;
  r.host_pages_held_peak = s.host_pages_held_peak;
  r.host_pages_allocated_peak = s.host_pages_allocated_peak;
  r.exact_match = exact_match;
  r.gpus = s.gpus;
  SpeculationFigures& f = r.speculation;
  f.speculate = s.speculate.empty() ? std::string(spec::SpeculateModeName(settings.speculation.mode)) : s.speculate;
  f.rounds = s.spec_rounds;
  if (s.spec_rounds > 0) f.acceptance_length_mean = static_cast<double>(s.spec_round_tokens) / s.spec_rounds;
  f.proposed = s.spec_proposed;
  f.accepted = s.spec_accepted;
  f.proposer_s = static_cast<double>(s.spec_propose_us) / 1e6;
  for (size_t k = 0; k < s.spec_width_rounds.size(); ++k) {
    if (s.spec_width_rounds[k] > 0) f.block_width[static_cast<int64_t>(k)] = s.spec_width_rounds[k];
  }
  f.staging_bytes = s.staging_bytes;
  f.draft_ring_bytes = s.draft_ring_bytes;
  return r;
}

// The worker's link model: {"model": "off"} with null figures, or "pcie5" with the figures in use.
static json LinkModelJson(const LinkModelConfig& l) {
  if (!l.enabled) {
    return json{{"model", "off"}, {"host_to_device_gb_per_s", nullptr}, {"device_to_host_gb_per_s", nullptr},
                {"latency_us", nullptr}};
  }
  return json{{"model", "pcie5"}, {"host_to_device_gb_per_s", l.host_to_device_gb_per_s},
              {"device_to_host_gb_per_s", l.device_to_host_gb_per_s}, {"latency_us", l.latency_us}};
}

// Nearest-rank p50 and p99 of the recovery samples, us; nullopt without samples.
static std::optional<Percentiles> RecoveryPercentiles(const std::vector<int64_t>& us) {
  std::vector<double> v(us.begin(), us.end());
  return P50P99(v);
}

// Issue 27: the prepared-prefix workload's figures (docs/replay.md), null without --prefixes.
static json PrefixWorkloadJson(const std::optional<PrefixWorkloadFigures>& w) {
  if (!w) return json(nullptr);
  return json{{"prefixes", w->prefixes}, {"prefix_tokens", w->prefix_tokens}, {"block_tokens", w->block_tokens},
              {"suffix_tokens", w->suffix_tokens}, {"output_tokens", w->output_tokens}, {"sessions", w->sessions},
              {"concurrency", w->concurrency}, {"in_flight_max", w->in_flight_max},
              {"in_flight_mean", w->in_flight_mean}, {"preparation_s", w->preparation_s},
              {"preparation_blocks_computed", w->preparation_blocks_computed},
              {"preparation_blocks_imported", w->preparation_blocks_imported},
              {"window_begin_ms", w->window_begin_ms}, {"window_end_ms", w->window_end_ms}};
}

static json FaultsJson(const FaultFigures& f) {
  const std::optional<Percentiles> p = RecoveryPercentiles(f.recovery_us);
  return json{{"fault_seed", OrNull(f.fault_seed)},
              {"worker_restarts", f.worker_restarts},
              {"memd_restarts", f.memd_restarts},
              {"worker_kills", f.worker_kills},
              {"memd_kills", f.memd_kills},
              {"kill_points_armed", f.kill_points_armed},
              {"requests_resumed", f.requests_resumed},
              {"rows_recomputed", f.rows_recomputed},
              {"requests_resubmitted", f.requests_resubmitted},
              {"host_rows_lost", f.host_rows_lost},
              {"host_pages_checked", f.host_pages_checked},
              {"host_pages_unconfirmed", f.host_pages_unconfirmed},
              {"worker_crashes", f.worker_crashes},
              {"recovery_us", {{"p50", p ? json(p->p50) : json(nullptr)},
                               {"p99", p ? json(p->p99) : json(nullptr)},
                               {"samples", f.recovery_us}}}};
}

// Issue 24's top-level fields (docs/replay.md): lookups by tier (blocks), prefill saved, memd's host pool.
static json PrefixSharingJson(const ReplayReport& r) {
  return json{
      {"prefix", {{"lookups", r.prefix_lookups}, {"hits_host", r.prefix_hits_host}, {"hits_worker", r.prefix_hits_worker}}},
      {"prefill_tokens_saved", r.prefill_tokens_saved},
      {"host_pages_shared", r.host_pages_shared},
      {"host_bytes_per_session", {{"mean", r.host_bytes_per_session_mean}, {"peak", r.host_bytes_per_session_peak}}},
      {"host_pages_peak", {{"held", r.host_pages_held_peak}, {"allocated", r.host_pages_allocated_peak}}}};
}

// Issue 26: one node's cluster tier (multi_node.per_node[i].cluster; docs/replay.md): null when memd reported none.
static json ClusterJson(const std::optional<NodeFigures::Cluster>& cluster) {
  if (!cluster) return json(nullptr);
  const NodeStats::ClusterCounters& c = cluster->counters;
  return json{{"lookups", c.lookups},
              {"hits", c.hits},
              {"imported", c.imported},
              {"session_imported", c.session_imported},
              {"published", c.published},
              // Issue 26 review (F4): why lookups missed and publishing lost pages, the store's health.
              {"misses", c.misses},
              {"offered", c.offered},
              {"publish_failed", c.publish_failed},
              {"shed", c.shed},
              {"health", c.health.empty() ? json(nullptr) : json(c.health)},
              {"health_samples", c.health_samples},
              {"reachable", c.reachable.empty() ? json(nullptr) : json(c.reachable)},
              {"memd_restarts_seen", c.memd_restarts_seen}};
}

// Issue 26: the multi-node figures (JSON "multi_node"; null without --nodes > 1 or --cluster-store).
static json MultiNodeJson(const std::optional<MultiNodeFigures>& m) {
  if (!m) return json(nullptr);
  json nodes = json::array();
  for (const NodeFigures& n : m->per_node) {
    json ttft = n.ttft_ms ? json{{"p50", n.ttft_ms->p50}, {"p99", n.ttft_ms->p99}} : json(nullptr);
    nodes.push_back({{"node", n.node},
                     {"run_dir", n.run_dir},
                     {"requests", n.requests},
                     {"requests_served", n.requests_served},
                     {"output_tokens", n.output_tokens},
                     {"output_tokens_per_s", n.output_tokens_per_s},
                     {"ttft_ms", ttft},
                     {"hits_blocks",
                      {{"lookups", n.prefix_lookups},
                       {"worker", n.hits_worker},
                       {"host", n.hits_host},
                       {"miss", n.misses}}},
                     // memd's cluster tier in pages (its imported pages are granted as host hits, part of "host");
                     // null when memd reports none
                     {"cluster", ClusterJson(n.cluster)},
                     {"prefill_tokens_saved", n.prefill_tokens_saved},
                     {"host_pages_shared", n.host_pages_shared},
                     {"store_bytes_out", n.cluster ? json(n.cluster->counters.published_bytes) : json(nullptr)},
                     {"store_bytes_in", n.cluster ? json(n.cluster->counters.imported_bytes) : json(nullptr)},
                     {"store_bytes_out_per_s", n.cluster ? json(n.cluster->bytes_out_per_s) : json(nullptr)},
                     {"store_bytes_in_per_s", n.cluster ? json(n.cluster->bytes_in_per_s) : json(nullptr)}});
  }
  json routing = json::array();
  for (const RouteFigure& f : m->routing) {
    routing.push_back({{"trace_index", f.trace_index},
                       {"node", f.node},
                       {"session", f.session},
                       {"turn", f.turn},
                       {"reason", f.reason},
                       {"matched_blocks", f.matched_blocks}});
  }
  return json{{"nodes", m->nodes},
              {"route", m->route},
              {"cluster_store", m->cluster_store.empty() ? json(nullptr) : json(m->cluster_store)},
              {"cluster_endpoint", m->cluster_endpoint.empty() ? json(nullptr) : json(m->cluster_endpoint)},
              {"cluster_lookup_timeout_ms",
               m->cluster_lookup_timeout_ms == 0 ? json(nullptr) : json(m->cluster_lookup_timeout_ms)},
              {"cluster_counters", m->cluster_counters ? "measured" : "not reported by memd"},
              {"sessions", m->sessions},
              {"next_turns", m->next_turns},
              {"kv_events",
               {{"seen", m->kv_events_seen}, {"lost", m->kv_events_lost}, {"settle_timeouts", m->kv_settle_timeouts}}},
              {"per_node", nodes},
              {"routing", routing}};
}

static std::string MultiNodeLines(const MultiNodeFigures& m) {
  std::string out = absl::StrFormat("  %d %s, route %s: %d sessions (%d next turns)", m.nodes,
                                    m.nodes == 1 ? "node" : "nodes", m.route, m.sessions, m.next_turns);
  if (!m.cluster_store.empty()) {  // issue 26 review: the store and the lookup deadline every memd got
    absl::StrAppendFormat(&out, "; cluster store %s, lookup deadline %s", m.cluster_store,
                          m.cluster_lookup_timeout_ms > 0 ? absl::StrCat(m.cluster_lookup_timeout_ms, " ms")
                                                          : std::string("memd's default"));
  }
  if (m.route == "prefix") absl::StrAppendFormat(&out, ", KV events %d (lost %d, settle timeouts %d)", m.kv_events_seen, m.kv_events_lost,
                        m.kv_settle_timeouts);
  absl::StrAppend(&out, "\n");
  for (const NodeFigures& n : m.per_node) {
    absl::StrAppendFormat(&out,
                          "  node %d: %d requests (%d served), %d tokens, %.1f tokens/s, TTFT ms p50 %s p99 %s; "
                          "blocks: worker %d, host %d, miss %d; prefill tokens saved %d\n",
                          n.node, n.requests, n.requests_served, n.output_tokens, n.output_tokens_per_s,
                          Fixed(P(n.ttft_ms, false), 1), Fixed(P(n.ttft_ms, true), 1), n.hits_worker, n.hits_host,
                          n.misses, n.prefill_tokens_saved);
    if (n.cluster) {
      const NodeStats::ClusterCounters& c = n.cluster->counters;
      absl::StrAppendFormat(&out,
                            "    cluster tier: %d pages looked up, %d found, %d imported (part of the host hits; %d by "
                            "a session key), %d published; store bytes out %d (%.0f/s), in %d (%.0f/s)",
                            c.lookups, c.hits, c.imported, c.session_imported, c.published, c.published_bytes,
                            n.cluster->bytes_out_per_s, c.imported_bytes, n.cluster->bytes_in_per_s);
      if (c.memd_restarts_seen > 0) absl::StrAppendFormat(&out, "; %d memd restarts seen", c.memd_restarts_seen);
      std::string misses;  // issue 26 review (F4): why lookups missed
      for (const auto& [reason, pages] : c.misses) {
        if (pages > 0) absl::StrAppendFormat(&misses, "%s%s %d", misses.empty() ? "" : ", ", reason, pages);
      }
      absl::StrAppend(&out, "\n    cluster misses: ", misses.empty() ? "none" : misses, "\n");
    }
  }
  for (const NodeFigures& n : m.per_node) {  // issue 26 review (F4): lookups that timed out, a store that was down
    if (!n.cluster) continue;
    const std::string warning = ClusterWarning(n.node, n.cluster->counters, m.cluster_lookup_timeout_ms);
    if (!warning.empty()) absl::StrAppend(&out, "  warning: ", warning, "\n");
  }
  if (!m.cluster_store.empty() && !m.cluster_counters) {
    absl::StrAppendFormat(&out, "  cluster store %s (%s): hits and bytes to/from the store not measured (memd "
                                "reported no cluster-tier counters)\n",
                          m.cluster_store, m.cluster_endpoint);
  }
  return out;
}

json ReportToJson(const ReplayReport& r) {
  const RunSettings& s = r.settings;
  json gpus = json::array();
  for (const GpuMemoryUse& g : r.gpus) {
    gpus.push_back({{"gpu", g.gpu},
                    {"capacity_pages", g.capacity_pages},
                    {"peak_required_pages", g.peak_required_pages},
                    {"peak_optional_pages", g.peak_optional_pages},
                    {"reserve_pages", g.reserve_pages},
                    {"page_bytes", g.page_bytes},
                    {"peak_used_bytes", g.peak_used_bytes}});
  }
  json census = r.census ? json{{"direct", r.census->direct}, {"hot", r.census->hot}, {"host", r.census->host}}
                         : json{{"direct", nullptr}, {"hot", nullptr}, {"host", nullptr}};
  json out{
      {"complete", r.complete},
      {"requests_total", r.requests_total},
      {"requests_served", r.requests_served},
      {"requests_failed", r.requests_failed},
      {"output_tokens", r.output_tokens},
      {"output_tokens_per_s", r.output_tokens_per_s},
      {"ttft_ms", PercentilesJson(r.ttft_ms)},
      {"tpot_ms", PercentilesJson(r.tpot_ms)},
      {"allocation_wait_share", OrNull(r.allocation_wait_share)},
      {"sessions_admitted_max", r.sessions_admitted_max},
      {"census", census},
      {"reclaims", r.reclaims},
      {"repopulated_pages", r.repopulated_pages},
      {"mode", s.mode},
      {"prefill", s.prefill},
      {"prefix_blocks", {{"imported", r.prefix_blocks_imported}, {"computed", r.prefix_blocks_computed}}},
      {"exact_match", OrNull(r.exact_match)},
      {"gpu_memory", gpus},
      {"elapsed_s", r.elapsed_s},
      {"trace",
       {{"path", s.trace_path},
        {"format", s.trace_format},
        {"requests", r.requests_total},
        {"length_scale", s.length_scale},
        {"block_tokens", s.block_tokens}}},
      {"settings",
       {{"schedule", s.concurrency ? "closed-loop" : "open-loop"},
        {"concurrency", OrNull(s.concurrency)},
        {"time_scale", OrNull(s.time_scale)},
        {"hbm_budget_bytes", OrNull(s.hbm_budget_bytes)},
        {"check_exact", s.check_exact},
        {"connect", s.connect},
        {"reclaim_policy", s.reclaim_policy.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.reclaim_policy)},
        {"link_model", LinkModelJson(s.link_model)},
        {"prefix_sharing", s.prefix_sharing ? "on" : "off"},  // issue 24
        {"tenant", s.tenant},
        {"tenants", s.tenants},
        {"tenant_by", s.tenants <= 1 ? json(nullptr) : json(s.tenant_by == TenantKey::kSession ? "session" : "index")},
        {"prefix_eviction", s.prefix_eviction.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.prefix_eviction)},
        {"prefix_tenant_quota_pages", s.prefix_tenant_quota_pages}}},
  };
  json failures = json::array();  // issue 22: every request not served, with its reason
  for (const RequestFailure& f : r.failures) {
    failures.push_back({{"request", f.request}, {"trace_row", f.trace_row}, {"end_reason", f.end_reason},
                        {"error", f.error}});
  }
  out["end_reasons"] = r.end_reasons;
  out["failures"] = failures;
  out.update(PrefixSharingJson(r));                                 // issue 24
  out["prefix_workload"] = PrefixWorkloadJson(r.prefix_workload);  // issue 27
  out["host_bytes_recovered"] = r.host_bytes_recovered;              // issue 27
  out["multi_node"] = MultiNodeJson(r.multi_node);                  // issue 26
  out.update(FaultsJson(r.faults));  // top-level fields (docs/replay.md, "Faults")
  const SpeculationFigures& f = r.speculation;  // top-level fields (docs/replay.md, "Speculation")
  json widths = json::object();
  for (const auto& [k, n] : f.block_width) widths[std::to_string(k)] = n;
  out.update(json{{"speculate", f.speculate},
                  {"acceptance_length_mean", OrNull(f.acceptance_length_mean)},
                  {"rounds", f.rounds},
                  {"proposals", {{"verified", f.proposed}, {"accepted", f.accepted}}},
                  {"proposer_s", f.proposer_s},
                  {"draft_ring_bytes", f.draft_ring_bytes},
                  {"staging_bytes", f.staging_bytes},
                  {"block_width", widths}});
  return out;
}

std::string ReportCsvHeader() {
  return "requests_total,requests_served,output_tokens,output_tokens_per_s,ttft_p50_ms,ttft_p99_ms,"
         "tpot_p50_ms,tpot_p99_ms,allocation_wait_share,sessions_admitted_max,census_direct,census_hot,"
         "census_host,reclaims,repopulated_pages,mode,prefill,exact_match,elapsed_s,trace,trace_format,"
         "length_scale,concurrency,time_scale,hbm_budget_bytes,requests_failed,fault_seed,worker_restarts,"
         "memd_restarts,requests_resumed,rows_recomputed,host_rows_lost,recovery_p50_us,recovery_p99_us";
}

std::string ReportCsvRow(const ReplayReport& r) {
  const RunSettings& s = r.settings;
  auto share = [&](double CensusShares::*field) -> std::optional<double> {
    if (!r.census) return std::nullopt;
    return (*r.census).*field;
  };
  std::vector<std::string> cells = {
      Cell(r.requests_total),        Cell(r.requests_served),          Cell(r.output_tokens),
      Cell(r.output_tokens_per_s),   Cell(P(r.ttft_ms, false)),        Cell(P(r.ttft_ms, true)),
      Cell(P(r.tpot_ms, false)),     Cell(P(r.tpot_ms, true)),         Cell(r.allocation_wait_share),
      Cell(r.sessions_admitted_max), Cell(share(&CensusShares::direct)), Cell(share(&CensusShares::hot)),
      Cell(share(&CensusShares::host)), Cell(r.reclaims),              Cell(r.repopulated_pages),
      Cell(std::string_view(s.mode)), Cell(std::string_view(s.prefill)), Cell(r.exact_match),
      Cell(r.elapsed_s),             Cell(std::string_view(s.trace_path)), Cell(std::string_view(s.trace_format)),
      Cell(s.length_scale),          Cell(s.concurrency),              Cell(s.time_scale),
      Cell(s.hbm_budget_bytes)};
  const FaultFigures& f = r.faults;
  const std::optional<Percentiles> recovery = RecoveryPercentiles(f.recovery_us);
  for (std::string cell : {Cell(r.requests_failed), Cell(f.fault_seed), Cell(f.worker_restarts),
                           Cell(f.memd_restarts), Cell(f.requests_resumed), Cell(f.rows_recomputed),
                           Cell(f.host_rows_lost), Cell(P(recovery, false)), Cell(P(recovery, true))}) {
    cells.push_back(std::move(cell));
  }
  return absl::StrJoin(cells, ",");
}

namespace {

// Issue 24: the content-addressed host tier's lines of the summary: lookups (blocks of the requests' chains) by tier
// with their shares of the lookups, the prefill saved and memd's host pool.
std::string PrefixSharingLines(const ReplayReport& r) {
  const RunSettings& s = r.settings;
  const int64_t missed = std::max<int64_t>(0, r.prefix_lookups - r.prefix_hits_worker - r.prefix_hits_host);
  auto rate = [&](int64_t n) {
    return r.prefix_lookups > 0 ? absl::StrFormat("%.1f%%", 100.0 * double(n) / double(r.prefix_lookups)) : "n/a";
  };
  std::string limits = s.prefix_eviction.empty() ? "eviction memd's default" : "eviction " + s.prefix_eviction;
  if (s.prefix_tenant_quota_pages > 0) absl::StrAppend(&limits, ", tenant quota ", s.prefix_tenant_quota_pages, " pages");
  std::string out = absl::StrFormat(
      "  prefix sharing on (%s): %d blocks looked up: worker row cache %d (%s), host tier %d (%s), miss (computed) "
      "%d (%s)\n",
      limits, r.prefix_lookups, r.prefix_hits_worker, rate(r.prefix_hits_worker), r.prefix_hits_host,
      rate(r.prefix_hits_host), missed, rate(missed));
  absl::StrAppendFormat(&out,
                        "  prefill tokens saved %d; host pages shared %d; host bytes per session mean %.0f, peak %.0f; "
                        "host pages peak %d held, %d allocated\n",
                        r.prefill_tokens_saved, r.host_pages_shared, r.host_bytes_per_session_mean,
                        r.host_bytes_per_session_peak, r.host_pages_held_peak, r.host_pages_allocated_peak);
  return out;
}

}  // namespace

NodeFigures MakeNodeFigures(int64_t node, const DriverResult& result, const std::vector<int>& node_of_row,
                            const NodeStats& stats) {
  NodeFigures f;
  f.node = node;
  std::vector<double> ttft;
  for (const RequestTiming& t : result.requests) {
    if (t.trace_index < 0 || t.trace_index >= static_cast<int64_t>(node_of_row.size()) ||
        node_of_row[t.trace_index] != node) {
      continue;
    }
    ++f.requests;
    f.requests_served += t.served() ? 1 : 0;
    f.output_tokens += t.tokens;
    if (auto x = t.ttft_ms()) ttft.push_back(*x);
  }
  f.output_tokens_per_s = result.elapsed_ms > 0 ? f.output_tokens * 1000.0 / result.elapsed_ms : 0.0;
  if (!ttft.empty()) f.ttft_ms = Percentiles{*PercentileNearestRank(ttft, 50), *PercentileNearestRank(ttft, 99)};
  f.prefix_lookups = stats.prefix_lookups;
  f.hits_worker = stats.prefix_hits_worker;
  f.hits_host = stats.prefix_hits_host;
  f.misses = std::max<int64_t>(0, stats.prefix_lookups - stats.prefix_hits_worker - stats.prefix_hits_host);
  f.prefill_tokens_saved = stats.prefill_tokens_saved;
  f.host_pages_shared = stats.host_pages_shared;
  if (const auto& c = stats.cluster) {  // issue 26
    const double s = result.elapsed_ms > 0 ? result.elapsed_ms / 1000.0 : 0.0;
    f.cluster = NodeFigures::Cluster{*c, s > 0 ? c->published_bytes / s : 0.0, s > 0 ? c->imported_bytes / s : 0.0};
  }
  return f;
}

std::string ClusterWarning(int64_t node, const NodeStats::ClusterCounters& c, int64_t lookup_timeout_ms) {
  std::vector<std::string> parts;
  if (const int64_t n = c.miss("timeout"); n > 0) {
    parts.push_back(absl::StrFormat("%d timed out (memd --cluster-lookup-timeout-ms %s)", n,
                                    lookup_timeout_ms > 0 ? absl::StrCat(lookup_timeout_ms)
                                                          : std::string("not given: memd's default")));
  }
  if (const int64_t n = c.miss("store_down"); n > 0) {
    parts.push_back(absl::StrFormat("%d more not asked (store down, or lookups paused after an unanswered one)", n));
  }
  if (const int64_t n = c.miss("unavailable"); n > 0) parts.push_back(absl::StrFormat("%d unavailable", n));
  if (const int64_t n = c.miss("store_error"); n > 0) {
    parts.push_back(absl::StrFormat("%d failed with a store error", n));
  }
  int64_t samples = 0, not_up = 0;
  for (const auto& [health, n] : c.health_samples) {
    samples += n;
    if (health != "up") not_up += n;
  }
  if (not_up > 0 || (!c.health.empty() && c.health != "up")) {
    parts.push_back(absl::StrFormat("store health not up in %d of %d samples (last: %s)", not_up, samples,
                                    c.health.empty() ? "unknown" : c.health));
  }
  if (c.reachable == "no") parts.push_back("the store did not answer memd's latest contact");
  if (const int64_t n = c.shed_of("store_down"); n > 0) {
    parts.push_back(absl::StrFormat("%d pages not published (store down)", n));
  }
  if (parts.empty()) return "";
  return absl::StrFormat("node %d: %d of %d cluster lookups found; %s", node, c.hits, c.lookups,
                         absl::StrJoin(parts, ", "));
}

std::string FormatSummary(const ReplayReport& r) {
  const RunSettings& s = r.settings;
  std::string schedule = s.concurrency ? absl::StrCat("closed loop, concurrency ", *s.concurrency)
                                       : absl::StrCat("open loop, time scale ", s.time_scale.value_or(1.0));
  std::string out = absl::StrFormat("dhs-replay: %s (%s), %d requests, length scale %g, %s\n", s.trace_path,
                                    s.trace_format, r.requests_total, s.length_scale, schedule);
  absl::StrAppendFormat(&out, "  mode %s, prefill %s, exact match %s\n", s.mode,
                        s.prefill.empty() ? "n/a" : s.prefill,
                        r.exact_match ? (*r.exact_match ? "yes" : "NO") : "not checked");
  if (s.link_model.enabled) {
    absl::StrAppendFormat(&out, "  link model: host->device %g GB/s, device->host %g GB/s, %g us per batch\n",
                          s.link_model.host_to_device_gb_per_s, s.link_model.device_to_host_gb_per_s,
                          s.link_model.latency_us);
  }
  absl::StrAppendFormat(&out, "  served %d/%d in %.1f s: %d output tokens, %.1f tokens/s\n", r.requests_served,
                        r.requests_total, r.elapsed_s, r.output_tokens, r.output_tokens_per_s);
  if (r.requests_served < r.requests_total) {  // issue 22: why the others ended
    std::string ends;
    for (const auto& [why, n] : r.end_reasons) absl::StrAppendFormat(&ends, "%s%s %d", ends.empty() ? "" : ", ", why, n);
    absl::StrAppendFormat(&out, "  ends: %s\n", ends);
  }
  absl::StrAppendFormat(&out, "  TTFT ms p50 %s p99 %s; TPOT ms p50 %s p99 %s; allocation wait %s of TTFT\n",
                        Fixed(P(r.ttft_ms, false), 1), Fixed(P(r.ttft_ms, true), 1), Fixed(P(r.tpot_ms, false), 2),
                        Fixed(P(r.tpot_ms, true), 2),
                        r.allocation_wait_share ? absl::StrFormat("%.1f%%", *r.allocation_wait_share * 100) : "n/a");
  absl::StrAppendFormat(&out, "  sessions admitted max %d, reclaims %d, repopulated pages %d\n",
                        r.sessions_admitted_max, r.reclaims, r.repopulated_pages);
  if (s.prefill == "prepared-prefix") {
    absl::StrAppendFormat(&out, "  prepared-prefix blocks: %d imported from the row cache, %d computed\n",
                          r.prefix_blocks_imported, r.prefix_blocks_computed);
  }
  if (s.prefix_sharing) absl::StrAppend(&out, PrefixSharingLines(r));  // issue 24
  if (const auto& w = r.prefix_workload) {  // issue 27
    absl::StrAppendFormat(&out,
                          "  prepared prefixes: %d x %d tokens prepared in %.2f s (%d blocks computed), then %d "
                          "sessions at C = %d: in flight max %d, mean %.2f\n",
                          w->prefixes, w->prefix_tokens, w->preparation_s, w->preparation_blocks_computed, w->sessions,
                          w->concurrency, w->in_flight_max, w->in_flight_mean);
  }
  if (const SpeculationFigures& f = r.speculation; f.speculate != "off") {
    std::string widths;
    for (const auto& [k, n] : f.block_width) absl::StrAppendFormat(&widths, " K=%d:%d", k, n);
    absl::StrAppendFormat(&out, "  speculation %s: %d rounds, acceptance length %s, %d/%d proposals accepted, "
                                "proposer %.2f s; block widths%s\n",
                          f.speculate, f.rounds,
                          f.acceptance_length_mean ? absl::StrFormat("%.2f", *f.acceptance_length_mean) : "n/a",
                          f.accepted, f.proposed, f.proposer_s, widths.empty() ? " none" : widths);
    if (f.rounds == 0) {  // issue 27 review: said, not left to a reader of "0 rounds"
      absl::StrAppend(&out, "  warning: speculation was on but no speculative round was verified: this run measured "
                            "plain decoding (a proposer that first catches up over a long prompt it cannot copy, such as "
                            "the drafter over a prepared prefix, proposes nothing within a short output)\n");
    }
  }
  if (r.census) {
    absl::StrAppendFormat(&out, "  census: direct %.1f%%, hot %.1f%%, host %.1f%%\n", r.census->direct * 100,
                          r.census->hot * 100, r.census->host * 100);
  }
  if (const FaultFigures& f = r.faults; f.fault_seed) {
    const std::optional<Percentiles> p = RecoveryPercentiles(f.recovery_us);
    absl::StrAppendFormat(&out,
                          "  faults (seed %d): worker restarts %d, memd restarts %d, requests resumed %d (%d rows "
                          "recomputed), resubmitted %d, failed %d, host rows lost %d (%d pages checked), host pages "
                          "unconfirmed %d; recovery us p50 %s p99 %s\n",
                          *f.fault_seed, f.worker_restarts, f.memd_restarts, f.requests_resumed, f.rows_recomputed,
                          f.requests_resubmitted, r.requests_failed, f.host_rows_lost, f.host_pages_checked,
                          f.host_pages_unconfirmed,
                          Fixed(P(p, false), 0), Fixed(P(p, true), 0));
  }
  if (const auto& m = r.multi_node) absl::StrAppend(&out, MultiNodeLines(*m));  // issue 26
  for (const GpuMemoryUse& g : r.gpus) {
    absl::StrAppendFormat(&out, "  gpu %d: peak %d bytes; pages: capacity %d, required %d, optional %d, reserve %d\n",
                          g.gpu, g.peak_used_bytes, g.capacity_pages, g.peak_required_pages, g.peak_optional_pages,
                          g.reserve_pages);
  }
  return out;
}

absl::Status WriteReportJson(const ReplayReport& report, std::string_view path) {
  return WriteFile(path, ReportToJson(report).dump(2) + "\n");
}

std::string RequestOutputsJsonLines(const DriverResult& result) {
  std::string out;
  for (const RequestTiming& t : result.requests) {
    const nlohmann::json line = {{"trace_index", t.trace_index}, {"request", t.request},  {"served", t.served()},
                                 {"error", t.error},             {"tokens", t.output},    {"logits_digests", t.logits_digests}};
    absl::StrAppend(&out, line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "\n");
  }
  return out;
}

absl::Status WriteRequestOutputs(const DriverResult& result, std::string_view path) {
  return WriteFile(path, RequestOutputsJsonLines(result));
}

absl::Status WriteReportCsv(const ReplayReport& report, std::string_view path) {
  return WriteFile(path, ReportCsvHeader() + "\n" + ReportCsvRow(report) + "\n");
}

std::string SweepCsv(const std::vector<SweepPoint>& points) {
  std::string out =
      "concurrency,output_tokens_per_s,requests_served,ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,"
      "allocation_wait_share,sessions_admitted_max\n";
  for (const SweepPoint& p : points) {
    const ReplayReport& r = p.report;
    absl::StrAppend(&out,
                    absl::StrJoin({Cell(p.concurrency), Cell(r.output_tokens_per_s), Cell(r.requests_served),
                                   Cell(P(r.ttft_ms, false)), Cell(P(r.ttft_ms, true)), Cell(P(r.tpot_ms, false)),
                                   Cell(P(r.tpot_ms, true)), Cell(r.allocation_wait_share),
                                   Cell(r.sessions_admitted_max)},
                                  ","),
                    "\n");
  }
  return out;
}

absl::Status WriteSweepCsv(const std::vector<SweepPoint>& points, std::string_view path) {
  return WriteFile(path, SweepCsv(points));
}

json SweepToJson(const std::vector<SweepPoint>& points) {
  json out = json::array();
  for (const SweepPoint& p : points) out.push_back(ReportToJson(p.report));
  return out;
}

absl::Status WriteSweepJson(const std::vector<SweepPoint>& points, std::string_view path) {
  return WriteFile(path, SweepToJson(points).dump(2) + "\n");
}

std::string PlotCommand::DefaultPlotScript() { return DHS_REPLAY_PLOT_SCRIPT; }

absl::Status RunPlotSweep(std::string_view csv_path, std::string_view png_path, const PlotCommand& command) {
  std::vector<std::string> args = {command.python, command.script, std::string(csv_path), std::string(png_path)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0].c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) {
    return absl::NotFoundError(absl::StrCat("cannot start ", args[0], " for --plot: ", std::strerror(rc)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--plot needs matplotlib, which ", args[0], " cannot import: install python3-matplotlib (Debian); the "
        "sweep figures are in ", std::string(csv_path)));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return absl::NotFoundError(absl::StrCat("cannot run ", args[0], " for --plot"));
  }
  return absl::InternalError(absl::StrCat(args[1], " failed (", WIFEXITED(status) ? "exit " : "signal ",
                                          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), ")"));
}

}  // namespace dhs::replay
