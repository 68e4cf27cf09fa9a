// Scheduler: open loop by scaled arrival and closed loop at fixed concurrency, driven with explicit times
// (a fake clock) and in-flight counts (tools/replay/scheduler.h).
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/replay/scheduler.h"

namespace dhs::replay {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(OpenLoop, SubmitsAtScaledArrivalsRegardlessOfLoad) {
  // Arrivals 0, 100, 100, 250 ms at time scale 0.5 -> due at 0, 50, 50, 125 ms.
  auto s = Scheduler::OpenLoop({0, 100, 100, 250}, 0.5);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->open_loop());
  EXPECT_EQ(s->NextDueMs(), 0.0);
  EXPECT_THAT(s->Due(0, 0), ElementsAre(0u));
  EXPECT_EQ(s->NextDueMs(), 50.0);
  EXPECT_THAT(s->Due(49.9, 1), IsEmpty());
  EXPECT_THAT(s->Due(50, 100), ElementsAre(1u, 2u));  // 100 in flight changes nothing in open loop
  EXPECT_EQ(s->NextDueMs(), 125.0);
  EXPECT_EQ(s->submitted(), 3u);
  EXPECT_FALSE(s->all_submitted());
  EXPECT_THAT(s->Due(1000, 0), ElementsAre(3u));
  EXPECT_TRUE(s->all_submitted());
  EXPECT_EQ(s->NextDueMs(), std::nullopt);
  EXPECT_THAT(s->Due(2000, 0), IsEmpty());
}

TEST(OpenLoop, LateCallSubmitsEverythingDueInArrivalOrder) {
  // Unsorted arrivals: submission follows arrival, ties keep index order.
  auto s = Scheduler::OpenLoop({30, 10, 20, 10}, 1.0);
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->Due(25, 0), ElementsAre(1u, 3u, 2u));
  EXPECT_THAT(s->Due(30, 0), ElementsAre(0u));
}

TEST(OpenLoop, TimeScaleZeroSubmitsAllAtOnce) {
  auto s = Scheduler::OpenLoop({0, 1000, 60000}, 0.0);
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->Due(0, 0), ElementsAre(0u, 1u, 2u));
}

TEST(OpenLoop, RejectsBadInput) {
  EXPECT_EQ(Scheduler::OpenLoop({0}, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::OpenLoop({0}, std::nan("")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::OpenLoop({0, -5}, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClosedLoop, KeepsConcurrencyInFlight) {
  auto s = Scheduler::ClosedLoop(5, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->open_loop());
  EXPECT_EQ(s->NextDueMs(), std::nullopt);  // closed loop waits for ends, not for times
  EXPECT_THAT(s->Due(0, 0), ElementsAre(0u, 1u));
  EXPECT_THAT(s->Due(10, 2), IsEmpty());
  EXPECT_THAT(s->Due(20, 1), ElementsAre(2u));
  EXPECT_THAT(s->Due(30, 0), ElementsAre(3u, 4u));
  EXPECT_TRUE(s->all_submitted());
  EXPECT_THAT(s->Due(40, 0), IsEmpty());
}

TEST(ClosedLoop, MoreInFlightThanConcurrencySubmitsNothing) {
  auto s = Scheduler::ClosedLoop(3, 1);
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->Due(0, 4), IsEmpty());
  EXPECT_THAT(s->Due(0, 0), ElementsAre(0u));
}

TEST(ClosedLoop, RejectsConcurrencyBelowOne) {
  auto s = Scheduler::ClosedLoop(3, 0);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("concurrency must be >= 1"));
}

}  // namespace
}  // namespace dhs::replay
