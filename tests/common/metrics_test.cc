// The Prometheus pieces shared by memd and workerd (issue 22): the histogram rendering against hand-computed text,
// the bounded request timelines (bounds, eviction order, lookup by client id, JSON round trip, the merged table) and
// the worker's rendering of a WorkerStatsReply (Prometheus, JSON).
#include <gtest/gtest.h>

#include "common/prometheus.h"
#include "common/request_timeline.h"
#include "common/worker_metrics.h"
#include "tests/common/prometheus_text.h"

namespace dhs {
namespace {

TEST(LatencyHistogram, RendersCumulativeBucketsSumAndCountByHand) {
  LatencyHistogram h;
  h.bounds_us = {1000, 5000};
  for (uint64_t us : {500, 1000, 3000, 7000}) h.Observe(us);  // <= 1 ms: 500, 1000; <= 5 ms: 3000; +Inf: 7000
  EXPECT_EQ(h.counts, (std::vector<uint64_t>{2, 1, 1}));     // per bucket, not cumulative
  EXPECT_EQ(h.sum_us, 11500u);
  EXPECT_EQ(h.count, 4u);
  std::string out;
  AppendHistogram(out, "x_seconds", "gpu=\"0\"", h);
  EXPECT_EQ(out,
            "x_seconds_bucket{gpu=\"0\",le=\"0.001000\"} 2\n"
            "x_seconds_bucket{gpu=\"0\",le=\"0.005000\"} 3\n"
            "x_seconds_bucket{gpu=\"0\",le=\"+Inf\"} 4\n"
            "x_seconds_sum{gpu=\"0\"} 0.011500\n"
            "x_seconds_count{gpu=\"0\"} 4\n");
  std::string bare;
  AppendHistogram(bare, "y", "", h);
  EXPECT_EQ(bare,
            "y_bucket{le=\"0.001000\"} 2\ny_bucket{le=\"0.005000\"} 3\ny_bucket{le=\"+Inf\"} 4\ny_sum 0.011500\n"
            "y_count 4\n");
}

TEST(LatencyHistogram, EmptyAndMalformedRenderZeros) {
  const LatencyHistogram h = MakeLatencyHistogram();
  ASSERT_EQ(h.bounds_us.size(), 18u);
  EXPECT_EQ(h.bounds_us.front(), 100u);
  EXPECT_EQ(h.bounds_us.back(), 60000000u);
  std::string out;
  AppendHistogram(out, "z", "", h);
  EXPECT_NE(out.find("z_bucket{le=\"60.000000\"} 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("z_bucket{le=\"+Inf\"} 0\nz_sum 0.000000\nz_count 0\n"), std::string::npos) << out;
  LatencyHistogram bad;  // counts of the wrong size (a peer's reply): every bucket 0, never out of bounds
  bad.bounds_us = {10, 20};
  bad.counts = {5};
  bad.sum_us = 99;
  std::string b;
  AppendHistogram(b, "b", "", bad);
  EXPECT_EQ(b, "b_bucket{le=\"0.000010\"} 0\nb_bucket{le=\"0.000020\"} 0\nb_bucket{le=\"+Inf\"} 0\nb_sum 0.000000\n"
               "b_count 0\n");
  EXPECT_EQ(SecondsText(61234567), "61.234567");
}

TEST(RequestTimelines, KeepsBoundedEventsAndTheTerminalOne) {
  RequestTimelines t(TimelineLimits{4, 3});
  t.Open(10, 7, 0, 0, 1);
  EXPECT_TRUE(t.Add(10, {1, TimelineEvent::kAdmitted, 0, "", ""}));
  EXPECT_TRUE(t.Add(10, {2, TimelineEvent::kGranted, 5, "", ""}));
  EXPECT_TRUE(t.Add(10, {3, TimelineEvent::kReclaimed, 2, "", ""}));
  EXPECT_TRUE(t.Add(10, {4, TimelineEvent::kPopulated, 2, "", ""}));  // beyond 3: dropped
  EXPECT_TRUE(t.Add(10, {5, TimelineEvent::kCompleted, 0, "", ""}));  // terminal: replaces the latest kept
  EXPECT_FALSE(t.Add(11, {5, TimelineEvent::kCompleted, 0, "", ""}));  // never opened
  const RequestTimeline* r = t.Find(10);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->events.size(), 3u);
  EXPECT_EQ(r->events[0].event, TimelineEvent::kAdmitted);
  EXPECT_EQ(r->events[1].event, TimelineEvent::kGranted);
  EXPECT_EQ(r->events[2].event, TimelineEvent::kCompleted);
  EXPECT_EQ(r->events_dropped, 2u);
}

TEST(RequestTimelines, EvictsTheOldestEndedFirstAndFindsEveryEpochOfAClient) {
  RequestTimelines t(TimelineLimits{3, 8});
  t.Open(1, 100, 0, 0, 1);  // client 100, epoch 1
  t.Open(2, 200, 0, 0, 1);
  t.Open(3, 100, 0, 0, 2);  // client 100 again: its resume in epoch 2
  t.End(2);
  t.Open(4, 300, 0, 0, 2);  // full: the oldest ended (2) goes, not the oldest (1)
  EXPECT_EQ(t.Find(2), nullptr);
  ASSERT_NE(t.Find(1), nullptr);
  EXPECT_TRUE(t.FindClient(200).empty());
  std::vector<const RequestTimeline*> c = t.FindClient(100);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]->request, 1u);  // oldest first
  EXPECT_EQ(c[1]->request, 3u);
  EXPECT_EQ(c[1]->epoch, 2u);
  t.Open(5, 500, 0, 0, 2);  // full, none ended: the oldest (1) goes
  EXPECT_EQ(t.Find(1), nullptr);
  EXPECT_EQ(t.FindClient(100).size(), 1u);
  EXPECT_EQ(t.size(), 3u);
  t.Open(3, 101, 0, 0, 2);  // an id opened again replaces its timeline (and its client)
  EXPECT_TRUE(t.FindClient(100).empty());
  EXPECT_EQ(t.FindClient(101).size(), 1u);
}

