// common/fault_point.h: the --fault-kill-at spec, the counter that picks the armed arrival, and the real SIGKILL.
#include "common/fault_point.h"

#include <signal.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dhs {
namespace {

using ::testing::HasSubstr;

TEST(FaultPoint, ParsesEveryKind) {
  const std::pair<const char*, FaultPoint> kinds[] = {{"prefill", FaultPoint::kPrefill},
                                                      {"decode", FaultPoint::kDecode},
                                                      {"backup", FaultPoint::kBackup},
                                                      {"populate", FaultPoint::kPopulate},
                                                      {"reclaim", FaultPoint::kReclaim},
                                                      {"complete", FaultPoint::kComplete}};
  for (const auto& [name, point] : kinds) {
    const std::string spec = std::string(name) + ":17";
    absl::StatusOr<FaultKill> kill = ParseFaultKill(spec);
    ASSERT_TRUE(kill.ok()) << spec << ": " << kill.status();
    EXPECT_EQ(kill->point, point);
    EXPECT_EQ(kill->nth, 17u);
    EXPECT_EQ(FormatFaultKill(*kill), spec);
    EXPECT_EQ(FaultPointName(point), name);
  }
}

TEST(FaultPoint, RefusesBadSpecsNamingTheProblem) {
  const std::pair<const char*, const char*> bad[] = {
      {"decode", "want KIND:N"},          {"sample:3", "unknown kind 'sample'"}, {"decode:0", "N must be"},
      {"decode:", "N must be"},           {"decode:-1", "N must be"},           {"decode:3x", "N must be"},
      {"decode:9223372036854775808", "N must be"}, {":3", "unknown kind ''"}};
  for (const auto& [spec, want] : bad) {
    absl::StatusOr<FaultKill> kill = ParseFaultKill(spec);
    ASSERT_FALSE(kill.ok()) << spec;
    EXPECT_EQ(kill.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(std::string(kill.status().message()), HasSubstr(want)) << spec;
  }
}

TEST(FaultCounter, FiresOnceAtTheNthArrivalOfTheArmedKind) {
  FaultCounter counter(FaultKill{FaultPoint::kBackup, 3});
  std::vector<int> fired;
  const FaultPoint sequence[] = {FaultPoint::kBackup, FaultPoint::kDecode, FaultPoint::kBackup, FaultPoint::kDecode,
                                 FaultPoint::kDecode, FaultPoint::kBackup, FaultPoint::kBackup, FaultPoint::kBackup};
  for (int i = 0; i < static_cast<int>(std::size(sequence)); ++i) {
    if (counter.Reach(sequence[i])) fired.push_back(i);
  }
  EXPECT_EQ(fired, std::vector<int>{5});  // the third backup; the decodes do not count towards it
  EXPECT_EQ(counter.count(FaultPoint::kBackup), 5u);
  EXPECT_EQ(counter.count(FaultPoint::kDecode), 3u);
  EXPECT_EQ(counter.count(FaultPoint::kPopulate), 0u);
}

TEST(FaultCounter, UnarmedNeverFires) {
  FaultCounter counter;
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(counter.Reach(static_cast<FaultPoint>(i % kFaultPoints)));
}

// The process really dies by SIGKILL at the armed arrival, and not before it (the line before the kill is written).
TEST(FaultPointDeathTest, ArmedArrivalRaisesSigkill) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ArmFaultKill(FaultKill{FaultPoint::kPopulate, 2});
        ReachFaultPoint(FaultPoint::kPopulate);
        ReachFaultPoint(FaultPoint::kDecode);
        ReachFaultPoint(FaultPoint::kPopulate);
        std::exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGKILL), "fault injection: SIGKILL at populate:2");
}

TEST(FaultPoint, UnarmedReachIsANoOp) {
  for (int i = 0; i < 10; ++i) ReachFaultPoint(FaultPoint::kDecode);  // this process was never armed
  SUCCEED();
}

}  // namespace
}  // namespace dhs
