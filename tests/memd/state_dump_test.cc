// StateDump rendering (the one shared pair dhsctl and the daemon use): views in JSON and table form, Prometheus.
#include <gtest/gtest.h>

#include "memd/residency_manager.h"
#include "memd/state_dump.h"

namespace dhs::memd {
namespace {

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

TEST_F(DumpTest, TableViews) {
  const std::string gpus = DumpToTable(dump_, *ParseDumpView("gpus"));
  EXPECT_EQ(gpus,
            "GPU        M   M_req   M_opt   M_res    free pending   ready  queued reclaim STATE  EPOCH\n"
            "0         10       2       3       2       5       0       3       1       0 up         1\n");
  const std::string reqs = DumpToTable(dump_, *ParseDumpView("requests"));
  EXPECT_NE(reqs.find("1           0     0 admitted       2     3       0/3     0     0\n"), std::string::npos) << reqs;
  EXPECT_NE(reqs.find("2           0     - queued         7     0       0/0     0    -1\n"), std::string::npos) << reqs;
  const std::string pages = DumpToTable(dump_, *ParseDumpView("pages 0"));
  EXPECT_NE(pages.find("2      optional-ready   1"), std::string::npos) << pages;
  EXPECT_NE(pages.find("9      free             -"), std::string::npos) << pages;
  EXPECT_EQ(DumpToTable(dump_, *ParseDumpView("request 9")), "request 9: not found\n");
  EXPECT_EQ(DumpToTable(dump_, *ParseDumpView("queue")), "GPU  POSITION REQUEST \n0           0 2       \n");
  EXPECT_NE(DumpToTable(dump_, *ParseDumpView("status")).find("policy oldest-first, 2 requests"), std::string::npos);
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

}  // namespace
}  // namespace dhs::memd
