// StateDump rendering (the one shared pair dhsctl and the daemon use): views in JSON and table form, Prometheus.
#include <gtest/gtest.h>

#include <algorithm>

#include "memd/residency_manager.h"
#include "memd/state_dump.h"
#include "tests/common/prometheus_text.h"

namespace dhs::memd {
namespace {

using json = nlohmann::json;

// GPU 0: M = 10, M_res = 2. Request 1: 2 required + 3 history pages on GPU (optional-ready). Request 2 needs 7 with
// 3 lendable: Δ = 4 > a_1 = 3, so it waits without a reclaim.
class DumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ResidencyConfig c{.reserve_pages = 2, .host_pages = 8, .host_page_bytes = 4096, .reclaim_policy = "oldest-first"};
    mgr_ = std::move(*ResidencyManager::Create(c, [] { return int64_t{5000}; }));
    ASSERT_TRUE(mgr_->RegisterGpu(0, 10).ok());
    // lendable 8 -> 2 required, 3 optional-ready; slot 0 (the lowest free, chosen at the grant)
    ASSERT_TRUE(mgr_->Admit({.request = 1, .gpu = 0, .required_pages = 2, .history_pages = 3, .context_pages = 3}).ok());
    // lendable 3 -> Δ = 4 > a_1 = 3: waits, no reclaim, no slot yet
    ASSERT_TRUE(mgr_->Admit({.request = 2, .gpu = 0, .required_pages = 7}).ok());
    dump_ = mgr_->Dump();
  }
  std::unique_ptr<ResidencyManager> mgr_;
  StateDump dump_;
};

TEST_F(DumpTest, ParsesViews) {
  EXPECT_EQ(ParseDumpView("status")->kind, DumpView::Kind::kStatus);
  EXPECT_EQ(ParseDumpView("request 7")->request, 7u);
  EXPECT_EQ(ParseDumpView("pages 1")->gpu, 1u);
  EXPECT_EQ(ParseDumpView("queue")->kind, DumpView::Kind::kQueue);
  EXPECT_EQ(ParseDumpView("request").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDumpView("request x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDumpView("gpus 3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDumpView("bogus").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DumpTest, JsonViews) {
  auto gpus = DumpToJson(dump_, *ParseDumpView("gpus"));
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0]["M"], 10);
  EXPECT_EQ(gpus[0]["M_req"], 2);
  EXPECT_EQ(gpus[0]["M_opt"], 3);
  EXPECT_EQ(gpus[0]["M_res"], 2);
  EXPECT_EQ(gpus[0]["up"], true);
  EXPECT_EQ(gpus[0]["epoch"], 1);
  EXPECT_EQ(gpus[0]["free"], 5);
  EXPECT_EQ(gpus[0]["queued"], 1);
  auto r1 = DumpToJson(dump_, *ParseDumpView("request 1"));
  EXPECT_EQ(r1["state"], "admitted");
  EXPECT_EQ(r1["a_r"], 3);
  EXPECT_EQ(r1["host_coverage"], "0/3");
  EXPECT_EQ(r1["slot"], 0);
  EXPECT_EQ(r1["reclaim_rank"], 0);
  auto r2 = DumpToJson(dump_, *ParseDumpView("request 2"));
  EXPECT_EQ(r2["state"], "queued");
  EXPECT_EQ(r2["required_pages"], 7);
  EXPECT_EQ(r2["reclaim_rank"], -1);
  EXPECT_TRUE(r2["slot"].is_null());
  EXPECT_TRUE(DumpToJson(dump_, *ParseDumpView("request 9")).contains("error"));
  auto q = DumpToJson(dump_, *ParseDumpView("queue"));
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0]["request"], 2);
  auto pages = DumpToJson(dump_, *ParseDumpView("pages 0"));
  ASSERT_EQ(pages["pages"].size(), 10u);
  EXPECT_EQ(pages["pages"][0]["state"], "required");  // lowest pages go first: 0,1 required; 2,3,4 optional
  EXPECT_EQ(pages["pages"][2]["state"], "optional-ready");
  EXPECT_EQ(pages["pages"][2]["owner"], 1);
  EXPECT_TRUE(pages["pages"][9]["owner"].is_null());
  auto status = DumpToJson(dump_, *ParseDumpView("status"));
  EXPECT_EQ(status["policy"], "oldest-first");
  EXPECT_EQ(status["requests"], 2);
  EXPECT_EQ(status["host"]["pages"], 8);
}

