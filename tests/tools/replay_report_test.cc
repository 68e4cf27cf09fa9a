// Report: nearest-rank percentiles against hand-computed values, report figures from a hand-made DriverResult,
// JSON fields, CSV, summary, sweep CSV and the plot script's failure modes (tools/replay/report.h).
#include <cmath>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <iterator>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/replay/report.h"
#include "tests/common/test_util.h"

namespace dhs::replay {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Percentile, NearestRankByHand) {
  // Sorted: 15 20 35 40 50. Rank = max(1, ceil(p * 5 / 100)).
  const std::vector<double> v = {50, 15, 40, 20, 35};
  EXPECT_EQ(*PercentileNearestRank(v, 0), 15);    // rank 1
  EXPECT_EQ(*PercentileNearestRank(v, 5), 15);    // ceil(0.25) = 1
  EXPECT_EQ(*PercentileNearestRank(v, 30), 20);   // ceil(1.5) = 2
  EXPECT_EQ(*PercentileNearestRank(v, 40), 20);   // 2 exactly
  EXPECT_EQ(*PercentileNearestRank(v, 50), 35);   // ceil(2.5) = 3
  EXPECT_EQ(*PercentileNearestRank(v, 99), 50);   // ceil(4.95) = 5
  EXPECT_EQ(*PercentileNearestRank(v, 100), 50);
}

TEST(Percentile, ExactRanksAreNotRoundedUp) {
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_EQ(*PercentileNearestRank(hundred, 99), 99);  // 99 * 100 / 100 = 99 exactly, not 100
  EXPECT_EQ(*PercentileNearestRank(hundred, 50), 50);
  std::vector<double> ten;
  for (int i = 1; i <= 10; ++i) ten.push_back(i * 1.5);
  EXPECT_EQ(*PercentileNearestRank(ten, 99), 15);  // ceil(9.9) = 10 -> 10 * 1.5
  EXPECT_EQ(*PercentileNearestRank(ten, 50), 7.5);  // 5 -> 5 * 1.5
  EXPECT_EQ(*PercentileNearestRank({42}, 99), 42);
}

TEST(Percentile, BadInput) {
  EXPECT_EQ(PercentileNearestRank({}, 50).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PercentileNearestRank({1}, 101).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PercentileNearestRank({1}, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PercentileNearestRank({1}, std::nan("")).status().code(), absl::StatusCode::kInvalidArgument);
}

RequestTiming Timing(double submit, double first, double last, int64_t tokens, double wait, bool ok = true) {
  RequestTiming t;
  t.submit_ms = submit;
  t.first_token_ms = first;
  t.last_token_ms = last;
  t.end_ms = last;
  t.tokens = tokens;
  t.allocation_wait_ms = wait;
  t.finished = ok;
  if (!ok) t.error = "failed";
  return t;
}

// Three requests over 2 s: TTFT 10, 30, 20 ms; TPOT 5 ms, 10 ms, none (one token).
DriverResult SampleResult() {
  DriverResult r;
  r.requests = {Timing(0, 10, 25, 4, 4), Timing(25, 55, 65, 2, 6), Timing(100, 120, 120, 1, 0, false)};
  r.elapsed_ms = 2000;
  r.stats.sessions_admitted_max = 2;
  r.stats.census = {60, 30, 10};
  r.stats.reclaims = 3;
  r.stats.repopulated_pages = 17;
  r.stats.prefix_blocks_imported = 5;
  r.stats.prefix_blocks_computed = 2;
  r.stats.gpus = {{0, 100, 40, 50, 5, 4096, 90 * 4096}, {1, 100, 10, 0, 5, 4096, 10 * 4096}};
  return r;
}

DriverResult SampleResultAllServed() {
  DriverResult r = SampleResult();
  r.requests.pop_back();
  return r;
}

RunSettings SampleSettings() {
  RunSettings s;
  s.trace_path = "data/mooncake.jsonl";
  s.trace_format = "mooncake";
  s.block_tokens = 10;
  s.length_scale = 0.02;
  s.concurrency = 4;
  s.mode = "adaptive";
  s.prefill = "prefill";
  s.hbm_budget_bytes = 1 << 20;
  return s;
}

TEST(BuildReport, FiguresByHand) {
  ReplayReport r = BuildReport(SampleResult(), SampleSettings(), true);
  EXPECT_EQ(r.requests_total, 3);
  EXPECT_EQ(r.requests_served, 2);
  EXPECT_EQ(r.output_tokens, 7);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s, 3.5);  // 7 tokens / 2 s
  ASSERT_TRUE(r.ttft_ms);
  EXPECT_EQ(r.ttft_ms->p50, 20);  // sorted 10 20 30: rank ceil(1.5) = 2
  EXPECT_EQ(r.ttft_ms->p99, 30);
  ASSERT_TRUE(r.tpot_ms);
  EXPECT_EQ(r.tpot_ms->p50, 5);   // sorted 5 10: rank ceil(1.0) = 1
  EXPECT_EQ(r.tpot_ms->p99, 10);
  ASSERT_TRUE(r.allocation_wait_share);
  EXPECT_DOUBLE_EQ(*r.allocation_wait_share, 10.0 / 60.0);  // (4 + 6 + 0) / (10 + 30 + 20)
  ASSERT_TRUE(r.census);
  EXPECT_DOUBLE_EQ(r.census->direct, 0.6);
  EXPECT_DOUBLE_EQ(r.census->hot, 0.3);
  EXPECT_DOUBLE_EQ(r.census->host, 0.1);
  EXPECT_EQ(r.sessions_admitted_max, 2);
  EXPECT_EQ(r.reclaims, 3);
  EXPECT_EQ(r.repopulated_pages, 17);
  EXPECT_EQ(r.prefix_blocks_imported, 5);
  EXPECT_EQ(r.prefix_blocks_computed, 2);
  EXPECT_EQ(r.exact_match, true);
  EXPECT_EQ(r.elapsed_s, 2.0);
  EXPECT_EQ(r.gpus.size(), 2u);
}

