// ResumedOutputBound (workerd/resumed_outputs.h): the bound on resumed outputs no client re-attached to, by count,
// bytes and age, with time passed in. Each scenario's expected drops are worked out by hand in its comment; then a
// randomized run checks the invariants after every event against a plain model (a list in Keep order).
#include "workerd/resumed_outputs.h"

#include <algorithm>
#include <list>
#include <random>

#include "gtest/gtest.h"

namespace dhs {
namespace {

using std::chrono::milliseconds;
using TimePoint = ResumedOutputBound::TimePoint;

const TimePoint kT0{};
TimePoint At(int64_t ms) { return kT0 + milliseconds(ms); }

ResumedOutputLimits Limits(uint32_t outputs, uint64_t bytes, int64_t age_ms) {
  ResumedOutputLimits l;
  l.max_outputs = outputs;
  l.max_bytes = bytes;
  l.max_age = milliseconds(age_ms);
  return l;
}

TEST(ResumedOutputBound, BytesFormulaIsTwelvePerTokenPlusTheMessage) {
  EXPECT_EQ(ResumedOutputBytes(0, 0), 0u);
  EXPECT_EQ(ResumedOutputBytes(100, 0), 1200u);  // 4-byte token + 8-byte digest each
  EXPECT_EQ(ResumedOutputBytes(3, 17), 53u);
}

TEST(ResumedOutputBound, ZeroLimitsAreRefusedNamingTheFlag) {
  EXPECT_TRUE(ValidateResumedOutputLimits(ResumedOutputLimits{}).ok());
  for (auto [limits, flag] : {std::pair{Limits(0, 1, 1), "--resumed-outputs-max"},
                              std::pair{Limits(1, 0, 1), "--resumed-output-bytes-max"},
                              std::pair{Limits(1, 1, 0), "--resumed-output-age-ms"}}) {
    absl::Status s = ValidateResumedOutputLimits(limits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(flag), std::string::npos) << s;
  }
}

// max 3 outputs: the 4th Keep drops the oldest (client 1's request 1), the 5th the next oldest (client 2's request
// 1: same request id, another client, another key). A claimed output leaves room: the 6th drops nothing.
TEST(ResumedOutputBound, OverTheCountTheOldestIsDropped) {
  ResumedOutputBound b(Limits(3, 1 << 20, 60000));
  EXPECT_TRUE(b.Keep({1, 1}, 10, At(0)).empty());
  EXPECT_TRUE(b.Keep({2, 1}, 20, At(1)).empty());
  EXPECT_TRUE(b.Keep({1, 2}, 30, At(2)).empty());
  std::vector<DroppedOutput> d = b.Keep({2, 2}, 40, At(5));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, (ResumeKey{1, 1}));
  EXPECT_EQ(d[0].bytes, 10u);
  EXPECT_EQ(d[0].reason, ResumedDropReason::kCount);
  EXPECT_EQ(d[0].waited, milliseconds(5));
  d = b.Keep({3, 7}, 50, At(6));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, (ResumeKey{2, 1}));
  EXPECT_EQ(b.outputs(), 3u);
  EXPECT_EQ(b.bytes(), 30u + 40 + 50);
  EXPECT_TRUE(b.Claim({2, 2}));
  EXPECT_FALSE(b.Claim({2, 2}));  // streamed once
  EXPECT_FALSE(b.Claim({1, 1}));  // dropped
  EXPECT_TRUE(b.Keep({4, 4}, 1, At(7)).empty());
  EXPECT_EQ(b.bytes(), 30u + 50 + 1);
  EXPECT_TRUE(b.CheckInvariants().ok()) << b.CheckInvariants();
}

// max 100 bytes: 40 + 40 fit (80); a 50-byte one makes 130: the oldest (40) goes -> 90. A 95-byte one makes 185: both
// older ones go (40, then 50) -> 95. A 101-byte one never fits: it alone is dropped, the 95 stays.
TEST(ResumedOutputBound, OverTheBytesTheOldestAreDroppedAndOneTooLargeAloneIsDroppedItself) {
  ResumedOutputBound b(Limits(100, 100, 60000));
  EXPECT_TRUE(b.Keep({0, 1}, 40, At(0)).empty());
  EXPECT_TRUE(b.Keep({0, 2}, 40, At(0)).empty());
  std::vector<DroppedOutput> d = b.Keep({0, 3}, 50, At(0));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, (ResumeKey{0, 1}));
  EXPECT_EQ(d[0].reason, ResumedDropReason::kBytes);
  EXPECT_EQ(b.bytes(), 90u);
  d = b.Keep({0, 4}, 95, At(0));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].key, (ResumeKey{0, 2}));
  EXPECT_EQ(d[1].key, (ResumeKey{0, 3}));
  EXPECT_EQ(b.bytes(), 95u);
  d = b.Keep({0, 5}, 101, At(0));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, (ResumeKey{0, 5}));
  EXPECT_EQ(d[0].reason, ResumedDropReason::kBytes);
  EXPECT_EQ(b.outputs(), 1u);
  EXPECT_EQ(b.bytes(), 95u);
  EXPECT_TRUE(b.CheckInvariants().ok()) << b.CheckInvariants();
}