TEST(RequestTimelines, JsonRoundTripsAndTheTableMergesByTime) {
  RequestTimelines memd, worker;
  memd.Open(1, 42, 9, 0, 1);
  memd.Add(1, {1000, TimelineEvent::kAdmitted, 0, "", ""});
  memd.Add(1, {1500, TimelineEvent::kGranted, 6, "", ""});
  worker.Open(1, 42, 9, 0, 1);
  worker.Add(1, {900, TimelineEvent::kSubmitted, 0, "", ""});
  worker.Add(1, {2500, TimelineEvent::kFirstToken, 0, "", ""});
  const nlohmann::json j = TimelinesToJson(memd.FindClient(42), "memd");
  EXPECT_EQ(j["timelines"][0]["events"][1]["event"], "granted");
  EXPECT_EQ(j["timelines"][0]["events"][1]["source"], "memd");
  auto back = TimelinesFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].client_request, 42u);
  EXPECT_EQ((*back)[0].client, 9u);
  EXPECT_EQ((*back)[0].events[1].pages, 6u);
  auto w = TimelinesFromJson(TimelinesToJson(worker.FindClient(42), "worker/0"));
  ASSERT_TRUE(w.ok());
  back->push_back((*w)[0]);
  const std::string table = RenderTimelineTable(*back);
  // Relative to the earliest event (the worker's submit at 900 us), in time order across both sources.
  const size_t submitted = table.find("+0.000       submitted");
  const size_t admitted = table.find("+0.100       admitted");
  const size_t granted = table.find("+0.600       granted");
  const size_t first = table.find("+1.600       first_token");
  ASSERT_NE(submitted, std::string::npos) << table;
  ASSERT_NE(admitted, std::string::npos) << table;
  ASSERT_NE(granted, std::string::npos) << table;
  ASSERT_NE(first, std::string::npos) << table;
  EXPECT_LT(submitted, admitted);
  EXPECT_LT(admitted, granted);
  EXPECT_LT(granted, first);
  EXPECT_EQ(RenderTimelineTable({}), "no events\n");
  nlohmann::json bad = j;
  bad["timelines"][0]["events"][0]["event"] = "exploded";
  EXPECT_EQ(TimelinesFromJson(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TimelinesFromJson(nlohmann::json::object()).status().code(), absl::StatusCode::kInvalidArgument);
}

wire::WorkerStatsReplyT SampleReply() {
  wire::WorkerStatsReplyT r;
  r.gpu = 2;
  r.mode = "adaptive";
  r.census_direct = 10;
  r.census_hot = 4;
  r.census_host = 3;
  r.bytes_recovered = 1728;
  r.tokens_generated = 17;
  r.token_commits_deferred = 6;
  r.token_records_refused = 1;
  r.finished_requests = 5;
  r.failed_requests = 3;
  auto f = std::make_unique<wire::ReasonCountT>();
  f->reason = "unavailable";
  f->count = 3;
  r.failures.push_back(std::move(f));
  r.ttft = std::make_unique<wire::LatencyHistogramT>();
  r.ttft->bounds_us = {1000};
  r.ttft->counts = {1, 1};
  r.ttft->sum_us = 2500;
  return r;
}

