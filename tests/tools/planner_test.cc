// tests/tools/planner_test.cc: the capacity planner (tools/planner; brief §6, §8; docs/planner.md). Every figure of
// both presets at several contexts against arithmetic written out here by hand (not the library's helpers), the
// description file, bad input naming its field, and `dhsctl plan` run as a process (table, --json, errors).
#include "tools/planner/planner.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>
#include <unistd.h>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dhs::planner {
namespace {

using ::testing::HasSubstr;

PlanInput Input(const char* preset, uint64_t context) {
  PlanInput in;
  in.topology = *Preset(preset);
  in.context_tokens = context;
  return in;
}

// glm5-like, brief §8: L_pay 78, L_idx 21, k 2048, d_KV 576, d_idx 132, p 64, B 4096, tail 64; drafter W 2048,
// K_max 8, 12,288 draft bytes/row, χ 4; N 64 (docs/planner.md); metadata 16 bytes per hot slot and producer.
TEST(PlannerGlm5, Context100000) {
  auto p = Compute(Input("glm5-like", 100000));
  ASSERT_TRUE(p.ok()) << p.status();
  // n_pad: 100000 / 64 = 1562.5 -> 1563 pages -> 100032 tokens.
  EXPECT_EQ(p->padded_context_tokens, 100032u);
  EXPECT_EQ(p->metadata_bytes_per_session, 16ull * 4096 * 21);  // 1,376,256
  // resident: 100032 * (78 * 576 + 21 * 132) = 100032 * 47700.
  EXPECT_EQ(p->resident_bytes_per_session, 4771526400ull);
  EXPECT_EQ(p->resident_bytes_per_session, 100032ull * (78 * 576 + 21 * 132));
  // hierarchical: 100032 * 21 * 132 + (4096 + 64) * 78 * 576 + 1376256 = 277288704 + 186900480 + 1376256.
  EXPECT_EQ(p->hierarchical_bytes_per_session, 465565440ull);
  // R_d = 64 * ceil((2048 + 8 + 63) / 64) = 64 * ceil(2119 / 64) = 64 * 34.
  EXPECT_EQ(p->draft_ring_rows, 2176u);
  EXPECT_EQ(p->draft_ring_bytes_per_session, 2176ull * 12288);     // 26,738,688
  EXPECT_EQ(p->draft_ring_bytes_per_gpu, 64ull * 2176 * 12288);    // 1,711,276,032
  // M_stage = 4 * 64 * 8 * 2048 * 576; one arena per payload layer: 78 * 64 * 8 * 2048 * 576.
  EXPECT_EQ(p->staging_bytes_per_gpu, 2415919104ull);
  EXPECT_EQ(p->staging_bytes_per_session, 37748736ull);            // 4 * 8 * 2048 * 576
  EXPECT_EQ(p->staging_bytes_one_arena_per_layer, 47110422528ull);
  // with a drafter: 465565440 + 26738688 + 37748736.
  EXPECT_EQ(p->hierarchical_with_drafter_bytes_per_session, 530052864ull);
  EXPECT_DOUBLE_EQ(p->resident_over_hierarchical, 4771526400.0 / 465565440.0);
  EXPECT_DOUBLE_EQ(p->resident_over_hierarchical_with_drafter, 4771526400.0 / 530052864.0);
  // host (payload rows, then the index keys: the resume extension of §8): 100032 * (78 * 576 + 21 * 132).
  EXPECT_EQ(p->host_bytes_per_session, 100032ull * (78 * 576 + 21 * 132));  // 4,771,526,400
  // fetch at μ = 0.1: 0.1 * 21 selections * 2048 * (78 / 21) follower layers * 576 = 0.1 * 92,012,544.
  EXPECT_NEAR(p->host_bytes_per_token, 9201254.4, 1e-6);
  EXPECT_FALSE(p->sessions_per_gpu.has_value());
  EXPECT_FALSE(p->sessions_per_host.has_value());
  EXPECT_FALSE(p->speculation.has_value());
}

TEST(PlannerGlm5, ShortContextsRoundUpToWholePages) {
  // n = 1 -> n_pad 64; n = 128 -> 128 (exact); n = 129 -> 192.
  for (auto [n, n_pad] : {std::pair<uint64_t, uint64_t>{1, 64}, {128, 128}, {129, 192}}) {
    auto p = Compute(Input("glm5-like", n));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->padded_context_tokens, n_pad);
    EXPECT_EQ(p->resident_bytes_per_session, n_pad * 47700) << n;
    EXPECT_EQ(p->hierarchical_bytes_per_session, n_pad * 2772 + 4160ull * 44928 + 1376256) << n;
    EXPECT_EQ(p->host_bytes_per_session, n_pad * (44928 + 2772)) << n;
    // Draft ring and staging do not depend on the context (brief §6).
    EXPECT_EQ(p->draft_ring_rows, 2176u);
    EXPECT_EQ(p->hierarchical_with_drafter_bytes_per_session,
              n_pad * 2772 + 4160ull * 44928 + 1376256 + 26738688 + 37748736) << n;
  }
  // At n = 64 the hierarchy costs more than resident serving: 64 * 47700 = 3,052,800 < 190,457,088.
  auto p = Compute(Input("glm5-like", 64));
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(p->resident_over_hierarchical, 3052800.0 / (64.0 * 2772 + 186900480 + 1376256));
}

