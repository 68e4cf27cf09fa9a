// The opt-in step-time split (workerd/model/step_profile.h, issue 27): on only with DHS_STEP_PROFILE set (not "0"),
// decode and mixed steps counted apart, the phases added to the step in progress, model = wall - phases, outside =
// the gap between two steps. Times come from a real clock, so values are checked by their relations (sums, order),
// never by speed.
#include "workerd/model/step_profile.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace dhs::model {
namespace {

// "step profile: KIND k1 v1 k2 v2 ..." -> {k: v}, and the kind.
std::map<std::string, double> Fields(const std::string& line, std::string* kind) {
  std::istringstream in(line);
  std::string a, b;
  in >> a >> b >> *kind;
  std::map<std::string, double> out;
  std::string key;
  double value = 0;
  while (in >> key >> value) out[key] = value;
  return out;
}

TEST(StepProfileTest, OffUnlessTheEnvironmentAsksAndSplitsDecodeFromMixed) {
  ::setenv("DHS_STEP_PROFILE", "1", 1);  // read once, at the first Get()
  StepProfile* profile = StepProfile::Get();
  ASSERT_NE(profile, nullptr);
  EXPECT_EQ(StepProfile::Get(), profile);
  // A decode step (4 requests, 4 queries) with 3 ms of fetch and 1 ms of index; then a mixed one (2 requests, 9
  // queries) after a 2 ms gap.
  profile->StepBegin();
  {
    PhaseTimer fetch(profile, StepPhase::kFetch);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  profile->Add(StepPhase::kIndexTopK, 1'000'000);
  profile->StepEnd(4, 4);
  const double before_gap_ms = std::chrono::duration<double, std::milli>(
                                    std::chrono::steady_clock::now().time_since_epoch()).count();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  profile->StepBegin();
  profile->StepEnd(9, 2);
  const double after_ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now().time_since_epoch()).count();
  std::string kind;
  auto d = Fields(profile->Line(true), &kind);
  EXPECT_EQ(kind, "decode");
  EXPECT_EQ(d["steps"], 1);
  EXPECT_EQ(d["queries"], 4);
  EXPECT_GE(d["fetch_ms"], 3.0);
  EXPECT_DOUBLE_EQ(d["index_topk_ms"], 1.0);
  EXPECT_EQ(d["outside_ms"], 0);  // the first step has no gap before it
  // model = wall - timed phases (the printed values are rounded to 1 µs)
  EXPECT_NEAR(d["model_ms"] + d["fetch_ms"] + d["index_topk_ms"] + d["append_ms"] + d["release_ms"], d["wall_ms"],
              0.005);
  auto m = Fields(profile->Line(false), &kind);
  EXPECT_EQ(kind, "mixed");
  EXPECT_EQ(m["steps"], 1);
  EXPECT_EQ(m["queries"], 9);
  EXPECT_GE(m["outside_ms"], 2.0);  // the gap since the decode step ended
  EXPECT_EQ(m["fetch_ms"], 0);      // the phases of the step in progress only
  EXPECT_EQ(m["index_topk_ms"], 0);
  // at_ms: the end of the latest step on steady_clock (ms since its epoch), the same in both lines: after the gap,
  // before the clock read after StepEnd (printed to 1 µs).
  EXPECT_EQ(m["at_ms"], d["at_ms"]);
  EXPECT_GE(m["at_ms"], before_gap_ms + 2.0 - 0.001);
  EXPECT_LE(m["at_ms"], after_ms + 0.001);
  PhaseTimer none(nullptr, StepPhase::kFetch);  // off: nothing to add to
}

// Issue 27 (admission split): the loop line counts prepared-prefix chunks and the loop's phases outside a step;
// they are not part of any step's phases (the decode / mixed lines keep their values), and every StepEnd prints it
// too. Values added exactly (Add), one timed by a real sleep (checked as a lower bound).
TEST(StepProfileTest, LoopLineCountsImportChunksAndPhasesOutsideSteps) {
  ::setenv("DHS_STEP_PROFILE", "1", 1);
  StepProfile* profile = StepProfile::Get();
  ASSERT_NE(profile, nullptr);
  std::string kind;
  const auto before = Fields(profile->LoopLine(), &kind);
  EXPECT_EQ(kind, "loop");
  const auto decode_before = Fields(profile->Line(true), &kind);
  profile->Add(LoopPhase::kImport, 5'000'000);
  profile->Add(LoopPhase::kImportAppend, 3'000'000);
  profile->Add(LoopPhase::kImportKeys, 1'000'000);
  profile->ImportChunkEnd();
  profile->Add(LoopPhase::kImport, 2'000'000);
  profile->ImportChunkEnd();
  {
    LoopTimer poll(profile, LoopPhase::kPoll);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const auto after = Fields(profile->LoopLine(), &kind);
  EXPECT_EQ(after.at("import_chunks") - before.at("import_chunks"), 2);
  EXPECT_DOUBLE_EQ(after.at("import_ms") - before.at("import_ms"), 7.0);
  EXPECT_DOUBLE_EQ(after.at("import_append_ms") - before.at("import_append_ms"), 3.0);
  EXPECT_DOUBLE_EQ(after.at("import_keys_ms") - before.at("import_keys_ms"), 1.0);
  EXPECT_GE(after.at("poll_ms") - before.at("poll_ms"), 2.0);
  EXPECT_GE(after.at("at_ms"), before.at("at_ms"));
  // No step ran: the decode line is unchanged (the loop's phases are not a step's).
  EXPECT_EQ(Fields(profile->Line(true), &kind), decode_before);
  LoopTimer none(nullptr, LoopPhase::kPoll);  // off: nothing to add to
}

}  // namespace
}  // namespace dhs::model