TEST(BuildReport, NoTokensGiveNulls) {
  DriverResult empty;
  empty.requests.resize(2);  // never got a token
  ReplayReport r = BuildReport(empty, SampleSettings());
  EXPECT_EQ(r.requests_served, 0);
  EXPECT_FALSE(r.ttft_ms);
  EXPECT_FALSE(r.tpot_ms);
  EXPECT_FALSE(r.allocation_wait_share);
  EXPECT_FALSE(r.census);
  EXPECT_FALSE(r.exact_match);
  EXPECT_EQ(r.output_tokens_per_s, 0);
  nlohmann::json j = ReportToJson(r);
  EXPECT_TRUE(j["ttft_ms"]["p50"].is_null());
  EXPECT_TRUE(j["exact_match"].is_null());
  EXPECT_TRUE(j["census"]["host"].is_null());
  EXPECT_TRUE(j["allocation_wait_share"].is_null());
}

TEST(ReportJson, APartialRunIsMarkedIncomplete) {
  ReplayReport r = BuildReport(SampleResult(), SampleSettings());
  r.complete = false;
  EXPECT_EQ(ReportToJson(r)["complete"], false);
}

TEST(ReportJson, HasEveryFieldWithItsValue) {
  nlohmann::json j = ReportToJson(BuildReport(SampleResult(), SampleSettings(), false));
  EXPECT_EQ(j["complete"], true);
  EXPECT_EQ(j["requests_total"], 3);
  EXPECT_EQ(j["requests_served"], 2);
  EXPECT_EQ(j["output_tokens"], 7);
  EXPECT_DOUBLE_EQ(j["output_tokens_per_s"].get<double>(), 3.5);
  EXPECT_EQ(j["ttft_ms"]["p50"], 20.0);
  EXPECT_EQ(j["ttft_ms"]["p99"], 30.0);
  EXPECT_EQ(j["tpot_ms"]["p50"], 5.0);
  EXPECT_EQ(j["tpot_ms"]["p99"], 10.0);
  EXPECT_DOUBLE_EQ(j["allocation_wait_share"].get<double>(), 10.0 / 60.0);
  EXPECT_EQ(j["sessions_admitted_max"], 2);
  EXPECT_DOUBLE_EQ(j["census"]["direct"].get<double>(), 0.6);
  EXPECT_DOUBLE_EQ(j["census"]["hot"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(j["census"]["host"].get<double>(), 0.1);
  EXPECT_EQ(j["reclaims"], 3);
  EXPECT_EQ(j["repopulated_pages"], 17);
  EXPECT_EQ(j["mode"], "adaptive");
  EXPECT_EQ(j["prefill"], "prefill");
  EXPECT_EQ(j["prefix_blocks"]["imported"], 5);
  EXPECT_EQ(j["prefix_blocks"]["computed"], 2);
  EXPECT_EQ(j["exact_match"], false);
  ASSERT_EQ(j["gpu_memory"].size(), 2u);
  EXPECT_EQ(j["gpu_memory"][0]["gpu"], 0);
  EXPECT_EQ(j["gpu_memory"][0]["peak_used_bytes"], 90 * 4096);
  EXPECT_EQ(j["gpu_memory"][1]["peak_required_pages"], 10);
  EXPECT_EQ(j["elapsed_s"], 2.0);
  EXPECT_EQ(j["trace"]["path"], "data/mooncake.jsonl");
  EXPECT_EQ(j["trace"]["format"], "mooncake");
  EXPECT_EQ(j["trace"]["requests"], 3);
  EXPECT_EQ(j["trace"]["length_scale"], 0.02);
  EXPECT_EQ(j["trace"]["block_tokens"], 10);
  EXPECT_EQ(j["settings"]["schedule"], "closed-loop");
  EXPECT_EQ(j["settings"]["concurrency"], 4);
  EXPECT_TRUE(j["settings"]["time_scale"].is_null());
  EXPECT_EQ(j["settings"]["hbm_budget_bytes"], 1 << 20);
  EXPECT_EQ(j["settings"]["check_exact"], false);
  EXPECT_TRUE(j["settings"]["reclaim_policy"].is_null());  // not chosen by the tool: memd's default
}

// Issue 22: every request's end reason reaches the report: counts by reason (each request once; a partial run's
// requests that never ended are "not_ended") and one failure entry per request not served, with its text.
TEST(ReportJson, EndReasonsAndFailuresOfEveryRequest) {
  DriverResult r;
  RequestTiming served = Timing(0, 10, 25, 4, 0);
  served.end_reason = EndReason::kFinished;
  RequestTiming stopped = Timing(0, 10, 30, 3, 0, false);
  stopped.request = 2;
  stopped.trace_index = 1;
  stopped.end_reason = EndReason::kWorkerStopping;
  stopped.error = "worker stopping";
  RequestTiming timed_out = Timing(0, 10, 40, 2, 0, false);
  timed_out.request = 3;
  timed_out.trace_index = 2;
  timed_out.end_reason = EndReason::kTimeout;
  timed_out.error = "timeout: cancelled: timeout after 100 ms (the worker released it)";
  RequestTiming never;  // a partial run: not submitted
  never.request = 4;
  never.trace_index = 3;
  r.requests = {served, stopped, timed_out, never};
  r.elapsed_ms = 1000;
  ReplayReport report = BuildReport(r, SampleSettings());
  const std::map<std::string, int64_t> want{{"finished", 1}, {"worker_stopping", 1}, {"timeout", 1}, {"not_ended", 1}};
  EXPECT_EQ(report.end_reasons, want);
  nlohmann::json j = ReportToJson(report);
  EXPECT_EQ(j["end_reasons"]["worker_stopping"], 1);
  EXPECT_EQ(j["end_reasons"]["timeout"], 1);
  EXPECT_EQ(j["end_reasons"]["finished"], 1);
  ASSERT_EQ(j["failures"].size(), 3u);
  EXPECT_EQ(j["failures"][0]["request"], 2);
  EXPECT_EQ(j["failures"][0]["trace_row"], 1);
  EXPECT_EQ(j["failures"][0]["end_reason"], "worker_stopping");
  EXPECT_EQ(j["failures"][0]["error"], "worker stopping");
  EXPECT_EQ(j["failures"][1]["end_reason"], "timeout");
  EXPECT_THAT(j["failures"][1]["error"].get<std::string>(), HasSubstr("timeout after 100 ms"));
  EXPECT_EQ(j["failures"][2]["end_reason"], "not_ended");
  EXPECT_EQ(j["failures"][2]["error"], "did not end");
  EXPECT_THAT(FormatSummary(report), HasSubstr("ends: finished 1, not_ended 1, timeout 1, worker_stopping 1"));
  // A run where everything was served names no end line.
  EXPECT_THAT(FormatSummary(BuildReport(SampleResultAllServed(), SampleSettings())), Not(HasSubstr("ends:")));
}

TEST(ReportCsv, OneRowMatchingTheHeader) {
  RunSettings s = SampleSettings();
  s.trace_path = "dir,with \"comma\"/t.jsonl";
  ReplayReport r = BuildReport(SampleResult(), s);
  const std::string header = ReportCsvHeader();
  const std::string row = ReportCsvRow(r);
  std::vector<std::string> names = absl::StrSplit(header, ',');
  EXPECT_EQ(names.size(), 34u);
  EXPECT_EQ(names[0], "requests_total");
  EXPECT_EQ(names[4], "ttft_p50_ms");
  EXPECT_EQ(names[17], "exact_match");
  EXPECT_THAT(row, ::testing::StartsWith("3,2,7,3.5,20,30,5,10,0.166667,2,0.6,0.3,0.1,3,17,adaptive,prefill,,2,"));
  EXPECT_THAT(row, HasSubstr(",\"dir,with \"\"comma\"\"/t.jsonl\",mooncake,0.02,4,,1048576,"));
  // The fault columns: requests_failed = 3 - 2; no fault injection: no seed, zero counts, no recovery percentiles.
  EXPECT_EQ(names[25], "requests_failed");
  EXPECT_EQ(names[31], "host_rows_lost");
  EXPECT_THAT(row, ::testing::EndsWith(",1048576,1,,0,0,0,0,0,,"));
  EXPECT_EQ(row.find('\n'), std::string::npos);
}

// The fault figures (issue 11): top-level JSON fields, the CSV's last columns, a summary line; recovery percentiles by
// nearest rank over {300, 100, 200} us: p50 = 200 (rank ceil(1.5) = 2), p99 = 300 (rank ceil(2.97) = 3).
TEST(ReportFaults, JsonCsvAndSummary) {
  ReplayReport r = BuildReport(SampleResult(), SampleSettings());
  r.faults.fault_seed = 42;
  r.faults.worker_restarts = 5;
  r.faults.memd_restarts = 1;
  r.faults.requests_resumed = 7;
  r.faults.rows_recomputed = 900;
  r.faults.host_rows_lost = 0;
  r.faults.host_pages_checked = 12;
  r.faults.recovery_us = {300, 100, 200};
  const nlohmann::json j = ReportToJson(r);
  EXPECT_EQ(j["fault_seed"], 42);
  EXPECT_EQ(j["worker_restarts"], 5);
  EXPECT_EQ(j["memd_restarts"], 1);
  EXPECT_EQ(j["requests_resumed"], 7);
  EXPECT_EQ(j["rows_recomputed"], 900);
  EXPECT_EQ(j["requests_failed"], 1);
  EXPECT_EQ(j["host_rows_lost"], 0);
  EXPECT_EQ(j["recovery_us"]["p50"], 200.0);
  EXPECT_EQ(j["recovery_us"]["p99"], 300.0);
  EXPECT_EQ(j["recovery_us"]["samples"], nlohmann::json::array({300, 100, 200}));
  EXPECT_THAT(ReportCsvRow(r), ::testing::EndsWith(",1,42,5,1,7,900,0,200,300"));
  EXPECT_THAT(FormatSummary(r), HasSubstr("faults (seed 42): worker restarts 5, memd restarts 1"));
  const nlohmann::json none = ReportToJson(BuildReport(SampleResult(), SampleSettings()));
  EXPECT_TRUE(none["fault_seed"].is_null());
  EXPECT_TRUE(none["recovery_us"]["p50"].is_null());
  EXPECT_THAT(FormatSummary(BuildReport(SampleResult(), SampleSettings())), Not(HasSubstr("faults")));
}

TEST(ReportFiles, WrittenAndReadBack) {
  const std::string dir = dhs::testing::ProcessTempDir();
  ReplayReport r = BuildReport(SampleResult(), SampleSettings());
  ASSERT_TRUE(WriteReportJson(r, dir + "/replay_report.json").ok());
  ASSERT_TRUE(WriteReportCsv(r, dir + "/replay_report.csv").ok());
  std::ifstream json_in(dir + "/replay_report.json");
  nlohmann::json j = nlohmann::json::parse(json_in);
  EXPECT_EQ(j["requests_served"], 2);
  std::ifstream csv_in(dir + "/replay_report.csv");
  std::string text((std::istreambuf_iterator<char>(csv_in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, ReportCsvHeader() + "\n" + ReportCsvRow(r) + "\n");
  EXPECT_EQ(WriteReportJson(r, dir + "/no/such/dir/r.json").code(), absl::StatusCode::kPermissionDenied);
}

// dhs-replay --outputs (issue 22): one JSON line per request, in trace order, with its tokens and logits digests, so
// that two runs' outputs compare exactly (tools/production_run.sh).
TEST(ReportFiles, RequestOutputsOneJsonLinePerRequest) {
  DriverResult result;
  RequestTiming a;
  a.trace_index = 0;
  a.request = 7;
  a.finished = true;
  a.output = {3, 1, 4};
  a.logits_digests = {1, 18446744073709551615ull, 2};  // a digest needs all 64 bits
  RequestTiming b;
  b.trace_index = 1;
  b.request = 8;
  b.error = "worker stopping";
  b.output = {5};
  result.requests = {a, b};
  const std::string text = RequestOutputsJsonLines(result);
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  const nlohmann::json first = nlohmann::json::parse(text.substr(0, text.find('\n')));
  const nlohmann::json second = nlohmann::json::parse(text.substr(text.find('\n') + 1));
  EXPECT_EQ(first["request"], 7);
  EXPECT_EQ(first["trace_index"], 0);
  EXPECT_EQ(first["served"], true);
  EXPECT_EQ(first["tokens"], nlohmann::json::array({3, 1, 4}));
  EXPECT_EQ(first["logits_digests"][1].get<uint64_t>(), 18446744073709551615ull);
  EXPECT_EQ(second["served"], false);
  EXPECT_EQ(second["error"], "worker stopping");
  EXPECT_EQ(second["tokens"], nlohmann::json::array({5}));
  const std::string dir = dhs::testing::ProcessTempDir();
  ASSERT_TRUE(WriteRequestOutputs(result, dir + "/outputs.jsonl").ok());
  std::ifstream in(dir + "/outputs.jsonl");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), text);
}

TEST(Summary, NamesTheMainFigures) {
  const std::string s = FormatSummary(BuildReport(SampleResult(), SampleSettings(), true));
  EXPECT_THAT(s, HasSubstr("served 2/3 in 2.0 s: 7 output tokens, 3.5 tokens/s"));
  EXPECT_THAT(s, HasSubstr("TTFT ms p50 20.0 p99 30.0; TPOT ms p50 5.00 p99 10.00; allocation wait 16.7% of TTFT"));
  EXPECT_THAT(s, HasSubstr("census: direct 60.0%, hot 30.0%, host 10.0%"));
  EXPECT_THAT(s, HasSubstr("exact match yes"));
  EXPECT_THAT(s, HasSubstr("closed loop, concurrency 4"));
}

// Issue 24: with sharing on, the summary gives the lookups by tier with their shares (blocks: 40 looked up, 10 from
// the worker's row cache = 25.0%, 20 from the host tier = 50.0%, the other 10 computed = 25.0%), the prefill saved,
// memd's shared pages, host bytes per session and the peak host pages; JSON carries the same figures and the limits.
// With sharing off there is no prefix line.
TEST(Summary, PrefixSharingLinesByTier) {
  RunSettings settings = SampleSettings();
  settings.prefix_sharing = true;
  settings.prefix_eviction = "fifo";
  settings.prefix_tenant_quota_pages = 64;
  DriverResult d = SampleResult();
  d.stats.prefix_lookups = 40;
  d.stats.prefix_hits_worker = 10;
  d.stats.prefix_hits_host = 20;
  d.stats.prefill_tokens_saved = 300;
  d.stats.host_pages_shared = 17;
  d.stats.host_bytes_per_session_mean = 1500.4;
  d.stats.host_bytes_per_session_peak = 4096;
  d.stats.host_pages_held_peak = 33;
  d.stats.host_pages_allocated_peak = 50;
  const ReplayReport r = BuildReport(d, settings);
  const std::string s = FormatSummary(r);
  EXPECT_THAT(s, HasSubstr("  prefix sharing on (eviction fifo, tenant quota 64 pages): 40 blocks looked up: worker row "
                           "cache 10 (25.0%), host tier 20 (50.0%), miss (computed) 10 (25.0%)\n"));
  EXPECT_THAT(s, HasSubstr("  prefill tokens saved 300; host pages shared 17; host bytes per session mean 1500, peak "
                           "4096; host pages peak 33 held, 50 allocated\n"));
  const nlohmann::json j = ReportToJson(r);
  EXPECT_EQ(j["host_pages_peak"]["held"], 33);
  EXPECT_EQ(j["host_pages_peak"]["allocated"], 50);
  EXPECT_EQ(j["settings"]["prefix_eviction"], "fifo");
  EXPECT_EQ(j["settings"]["prefix_tenant_quota_pages"], 64);
  // No lookup: rates n/a, memd's default policy named as such.
  settings.prefix_eviction.clear();
  settings.prefix_tenant_quota_pages = 0;
  EXPECT_THAT(FormatSummary(BuildReport(SampleResult(), settings)),
              HasSubstr("prefix sharing on (eviction memd's default): 0 blocks looked up: worker row cache 0 (n/a), "
                        "host tier 0 (n/a), miss (computed) 0 (n/a)"));
  EXPECT_TRUE(ReportToJson(BuildReport(SampleResult(), settings))["settings"]["prefix_eviction"].is_null());
  EXPECT_THAT(FormatSummary(BuildReport(d, SampleSettings())), Not(HasSubstr("prefix sharing")));
}

// Issue 26 review (F3 / F4): one node's memd cluster counters, as the node client totals them across memd restarts.
NodeStats::ClusterCounters SampleCluster(int64_t lookups, int64_t hits, int64_t timeouts) {
  NodeStats::ClusterCounters c;
  c.lookups = lookups;
  c.hits = hits;
  c.imported = hits - 1;
  c.session_imported = 1;
  c.published = 40;
  c.offered = 45;
  c.publish_failed = 2;
  c.published_bytes = 4000;
  c.imported_bytes = 600;
  c.misses = {{"absent", lookups - hits - timeouts}, {"timeout", timeouts}, {"no_room", 0}};
  c.shed = {{"queue_full", 3}, {"store_down", 0}};
  c.health = "up";
  c.health_samples = {{"up", 12}};
  c.reachable = "yes";
  c.memd_restarts_seen = 2;
  return c;
}

// Two nodes: node 0 found 30 of 40 pages (no timeout), node 1 found 7 of 113 (96 timed out); the JSON carries each
// node's misses by reason, sheds, health and the memd restarts seen, and the summary warns about node 1 only.
TEST(MultiNodeReport, PerNodeClusterFiguresWithMissReasonsAndAWarning) {
  DriverResult d = SampleResult();  // 2 s; every request's trace index is 0: all on node 0
  NodeStats s0, s1, s2;
  s0.cluster = SampleCluster(40, 30, 0);
  s1.cluster = SampleCluster(113, 7, 96);
  MultiNodeFigures m;
  m.nodes = 3;
  m.route = "session";
  m.cluster_store = "local";
  m.cluster_endpoint = "redis://127.0.0.1:7000";
  m.cluster_lookup_timeout_ms = 200;
  m.cluster_counters = true;
  m.per_node = {MakeNodeFigures(0, d, {0}, s0), MakeNodeFigures(1, d, {0}, s1), MakeNodeFigures(2, d, {0}, s2)};
  ReplayReport r = BuildReport(d, SampleSettings());
  r.multi_node = m;
  const nlohmann::json j = ReportToJson(r);
  const nlohmann::json& c1 = j["multi_node"]["per_node"][1]["cluster"];
  EXPECT_EQ(c1["lookups"], 113);
  EXPECT_EQ(c1["hits"], 7);
  EXPECT_EQ(c1["imported"], 6);
  EXPECT_EQ(c1["session_imported"], 1);
  EXPECT_EQ(c1["published"], 40);
  EXPECT_EQ(c1["offered"], 45);
  EXPECT_EQ(c1["publish_failed"], 2);
  EXPECT_EQ(c1["misses"], (nlohmann::json{{"absent", 10}, {"timeout", 96}, {"no_room", 0}}));
  EXPECT_EQ(c1["shed"], (nlohmann::json{{"queue_full", 3}, {"store_down", 0}}));
  EXPECT_EQ(c1["health"], "up");
  EXPECT_EQ(c1["health_samples"], (nlohmann::json{{"up", 12}}));
  EXPECT_EQ(c1["reachable"], "yes");
  EXPECT_EQ(c1["memd_restarts_seen"], 2);
  EXPECT_EQ(j["multi_node"]["per_node"][1]["store_bytes_out"], 4000);
  EXPECT_EQ(j["multi_node"]["per_node"][1]["store_bytes_in"], 600);
  EXPECT_DOUBLE_EQ(j["multi_node"]["per_node"][1]["store_bytes_out_per_s"].get<double>(), 2000.0);  // 4000 B / 2 s
  EXPECT_DOUBLE_EQ(j["multi_node"]["per_node"][1]["store_bytes_in_per_s"].get<double>(), 300.0);
  EXPECT_TRUE(j["multi_node"]["per_node"][2]["cluster"].is_null());  // its memd reported no cluster tier
  EXPECT_TRUE(j["multi_node"]["per_node"][2]["store_bytes_out"].is_null());
  EXPECT_EQ(j["multi_node"]["cluster_lookup_timeout_ms"], 200);
  const std::string text = FormatSummary(r);
  EXPECT_THAT(text, HasSubstr("  3 nodes, route session: 0 sessions (0 next turns); cluster store local, lookup "
                              "deadline 200 ms\n"));
  EXPECT_THAT(text, HasSubstr("    cluster tier: 113 pages looked up, 7 found, 6 imported (part of the host hits; 1 by "
                              "a session key), 40 published; store bytes out 4000 (2000/s), in 600 (300/s); 2 memd "
                              "restarts seen\n    cluster misses: absent 10, timeout 96\n"));
  EXPECT_THAT(text, HasSubstr("    cluster misses: absent 10\n"));  // node 0: no zero reason listed
  EXPECT_THAT(text, HasSubstr("  warning: node 1: 7 of 113 cluster lookups found; 96 timed out (memd "
                              "--cluster-lookup-timeout-ms 200)\n"));
  EXPECT_THAT(text, Not(HasSubstr("warning: node 0")));
  EXPECT_THAT(text, Not(HasSubstr("warning: node 2")));
}

TEST(MultiNodeReport, ClusterWarningNamesEachReasonAndStaysQuietWhenHealthy) {
  NodeStats::ClusterCounters c = SampleCluster(40, 30, 0);
  EXPECT_EQ(ClusterWarning(0, c, 0), "");  // absent misses and a queue_full shed are no warning
  c.misses["timeout"] = 5;
  EXPECT_EQ(ClusterWarning(0, c, 0), "node 0: 30 of 40 cluster lookups found; 5 timed out (memd "
                                     "--cluster-lookup-timeout-ms not given: memd's default)");
  c.misses["timeout"] = 0;
  c.misses["store_down"] = 50;
  c.misses["unavailable"] = 4;
  c.misses["store_error"] = 1;
  c.health = "down";
  c.health_samples = {{"up", 8}, {"down", 3}, {"probing", 1}};
  c.shed["store_down"] = 12;
  EXPECT_EQ(ClusterWarning(3, c, 7),
            "node 3: 30 of 40 cluster lookups found; 50 more not asked (store down, or lookups paused after an "
            "unanswered one), 4 unavailable, 1 failed with a store error, store health not up in 4 of 12 samples "
            "(last: down), 12 pages not published (store down)");
  NodeStats::ClusterCounters unreachable = SampleCluster(40, 30, 0);  // memd's latest contact got no answer
  unreachable.reachable = "no";
  EXPECT_EQ(ClusterWarning(2, unreachable, 0),
            "node 2: 30 of 40 cluster lookups found; the store did not answer memd's latest contact");
  unreachable.reachable = "yes";
  EXPECT_EQ(ClusterWarning(2, unreachable, 0), "");
  NodeStats::ClusterCounters once_down = SampleCluster(40, 30, 0);  // down in a sample, nothing missed for it
  once_down.health_samples = {{"up", 8}, {"down", 1}};
  EXPECT_EQ(ClusterWarning(1, once_down, 0),
            "node 1: 30 of 40 cluster lookups found; store health not up in 1 of 9 samples (last: up)");
}

// A 1-node run with --cluster-store: the same multi_node object with one node (dhs-replay main's OneNodeFigures).
TEST(MultiNodeReport, OneNodeWithAStoreSaysNode) {
  DriverResult d = SampleResult();
  NodeStats s;
  s.cluster = SampleCluster(10, 9, 0);
  MultiNodeFigures m;
  m.route = "round-robin";
  m.cluster_store = "local";
  m.cluster_counters = true;
  m.per_node = {MakeNodeFigures(0, d, {0}, s)};
  ReplayReport r = BuildReport(d, SampleSettings());
  r.multi_node = m;
  const std::string text = FormatSummary(r);
  EXPECT_THAT(text, HasSubstr("  1 node, route round-robin: 0 sessions (0 next turns); cluster store local, lookup "
                              "deadline memd's default\n"));
  EXPECT_THAT(text, HasSubstr("  node 0: 3 requests (2 served), 7 tokens"));
  const nlohmann::json j = ReportToJson(r);
  EXPECT_EQ(j["multi_node"]["nodes"], 1);
  EXPECT_EQ(j["multi_node"]["per_node"][0]["cluster"]["hits"], 9);
  EXPECT_TRUE(j["multi_node"]["cluster_lookup_timeout_ms"].is_null());
}

std::vector<SweepPoint> SamplePoints() {
  std::vector<SweepPoint> points;
  for (int64_t c : {1, 2, 4}) {
    DriverResult d = SampleResult();
    d.elapsed_ms = 4000.0 / static_cast<double>(c);  // 7 tokens in 4 s, 2 s, 1 s
    points.push_back({c, BuildReport(d, SampleSettings())});
  }
  return points;
}

TEST(Summary, SpeculationThatVerifiedNoRoundIsSaidSo) {
  // Issue 27 review: `--speculate` on over a prepared prefix with a short output verified nothing and exited 0 with
  // "0 rounds" only; the summary says that the run measured plain decoding.
  DriverResult d = SampleResult();
  d.stats.speculate = "fixed";
  d.stats.spec_rounds = 0;
  const std::string none = FormatSummary(BuildReport(d, SampleSettings()));
  EXPECT_THAT(none, HasSubstr("speculation fixed: 0 rounds"));
  EXPECT_THAT(none, HasSubstr("warning: speculation was on but no speculative round was verified"));
  d.stats.spec_rounds = 3;
  d.stats.spec_round_tokens = 7;
  EXPECT_THAT(FormatSummary(BuildReport(d, SampleSettings())), Not(HasSubstr("warning: speculation")));
  d.stats.speculate = "off";
  d.stats.spec_rounds = 0;
  EXPECT_THAT(FormatSummary(BuildReport(d, SampleSettings())), Not(HasSubstr("warning: speculation")));
}

TEST(Sweep, CsvRowsPerConcurrency) {
  const std::string csv = SweepCsv(SamplePoints());
  std::vector<std::string> lines = absl::StrSplit(csv, '\n');
  ASSERT_EQ(lines.size(), 5u);  // header, 3 rows, "" after the final newline
  EXPECT_EQ(lines[0],
            "concurrency,output_tokens_per_s,requests_served,ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,"
            "allocation_wait_share,sessions_admitted_max");
  EXPECT_EQ(lines[1], "1,1.75,2,20,30,5,10,0.166667,2");
  EXPECT_EQ(lines[2], "2,3.5,2,20,30,5,10,0.166667,2");
  EXPECT_EQ(lines[3], "4,7,2,20,30,5,10,0.166667,2");
  EXPECT_EQ(lines[4], "");
}

TEST(Sweep, JsonArrayOfReports) {
  nlohmann::json j = SweepToJson(SamplePoints());
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 3u);
  EXPECT_DOUBLE_EQ(j[0]["output_tokens_per_s"].get<double>(), 1.75);
  EXPECT_DOUBLE_EQ(j[2]["output_tokens_per_s"].get<double>(), 7.0);
}

std::string WriteScript(const std::string& name, const std::string& body) {
  const std::string path = dhs::testing::ProcessTempDir() + "/" + name;
  std::ofstream(path, std::ios::trunc) << body;
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

TEST(Plot, MissingMatplotlibIsReportedClearly) {
  // A stand-in interpreter that behaves like plot_sweep.py without matplotlib: exit status 3.
  PlotCommand command;
  command.python = WriteScript("fake_python_no_matplotlib.sh", "#!/bin/sh\nexit 3\n");
  absl::Status s = RunPlotSweep("sweep.csv", "sweep.png", command);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("install python3-matplotlib"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("sweep.csv"));
}

TEST(Plot, OtherFailuresAreErrors) {
  PlotCommand missing;
  missing.python = "/nonexistent/python3";
  EXPECT_EQ(RunPlotSweep("a.csv", "a.png", missing).code(), absl::StatusCode::kNotFound);
  PlotCommand failing;
  failing.python = WriteScript("fake_python_fails.sh", "#!/bin/sh\nexit 1\n");
  absl::Status s = RunPlotSweep("a.csv", "a.png", failing);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("exit 1"));
}

TEST(Plot, RealScriptWritesPngOrNamesMatplotlib) {
  EXPECT_EQ(PlotCommand{}.script, DHS_REPLAY_PLOT_SCRIPT_PATH);
  const std::string dir = dhs::testing::ProcessTempDir();
  ASSERT_TRUE(WriteSweepCsv(SamplePoints(), dir + "/replay_sweep.csv").ok());
  std::filesystem::remove(dir + "/replay_sweep.png");
  const bool have_matplotlib = std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
  absl::Status s = RunPlotSweep(dir + "/replay_sweep.csv", dir + "/replay_sweep.png");
  if (have_matplotlib) {
    ASSERT_TRUE(s.ok()) << s;
    std::ifstream png(dir + "/replay_sweep.png", std::ios::binary);
    char magic[8] = {};
    png.read(magic, 8);
    EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("install python3-matplotlib"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/replay_sweep.png"));
  }
}

}  // namespace
}  // namespace dhs::replay