TEST(PlannerGlm5, SessionsPerGpuAndHostAndSpeculation) {
  PlanInput in = Input("glm5-like", 131072);  // exact: 2048 pages
  in.hbm_bytes = 100ull << 30;               // 107,374,182,400 bytes
  in.host_bytes = 1ull << 40;                // 1,099,511,627,776 bytes
  in.miss_rate = 0.05;
  in.tpot_base_ms = 30;
  in.tpot_spec_ms = 20;
  auto p = Compute(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->padded_context_tokens, 131072u);
  // resident 131072 * 47700 = 6,252,134,400 -> floor(107374182400 / 6252134400) = 17.
  EXPECT_EQ(p->resident_bytes_per_session, 6252134400ull);
  // hierarchical 131072 * 2772 + 186900480 + 1376256 = 363,331,584 + 188,276,736 = 551,608,320 -> 194.
  EXPECT_EQ(p->hierarchical_bytes_per_session, 551608320ull);
  // with drafter 551,608,320 + 26,738,688 + 37,748,736 = 616,095,744 -> 174.
  EXPECT_EQ(p->hierarchical_with_drafter_bytes_per_session, 616095744ull);
  ASSERT_TRUE(p->sessions_per_gpu.has_value());
  EXPECT_EQ(p->sessions_per_gpu->resident, 17u);
  EXPECT_EQ(p->sessions_per_gpu->hierarchical, 194u);
  EXPECT_EQ(p->sessions_per_gpu->hierarchical_with_drafter, 174u);
  // host 131072 * (44928 + 2772) = 6,252,134,400 -> floor(1099511627776 / 6252134400) = 175.
  EXPECT_EQ(p->host_bytes_per_session, 131072ull * (44928 + 2772));
  ASSERT_TRUE(p->sessions_per_host.has_value());
  EXPECT_EQ(*p->sessions_per_host, 175u);
  EXPECT_NEAR(p->host_bytes_per_token, 0.05 * 78 * 2048 * 576, 1e-6);  // 4,600,627.2
  // §6: 174 / 194 = 0.8969 > 20 / 30 = 0.6667: pays; break-even TPOT_spec = 30 * 174 / 194.
  ASSERT_TRUE(p->speculation.has_value());
  EXPECT_EQ(p->speculation->sessions_base, 194u);
  EXPECT_EQ(p->speculation->sessions_spec, 174u);
  EXPECT_DOUBLE_EQ(p->speculation->sessions_ratio, 174.0 / 194.0);
  EXPECT_DOUBLE_EQ(p->speculation->tpot_ratio, 20.0 / 30.0);
  EXPECT_DOUBLE_EQ(p->speculation->break_even_tpot_spec_ms, 30.0 * (174.0 / 194.0));
  EXPECT_TRUE(p->speculation->pays);
  // TPOT_spec 28 ms: 28 / 30 = 0.9333 > 0.8969: does not pay.
  in.tpot_spec_ms = 28;
  p = Compute(in);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->speculation->pays);
}

TEST(PlannerGlm5, SpeculationAtExactBreakEvenDoesNotPay) {
  // The brief's test is strict (>). Budget for exactly 2 base and 1 spec sessions at n = 64:
  // hierarchical 64 * 2772 + 186900480 + 1376256 = 188,454,144; with drafter + 64,487,424 = 252,941,568.
  PlanInput in = Input("glm5-like", 64);
  in.hbm_bytes = 2ull * 188454144;  // 376,908,288: 2 hierarchical, 1 with drafter (< 2 * 252,941,568)
  in.tpot_base_ms = 10;
  in.tpot_spec_ms = 5;              // ratio 0.5 == 1 / 2
  auto p = Compute(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sessions_per_gpu->hierarchical, 2u);
  EXPECT_EQ(p->sessions_per_gpu->hierarchical_with_drafter, 1u);
  EXPECT_FALSE(p->speculation->pays);
  in.tpot_spec_ms = 4.999;
  p = Compute(in);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->speculation->pays);
}

// dsv4flash-like, brief §8: 8 sources, 8 index producers, k 512, d_KV 288, d_idx 132, p 64; B 1024 (2k), tail 64,
// one row per selection, 8 selections per token, χ 1, drafter as glm5-like, N 64 (docs/planner.md).
TEST(PlannerDsv4Flash, Context100000) {
  auto p = Compute(Input("dsv4flash-like", 100000));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->padded_context_tokens, 100032u);
  EXPECT_EQ(p->metadata_bytes_per_session, 16ull * 1024 * 8);                         // 131,072
  EXPECT_EQ(p->resident_bytes_per_session, 100032ull * (8 * 288 + 8 * 132));          // 100032 * 3360
  EXPECT_EQ(p->resident_bytes_per_session, 336107520ull);
  // 100032 * 1056 + (1024 + 64) * 2304 + 131072 = 105,633,792 + 2,506,752 + 131,072.
  EXPECT_EQ(p->hierarchical_bytes_per_session, 108271616ull);
  EXPECT_EQ(p->draft_ring_rows, 2176u);
  EXPECT_EQ(p->draft_ring_bytes_per_session, 26738688ull);
  EXPECT_EQ(p->draft_ring_bytes_per_gpu, 64ull * 26738688);
  EXPECT_EQ(p->staging_bytes_per_session, 1ull * 8 * 512 * 288);                      // 1,179,648
  EXPECT_EQ(p->staging_bytes_per_gpu, 1ull * 64 * 8 * 512 * 288);                      // 75,497,472
  EXPECT_EQ(p->staging_bytes_one_arena_per_layer, 8ull * 64 * 8 * 512 * 288);          // 603,979,776
  EXPECT_EQ(p->hierarchical_with_drafter_bytes_per_session, 108271616ull + 26738688 + 1179648);
  EXPECT_DOUBLE_EQ(p->resident_over_hierarchical, 336107520.0 / 108271616.0);
  EXPECT_EQ(p->host_bytes_per_session, 100032ull * (8 * 288 + 8 * 132));              // 336,107,520
  EXPECT_NEAR(p->host_bytes_per_token, 0.1 * 8 * 512 * 1 * 288, 1e-6);                // 117,964.8
}

