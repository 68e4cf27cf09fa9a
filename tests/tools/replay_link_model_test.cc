// tests/tools/replay_link_model_test.cc: dhs-replay's link-model options (issue 14; docs/link_model.md): parsed and
// resolved (pcie5 defaults, overrides, errors naming the option, refused with --connect), carried into the run
// settings, and echoed by the JSON report and the summary.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/replay/options.h"
#include "tools/replay/report.h"

namespace dhs::replay {
namespace {

using ::testing::HasSubstr;

CommandLine Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "dhs-replay");
  return ParseReplayCommandLine(static_cast<int>(args.size()), args.data());
}

TEST(ReplayLinkModel, OffByDefault) {
  CommandLine cl = Parse({});
  ASSERT_FALSE(cl.exit_code.has_value()) << cl.message;
  EXPECT_FALSE(cl.options.link_model.enabled);
}

TEST(ReplayLinkModel, Pcie5DefaultsAndOverrides) {
  CommandLine cl = Parse({"--link-model", "pcie5"});
  ASSERT_FALSE(cl.exit_code.has_value()) << cl.message;
  EXPECT_TRUE(cl.options.link_model.enabled);
  EXPECT_EQ(cl.options.link_model.host_to_device_gb_per_s, 55.0);
  EXPECT_EQ(cl.options.link_model.device_to_host_gb_per_s, 55.0);
  EXPECT_EQ(cl.options.link_model.latency_us, 5.0);
  cl = Parse({"--link-model", "pcie5", "--link-h2d-gb-per-s", "25", "--link-d2h-gb-per-s", "12.5",
              "--link-latency-us", "2"});
  ASSERT_FALSE(cl.exit_code.has_value()) << cl.message;
  EXPECT_EQ(cl.options.link_model.host_to_device_gb_per_s, 25.0);
  EXPECT_EQ(cl.options.link_model.device_to_host_gb_per_s, 12.5);
  EXPECT_EQ(cl.options.link_model.latency_us, 2.0);
}

TEST(ReplayLinkModel, BadValuesNameTheOption) {
  const std::pair<std::vector<const char*>, const char*> cases[] = {
      {{"--link-model", "nvlink"}, "--link-model"},
      {{"--link-latency-us", "3"}, "--link-model pcie5"},
      {{"--link-model", "pcie5", "--link-h2d-gb-per-s", "0"}, "--link-h2d-gb-per-s"},
      {{"--link-model", "pcie5", "--link-latency-us", "-1"}, "--link-latency-us"},
      {{"--link-model", "pcie5", "--connect", "ipc:///tmp/x.sock"}, "--link-model"},
  };
  for (const auto& [args, option] : cases) {
    CommandLine cl = Parse(args);
    ASSERT_TRUE(cl.exit_code.has_value()) << option;
    EXPECT_EQ(*cl.exit_code, 2);
    EXPECT_THAT(cl.message, HasSubstr(option));
  }
}

TEST(ReplayLinkModel, ReportEchoesIt) {
  CommandLine cl = Parse({"--link-model", "pcie5", "--link-latency-us", "2"});
  ASSERT_FALSE(cl.exit_code.has_value()) << cl.message;
  auto trace = LoadTrace(cl.options);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ReplayReport r;
  r.settings = MakeRunSettings(cl.options, *trace, "prefill");
  const nlohmann::json j = ReportToJson(r);
  const nlohmann::json& link = j["settings"]["link_model"];
  EXPECT_EQ(link["model"], "pcie5");
  EXPECT_EQ(link["host_to_device_gb_per_s"], 55.0);
  EXPECT_EQ(link["device_to_host_gb_per_s"], 55.0);
  EXPECT_EQ(link["latency_us"], 2.0);
  EXPECT_THAT(FormatSummary(r), HasSubstr("link model: host->device 55 GB/s, device->host 55 GB/s, 2 us per batch"));

  r.settings = MakeRunSettings(Parse({}).options, *trace, "prefill");
  const nlohmann::json off = ReportToJson(r)["settings"]["link_model"];
  EXPECT_EQ(off["model"], "off");
  EXPECT_TRUE(off["latency_us"].is_null());
  EXPECT_THAT(FormatSummary(r), ::testing::Not(HasSubstr("link model")));
}

}  // namespace
}  // namespace dhs::replay
