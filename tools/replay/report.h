// tools/replay/report.h: the replay report (issue 5): figures computed from a DriverResult, written as JSON
// and as one CSV row, printed as a human summary; the sweep CSV and its plot.
//
// Thread-safety: free functions over values; RunPlotSweep starts a child process and waits for it.
//
// Percentiles use the nearest-rank method: for N sorted values v_1 <= ... <= v_N and p in [0, 100], the p-th
// percentile is v_r with r = max(1, ceil(p * N / 100)). It is always one of the observed values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/replay/driver.h"
#include "tools/replay/node_client.h"
#include "workerd/device/link_model.h"
#include "workerd/speculation/speculation_config.h"

namespace dhs::replay {

// Nearest-rank percentile (see above). InvalidArgument for no values or p outside [0, 100].
absl::StatusOr<double> PercentileNearestRank(std::vector<double> values, double p);

// The trace and settings of a run, echoed into the report.
struct RunSettings {
  std::string trace_path;
  std::string trace_format;           // "mooncake" / "azure"
  int64_t block_tokens = 512;         // tokens per hash block after length scaling
  double length_scale = 1.0;
  std::optional<int64_t> concurrency; // closed loop
  std::optional<double> time_scale;   // open loop
  std::string mode;                   // "resident" / "hisparse" / "adaptive"
  std::string prefill;                // which prefill the node used: "prefill" or "prepared-prefix"
  std::optional<int64_t> hbm_budget_bytes;
  bool check_exact = false;
  std::string connect;                // node endpoint; empty when the tool started its own node
  std::string reclaim_policy;         // memd's victim order when the tool chose it; empty = memd's default
  LinkModelConfig link_model;         // the worker's host-device link model (docs/link_model.md); off by default
  spec::SpeculationConfig speculation;  // the worker's --speculate options (off by default)
  bool prefix_sharing = false;        // issue 24: memd's --prefix-sharing of the node the tool started
  std::string tenant;                 // --tenant
  int64_t tenants = 1;                // --tenants (the mix)
  TenantKey tenant_by = TenantKey::kSession;  // --tenant-by
  std::string prefix_eviction;        // memd's --prefix-eviction when the tool chose it; empty = memd's default
  int64_t prefix_tenant_quota_pages = 0;  // memd's --prefix-tenant-quota-pages (0 = no quota)
};

// Speculative decoding figures of a run (issue 13; docs/replay.md "Speculation").
struct SpeculationFigures {
  std::string speculate = "off";                 // the worker's mode (what it reported; the settings' when none)
  int64_t rounds = 0;                            // verified rounds (K_r >= 2)
  std::optional<double> acceptance_length_mean;  // (accepted proposals + 1) per round, averaged; nullopt: no round
  int64_t proposed = 0, accepted = 0;            // proposals verified / accepted
  double proposer_s = 0;                         // time the proposer took, s (the synthetic proposer's target steps)
  std::map<int64_t, int64_t> block_width;        // K -> rounds of K queries
  int64_t staging_bytes = 0;                     // staging arenas reserved, bytes
  int64_t draft_ring_bytes = 0;                  // draft rings reserved, bytes
};

struct Percentiles {
  double p50 = 0;
  double p99 = 0;
};

struct CensusShares {  // brief §5 census as fractions of all selected rows (sum 1)
  double direct = 0;
  double hot = 0;
  double host = 0;
};

// What the faults of a run did (issue 11: dhs-replay --kill-worker-every, --restart-memd-every, --kill-worker-at;
// tools/replay/supervised_node.h). Without fault injection: fault_seed nullopt, counts 0, no recovery samples.
struct FaultFigures {
  std::optional<uint64_t> fault_seed;  // the seed of the kill times and random kill points
  int64_t worker_restarts = 0;         // worker starts after the first (kills, kill points, crashes)
  int64_t memd_restarts = 0;           // memd starts after the first
  int64_t worker_kills = 0;            // timed SIGKILLs of the worker
  int64_t memd_kills = 0;              // timed SIGKILLs of memd
  int64_t kill_points_armed = 0;       // worker starts given a --fault-kill-at
  int64_t requests_resumed = 0;        // interrupted requests the restarted workers resumed, summed
  int64_t rows_recomputed = 0;         // rows those requests recomputed from their tokens, summed
  int64_t requests_resubmitted = 0;    // unknown to the restarted worker with no token received: submitted again
  int64_t host_rows_lost = 0;          // rows of recorded host pages whose bytes changed or vanished
  int64_t host_pages_checked = 0;      // digest comparisons behind host_rows_lost
  int64_t worker_crashes = 0;          // worker ends other than the tool's SIGKILLs (issue 28); > 0: not clean
  int64_t host_pages_unconfirmed = 0;  // pages that should have held a confirmed host copy by the steps taken and
                                       // did not (issue 28; never counted in host_rows_lost); > 0: the run is not clean
  std::vector<int64_t> recovery_us;    // per recovery: the latest worker death (kill sent / exit seen) -> the first
                                       // token after the client re-attached, microseconds
};

// Issue 27: the closed loop over prepared prefixes (tools/replay/closed_loop.h; docs/replay.md). The measured window
// is the sessions only: the report's other figures (tokens/s, TTFT, TPOT, census, prefix_blocks_*) are theirs.
struct PrefixWorkloadFigures {
  int64_t prefixes = 0;          // N prepared prefixes
  int64_t prefix_tokens = 0;     // L, tokens per prefix
  int64_t block_tokens = 0;      // tokens per hash block
  int64_t suffix_tokens = 0;     // each session's own tokens after its prefix
  int64_t output_tokens = 0;     // tokens each session generates
  int64_t sessions = 0;          // measured sessions
  int64_t concurrency = 0;       // C of the closed loop
  int64_t in_flight_max = 0;     // most sessions streaming at once (first token seen, not ended) in the window
  double in_flight_mean = 0;     // sum over sessions of (end - submit) / the window: sessions in flight on average
  double preparation_s = 0;      // wall time of the preparation (one request per prefix), not in the window
  int64_t preparation_blocks_computed = 0;  // prefix blocks computed during the preparation (N * L / block expected)
  int64_t preparation_blocks_imported = 0;  // prefix blocks imported during the preparation
  // The measured window's bounds on the driver's clock, ms (dhs-replay: CLOCK_MONOTONIC, the clock of the worker's
  // `step profile: ... at_ms T` lines, so a sweep on one node can split its step profile per point).
  double window_begin_ms = 0;
  double window_end_ms = 0;
};

// A request that was not served, and why (issue 22).
struct RequestFailure {
  RequestId request = 0;
  int64_t trace_row = 0;
  std::string end_reason;  // EndReasonName ("not_ended" in a partial run)
  std::string error;       // the node's text (or the client's account of a worker that went away)
};

// Issue 26 (dhs-replay --nodes N; docs/replay.md "Several nodes"): one node's share of a multi-node run (or the one
// node of a run with --cluster-store). Hits by tier are the node's worker counters in prefix blocks
// (WorkerStatsReply.prefix_*): the worker's row cache, memd's shared host tier, and the misses (lookups - worker -
// host hits). The cluster tier's pages and bytes come from memd's status view; a memd that reports none gives JSON
// null (cluster_counters says so), never a measured 0.
struct NodeFigures {
  int64_t node = 0;                    // 0 .. nodes - 1
  std::string run_dir;                 // its run directory (kept when given with --run-dir)
  int64_t requests = 0;                // routed to it
  int64_t requests_served = 0;
  int64_t output_tokens = 0;
  double output_tokens_per_s = 0;      // its output tokens / the run's elapsed time
  std::optional<Percentiles> ttft_ms;  // its requests with a first token
  int64_t prefix_lookups = 0;          // blocks looked up
  int64_t hits_worker = 0;             // blocks found in the worker's row cache
  int64_t hits_host = 0;               // blocks imported from memd's shared host pages
  int64_t misses = 0;                  // lookups - hits_worker - hits_host (>= 0), prefilled
  int64_t prefill_tokens_saved = 0;    // tokens not prefilled thanks to those hits
  int64_t host_pages_shared = 0;       // memd's shared + cached prefix pages at the end
  // memd's cluster tier (NodeStats::cluster: the run's totals across memd restarts), when configured: pages asked /
  // found / copied into the host pool (then granted as host hits: they are part of hits_host) and published, the
  // misses and sheds by reason, memd's store health, bytes published to / imported from the store (published_bytes,
  // imported_bytes) and those per second of the run. nullopt: memd reported no cluster tier (JSON null).
  struct Cluster {
    NodeStats::ClusterCounters counters;
    double bytes_out_per_s = 0, bytes_in_per_s = 0;
  };
  std::optional<Cluster> cluster;
};

// One routing decision (tools/replay/router.h), in submit order.
struct RouteFigure {
  int64_t trace_index = 0;
  int64_t node = 0;
  int64_t session = 0;         // tools/replay/sessions.h
  int64_t turn = 0;
  std::string reason;          // RouteReasonName
  int64_t matched_blocks = 0;  // prefix routing: leading blocks the chosen node held
};

struct MultiNodeFigures {
  int64_t nodes = 1;
  std::string route;             // --route
  std::string cluster_store;     // --cluster-store as given ("" = none)
  std::string cluster_endpoint;  // what every memd was given (redis://...; "" = none)
  int64_t cluster_lookup_timeout_ms = 0;  // --cluster-lookup-timeout-ms (0: memd's default)
  int64_t sessions = 0;          // sessions of the replayed requests (DeriveSessions)
  int64_t next_turns = 0;        // requests that are a session's turn >= 1
  int64_t kv_events_seen = 0;    // KV events consumed (--route prefix)
  int64_t kv_events_lost = 0;    // sequence gaps in them
  int64_t kv_settle_timeouts = 0;  // next turns routed before their previous turn's blocks were announced
                                   // (MultiNodeClient::Submit's wait ran out)
  bool cluster_counters = false; // some node's memd reported cluster-tier counters (else: not measured)
  std::vector<NodeFigures> per_node;
  std::vector<RouteFigure> routing;
};

// A node's figures from the run's timings: the requests of `result` whose trace row `node_of_row` maps to `node`
// (node_of_row[trace_index]; rows beyond it or -1 belong to no node), and the node's own stats. Pure function.
NodeFigures MakeNodeFigures(int64_t node, const DriverResult& result, const std::vector<int>& node_of_row,
                            const NodeStats& stats);

// Issue 26 review (F4): the text report's warning about a node's cluster lookups, one line without a newline, e.g.
// "node 1: 7 of 113 cluster lookups found; 96 timed out (memd --cluster-lookup-timeout-ms 5 ms, memd's default)";
// empty when nothing is worth a warning: no lookup timed out, none was skipped or failed with the store down
// (store_down, unavailable), no sample saw the store other than up, the last sample did not say the store unreachable
// (reachable "no"), and nothing was shed because the store was down.
// `lookup_timeout_ms`: --cluster-lookup-timeout-ms (0: memd's default). Pure function.
std::string ClusterWarning(int64_t node, const NodeStats::ClusterCounters& c, int64_t lookup_timeout_ms);

struct ReplayReport {
  RunSettings settings;
  int64_t requests_total = 0;          // requests in the run
  int64_t requests_served = 0;         // ended without error
  int64_t requests_failed = 0;         // requests_total - requests_served (failed, or not ended in a partial run)
  int64_t output_tokens = 0;           // tokens received, all requests
  double output_tokens_per_s = 0;      // output_tokens / elapsed_s
  std::optional<Percentiles> ttft_ms;  // over requests with a first token
  std::optional<Percentiles> tpot_ms;  // over requests with >= 2 tokens
  std::optional<double> allocation_wait_share;  // sum allocation wait / sum TTFT (requests with a TTFT)
  int64_t sessions_admitted_max = 0;
  std::optional<CensusShares> census;  // nullopt when no row was selected
  int64_t reclaims = 0;
  int64_t repopulated_pages = 0;
  int64_t prefix_blocks_imported = 0;  // prepared-prefix blocks the worker imported from its row cache
  int64_t prefix_blocks_computed = 0;  // prepared-prefix blocks the worker computed
  int64_t host_bytes_recovered = 0;    // issue 27: host -> device bytes the worker's recoveries moved, bytes
  // Issue 24 (prefix sharing; NodeStats' fields): JSON "prefix" {lookups, hits_host, hits_worker} (blocks),
  // prefill_tokens_saved, host_pages_shared, host_bytes_per_session {mean, peak} (bytes).
  int64_t prefix_lookups = 0, prefix_hits_host = 0, prefix_hits_worker = 0, prefill_tokens_saved = 0;
  int64_t host_pages_shared = 0;
  double host_bytes_per_session_mean = 0, host_bytes_per_session_peak = 0;
  // JSON "host_pages_peak" {held, allocated}: memd's host pages at the sampled peak, held by sessions (allocated less
  // cached prefix pages no session holds) and allocated in all (cached ones included).
  int64_t host_pages_held_peak = 0, host_pages_allocated_peak = 0;
  std::optional<bool> exact_match;     // nullopt: not checked
  std::vector<GpuMemoryUse> gpus;
  double elapsed_s = 0;
  FaultFigures faults;
  SpeculationFigures speculation;
  std::map<std::string, int64_t> end_reasons;  // EndReasonName -> requests (issue 22); every request counted once
  std::vector<RequestFailure> failures;        // every request not served, in trace order (issue 22)
  std::optional<PrefixWorkloadFigures> prefix_workload;  // issue 27: with --prefixes, else nullopt (JSON null)
  std::optional<MultiNodeFigures> multi_node;  // issue 26: with --nodes > 1 or --cluster-store, else nullopt (null)
  bool complete = true;  // false: the run failed part-way; figures of the requests recorded until then, node-wide
                         // figures (sessions, census, reclaims, pages, gpu_memory) not read (0 / empty)
};

// Computes the report. exact_match: the outcome of --check-exact (OutputsMatch against a resident run), or
// nullopt when not checked.
ReplayReport BuildReport(const DriverResult& result, const RunSettings& settings,
                         std::optional<bool> exact_match = std::nullopt);

// JSON (docs/replay.md lists the fields and units); nullopt values are JSON null.
nlohmann::json ReportToJson(const ReplayReport& report);
// The scalar fields as one CSV row under a header (RFC 4180 quoting; empty field = null). No trailing newline.
std::string ReportCsvHeader();
std::string ReportCsvRow(const ReplayReport& report);
// A few lines for a person.
std::string FormatSummary(const ReplayReport& report);

absl::Status WriteReportJson(const ReplayReport& report, std::string_view path);
absl::Status WriteReportCsv(const ReplayReport& report, std::string_view path);  // header + row
// dhs-replay --outputs (issue 22): one JSON object a line per request, in trace order: {"trace_index", "request",
// "served" (finished without error), "error" ("" = none), "tokens": [token, ...], "logits_digests": [u64, ...]}.
// Two runs' files are compared for exactness when the runs cannot be made by one dhs-replay (--check-exact), e.g. a
// node under dhs-node against a resident reference node (tools/production_run.sh).
std::string RequestOutputsJsonLines(const DriverResult& result);
absl::Status WriteRequestOutputs(const DriverResult& result, std::string_view path);

// --sweep: one closed-loop run per concurrency.
struct SweepPoint {
  int64_t concurrency = 0;
  ReplayReport report;
};
// Header `concurrency,output_tokens_per_s,requests_served,ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,
// allocation_wait_share,sessions_admitted_max`, one row per point, newline-terminated.
std::string SweepCsv(const std::vector<SweepPoint>& points);
absl::Status WriteSweepCsv(const std::vector<SweepPoint>& points, std::string_view path);
// --json with --sweep: an array of ReportToJson objects, one per point, in the order given.
nlohmann::json SweepToJson(const std::vector<SweepPoint>& points);
absl::Status WriteSweepJson(const std::vector<SweepPoint>& points, std::string_view path);

// How to run tools/replay/plot_sweep.py.
struct PlotCommand {
  std::string python = "/usr/bin/python3";  // Debian's interpreter: python3-matplotlib installs for it
  std::string script = DefaultPlotScript();
  static std::string DefaultPlotScript();  // the plot_sweep.py of this source tree
};

// Runs `python script CSV PNG` (throughput against concurrency). FailedPrecondition naming python3-matplotlib
// when matplotlib is missing (the script exits 3); NotFound when python cannot be started; Internal for any
// other failure.
absl::Status RunPlotSweep(std::string_view csv_path, std::string_view png_path, const PlotCommand& command = {});

}  // namespace dhs::replay