TEST(PlannerDsv4Flash, OverridesAndBudgets) {
  PlanInput in = Input("dsv4flash-like", 65);  // n_pad 128
  in.topology.hot_rows = 2048;
  in.topology.slots = 16;
  in.hbm_bytes = 1000000000;
  in.host_bytes = 1000000;
  auto p = Compute(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->padded_context_tokens, 128u);
  EXPECT_EQ(p->metadata_bytes_per_session, 16ull * 2048 * 8);                         // 262,144
  EXPECT_EQ(p->resident_bytes_per_session, 128ull * 3360);                            // 430,080
  EXPECT_EQ(p->hierarchical_bytes_per_session, 128ull * 1056 + 2112ull * 2304 + 262144);  // 5,263,360
  EXPECT_EQ(p->draft_ring_bytes_per_gpu, 16ull * 2176 * 12288);
  EXPECT_EQ(p->staging_bytes_per_gpu, 16ull * 8 * 512 * 288);
  EXPECT_EQ(p->staging_bytes_one_arena_per_layer, 8ull * 16 * 8 * 512 * 288);
  // 1e9 / 430080 = 2325; 1e9 / 5263360 = 189; 1e9 / (5263360 + 26738688 + 1179648 = 33181696) = 30.
  EXPECT_EQ(p->sessions_per_gpu->resident, 2325u);
  EXPECT_EQ(p->sessions_per_gpu->hierarchical, 189u);
  EXPECT_EQ(p->sessions_per_gpu->hierarchical_with_drafter, 30u);
  // host 128 * (2304 + 1056) = 430,080 -> 1e6 / 430080 = 2.
  EXPECT_EQ(*p->sessions_per_host, 2u);
}

TEST(PlannerInput, BadFieldsAreNamed) {
  struct Case {
    std::function<void(PlanInput&)> edit;
    const char* field;
  };
  const Case cases[] = {
      {[](PlanInput& i) { i.context_tokens = 0; }, "context_tokens"},
      {[](PlanInput& i) { i.topology.page_rows = 0; }, "page_rows"},
      {[](PlanInput& i) { i.topology.payload_layers = 0; }, "payload_layers"},
      {[](PlanInput& i) { i.topology.index_producers = 0; }, "index_producers"},
      {[](PlanInput& i) { i.topology.top_k = 0; }, "top_k"},
      {[](PlanInput& i) { i.topology.payload_row_bytes = 0; }, "payload_row_bytes"},
      {[](PlanInput& i) { i.topology.index_key_bytes = 0; }, "index_key_bytes"},
      {[](PlanInput& i) { i.topology.slots = 0; }, "slots"},
      {[](PlanInput& i) { i.topology.k_max = 0; }, "k_max"},
      {[](PlanInput& i) { i.topology.live_payload_layers = 79; }, "live_payload_layers"},
      {[](PlanInput& i) { i.topology.hot_rows = 2047; }, "hot_rows"},
      {[](PlanInput& i) { i.topology.tail_rows = 65; }, "tail_rows"},
      {[](PlanInput& i) { i.topology.selections_per_token = 0; }, "selections_per_token"},
      {[](PlanInput& i) { i.topology.rows_per_selection = -1; }, "rows_per_selection"},
      {[](PlanInput& i) { i.miss_rate = 1.5; }, "miss_rate"},
      {[](PlanInput& i) { i.miss_rate = std::nan(""); }, "miss_rate"},
      {[](PlanInput& i) { i.hbm_bytes = 0; }, "hbm_bytes"},
      {[](PlanInput& i) { i.host_bytes = 0; }, "host_bytes"},
      {[](PlanInput& i) { i.hbm_bytes = 1ull << 40; i.tpot_base_ms = 10; }, "tpot_spec_ms"},
      {[](PlanInput& i) { i.hbm_bytes = 1ull << 40; i.tpot_spec_ms = 10; }, "tpot_base_ms"},
      {[](PlanInput& i) { i.hbm_bytes = 1ull << 40; i.tpot_base_ms = 0; i.tpot_spec_ms = 1; }, "tpot_base_ms"},
      {[](PlanInput& i) { i.tpot_base_ms = 10; i.tpot_spec_ms = 5; }, "hbm_bytes"},
  };
  for (const Case& c : cases) {
    PlanInput in = Input("glm5-like", 1000);
    c.edit(in);
    auto p = Compute(in);
    ASSERT_FALSE(p.ok()) << c.field;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(c.field)) << p.status();
  }
}

