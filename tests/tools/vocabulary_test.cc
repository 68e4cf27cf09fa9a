// tests/tools/vocabulary_test.cc (issue 23, "one list per vocabulary"): each vocabulary is one list, owned by the
// component that defines it, and the programs that use it ask that list:
// - reclaim policy names (memd/reclaim_policy.h): every name makes the policy of that name, an unknown one is refused
//   naming them all; the default is one of them; the same for the prefix eviction policies (memd/prefix_pages.h);
// - model preset names (workerd/model/config.h): every name gives the model of that name, the default is the first;
// - serving modes (workerd/serving_mode.h): name <-> enum both ways for every mode, an unknown name refused;
// - the daemons' flag lists (memd/memd_flags.h, workerd/worker_flags.h): one entry per key and per flag, choices from
//   the owners' lists, and AddDaemonFlag gives the daemon's CLI11 option the list's range and choices (what dhs-node
//   checks too, tests/tools/node_config_test.cc);
// - the speculation flags (workerd/speculation/speculation_flags.h): the speculation component's one list, which
//   kWorkerFlags appends and AddSpeculationOptions declares;
// - the Python tools' copies (tools/dhs_vocabulary.py): each tuple equals its C++ owner's list, in order.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cli_flags.h"
#include "memd/memd_flags.h"
#include "memd/prefix_pages.h"
#include "memd/reclaim_policy.h"
#include "workerd/model/config.h"
#include "workerd/serving_mode.h"
#include "workerd/speculation/speculation_cli.h"
#include "workerd/speculation/speculation_flags.h"
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

// memd's prefix eviction policies (issue 24, memd/prefix_pages.h): every name makes the policy of that name, an
// unknown one is refused naming them all; --prefix-eviction and --prefix-sharing take memd's lists.
TEST(Vocabulary, PrefixEvictionPolicyNamesMakeTheirPolicies) {
  EXPECT_THAT(memd::PrefixEvictionPolicyNames(), ElementsAre("lru", "fifo"));
  for (const std::string& name : memd::PrefixEvictionPolicyNames()) {
    absl::StatusOr<std::unique_ptr<memd::PrefixEvictionPolicy>> policy = memd::MakePrefixEvictionPolicy(name);
    ASSERT_TRUE(policy.ok()) << name << ": " << policy.status();
    EXPECT_EQ((*policy)->name(), name);
  }
  EXPECT_EQ(memd::PrefixConfig{}.eviction_policy, "lru");  // the default is one of them
  const absl::Status unknown = memd::MakePrefixEvictionPolicy("lfu").status();
  EXPECT_TRUE(absl::IsInvalidArgument(unknown));
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("known: lru, fifo"));
  EXPECT_EQ(FindDaemonFlag(memd::kMemdFlags, "--prefix-eviction")->choices(), memd::PrefixEvictionPolicyNames());
  EXPECT_EQ(FindDaemonFlag(memd::kMemdFlags, "--prefix-sharing")->choices(), memd::PrefixSharingModes());
  EXPECT_THAT(memd::PrefixSharingModes(), ElementsAre("off", "on"));
}

