// tests/tools/vocabulary_test.cc (issue 23, "one list per vocabulary"): each vocabulary is one list, owned by the
// component that defines it, and the programs that use it ask that list:
// - reclaim policy names (memd/reclaim_policy.h): every name makes the policy of that name, an unknown one is refused
//   naming them all; the default is one of them;
// - model preset names (workerd/model/config.h): every name gives the model of that name, the default is the first;
// - serving modes (workerd/serving_mode.h): name <-> enum both ways for every mode, an unknown name refused;
// - the daemons' flag lists (memd/memd_flags.h, workerd/worker_flags.h): one entry per key and per flag, choices from
//   the owners' lists, and AddDaemonFlag gives the daemon's CLI11 option the list's range and choices (what dhs-node
//   checks too, tests/tools/node_config_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/cli_flags.h"
#include "memd/memd_flags.h"
#include "memd/reclaim_policy.h"
#include "workerd/model/config.h"
#include "workerd/serving_mode.h"
#include "workerd/worker_flags.h"

namespace dhs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Vocabulary, ReclaimPolicyNamesMakeTheirPolicies) {
  EXPECT_THAT(memd::ReclaimPolicyNames(), ElementsAre("oldest-first", "newest-first", "largest-first"));
  for (const std::string& name : memd::ReclaimPolicyNames()) {
    absl::StatusOr<std::unique_ptr<memd::ReclaimPolicy>> policy = memd::MakeReclaimPolicy(name);
    ASSERT_TRUE(policy.ok()) << name << ": " << policy.status();
    EXPECT_EQ((*policy)->name(), name);
  }
  const absl::Status unknown = memd::MakeReclaimPolicy("random").status();
  EXPECT_TRUE(absl::IsInvalidArgument(unknown));
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("known: oldest-first, newest-first, largest-first"));
  EXPECT_EQ(memd::kDefaultReclaimPolicy, "largest-first");  // memd/README.md: chosen by measurement
}

TEST(Vocabulary, PresetNamesGiveTheirModels) {
  EXPECT_THAT(model::PresetNames(), ElementsAre("dsv4flash-like", "glm5-like", "bench-wide"));
  for (const std::string& name : model::PresetNames()) {
    absl::StatusOr<model::ModelConfig> config = model::PresetConfig(name);
    ASSERT_TRUE(config.ok()) << name << ": " << config.status();
    EXPECT_EQ(config->preset, name);
  }
  EXPECT_EQ(model::kDefaultPreset, "dsv4flash-like");
  const absl::Status unknown = model::PresetConfig("glm6-like").status();
  EXPECT_TRUE(absl::IsNotFound(unknown));
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("known: dsv4flash-like, glm5-like, bench-wide"));
}

TEST(Vocabulary, ServingModesBothWays) {
  EXPECT_THAT(WorkerModeNames(), ElementsAre("resident", "hisparse", "adaptive"));
  for (WorkerMode mode : {WorkerMode::kResident, WorkerMode::kHisparse, WorkerMode::kAdaptive}) {
    absl::StatusOr<WorkerMode> parsed = ParseWorkerMode(WorkerModeName(mode));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, mode);
  }
  EXPECT_EQ(WorkerModeList(), "resident, hisparse or adaptive");  // memd's refusal of a Hello names them so
  EXPECT_EQ(WorkerModeName(static_cast<WorkerMode>(9)), "unknown");
  const absl::Status unknown = ParseWorkerMode("Adaptive").status();  // exact: the wire text (Hello.serving_mode)
  EXPECT_TRUE(absl::IsInvalidArgument(unknown));
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("resident, hisparse, adaptive"));
}

void ExpectOneEntryPerKeyAndFlag(std::span<const DaemonFlag> flags) {
  std::set<std::string_view> keys, names;
  for (const DaemonFlag& f : flags) {
    EXPECT_TRUE(keys.insert(f.key).second) << "key " << f.key << " twice";
    EXPECT_TRUE(names.insert(f.flag).second) << "flag " << f.flag << " twice";
    EXPECT_TRUE(f.flag.starts_with("--")) << f.flag;
    EXPECT_EQ(f.kind == DaemonFlag::kChoice, f.choices != nullptr) << f.key;
    if (f.kind == DaemonFlag::kUint || f.kind == DaemonFlag::kSize) EXPECT_LE(f.min, f.max) << f.key;
  }
}

TEST(Vocabulary, DaemonFlagListsHaveOneEntryPerKeyAndFlagAndAskTheOwnersLists) {
  ExpectOneEntryPerKeyAndFlag(memd::kMemdFlags);
  ExpectOneEntryPerKeyAndFlag(kWorkerFlags);
  EXPECT_EQ(FindDaemonFlag(memd::kMemdFlags, "--reclaim-policy")->choices(), memd::ReclaimPolicyNames());
  EXPECT_EQ(FindDaemonFlag(kWorkerFlags, "--mode")->choices(), WorkerModeNames());
  EXPECT_EQ(FindDaemonFlag(kWorkerFlags, "--preset")->choices(), model::PresetNames());
  EXPECT_EQ(FindDaemonFlag(kWorkerFlags, "--hbm-budget")->key, "hbm_budget_bytes");
  EXPECT_EQ(FindDaemonFlag(kWorkerFlags, "--no-such-flag"), nullptr);
}

// AddDaemonFlag: the daemon's option takes the list's range and choices (workerd --slots is [1, 4096]; memd
// --reclaim-policy one of memd's policies).
TEST(Vocabulary, AddDaemonFlagChecksTheListsRangeAndChoices) {
  const auto parse = [](std::vector<std::string> args) {
    CLI::App app;
    uint32_t slots = 8;
    std::string policy, mode;
    AddDaemonFlag(app, kWorkerFlags, "--slots", slots, "request slots N");
    AddDaemonFlag(app, kWorkerFlags, "--mode", mode, "mode");
    AddDaemonFlag(app, memd::kMemdFlags, "--reclaim-policy", policy, "policy");
    std::reverse(args.begin(), args.end());
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      return std::string(e.what());
    }
    return std::string("ok slots=") + std::to_string(slots) + " policy=" + policy + " mode=" + mode;
  };
  EXPECT_EQ(parse({"--slots", "4096", "--reclaim-policy", "oldest-first", "--mode", "hisparse"}),
            "ok slots=4096 policy=oldest-first mode=hisparse");
  EXPECT_THAT(parse({"--slots", "4097"}), HasSubstr("must be an integer in [1, 4096], got '4097'"));
  EXPECT_THAT(parse({"--slots", "0"}), HasSubstr("[1, 4096]"));
  EXPECT_THAT(parse({"--reclaim-policy", "random"}), HasSubstr("random"));
  EXPECT_THAT(parse({"--mode", "approximate"}), HasSubstr("approximate"));
}

}  // namespace
}  // namespace dhs