TEST(PlannerInput, BudgetTooSmallAndOverflow) {
  PlanInput in = Input("glm5-like", 64);
  in.hbm_bytes = 188454143;  // one byte short of one hierarchical session (188,454,144)
  auto p = Compute(in);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("188454144"));
  in.hbm_bytes = 188454144;  // exactly one
  p = Compute(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sessions_per_gpu->hierarchical, 1u);
  EXPECT_EQ(p->sessions_per_gpu->resident, 188454144u / 3052800);  // 61

  in = Input("glm5-like", 64);
  in.host_bytes = 64 * 44928 - 1;
  p = Compute(in);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("host_bytes"));

  in = Input("glm5-like", uint64_t{1} << 60);
  p = Compute(in);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange);
}

TEST(PlannerInput, UnknownPreset) {
  auto t = Preset("llama");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("glm5-like"));
}

constexpr const char* kDsv4Description = R"({
  "name": "mine", "payload_layers": 8, "index_producers": 8, "top_k": 512, "payload_row_bytes": 288,
  "index_key_bytes": 132, "page_rows": 64, "hot_rows": 1024, "tail_rows": 64, "selections_per_token": 8,
  "rows_per_selection": 1, "drafter_window": 2048, "k_max": 8, "draft_bytes_per_row": 12288,
  "live_payload_layers": 1, "slots": 64
})";

TEST(PlannerDescription, SameFiguresAsThePreset) {
  auto t = TopologyFromJson(kDsv4Description);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name, "mine");
  EXPECT_EQ(t->metadata_bytes_per_hot_slot, 16u);  // the default
  PlanInput in;
  in.topology = *t;
  in.context_tokens = 100000;
  auto p = Compute(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->hierarchical_bytes_per_session, 108271616ull);
  EXPECT_EQ(p->resident_bytes_per_session, 336107520ull);
}

TEST(PlannerDescription, ErrorsNameTheKey) {
  nlohmann::json base = nlohmann::json::parse(kDsv4Description);
  auto expect_error = [](const nlohmann::json& doc, const char* key) {
    auto t = TopologyFromJson(doc.dump());
    ASSERT_FALSE(t.ok()) << key;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(key)) << t.status();
  };
  for (const char* key : {"payload_layers", "top_k", "page_rows", "slots", "rows_per_selection", "k_max"}) {
    nlohmann::json doc = base;
    doc.erase(key);
    expect_error(doc, key);
  }
  nlohmann::json doc = base;
  doc["page_rows"] = -64;
  expect_error(doc, "page_rows");
  doc = base;
  doc["speculation"] = 1;
  expect_error(doc, "speculation");
  doc = base;
  doc["top_k"] = 1.5;
  expect_error(doc, "top_k");
  doc = base;
  doc["hot_rows"] = "1024";
  expect_error(doc, "hot_rows");
  doc = base;
  doc["miss_rates"] = 0.1;
  expect_error(doc, "miss_rates");
  doc = base;
  doc["name"] = 3;
  expect_error(doc, "name");
  EXPECT_FALSE(TopologyFromJson("{").ok());
  EXPECT_FALSE(TopologyFromJson("[1, 2]").ok());
  // Well-formed but out of range: Validate names it.
  doc = base;
  doc["page_rows"] = 0;
  auto t = TopologyFromJson(doc.dump());
  ASSERT_TRUE(t.ok());
  PlanInput in;
  in.topology = *t;
  in.context_tokens = 10;
  EXPECT_THAT(std::string(Compute(in).status().message()), HasSubstr("page_rows"));
}

TEST(PlannerOutput, JsonCarriesEveryFigure) {
  PlanInput in = Input("glm5-like", 100000);
  in.hbm_bytes = 100ull << 30;
  auto p = Compute(in);
  ASSERT_TRUE(p.ok());
  const nlohmann::json j = PlanToJson(*p);
  EXPECT_EQ(j["resident_bytes_per_session"], 4771526400ull);
  EXPECT_EQ(j["hierarchical_bytes_per_session"], 465565440ull);
  EXPECT_EQ(j["hierarchical_with_drafter_bytes_per_session"], 530052864ull);
  EXPECT_EQ(j["draft_ring_rows"], 2176u);
  EXPECT_EQ(j["draft_ring_bytes_per_gpu"], 1711276032ull);
  EXPECT_EQ(j["staging_bytes_per_gpu"], 2415919104ull);
  EXPECT_EQ(j["staging_bytes_one_arena_per_layer"], 47110422528ull);
  // 107374182400 / 4771526400 = 22; / 465565440 = 230; / 530052864 = 202.
  EXPECT_EQ(j["sessions_per_gpu"]["resident"], 22u);
  EXPECT_EQ(j["sessions_per_gpu"]["hierarchical"], 230u);
  EXPECT_EQ(j["sessions_per_gpu"]["hierarchical_with_drafter"], 202u);
  EXPECT_EQ(j["host_bytes_per_session"], 100032ull * (78 * 576 + 21 * 132));  // payload rows and index keys
  EXPECT_TRUE(j["sessions_per_host"].is_null());
  EXPECT_NEAR(j["host_bytes_per_token"].get<double>(), 9201254.4, 1e-6);
  EXPECT_TRUE(j["speculation"].is_null());
  EXPECT_EQ(j["input"]["topology"]["name"], "glm5-like");
  EXPECT_EQ(j["input"]["context_tokens"], 100000u);
  const std::string table = PlanToTable(*p);
  EXPECT_THAT(table, HasSubstr("4771526400 B"));
  EXPECT_THAT(table, HasSubstr("resident 22, hierarchical 230, with drafter 202"));
}

// ---- dhsctl plan as a process ----

