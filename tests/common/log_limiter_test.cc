// tests/common/log_limiter_test.cc: LogRateLimiter (common/log_limiter.h) with an injected clock: at most N per
// window, the dropped ones counted and reported with the next one let through, a fresh window after the window's time.
#include "common/log_limiter.h"

#include "gtest/gtest.h"

namespace dhs {
namespace {

using std::chrono::milliseconds;

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  LogRateLimiter::Clock fn() {
    return [this] { return now; };
  }
};

TEST(LogRateLimiter, LetsNThroughPerWindowThenCountsTheRest) {
  FakeClock clock;
  LogRateLimiter limiter(3, milliseconds(1000), clock.fn());
  uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limiter.Allow(&suppressed)) << i;
    EXPECT_EQ(suppressed, 0u);
    clock.now += milliseconds(10);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(limiter.Allow(&suppressed));  // a flood within the window
  clock.now += milliseconds(500);  // still the same window (started at 0, now 530 ms)
  EXPECT_FALSE(limiter.Allow(&suppressed));
  clock.now += milliseconds(470);  // 1000 ms after the window's start: a new window
  ASSERT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 1001u);  // the summary comes with the first one let through
  ASSERT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 0u);  // reported once
}

TEST(LogRateLimiter, AQuietSiteIsNeverLimited) {
  FakeClock clock;
  LogRateLimiter limiter(2, milliseconds(1000), clock.fn());
  uint64_t suppressed = 0;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(limiter.Allow(&suppressed)) << i;  // one a second: below the limit in every window
    EXPECT_EQ(suppressed, 0u);
    clock.now += milliseconds(1000);
  }
}

TEST(LogRateLimiter, WindowsStartAtTheFirstOccurrenceAfterAQuietSpell) {
  FakeClock clock;
  LogRateLimiter limiter(1, milliseconds(1000), clock.fn());
  uint64_t suppressed = 0;
  EXPECT_TRUE(limiter.Allow(&suppressed));
  EXPECT_FALSE(limiter.Allow(&suppressed));
  clock.now += milliseconds(5000);  // quiet for 5 s
  EXPECT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 1u);
  clock.now += milliseconds(999);  // the window started at 5000 ms: still in it
  EXPECT_FALSE(limiter.Allow(&suppressed));
  clock.now += milliseconds(1);
  EXPECT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 1u);
}

TEST(LogRateLimiter, ZeroPerWindowIsOne) {
  FakeClock clock;
  LogRateLimiter limiter(0, milliseconds(1000), clock.fn());
  uint64_t suppressed = 0;
  EXPECT_TRUE(limiter.Allow(&suppressed));
  EXPECT_FALSE(limiter.Allow(&suppressed));
}

// The macro compiles at a call site and drops the flood (each site has its own limiter).
TEST(LogRateLimiter, MacroGivesEachCallSiteItsOwnLimiter) {
  int logged_a = 0;
  for (int i = 0; i < 100; ++i) DHS_LOG_LIMITED(spdlog::level::debug, "flood {}", (++logged_a, i));
  EXPECT_LE(logged_a, static_cast<int>(LogRateLimiter::kDefaultMaxPerWindow) + 1);  // arguments only when logged
  int logged_b = 0;
  DHS_LOG_LIMITED(spdlog::level::debug, "other site {}", ++logged_b);
  EXPECT_EQ(logged_b, 1);
}

}  // namespace
}  // namespace dhs