// The `request N` view lists the history pages with a confirmed host copy and their host pages (those of the grant);
// the `requests` view does not.
TEST_F(DumpTest, RequestViewListsConfirmedHostCopies) {
  std::vector<PageIndex> host_pages;  // request 1's host pages, from its grant
  for (const Order& o : mgr_->DrainOrders()) {
    if (const auto* g = std::get_if<GrantOrder>(&o); g != nullptr && g->request == 1) host_pages = g->host_pages;
  }
  ASSERT_EQ(host_pages.size(), 3u);
  EXPECT_EQ(DumpToJson(mgr_->Dump(), *ParseDumpView("request 1"))["host_copies"], json::array());
  const uint32_t written[] = {0, 2};
  ASSERT_TRUE(mgr_->OnHostCopyWritten(1, written, {}, true).ok());
  const json r1 = DumpToJson(mgr_->Dump(), *ParseDumpView("request 1"));
  EXPECT_EQ(r1["host_copies"], json::array({json::array({0, host_pages[0]}), json::array({2, host_pages[2]})}));
  EXPECT_EQ(r1["host_coverage"], "2/3");
  EXPECT_FALSE(DumpToJson(mgr_->Dump(), *ParseDumpView("requests"))[0].contains("host_copies"));
  // The core keeps no records: the daemon fills record_tokens (null without one).
  EXPECT_TRUE(r1["record_tokens"].is_null());
  RequestDump with_record = mgr_->Dump().requests.front();
  with_record.record_tokens = 5;
  StateDump one;
  one.requests.push_back(with_record);
  EXPECT_EQ(DumpToJson(one, *ParseDumpView("request " + std::to_string(with_record.request)))["record_tokens"], 5);
  EXPECT_FALSE(DumpToJson(one, *ParseDumpView("requests"))[0].contains("record_tokens"));
}

TEST_F(DumpTest, TableViews) {
  const std::string gpus = DumpToTable(dump_, *ParseDumpView("gpus"));
  EXPECT_EQ(gpus,
            "GPU        M   M_req   M_opt   M_res    free pending   ready  queued reclaim STATE  EPOCH   RING  STAGE\n"
            "0         10       2       3       2       5       0       3       1       0 up         1      0      0\n");
  const std::string reqs = DumpToTable(dump_, *ParseDumpView("requests"));
  EXPECT_NE(reqs.find("1           0     0 admitted       2     3       0/3     0     0     0     0\n"), std::string::npos)
      << reqs;
  EXPECT_NE(reqs.find("2           0     - queued         7     0       0/0     0    -1     0     0\n"), std::string::npos)
      << reqs;
  const std::string pages = DumpToTable(dump_, *ParseDumpView("pages 0"));
  EXPECT_NE(pages.find("2      optional-ready   1"), std::string::npos) << pages;
  EXPECT_NE(pages.find("9      free             -"), std::string::npos) << pages;
  EXPECT_EQ(DumpToTable(dump_, *ParseDumpView("request 9")), "request 9: not found\n");
  EXPECT_EQ(DumpToTable(dump_, *ParseDumpView("queue")), "GPU  POSITION REQUEST \n0           0 2       \n");
  EXPECT_NE(DumpToTable(dump_, *ParseDumpView("status")).find("policy oldest-first, 2 requests"), std::string::npos);
}