std::pair<int, std::string> RunDhsctl(const std::string& args) {
  const std::string cmd = std::string(DHSCTL_BIN) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(DhsctlPlan, JsonWithoutMemd) {
  // --run-dir points nowhere: plan needs no memd.
  auto [rc, out] = RunDhsctl("--run-dir /nonexistent plan --preset glm5-like --context 100000 --hbm-bytes 107374182400 "
                       "--host-bytes 1099511627776 --tpot-base-ms 30 --tpot-spec-ms 20 --json");
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["resident_bytes_per_session"], 4771526400ull);
  EXPECT_EQ(j["hierarchical_bytes_per_session"], 465565440ull);
  EXPECT_EQ(j["hierarchical_with_drafter_bytes_per_session"], 530052864ull);
  EXPECT_EQ(j["draft_ring_rows"], 2176u);
  EXPECT_EQ(j["draft_ring_bytes_per_gpu"], 1711276032ull);
  EXPECT_EQ(j["staging_bytes_per_gpu"], 2415919104ull);
  EXPECT_EQ(j["staging_bytes_one_arena_per_layer"], 47110422528ull);
  EXPECT_EQ(j["sessions_per_gpu"]["hierarchical"], 230u);
  EXPECT_EQ(j["host_bytes_per_session"], 100032ull * (78 * 576 + 21 * 132));
  EXPECT_EQ(j["sessions_per_host"], 1099511627776ull / 4771526400ull);  // 230
  EXPECT_NEAR(j["host_bytes_per_token"].get<double>(), 9201254.4, 1e-6);
  // 202 / 230 = 0.878 > 20 / 30.
  EXPECT_EQ(j["speculation"]["pays"], true);
  // The app-level --json works as well.
  auto [rc2, out2] = RunDhsctl("--json plan --preset dsv4flash-like --context 100000 --hot-rows 2048 --slots 16");
  ASSERT_EQ(rc2, 0) << out2;
  const nlohmann::json j2 = nlohmann::json::parse(out2, nullptr, false);
  EXPECT_EQ(j2["hierarchical_bytes_per_session"], 100032ull * 1056 + 2112ull * 2304 + 16ull * 2048 * 8);
  EXPECT_EQ(j2["staging_bytes_per_gpu"], 16ull * 8 * 512 * 288);
}

TEST(DhsctlPlan, TableAndDescriptionFile) {
  const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                     ("planner_test_" + std::to_string(getpid()) + ".json");
  std::ofstream(file) << kDsv4Description;
  auto [rc, out] = RunDhsctl("plan --file " + file.string() + " --context 100000");
  std::filesystem::remove(file);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("108271616 B"));
  EXPECT_THAT(out, HasSubstr("mine"));
}

// ComputeLive (dhsctl plan --live) on hand-made live states. Topology: glm5-like with p = 64, L_pay = 78,
// d_KV = 576, L_idx = 21, d_idx = 132: GPU page = 64 * 78 * 576 = 2875392 bytes, host page (memd's pool page) =
// 64 * (78 * 576 + 21 * 132) = 3052800 bytes. Context 100000 -> n_pad 100032 -> 1563 host pages per session.
// Required GPU pages as workerd declares them (SessionRequiredPages): ceil((4096 + 64) / 64) = 65 hot + tail, index
// keys ceil(100000 * 21 * 132 / 2875392) = ceil(96.4) = 97, the draft ring ceil(2176 * 12288 / 2875392) =
// ceil(9.3) = 10 and the staging share ceil(4 * 8 * 2048 * 576 / 2875392) = ceil(13.1) = 14: 186 pages.
TEST(LivePlan, SessionsFromFreeReclaimableSlotsAndHost) {
  PlanInput in;
  in.topology = *Preset("glm5-like");
  in.context_tokens = 100000;
  const Plan plan = *Compute(in);
  ASSERT_EQ(plan.hierarchical_bytes_per_session, 465565440u);
  LiveState s;
  s.page_bytes = 3052800;
  s.host_reusable_pages = 10 * 1563 + 5;  // 10 sessions by host
  // GPU 0: free 1000 - M_res 40 = 960 lendable + 100 reclaimable + 20 reclaiming - 162 queued = 918 -> 4 sessions
  // (4 * 186 = 744, 5 * 186 = 930); slots 64 - 10 used - 1 queued = 53.
  s.gpus.push_back({.gpu = 0, .pages = 4000, .reserve_pages = 40, .free_pages = 1000, .reclaimable_pages = 100,
                    .reclaiming_pages = 20, .slots = 64, .slots_used = 10, .queued = 1, .queued_required_pages = 162,
                    .queued_host_pages = 1563});
  // GPU 1: 3000 - 0 = 3000 pages -> 16 by pages, but slots 4 - 2 = 2 -> 2 sessions.
  s.gpus.push_back({.gpu = 1, .pages = 4000, .free_pages = 3000, .slots = 4, .slots_used = 2});
  // GPU 2: unlimited slots, free below the reserve: 0 pages -> 0 sessions.
  s.gpus.push_back({.gpu = 2, .pages = 4000, .reserve_pages = 40, .free_pages = 30});
  const LivePlan l = *ComputeLive(plan, s);
  EXPECT_EQ(l.required_pages_per_session, 186u);
  EXPECT_EQ(l.speculation_pages_per_session, 10u + 14);
  EXPECT_EQ(l.host_pages_per_session, 1563u);
  ASSERT_EQ(l.gpus.size(), 3u);
  EXPECT_EQ(l.gpus[0].available_pages, 918u);
  EXPECT_EQ(l.gpus[0].free_slots, std::optional<uint64_t>(53));
  EXPECT_EQ(l.gpus[0].sessions, 4u);
  EXPECT_EQ(l.gpus[1].sessions, 2u);
  EXPECT_EQ(l.gpus[2].available_pages, 0u);
  EXPECT_EQ(l.gpus[2].free_slots, std::nullopt);
  EXPECT_EQ(l.gpus[2].sessions, 0u);
  EXPECT_EQ(l.host_available_pages, 9u * 1563 + 5);  // the queued admission's context pages come first
  EXPECT_EQ(l.sessions_by_host, 9u);
  EXPECT_EQ(l.sessions_now, 6u);  // min(4 + 2 + 0, 9)
  s.host_reusable_pages = 1563 * 5;  // host-bound: (5 - 1 queued) = 4 sessions
  EXPECT_EQ(ComputeLive(plan, s)->sessions_now, 4u);

  EXPECT_EQ(ComputeLive(plan, s)->gpu_page_bytes, 2875392u);
  s.page_bytes = 2875392;  // the GPU page: not memd's pool page (a host page)
  EXPECT_EQ(ComputeLive(plan, s).status().code(), absl::StatusCode::kFailedPrecondition);
  s.page_bytes = 3052800;
  s.gpus.clear();
  EXPECT_EQ(ComputeLive(plan, s).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(LiveStateFromStatusJson("{\"gpus\": []}").status().code(), absl::StatusCode::kInvalidArgument);
}

// A fenced GPU (issue 11: its worker died or hung) admits nothing: the live plan leaves it out; an up one is read.
TEST(LivePlan, FencedGpusAreLeftOut) {
  const std::string up = R"({"gpu": 1, "up": true, "epoch": 2, "M": 100, "M_res": 0, "free": 100, "reclaimable": 0,
      "reclaiming": 0, "slots": 4, "slots_used": 0, "queued": 0, "queued_required": 0, "queued_host": 0})";
  const std::string fenced = R"({"gpu": 0, "up": false, "epoch": 1, "M": 0, "M_res": 0, "free": 0, "reclaimable": 0,
      "reclaiming": 0, "slots": 0, "slots_used": 0, "queued": 0, "queued_required": 0, "queued_host": 0})";
  auto s = LiveStateFromStatusJson(R"({"host": {"page_bytes": 4096, "reusable": 10}, "gpus": [)" + fenced + "," + up +
                                   "]}");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->gpus.size(), 1u);
  EXPECT_EQ(s->gpus[0].gpu, 1u);
  EXPECT_EQ(s->gpus[0].pages, 100u);
}