void ExpectOneEntryPerKeyAndFlag(std::span<const DaemonFlag> flags) {
  std::set<std::string_view> keys, names;
  for (const DaemonFlag& f : flags) {
    EXPECT_TRUE(keys.insert(f.key).second) << "key " << f.key << " twice";
    EXPECT_TRUE(names.insert(f.flag).second) << "flag " << f.flag << " twice";
    EXPECT_TRUE(f.flag.starts_with("--")) << f.flag;
    EXPECT_EQ(f.kind == DaemonFlag::kChoice, f.choices != nullptr) << f.key;
    if (f.kind == DaemonFlag::kUint || f.kind == DaemonFlag::kSize) {
      EXPECT_LE(f.min, f.max) << f.key;
    }
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

// The speculation flags are one list (spec::kSpeculationFlags): kWorkerFlags (what dhs-node reads) ends with exactly
// its entries, and AddSpeculationOptions (workerd's and dhs-replay's CLI) declares each of them with the list's range
// and choices.
TEST(Vocabulary, SpeculationFlagsAreOneListReadByWorkerdAndDhsNode) {
  ExpectOneEntryPerKeyAndFlag(spec::kSpeculationFlags);
  const size_t n = std::size(spec::kSpeculationFlags);
  ASSERT_GE(kWorkerFlags.size(), n);
  for (size_t i = 0; i < n; ++i) {
    const DaemonFlag& f = kWorkerFlags[kWorkerFlags.size() - n + i];
    EXPECT_EQ(f.key, spec::kSpeculationFlags[i].key);
    EXPECT_EQ(f.flag, spec::kSpeculationFlags[i].flag);
  }
  EXPECT_EQ(FindDaemonFlag(kWorkerFlags, "--speculate")->choices(),
            (std::vector<std::string>{"off", "fixed", "confidence", "synthetic"}));
  for (const auto& [mode, name] : spec::kSpeculateModes) EXPECT_EQ(spec::SpeculateModeName(mode), name);
  CLI::App app;
  spec::SpeculationFlags flags;
  spec::AddSpeculationOptions(app, &flags);
  for (const DaemonFlag& f : spec::kSpeculationFlags) {
    EXPECT_NE(app.get_option_no_throw(std::string(f.flag)), nullptr) << f.flag << " not declared";
  }
  const auto parse = [](std::vector<std::string> args) {
    CLI::App a;
    spec::SpeculationFlags f;
    spec::AddSpeculationOptions(a, &f);
    std::reverse(args.begin(), args.end());
    try {
      a.parse(args);
    } catch (const CLI::ParseError& e) {
      return std::string(e.what());
    }
    return absl::StrCat("ok ", f.mode, " ", f.config.block);
  };
  EXPECT_EQ(parse({"--speculate", "synthetic", "--block", "64"}), "ok synthetic 64");
  EXPECT_THAT(parse({"--block", "65"}), HasSubstr("must be an integer in [1, 64], got '65'"));
  EXPECT_THAT(parse({"--speculate", "always"}), HasSubstr("always"));
}

// tools/dhs_vocabulary.py's tuples, by name: NAME = ("a", "b", ...) on one line, and NAME = "a".
std::map<std::string, std::vector<std::string>> PythonVocabulary() {
  const char* path = std::getenv("DHS_VOCABULARY_PY");
  EXPECT_NE(path, nullptr) << "DHS_VOCABULARY_PY (set by tests/tools/meson.build) names tools/dhs_vocabulary.py";
  std::map<std::string, std::vector<std::string>> lists;
  if (path == nullptr) return lists;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  const std::regex assignment(R"re(^([A-Z_]+) = (\(.*\)|"[^"]*")\s*$)re");
  const std::regex quoted(R"re("([^"]*)")re");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, assignment)) continue;
    std::vector<std::string>& names = lists[m[1]];
    const std::string value = m[2];
    for (auto it = std::sregex_iterator(value.begin(), value.end(), quoted); it != std::sregex_iterator(); ++it) {
      names.push_back((*it)[1]);
    }
  }
  return lists;
}

TEST(Vocabulary, PythonToolsListsEqualTheirOwners) {
  const auto py = PythonVocabulary();
  auto list = [&py](const std::string& name) {
    auto it = py.find(name);
    EXPECT_NE(it, py.end()) << name << " missing from tools/dhs_vocabulary.py";
    return it == py.end() ? std::vector<std::string>{} : it->second;
  };
  EXPECT_EQ(list("WORKER_MODES"), WorkerModeNames());
  EXPECT_EQ(list("RECLAIM_POLICIES"), memd::ReclaimPolicyNames());
  EXPECT_EQ(list("DEFAULT_RECLAIM_POLICY"), std::vector<std::string>{std::string(memd::kDefaultReclaimPolicy)});
  EXPECT_EQ(list("MODEL_PRESETS"), model::PresetNames());
  EXPECT_EQ(list("SPECULATE_MODES"), spec::SpeculateModeNames());
  EXPECT_EQ(list("PREFIX_SHARING_MODES"), memd::PrefixSharingModes());
  EXPECT_EQ(list("PREFIX_EVICTION_POLICIES"), memd::PrefixEvictionPolicyNames());
}

}  // namespace
}  // namespace dhs
