// tests/speculation/online_block_width_test.cc: the online block width (workerd/speculation/online_block_width.h): alpha's moving
// average, the step-time fit, the width that maximizes n * E[L](alpha, K) / t(n * K), with figures worked by hand below.
#include "workerd/speculation/online_block_width.h"

#include <gtest/gtest.h>

namespace dhs::spec {
namespace {

OnlineBlockWidth Make(OnlineBlockWidthOptions o = {}) {
  absl::StatusOr<OnlineBlockWidth> c = OnlineBlockWidth::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

// Steps of exactly t(Q) = 1000 + 10 Q us for Q = 1 .. 8 (twice), and rounds accepting 4 of 5 proposals (alpha 0.8).
OnlineBlockWidth Fed(double alpha_num = 4, double alpha_den = 5) {
  OnlineBlockWidth c = Make();
  for (int rep = 0; rep < 2; ++rep) {
    for (int64_t q = 1; q <= 8; ++q) EXPECT_TRUE(c.ObserveStep(q, 1000.0 + 10.0 * static_cast<double>(q)).ok());
  }
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(c.ObserveRound(static_cast<int64_t>(alpha_den), static_cast<int64_t>(alpha_num)).ok());
  }
  return c;
}

TEST(OnlineBlockWidth, FallsBackUntilTheModelIsTrusted) {
  OnlineBlockWidth c = Make();
  EXPECT_EQ(c.Decide(4, 0, 6).width, 6);
  EXPECT_FALSE(c.Decide(4, 0, 6).fitted);
  EXPECT_EQ(c.Decide(4, 0, 99).width, 8) << "the fallback is clamped to k_max";
  // 8 steps of one single Q: the per-query cost cannot be separated from the fixed cost.
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(c.ObserveStep(4, 1000).ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(c.ObserveRound(3, 3).ok());
  EXPECT_FALSE(c.StepFit().has_value());
  EXPECT_EQ(c.Decide(4, 0, 5).width, 5);
  // Two distinct Q: fitted.
  ASSERT_TRUE(c.ObserveStep(8, 2000).ok());
  EXPECT_TRUE(c.Decide(4, 0, 5).fitted);
}

TEST(OnlineBlockWidth, AcceptanceIsAnExponentiallyWeightedMeanOverRounds) {
  OnlineBlockWidthOptions o;
  o.acceptance_weight = 0.5;
  OnlineBlockWidth c = Make(o);
  ASSERT_TRUE(c.ObserveRound(4, 3).ok());  // first round sets it: 0.75
  EXPECT_DOUBLE_EQ(c.alpha(), 0.75);
  ASSERT_TRUE(c.ObserveRound(4, 1).ok());  // 0.75 + 0.5 * (0.25 - 0.75) = 0.5
  EXPECT_DOUBLE_EQ(c.alpha(), 0.5);
  ASSERT_TRUE(c.ObserveRound(0, 0).ok());  // no proposal: ignored
  EXPECT_DOUBLE_EQ(c.alpha(), 0.5);
  EXPECT_EQ(c.rounds(), 2);
}

TEST(OnlineBlockWidth, TheStepFitRecoversTheFixedAndPerQueryCosts) {
  OnlineBlockWidth c = Fed();
  std::optional<OnlineBlockWidth::Fit> f = c.StepFit();
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(f->a_us, 1000.0, 1e-9);
  EXPECT_NEAR(f->b_us, 10.0, 1e-9);
}

TEST(OnlineBlockWidth, TheWidthNarrowsAsLoadGrows) {
  OnlineBlockWidth c = Fed();  // alpha 0.8, t(Q) = 1000 + 10 Q
  // E[L](0.8, K) = (1 - 0.8^K) / 0.2 = 1, 1.8, 2.44, 2.952, 3.3616, 3.68928, 3.951424, 4.1611392 for K = 1 .. 8.
  // n = 1: E[L] / (1000 + 10 K) grows up to K = 8 (4.1611392 / 1080 = 0.003853 > 3.951424 / 1070 = 0.003693).
  WidthDecision d = c.Decide(1, 0, 1);
  EXPECT_TRUE(d.fitted);
  EXPECT_EQ(d.width, 8);
  EXPECT_NEAR(d.tokens_per_s, 4.1611392 / 1080.0 * 1e6, 1e-6);
  // n = 64: 64 E[L] / (1000 + 640 K): K = 2: 115.2 / 2280 = 0.05053; K = 3: 156.16 / 2920 = 0.05348;
  // K = 4: 188.928 / 3560 = 0.05307: K = 3.
  EXPECT_EQ(c.Decide(64, 0, 1).width, 3);
  // n = 128: 128 E[L] / (1000 + 1280 K): K = 1: 128 / 2280 = 0.05614; K = 2: 230.4 / 3560 = 0.06472;
  // K = 3: 312.32 / 4840 = 0.06453: K = 2.
  EXPECT_EQ(c.Decide(128, 0, 1).width, 2);
  // Admissions that wait and fit in free memory count as load: 64 decoding + 64 joining plan like 128.
  WidthDecision joining = c.Decide(64, 64, 1);
  EXPECT_EQ(joining.width, 2);
  EXPECT_EQ(joining.sessions, 128);
}

TEST(OnlineBlockWidth, NoAcceptanceMeansNoSpeculation) {
  OnlineBlockWidth c = Fed(0, 5);  // alpha 0: E[L] = 1 for every K, and a wider step only costs
  EXPECT_DOUBLE_EQ(c.alpha(), 0.0);
  EXPECT_EQ(c.Decide(1, 0, 8).width, 1);
  EXPECT_EQ(c.Decide(32, 0, 8).width, 1);
}

TEST(OnlineBlockWidth, AFitLostInNoiseTakesTheMeanAsAFixedCost) {
  OnlineBlockWidth c = Make();
  // Step time falling with Q (noise): b would be negative; the fit takes b = 0 and a = the mean (1500).
  for (int64_t q = 1; q <= 8; ++q) ASSERT_TRUE(c.ObserveStep(q, 1900.0 - 100.0 * static_cast<double>(q) + 50).ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(c.ObserveRound(7, 1).ok());
  std::optional<OnlineBlockWidth::Fit> f = c.StepFit();
  ASSERT_TRUE(f.has_value());
  EXPECT_DOUBLE_EQ(f->b_us, 0.0);
  EXPECT_NEAR(f->a_us, 1500.0, 1e-9);  // mean of 1850 .. 1150
  // Free queries and some acceptance: the widest block.
  EXPECT_EQ(c.Decide(16, 0, 1).width, 8);
}

TEST(OnlineBlockWidth, TheWindowForgetsOldSteps) {
  OnlineBlockWidthOptions o;
  o.window = 4;
  o.min_steps = 4;
  OnlineBlockWidth c = Make(o);
  for (int64_t q = 1; q <= 4; ++q) ASSERT_TRUE(c.ObserveStep(q, 100.0 * static_cast<double>(q)).ok());  // a 0, b 100
  for (int64_t q = 1; q <= 4; ++q) ASSERT_TRUE(c.ObserveStep(q, 500.0 + static_cast<double>(q)).ok());  // a 500, b 1
  std::optional<OnlineBlockWidth::Fit> f = c.StepFit();
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(f->a_us, 500.0, 1e-9);
  EXPECT_NEAR(f->b_us, 1.0, 1e-9);
}

TEST(OnlineBlockWidth, BadInputIsRefusedAndChangesNothing) {
  for (OnlineBlockWidthOptions o : {OnlineBlockWidthOptions{.k_max = 0}, OnlineBlockWidthOptions{.window = 1},
                                    OnlineBlockWidthOptions{.min_steps = 65}, OnlineBlockWidthOptions{.min_rounds = 0},
                                    OnlineBlockWidthOptions{.acceptance_weight = 0.0}}) {
    EXPECT_EQ(OnlineBlockWidth::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  }
  OnlineBlockWidth c = Make();
  EXPECT_EQ(c.ObserveRound(3, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ObserveRound(-1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ObserveStep(0, 10).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ObserveStep(2, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.rounds(), 0);
  EXPECT_FALSE(c.StepFit().has_value());
}

}  // namespace
}  // namespace dhs::spec