// A worker's declared shape (its Hello, as memd's `status` view shows it) -> topology -> plan and live figures, all
// by hand. The worker: adaptive, p = 16, L_pay = 3 sources, GPU page 7680 bytes (d_KV = 7680 / (16 * 3) = 160),
// L_idx = 1 with 64-byte keys (host page 16 * (3 * 160 + 64) = 8704 bytes), k = 32, B = 192, T = 32, N = 8, 3 rows
// fetched per selected position; speculating: W = 64, K_max = 4, 1024-byte draft rows, R_d = 16 * ceil((64 + 4 + 15)
// / 16) = 96, ring totals 8 * 96 * 1024 = 786432, χ = 2 arenas, staging 2 * 8 * 4 * 32 * 160 = 327680.
WorkerShape SpeculatingWorker() {
  WorkerShape w;
  w.serving_mode = "adaptive";
  w.page_rows = 16;
  w.page_bytes = 7680;
  w.host_page_bytes = 8704;
  w.payload_sources = 3;
  w.index_producers = 1;
  w.index_key_bytes = 64;
  w.top_k = 32;
  w.hot_rows = 192;
  w.tail_rows = 32;
  w.fetched_rows_per_token = 3;
  w.request_slots = 8;
  w.drafter_window = 64;
  w.k_max = 4;
  w.draft_bytes_per_row = 1024;
  w.draft_ring_rows = 96;
  w.draft_ring_bytes = 786432;
  w.staging_bytes = 327680;
  w.staging_arenas = 2;
  return w;
}