TEST(WorkerMetrics, RendersEveryCounterWithItsGpuLabel) {
  const std::string text = RenderWorkerPrometheus(SampleReply());
  for (const char* line :
       {"dhs_worker_census_rows_total{gpu=\"2\",tier=\"direct\"} 10\n",
        "dhs_worker_census_rows_total{gpu=\"2\",tier=\"hot\"} 4\n",
        "dhs_worker_census_rows_total{gpu=\"2\",tier=\"host\"} 3\n", "dhs_worker_recovered_rows_total{gpu=\"2\"} 3\n",
        "dhs_worker_recovered_bytes_total{gpu=\"2\"} 1728\n", "dhs_worker_tokens_total{gpu=\"2\"} 17\n",
        "dhs_worker_token_commits_deferred_total{gpu=\"2\"} 6\n",
        "dhs_worker_token_records_refused_total{gpu=\"2\"} 1\n",
        "dhs_worker_requests_finished_total{gpu=\"2\"} 5\n",
        "dhs_worker_requests_failed_total{gpu=\"2\",reason=\"unavailable\"} 3\n",
        "dhs_worker_info{gpu=\"2\",mode=\"adaptive\",speculate=\"off\"} 1\n",
        "# TYPE dhs_worker_ttft_seconds histogram\n", "dhs_worker_ttft_seconds_bucket{gpu=\"2\",le=\"0.001000\"} 1\n",
        "dhs_worker_ttft_seconds_bucket{gpu=\"2\",le=\"+Inf\"} 2\n", "dhs_worker_ttft_seconds_sum{gpu=\"2\"} 0.002500\n",
        "dhs_worker_ttft_seconds_count{gpu=\"2\"} 2\n",
        // absent histograms render as the default buckets, empty
        "dhs_worker_tpot_seconds_count{gpu=\"2\"} 0\n", "dhs_worker_admission_wait_seconds_count{gpu=\"2\"} 0\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nin:\n" << text;
  }
}

TEST(WorkerMetrics, JsonAndTableCarryTheSameFigures) {
  const nlohmann::json j = WorkerStatsToJson(SampleReply());
  EXPECT_EQ(j["gpu"], 2);
  EXPECT_EQ(j["tokens_generated"], 17);
  EXPECT_EQ(j["token_commits_deferred"], 6);
  EXPECT_EQ(j["token_records_refused"], 1);
  EXPECT_EQ(j["failures"]["unavailable"], 3);
  EXPECT_EQ(j["ttft"]["count"], 2);
  EXPECT_EQ(j["ttft"]["sum_us"], 2500);
  EXPECT_EQ(j["tpot"]["count"], 0);
  const std::string table = WorkerStatsToTable(SampleReply());
  EXPECT_NE(table.find("tokens_generated             17\n"), std::string::npos) << table;
  EXPECT_NE(table.find("failed[unavailable]          3\n"), std::string::npos) << table;
  EXPECT_NE(table.find("ttft                         count 2, sum 0.002500 s, mean 0.001250 s\n"), std::string::npos)
      << table;
}

// RenderWorkerPrometheus is written in phases (issue 23): the page they make together is well formed (each family
// typed once, before its samples, its samples together) and holds exactly the families docs/operations.md lists
// under "Worker metrics", in that order.
TEST(WorkerMetrics, PageIsWellFormedWithEveryDocumentedFamilyOnce) {
  absl::StatusOr<std::vector<std::string>> families =
      testing::PrometheusFamilies(RenderWorkerPrometheus(SampleReply()));
  ASSERT_TRUE(families.ok()) << families.status();
  const std::vector<std::string> documented = {
      "dhs_worker_info", "dhs_worker_epoch", "dhs_worker_capacity_pages", "dhs_worker_page_bytes",
      "dhs_worker_census_rows_total", "dhs_worker_recovered_rows_total", "dhs_worker_recovered_bytes_total",
      "dhs_worker_tokens_total", "dhs_worker_token_commits_deferred_total",
      "dhs_worker_token_records_refused_total", "dhs_worker_requests_active", "dhs_worker_requests_waiting",
      "dhs_worker_requests_waiting_peak", "dhs_worker_requests_finished_total", "dhs_worker_requests_failed_total",
      "dhs_worker_requests_resumed_total", "dhs_worker_resume_rows_total", "dhs_worker_resume_seconds_max",
      "dhs_worker_resumed_outputs_waiting", "dhs_worker_resumed_outputs_dropped_total", "dhs_worker_reclaims_total",
      "dhs_worker_pages_total", "dhs_worker_prefix_blocks_total", "dhs_worker_submits_refused_total",
      "dhs_worker_client_queued_bytes", "dhs_worker_client_queued_peak_bytes",
      "dhs_worker_client_streams_refused_total", "dhs_worker_client_replies_dropped_total",
      "dhs_worker_spec_rounds_total", "dhs_worker_spec_round_tokens_total", "dhs_worker_spec_proposed_total",
      "dhs_worker_spec_accepted_total", "dhs_worker_ttft_seconds", "dhs_worker_tpot_seconds",
      "dhs_worker_admission_wait_seconds"};
  EXPECT_EQ(*families, documented);
}

// The reader itself refuses what a scraper would: a family typed twice, a sample outside its family's block, a
// histogram sample of the wrong name, a page without its last newline.
TEST(PrometheusText, RefusesMalformedPages) {
  EXPECT_EQ(*testing::PrometheusFamilies("# TYPE a gauge\na 1\n# TYPE b counter\nb{x=\"1\"} 2\n"),
            (std::vector<std::string>{"a", "b"}));
  for (const char* page : {"# TYPE a gauge\na 1\n# TYPE a gauge\na 2\n", "a 1\n# TYPE a gauge\n",
                           "# TYPE a gauge\n# TYPE b gauge\na 1\n", "# TYPE h histogram\nh 1\n",
                           "# TYPE a gauge\na one\n", "# TYPE a gauge\na 1"}) {
    EXPECT_FALSE(testing::PrometheusFamilies(page).ok()) << page;
  }
}

}  // namespace
}  // namespace dhs