TEST_F(DumpTest, ParsesPageOptions) {
  auto v = ParseDumpView("pages 0 from 3 count 4 runs");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->from, 3u);
  EXPECT_EQ(v->count, 4u);
  EXPECT_TRUE(v->runs);
  EXPECT_EQ(ParseDumpView("pages 0")->count, kDefaultPageRows);
  EXPECT_FALSE(ParseDumpView("pages 0")->runs);
  EXPECT_EQ(ParseDumpView("pages 0 count 65536")->count, kMaxPageRows);
  for (const char* bad : {"pages 0 count 0", "pages 0 count 65537", "pages 0 from", "pages 0 from x", "pages 0 bogus",
                          "pages 0 from 4294967296", "request 1 runs"}) {
    auto b = ParseDumpView(bad);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// The page rows of a scoped dump (what the daemon renders) are the slice of the full dump the view names.
TEST_F(DumpTest, PagesFromAndCount) {
  const DumpView view = *ParseDumpView("pages 0 from 3 count 4");
  const StateDump d = mgr_->Dump(DumpScopeOf(view));
  auto j = DumpToJson(d, view);
  ASSERT_EQ(j["pages"].size(), 4u) << j;
  EXPECT_EQ(j["M"], 10);
  EXPECT_EQ(j["from"], 3);
  EXPECT_EQ(j["next"], 7);
  for (int i = 0; i < 4; ++i) {
    const json want = DumpToJson(dump_, *ParseDumpView("pages 0"))["pages"][3 + i];
    EXPECT_EQ(j["pages"][i], want) << i;
  }
  EXPECT_EQ(DumpToTable(d, view),
            "PAGE   STATE            OWNER   \n"
            "3      optional-ready   1       \n"
            "4      optional-ready   1       \n"
            "5      free             -       \n"
            "6      free             -       \n"
            "... pages 7..9 of GPU 0 not shown (M = 10): --from 7 for the next rows, --runs for runs of pages\n");
  const DumpView tail = *ParseDumpView("pages 0 from 8");  // the last rows: no "not shown" line, next null
  auto t = DumpToJson(mgr_->Dump(DumpScopeOf(tail)), tail);
  ASSERT_EQ(t["pages"].size(), 2u);
  EXPECT_EQ(t["pages"][1]["page"], 9);
  EXPECT_TRUE(t["next"].is_null());
  const DumpView past = *ParseDumpView("pages 0 from 10");
  EXPECT_EQ(DumpToTable(mgr_->Dump(DumpScopeOf(past)), past),
            "GPU 0 has M = 10 pages: from 10 is beyond its last page\n");
}

// Runs: pages 0,1 required (request 1), 2..4 optional-ready (request 1), 5..9 free.
TEST_F(DumpTest, PageRuns) {
  const DumpView all = *ParseDumpView("pages 0 runs");
  const StateDump d = mgr_->Dump(DumpScopeOf(all));
  EXPECT_EQ(DumpToTable(d, all),
            "FIRST         COUNT STATE            OWNER   \n"
            "0                 2 required         1       \n"
            "2                 3 optional-ready   1       \n"
            "5                 5 free             -       \n");
  auto j = DumpToJson(d, all);
  ASSERT_EQ(j["runs"].size(), 3u);
  EXPECT_EQ(j["runs"][2], (json{{"first", 5}, {"count", 5}, {"state", "free"}, {"owner", nullptr}}));
  EXPECT_TRUE(j["next"].is_null());
  const DumpView two = *ParseDumpView("pages 0 from 3 count 1 runs");  // a run starting inside one
  auto t = DumpToJson(mgr_->Dump(DumpScopeOf(two)), two);
  ASSERT_EQ(t["runs"].size(), 1u);
  EXPECT_EQ(t["runs"][0], (json{{"first", 3}, {"count", 2}, {"state", "optional-ready"}, {"owner", 1}}));
  EXPECT_EQ(t["next"], 5);
}

// Each view's scoped dump renders exactly as the full dump does, and holds only what the view shows.
TEST_F(DumpTest, ScopedDumpsRenderAsTheFullDump) {
  for (const char* text : {"status", "gpus", "requests", "request 1", "request 2", "request 9", "queue"}) {
    const DumpView view = *ParseDumpView(text);
    const StateDump d = mgr_->Dump(DumpScopeOf(view));
    EXPECT_EQ(DumpToJson(d, view), DumpToJson(dump_, view)) << text;
    EXPECT_EQ(DumpToTable(d, view), DumpToTable(dump_, view)) << text;
    for (const GpuDump& g : d.gpus) EXPECT_TRUE(g.page_states.empty() && g.page_runs.empty()) << text;
  }
  EXPECT_TRUE(mgr_->Dump(DumpScopeOf(*ParseDumpView("status"))).requests.empty());
  EXPECT_EQ(mgr_->Dump(DumpScopeOf(*ParseDumpView("request 2"))).requests.size(), 1u);
}

// Issue 12: a node of 8 GPUs x 2.5M pages (an H200 at 55,296-byte pages). Request 100+g on GPU g holds pages 0..7
// (required) and 8..19 (optional-ready); the rest is free. Every view's answer is bounded and correct.
TEST(DumpAtScale, EveryViewIsBoundedAtEightGpusOf2500000Pages) {
  constexpr uint32_t kM = 2'500'000;
  ResidencyConfig c{.reserve_pages = 64, .host_pages = 1024, .host_page_bytes = 4096};
  auto mgr = std::move(*ResidencyManager::Create(c, [] { return int64_t{0}; }));
  for (GpuId g = 0; g < 8; ++g) {
    ASSERT_TRUE(mgr->RegisterGpu(g, kM).ok());
    ASSERT_TRUE(mgr->Admit({.request = 100 + g, .gpu = g, .required_pages = 8, .history_pages = 12,
                            .context_pages = 12}).ok());
  }
  auto size_of = [&](const char* text, size_t* json_bytes = nullptr) {
    const DumpView view = *ParseDumpView(text);
    const StateDump d = mgr->Dump(DumpScopeOf(view));
    if (json_bytes) *json_bytes = DumpToJson(d, view).dump(2).size();
    return DumpToTable(d, view).size();
  };
  size_t json_bytes = 0;
  for (const char* small : {"status", "gpus", "requests", "request 103", "queue"}) {
    EXPECT_LT(size_of(small, &json_bytes), 4096u) << small;
    EXPECT_LT(json_bytes, 8192u) << small;
  }
  const DumpView gpus = *ParseDumpView("gpus");
  auto g = DumpToJson(mgr->Dump(DumpScopeOf(gpus)), gpus);
  ASSERT_EQ(g.size(), 8u);
  EXPECT_EQ(g[7]["M"], kM);
  EXPECT_EQ(g[7]["M_req"], 8);
  EXPECT_EQ(g[7]["M_opt"], 12);
  EXPECT_EQ(g[7]["free"], kM - 20);
  // pages: 1000 rows by default (header + rows + the "not shown" line), 65536 at most.
  const std::string trailer =
      "... pages 1000..2499999 of GPU 5 not shown (M = 2500000): --from 1000 for the next rows, --runs for runs of "
      "pages\n";
  EXPECT_EQ(size_of("pages 5", &json_bytes), 33u + 1000 * 33 + trailer.size());  // rows of 6 + 16 + 8 columns
  const DumpView first = *ParseDumpView("pages 5");
  const std::string table = DumpToTable(mgr->Dump(DumpScopeOf(first)), first);
  EXPECT_TRUE(table.ends_with("999    free             -       \n" + trailer)) << table.substr(table.size() - 200);
  EXPECT_LT(json_bytes, 100'000u);
  EXPECT_LT(size_of("pages 5 count 65536"), 65537u * 40);
  const DumpView last = *ParseDumpView("pages 5 from 2499990");
  auto l = DumpToJson(mgr->Dump(DumpScopeOf(last)), last);
  ASSERT_EQ(l["pages"].size(), 10u);
  EXPECT_EQ(l["pages"][9], (json{{"page", kM - 1}, {"state", "free"}, {"owner", nullptr}}));
  const DumpView runs = *ParseDumpView("pages 5 runs");
  auto r = DumpToJson(mgr->Dump(DumpScopeOf(runs)), runs);
  EXPECT_EQ(r["runs"], (json{{{"first", 0}, {"count", 8}, {"state", "required"}, {"owner", 105}},
                             {{"first", 8}, {"count", 12}, {"state", "optional-ready"}, {"owner", 105}},
                             {{"first", 20}, {"count", kM - 20}, {"state", "free"}, {"owner", nullptr}}}));
  EXPECT_TRUE(r["next"].is_null());
}

TEST_F(DumpTest, Prometheus) {
  const std::string text = RenderPrometheus(dump_, mgr_->counters());
  EXPECT_NE(text.find("dhs_memd_gpu_pages{gpu=\"0\",kind=\"required\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dhs_memd_gpu_pages{gpu=\"0\",kind=\"optional\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("dhs_memd_gpu_pages{gpu=\"0\",kind=\"free\"} 5\n"), std::string::npos);
  EXPECT_NE(text.find("dhs_memd_gpu_up{gpu=\"0\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dhs_memd_gpu_epoch{gpu=\"0\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dhs_memd_queued_admissions{gpu=\"0\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("dhs_memd_grants_total 1\n"), std::string::npos);
  EXPECT_NE(text.find("dhs_memd_waits_total 1\n"), std::string::npos);
  EXPECT_NE(text.find("dhs_memd_host_pages{kind=\"total\"} 8\n"), std::string::npos);
}

// Issue 26: the cluster tier's counters (filled by the daemon) in the status and prefixes views and the metrics page,
// each family with a HELP line; nothing of it when the tier is not configured.
TEST_F(DumpTest, ClusterTierInViewsAndMetrics) {
  EXPECT_EQ(DumpToTable(dump_, *ParseDumpView("status")).find("cluster"), std::string::npos);
  EXPECT_EQ(RenderPrometheus(dump_, mgr_->counters()).find("cluster"), std::string::npos);
  EXPECT_FALSE(DumpToJson(dump_, *ParseDumpView("status")).contains("cluster"));
  ClusterDump c;
  c.configured = true;
  c.store = "redis://127.0.0.1:6399";
  c.health = "down";
  c.queue_depth = 3;
  c.queue_bytes = 300;
  c.published = 7;
  c.published_bytes = 700;
  c.shed = {{"queue_full", 0}, {"store_down", 5}};
  c.lookups = 11;
  c.hits = 4;
  c.hit_bytes = 4096;
  c.imported = 4;
  c.misses = {{"absent", 2}, {"timeout", 5}};
  c.bad_values = {{"checksum_mismatch", 0}};
  c.reachable = "no";
  StateDump d = dump_;
  d.cluster = c;
  const std::string status = DumpToTable(d, *ParseDumpView("status"));
  EXPECT_NE(status.find("cluster tier redis://127.0.0.1:6399 (down, reachable: no): queue 3 pages / 300 bytes; "
                        "published 7 pages / 700 bytes (0 failed), shed: store_down 5\n"), std::string::npos) << status;
  EXPECT_NE(status.find("cluster tier lookups: 11 pages, 4 hits (4096 bytes), 4 imported (0 bytes), misses: absent 2, "
                        "timeout 5\n"), std::string::npos) << status;
  EXPECT_NE(DumpToTable(d, *ParseDumpView("prefixes")).find("cluster tier lookups: 11 pages"), std::string::npos);
  const json j = DumpToJson(d, *ParseDumpView("status"));
  EXPECT_EQ(j["cluster"]["health"], "down");
  EXPECT_EQ(j["cluster"]["reachable"], "no");
  EXPECT_EQ(j["cluster"]["misses"]["timeout"], 5);
  EXPECT_EQ(DumpToJson(d, *ParseDumpView("prefixes"))["cluster"]["hits"], 4);
  DaemonCounters dc;
  dc.cluster = c;
  const std::string text = RenderPrometheus(dump_, mgr_->counters(), dc);
  const absl::StatusOr<std::vector<std::string>> families = testing::PrometheusFamilies(text);
  ASSERT_TRUE(families.ok()) << families.status();
  for (const char* want : {"dhs_memd_cluster_store_up 0\n", "dhs_memd_cluster_store_reachable 0\n", "dhs_memd_cluster_store_health{state=\"down\"} 1\n",
                           "dhs_memd_cluster_queue_pages 3\n", "dhs_memd_cluster_published_total 7\n",
                           "dhs_memd_cluster_shed_total{reason=\"store_down\"} 5\n",
                           "dhs_memd_cluster_hits_total 4\n", "dhs_memd_cluster_misses_total{reason=\"timeout\"} 5\n",
                           "# HELP dhs_memd_cluster_imported_total ", "# HELP dhs_memd_cluster_misses_total "}) {
    EXPECT_NE(text.find(want), std::string::npos) << want;
  }
  // Every cluster family has its HELP line.
  for (const std::string& family : *families) {
    if (family.starts_with("dhs_memd_cluster_")) {
      EXPECT_NE(text.find("# HELP " + family + " "), std::string::npos) << family;
    }
  }
}

// The worker's shape (issue 14; filled by the daemon from its Hello) in the status view: JSON "worker" with every
// field (null without one) and a line of the table; plan --live reads it back (tests/tools/planner_test.cc).
TEST_F(DumpTest, WorkerShapeInTheStatusView) {
  ASSERT_TRUE(mgr_->RegisterGpu(1, 20, 4, GpuDeclaration{4096, 40000, 20000}).ok());
  StateDump d = mgr_->Dump();
  ASSERT_EQ(d.gpus.size(), 2u);
  WorkerShape w;
  w.serving_mode = "hisparse";
  w.page_rows = 16;
  w.page_bytes = 4096;
  w.payload_sources = 2;
  w.index_producers = 1;
  w.index_key_bytes = 64;
  w.top_k = 8;
  w.hot_rows = 64;
  w.tail_rows = 32;
  w.fetched_rows_per_token = 2;
  w.request_slots = 4;
  w.drafter_window = 32;
  w.k_max = 4;
  w.draft_bytes_per_row = 1024;
  w.staging_arenas = 2;
  d.gpus[1].worker = w;
  const json status = DumpToJson(d, *ParseDumpView("status"));
  EXPECT_TRUE(status["gpus"][0]["worker"].is_null());
  const json& wj = status["gpus"][1]["worker"];
  EXPECT_EQ(wj.size(), 19u);
  EXPECT_EQ(wj["serving_mode"], "hisparse");
  EXPECT_EQ(wj["index_key_bytes"], 64);
  EXPECT_EQ(wj["fetched_rows_per_token"], 2);
  EXPECT_EQ(wj["k_max"], 4);
  EXPECT_EQ(wj["draft_bytes_per_row"], 1024);
  const std::string table = DumpToTable(d, *ParseDumpView("status"));
  EXPECT_NE(table.find("GPU 1 worker: hisparse, p 16, L_pay 2, L_idx 1 x 64 B keys, k 8, B 64, T 32, N 4, K_max 4, "
                       "W 32, chi 2, model unknown\n"),
            std::string::npos)
      << table;
  EXPECT_TRUE(status["gpus"][1]["model"].is_null()) << status.dump();  // 0: not said
  d.gpus[1].model_fingerprint = 0x0123456789abcdefull;  // issue 26: 16 hex digits, a string (a number would lose bits)
  EXPECT_EQ(DumpToJson(d, *ParseDumpView("status"))["gpus"][1]["model"], "0123456789abcdef");
  EXPECT_NE(DumpToTable(d, *ParseDumpView("status")).find("chi 2, model 0123456789abcdef\n"), std::string::npos);
  EXPECT_EQ(table.find("GPU 0 worker"), std::string::npos) << table;
}

// Speculation shares (issue 13) in every rendering: GPU 1's Hello declares draft rings of 4 * 10000 and staging of
// 4 * 5000 bytes (pages of 4096 bytes); request 3 holds a share of ceil(10000 / 4096) = 3 ring and ceil(5000 / 4096)
// = 2 staging pages in its 7 required pages; request 4 (4 required, no share) too.
TEST_F(DumpTest, SpeculationSharesInJsonTableAndPrometheus) {
  ASSERT_TRUE(mgr_->RegisterGpu(1, 20, 4, GpuDeclaration{4096, 40000, 20000}).ok());
  ASSERT_TRUE(mgr_->Admit({.request = 3, .gpu = 1, .required_pages = 7,
                           .speculation = SpeculationShare{3, 2, 10000, 5000}}).ok());
  ASSERT_TRUE(mgr_->Admit({.request = 4, .gpu = 1, .required_pages = 4}).ok());
  const StateDump d = mgr_->Dump();
  const json g1 = DumpToJson(d, *ParseDumpView("gpus"))[1];
  EXPECT_EQ(g1["M_req"], 11);
  EXPECT_EQ(g1["draft_ring_pages"], 3);
  EXPECT_EQ(g1["staging_pages"], 2);
  EXPECT_EQ(g1["draft_ring_bytes"], 10000);
  EXPECT_EQ(g1["staging_bytes"], 5000);
  EXPECT_EQ(g1["declared_draft_ring_bytes"], 40000);
  EXPECT_EQ(g1["declared_staging_bytes"], 20000);
  const json r3 = DumpToJson(d, *ParseDumpView("request 3"));
  EXPECT_EQ(r3["required_pages"], 7);
  EXPECT_EQ(r3["draft_ring_pages"], 3);
  EXPECT_EQ(r3["draft_ring_bytes"], 10000);
  EXPECT_EQ(r3["staging_pages"], 2);
  EXPECT_EQ(r3["staging_bytes"], 5000);
  EXPECT_EQ(DumpToJson(d, *ParseDumpView("request 4"))["draft_ring_pages"], 0);
  const std::string gpus = DumpToTable(d, *ParseDumpView("gpus"));
  EXPECT_NE(gpus.find("1         20      11       0       2       9       0       0       0       0 up         1      3"
                      "      2\n"),
            std::string::npos)
      << gpus;
  EXPECT_NE(gpus.find("GPU 1 speculation: draft ring 3 pages = 10000 bytes in use (40000 declared), staging 2 pages = "
                      "5000 bytes in use (20000 declared)\n"),
            std::string::npos)
      << gpus;
  EXPECT_EQ(gpus.find("GPU 0 speculation"), std::string::npos) << gpus;  // none declared or held
  const std::string r3_text = DumpToTable(d, *ParseDumpView("request 3"));
  EXPECT_NE(r3_text.find("admitted       7     0       0/0     0    -1     3     2\n"), std::string::npos) << r3_text;
  EXPECT_NE(r3_text.find("speculation: draft ring 3 pages = 10000 bytes, staging 2 pages = 5000 bytes\n"),
            std::string::npos)
      << r3_text;
  EXPECT_EQ(DumpToTable(d, *ParseDumpView("request 4")).find("speculation"), std::string::npos);
  const std::string text = RenderPrometheus(d, mgr_->counters());
  for (const char* line : {"dhs_memd_gpu_speculation_pages{gpu=\"1\",kind=\"draft_ring\"} 3\n",
                           "dhs_memd_gpu_speculation_pages{gpu=\"1\",kind=\"staging\"} 2\n",
                           "dhs_memd_gpu_speculation_bytes{gpu=\"1\",kind=\"draft_ring\"} 10000\n",
                           "dhs_memd_gpu_speculation_bytes{gpu=\"1\",kind=\"staging\"} 5000\n",
                           "dhs_memd_gpu_declared_speculation_bytes{gpu=\"1\",kind=\"draft_ring\"} 40000\n",
                           "dhs_memd_gpu_declared_speculation_bytes{gpu=\"1\",kind=\"staging\"} 20000\n",
                           "dhs_memd_gpu_speculation_pages{gpu=\"0\",kind=\"draft_ring\"} 0\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
  }
}

// RenderPrometheus is written in phases (issue 23): the page they make together is well formed (each family typed
// once, before its samples, its samples together) and holds exactly the families docs/operations.md lists under
// memd's metrics (as a set: the page's order is its own).
TEST_F(DumpTest, PrometheusPageIsWellFormedWithEveryDocumentedFamilyOnce) {
  absl::StatusOr<std::vector<std::string>> families =
      dhs::testing::PrometheusFamilies(RenderPrometheus(dump_, mgr_->counters()));
  ASSERT_TRUE(families.ok()) << families.status();
  std::vector<std::string> documented = {
      "dhs_memd_gpu_pages", "dhs_memd_gpu_speculation_pages", "dhs_memd_gpu_speculation_bytes",
      "dhs_memd_gpu_declared_speculation_bytes", "dhs_memd_queued_admissions", "dhs_memd_reclaims_in_flight",
      "dhs_memd_host_pages", "dhs_memd_requests", "dhs_memd_workers", "dhs_memd_gpu_up", "dhs_memd_gpu_epoch",
      "dhs_memd_events_total", "dhs_memd_event_errors_total", "dhs_memd_ticks_total", "dhs_memd_admissions_total",
      "dhs_memd_grants_total", "dhs_memd_waits_total", "dhs_memd_rejects_total", "dhs_memd_completions_total",
      "dhs_memd_reclaims_started_total", "dhs_memd_reclaims_retired_total", "dhs_memd_reclaims_failed_total",
      "dhs_memd_pages_retired_total", "dhs_memd_backups_ordered_total", "dhs_memd_backups_failed_total",
      "dhs_memd_populates_ordered_total", "dhs_memd_populates_failed_total", "dhs_memd_stale_reports_total",
      "dhs_memd_host_writes_total", "dhs_memd_host_write_failures_total", "dhs_memd_deferred_backups_total",
      "dhs_memd_keeps_lost_total", "dhs_memd_fences_total", "dhs_memd_reregistrations_total",
      "dhs_memd_requests_interrupted_total", "dhs_memd_admissions_fenced_total", "dhs_memd_host_pages_lost_total",
      "dhs_memd_resumes_total", "dhs_memd_host_pages_resumed_total", "dhs_memd_requests_adopted_total",
      "dhs_memd_host_pages_adopted_total", "dhs_memd_host_pages_held_total", "dhs_memd_requests_reported_total",
      "dhs_memd_reports_refused_total", "dhs_memd_workers_lost_total", "dhs_memd_fenced_refused_total",
      "dhs_memd_messages_total", "dhs_memd_hellos_total", "dhs_memd_send_failures_total",
      "dhs_memd_refused_peers_total", "dhs_memd_foreign_request_ids_total"};
  std::vector<std::string> rendered = *families;
  std::sort(rendered.begin(), rendered.end());
  std::sort(documented.begin(), documented.end());
  EXPECT_EQ(rendered, documented);
}

}  // namespace
}  // namespace dhs::memd