TEST(LivePlan, TopologyFromTheWorkersShapeHandComputed) {
  auto t = TopologyFromWorker(SpeculatingWorker(), "w");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->payload_layers, 3u);
  EXPECT_EQ(t->payload_row_bytes, 160u);
  EXPECT_EQ(t->index_producers, 1u);
  EXPECT_EQ(t->index_key_bytes, 64u);
  EXPECT_EQ(t->metadata_bytes_per_hot_slot, 0u);
  EXPECT_DOUBLE_EQ(t->selections_per_token, 1.0);
  EXPECT_DOUBLE_EQ(t->rows_per_selection, 3.0);
  EXPECT_EQ(t->live_payload_layers, 2u);
  EXPECT_EQ(t->slots, 8u);
  EXPECT_TRUE(t->speculation);
  PlanInput in;
  in.topology = *t;
  in.context_tokens = 1000;
  const Plan plan = *Compute(in);
  EXPECT_EQ(plan.padded_context_tokens, 1008u);                   // 63 pages of 16
  EXPECT_EQ(plan.hierarchical_bytes_per_session, 1008u * 64 + (192 + 32) * 3 * 160);  // 64512 + 107520
  EXPECT_EQ(plan.draft_ring_rows, 96u);
  EXPECT_EQ(plan.draft_ring_bytes_per_session, 96u * 1024);       // = the worker's 786432 / 8
  EXPECT_EQ(plan.staging_bytes_per_session, 2u * 4 * 32 * 160);   // = the worker's 327680 / 8
  EXPECT_EQ(plan.draft_ring_bytes_per_gpu, 786432u);
  EXPECT_EQ(plan.staging_bytes_per_gpu, 327680u);

  // Live: ceil((192 + 32) / 16) = 14 + ceil(1000 * 64 / 7680) = ceil(8.33) = 9 -> 23; the draft ring
  // ceil(98304 / 7680) = 13 and staging ceil(40960 / 7680) = 6 -> 19 more: 42 pages. Host: 63 pages per session.
  LiveState s;
  s.page_bytes = 8704;
  s.host_reusable_pages = 63 * 10;
  // GPU 0: (300 - 10) + 20 = 310 available -> floor(310 / 42) = 7 (294; 8 would take 336); 8 free slots.
  s.gpus.push_back({.gpu = 0, .pages = 400, .reserve_pages = 10, .free_pages = 300, .reclaimable_pages = 20,
                    .slots = 8});
  s.gpus.push_back({.gpu = 1, .pages = 400, .free_pages = 400, .slots = 8});  // left out with options.gpu = 0
  auto l = ComputeLive(plan, s, {.gpu = 0});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->required_pages_per_session, 42u);
  EXPECT_EQ(l->speculation_pages_per_session, 19u);
  EXPECT_EQ(l->host_pages_per_session, 63u);
  ASSERT_EQ(l->gpus.size(), 1u);
  EXPECT_EQ(l->gpus[0].available_pages, 310u);
  EXPECT_EQ(l->gpus[0].sessions, 7u);
  EXPECT_EQ(l->sessions_now, 7u);
  // Resident mode: the whole context ceil(1000 / 16) = 63 instead of hot + tail (14; issue 27: resident keeps no hot
  // cache) + 9 keys + 19 speculation = 91 pages: floor(310 / 91) = 3.
  auto r = ComputeLive(plan, s, {.resident = true, .gpu = 0});
  EXPECT_EQ(r->required_pages_per_session, 91u);
  EXPECT_EQ(r->sessions_now, 3u);
  EXPECT_EQ(ComputeLive(plan, s, {.gpu = 5}).status().code(), absl::StatusCode::kNotFound);

  // Without speculation (--speculate off: K_max, W, draft row, χ and the totals 0): 23 pages, every drafter figure 0.
  WorkerShape off = SpeculatingWorker();
  off.k_max = off.drafter_window = off.draft_ring_rows = off.staging_arenas = 0;
  off.draft_bytes_per_row = off.draft_ring_bytes = off.staging_bytes = 0;
  in.topology = *TopologyFromWorker(off, "w");
  EXPECT_FALSE(in.topology.speculation);
  const Plan plain = *Compute(in);
  EXPECT_EQ(plain.draft_ring_rows, 0u);
  EXPECT_EQ(plain.staging_bytes_per_session, 0u);
  EXPECT_EQ(plain.hierarchical_with_drafter_bytes_per_session, plain.hierarchical_bytes_per_session);
  EXPECT_EQ(ComputeLive(plain, s, {.gpu = 0})->required_pages_per_session, 23u);
  EXPECT_EQ(ComputeLive(plain, s, {.gpu = 0})->sessions_now, 8u);  // floor(310 / 23) = 13, 8 free slots

  // Errors: no shape declared (an older workerd), a page that is not p * L_pay * d_KV.
  EXPECT_EQ(TopologyFromWorker(WorkerShape{}, "w").status().code(), absl::StatusCode::kFailedPrecondition);
  WorkerShape odd = SpeculatingWorker();
  odd.page_bytes = 7681;
  EXPECT_EQ(TopologyFromWorker(odd, "w").status().code(), absl::StatusCode::kInvalidArgument);
}

// memd's "worker" object (memd/state_dump.cc renders it) parses back into the shape; a GPU without one has none.
TEST(LivePlan, WorkerShapeFromMemdsStatusJson) {
  const std::string worker = R"({"serving_mode": "adaptive", "page_rows": 16, "page_bytes": 7680,
      "host_page_bytes": 8704, "payload_sources": 3, "index_producers": 1, "index_key_bytes": 64, "top_k": 32,
      "hot_rows": 192, "tail_rows": 32, "fetched_rows_per_token": 3, "request_slots": 8, "drafter_window": 64,
      "k_max": 4, "draft_bytes_per_row": 1024, "draft_ring_rows": 96, "draft_ring_bytes": 786432,
      "staging_bytes": 327680, "staging_arenas": 2})";
  const std::string gpu = R"({"gpu": 0, "up": true, "M": 100, "M_res": 0, "free": 100, "reclaimable": 0,
      "reclaiming": 0, "slots": 8, "slots_used": 0, "queued": 0, "queued_required": 0, "queued_host": 0, "worker": )";
  auto s = LiveStateFromStatusJson(R"({"host": {"page_bytes": 8704, "reusable": 10}, "gpus": [)" + gpu + worker +
                                   "}, " + gpu + "null}]}");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->gpus.size(), 2u);
  ASSERT_TRUE(s->gpus[0].worker.has_value());
  const WorkerShape want = SpeculatingWorker();
  const WorkerShape& got = *s->gpus[0].worker;
  EXPECT_EQ(got.serving_mode, want.serving_mode);
  EXPECT_EQ(got.page_bytes, want.page_bytes);
  EXPECT_EQ(got.host_page_bytes, want.host_page_bytes);
  EXPECT_EQ(got.fetched_rows_per_token, want.fetched_rows_per_token);
  EXPECT_EQ(got.draft_bytes_per_row, want.draft_bytes_per_row);
  EXPECT_EQ(got.staging_bytes, want.staging_bytes);
  EXPECT_EQ(got.staging_arenas, want.staging_arenas);
  EXPECT_FALSE(s->gpus[1].worker.has_value());
  auto bad = LiveStateFromStatusJson(R"({"host": {"page_bytes": 8704, "reusable": 10}, "gpus": [)" + gpu +
                                     R"({"serving_mode": "adaptive"}}]})");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("page_rows"));
}