// max age 1000 ms: kept at 0, 400, 900. Expire at 999: none. At 1000: the first (waited exactly 1000). At 1399:
// none. At 1900: the other two (waited 1500 and 1000), oldest first.
TEST(ResumedOutputBound, AnOutputKeptForMaxAgeIsDroppedAtExpire) {
  ResumedOutputBound b(Limits(10, 1000, 1000));
  b.Keep({5, 1}, 1, At(0));
  b.Keep({5, 2}, 2, At(400));
  b.Keep({6, 1}, 3, At(900));
  EXPECT_TRUE(b.Expire(At(999)).empty());
  std::vector<DroppedOutput> d = b.Expire(At(1000));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, (ResumeKey{5, 1}));
  EXPECT_EQ(d[0].reason, ResumedDropReason::kAge);
  EXPECT_EQ(d[0].waited, milliseconds(1000));
  EXPECT_TRUE(b.Expire(At(1399)).empty());
  EXPECT_TRUE(b.CheckInvariants().ok()) << b.CheckInvariants();
  d = b.Expire(At(1900));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].key, (ResumeKey{5, 2}));
  EXPECT_EQ(d[0].waited, milliseconds(1500));
  EXPECT_EQ(d[1].key, (ResumeKey{6, 1}));
  EXPECT_EQ(b.outputs(), 0u);
  EXPECT_EQ(b.bytes(), 0u);
}

// The same key kept again (anonymous clients that share a request id): the older output is reported replaced; the
// new one is kept under the key and ages from its own Keep.
TEST(ResumedOutputBound, TheSameKeyKeptAgainReplacesTheOlderOutput) {
  ResumedOutputBound b(Limits(10, 1000, 1000));
  b.Keep({0, 9}, 100, At(0));
  std::vector<DroppedOutput> d = b.Keep({0, 9}, 30, At(600));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].reason, ResumedDropReason::kReplaced);
  EXPECT_EQ(d[0].bytes, 100u);
  EXPECT_EQ(b.outputs(), 1u);
  EXPECT_EQ(b.bytes(), 30u);
  EXPECT_TRUE(b.Expire(At(1200)).empty());  // 600 ms after the new Keep
  EXPECT_EQ(b.Expire(At(1600)).size(), 1u);
}

// Random Keep / Claim / Expire against a model: a list of (key, bytes, kept at) in Keep order, trimmed by the rules
// of the header. Every decision and the totals must equal the model's; the invariants hold after every event.
TEST(ResumedOutputBound, RandomEventsMatchAPlainModel) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const ResumedOutputLimits limits = Limits(1 + rng() % 6, 50 + rng() % 200, 50 + rng() % 500);
    ResumedOutputBound b(limits);
    struct M {
      ResumeKey key;
      uint64_t bytes;
      TimePoint kept;
    };
    std::list<M> model;
    int64_t now = 0;
    for (int step = 0; step < 400; ++step) {
      now += rng() % 40;
      const ResumeKey key{rng() % 3, rng() % 6};
      const int what = static_cast<int>(rng() % 10);
      std::vector<ResumeKey> want;  // keys the model drops, in order
      std::vector<DroppedOutput> got;
      if (what < 5) {
        const uint64_t bytes = rng() % (limits.max_bytes + 20);
        auto same = std::find_if(model.begin(), model.end(), [&](const M& m) { return m.key == key; });
        if (same != model.end()) {
          want.push_back(key);
          model.erase(same);
        }
        if (bytes > limits.max_bytes) {
          want.push_back(key);
        } else {
          model.push_back(M{key, bytes, At(now)});
          auto total = [&] {
            uint64_t t = 0;
            for (const M& m : model) t += m.bytes;
            return t;
          };
          while (model.size() > limits.max_outputs || total() > limits.max_bytes) {
            want.push_back(model.front().key);
            model.pop_front();
          }
        }
        got = b.Keep(key, bytes, At(now));
      } else if (what < 7) {
        auto it = std::find_if(model.begin(), model.end(), [&](const M& m) { return m.key == key; });
        EXPECT_EQ(b.Claim(key), it != model.end());
        if (it != model.end()) model.erase(it);
      } else {
        while (!model.empty() && At(now) - model.front().kept >= limits.max_age) {
          want.push_back(model.front().key);
          model.pop_front();
        }
        got = b.Expire(At(now));
      }
      std::vector<ResumeKey> got_keys;
      for (const DroppedOutput& d : got) got_keys.push_back(d.key);
      ASSERT_EQ(got_keys, want) << "step " << step;
      uint64_t total = 0;
      for (const M& m : model) total += m.bytes;
      ASSERT_EQ(b.outputs(), model.size());
      ASSERT_EQ(b.bytes(), total);
      ASSERT_TRUE(b.CheckInvariants().ok()) << b.CheckInvariants();
    }
  }
}

}  // namespace
}  // namespace dhs