// workerd's models as presets (`--preset workerd:glm5-like`): workerd's glm5-like (workerd/model/config.cc: 7 payload
// sources of d_KV = 4 * (128 + 16) = 576 bytes, 2 index producers of 4 * 32 = 128-byte keys, k = 32, window 0, the
// producers driving 4 and 3 payload layers) at workerd's default sizes (p = 64, N = 8, B = max(64, 4 * (32 + 0)) =
// 128, T = 2 * 64 = 128, speculation off), through dhsctl. Context 1000 -> n_pad 1024.
TEST(DhsctlPlan, WorkerdPresetIsWorkerdsModelAtItsDefaultSizes) {
  auto [rc, out] = RunDhsctl("--json plan --preset workerd:glm5-like --context 1000");
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  const nlohmann::json& t = j["input"]["topology"];
  EXPECT_EQ(t["name"], "workerd:glm5-like");
  EXPECT_EQ(t["payload_layers"], 7);
  EXPECT_EQ(t["payload_row_bytes"], 576);
  EXPECT_EQ(t["index_producers"], 2);
  EXPECT_EQ(t["index_key_bytes"], 128);
  EXPECT_EQ(t["top_k"], 32);
  EXPECT_EQ(t["page_rows"], 64);
  EXPECT_EQ(t["hot_rows"], 128);
  EXPECT_EQ(t["tail_rows"], 128);
  EXPECT_EQ(t["slots"], 8);
  EXPECT_EQ(t["speculation"], false);
  EXPECT_DOUBLE_EQ(t["rows_per_selection"].get<double>(), 3.5);  // (4 + 3) / 2
  EXPECT_EQ(j["hierarchical_bytes_per_session"], 1024 * 2 * 128 + (128 + 128) * 7 * 576);
  EXPECT_EQ(j["draft_ring_bytes_per_session"], 0);
  // workerd's dsv4flash-like: 3 sources of 4 * (64 + 8) = 288 bytes; 5 layers with an indexer (3 write, 2 reindex),
  // each fetching its own source only: 5 selections of 1 row; B = max(64, 4 * (16 + 4)) = 80.
  auto [rc_d, out_d] = RunDhsctl("--json plan --preset workerd:dsv4flash-like --context 1000");
  ASSERT_EQ(rc_d, 0) << out_d;
  const nlohmann::json d = nlohmann::json::parse(out_d)["input"]["topology"];
  EXPECT_EQ(d["payload_layers"], 3);
  EXPECT_EQ(d["payload_row_bytes"], 288);
  EXPECT_EQ(d["index_producers"], 5);
  EXPECT_DOUBLE_EQ(d["selections_per_token"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(d["rows_per_selection"].get<double>(), 1.0);
  EXPECT_EQ(d["hot_rows"], 80);
  auto [rc2, out2] = RunDhsctl("plan --preset workerd:nope --context 1000");
  EXPECT_EQ(rc2, 2) << out2;
  EXPECT_THAT(out2, HasSubstr("--preset"));
}

TEST(DhsctlPlan, Errors) {
  auto [rc, out] = RunDhsctl("plan --preset glm5-like --context 0");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("context_tokens"));
  std::tie(rc, out) = RunDhsctl("plan --preset glm5-like --context -5");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("--context"));
  std::tie(rc, out) = RunDhsctl("plan --preset nope --context 10");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("--preset"));
  std::tie(rc, out) = RunDhsctl("plan --context 10");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("--preset"));
  std::tie(rc, out) = RunDhsctl("plan --preset glm5-like --file x.json --context 10");
  EXPECT_EQ(rc, 2);
  std::tie(rc, out) = RunDhsctl("plan --preset glm5-like --context 10 --gpu 1");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("--gpu needs --live"));
  std::tie(rc, out) = RunDhsctl("--run-dir /nonexistent plan --context 10 --live");
  EXPECT_EQ(rc, 1);  // the worker's shape needs a running memd
  std::tie(rc, out) = RunDhsctl("--run-dir /nonexistent plan --preset glm5-like --context 10 --live");
  EXPECT_EQ(rc, 1);  // --live needs a running memd (tests/memd/memd_process_test.cc runs it against one)
  EXPECT_THAT(out, HasSubstr("memd is not running"));
  std::tie(rc, out) = RunDhsctl("plan --preset glm5-like --context 64 --hbm-bytes 1000");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("hbm_bytes"));
  std::tie(rc, out) = RunDhsctl("plan --file /nonexistent/x.json --context 10");
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(out, HasSubstr("cannot read"));
}

}  // namespace
}  // namespace dhs::planner
