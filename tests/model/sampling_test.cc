// tests/model/sampling_test.cc: the recoverable (counter-based) sampler of workerd/model/sampling.h.
//
// - UniformAt is Philox4x32-10: the published known answer for counter 0, key 0 (Random123's kat_vectors).
// - Draws depend only on their key: the same key gives the same draw in any order of calls; changing any of
//   seed, stream or position changes it.
// - SampleAt picks the id whose cumulative interval holds u (intervals computed here from the probabilities).
// - The sampler's distribution is exact: a chi-square goodness-of-fit test of 60000 keyed draws against
//   SamplingDistribution's probabilities, at significance 0.001.
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "workerd/model/sampling.h"

namespace dhs::model {
namespace {

TEST(RecoverableSampling, UniformAtIsPhilox4x32x10) {
  // Philox4x32-10, counter {0,0,0,0}, key {0,0} -> {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8} (Random123 KAT).
  const uint64_t word = uint64_t{0xe169c58d} << 32 | 0x6627e8d5;
  EXPECT_EQ(UniformAt(DrawKey{0, 0, 0}), static_cast<double>(word >> 11) * 0x1p-53);
}

TEST(RecoverableSampling, DrawsDependOnlyOnTheirKey) {
  std::vector<double> forward, backward(64);
  for (uint64_t t = 0; t < 64; ++t) forward.push_back(UniformAt(DrawKey{7, 1234, t}));
  for (uint64_t t = 64; t-- > 0;) {
    UniformAt(DrawKey{8, 99, t});  // other keys drawn in between change nothing
    backward[t] = UniformAt(DrawKey{7, 1234, t});
  }
  EXPECT_EQ(forward, backward);
  std::set<double> seen(forward.begin(), forward.end());
  EXPECT_EQ(seen.size(), forward.size()) << "positions of one stream collide";
  const double base = UniformAt(DrawKey{7, 1234, 5});
  EXPECT_NE(UniformAt(DrawKey{8, 1234, 5}), base);  // seed
  EXPECT_NE(UniformAt(DrawKey{7, 1235, 5}), base);  // stream (client request id)
  EXPECT_NE(UniformAt(DrawKey{7, 1234, 6}), base);  // position
  EXPECT_NE(UniformAt(DrawKey{7, 1234, 5 + (uint64_t{1} << 32)}), base);  // high word of the position counts
  EXPECT_NE(UniformAt(DrawKey{7 + (uint64_t{1} << 32), 1234, 5}), base);  // high word of the seed counts
  for (uint64_t t = 0; t < 1000; ++t) {
    const double u = UniformAt(DrawKey{t, t * 31, t * 17});
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(RecoverableSampling, SampleAtPicksTheIntervalHoldingU) {
  std::vector<double> p(256, 0.0);
  p[3] = 0.25;
  p[10] = 0.5;
  p[200] = 0.25;  // intervals [0, .25) -> 3, [.25, .75) -> 10, [.75, 1) -> 200
  EXPECT_EQ(SampleAt(p, 0.0), 3);
  EXPECT_EQ(SampleAt(p, 0.2499), 3);
  EXPECT_EQ(SampleAt(p, 0.25), 10);
  EXPECT_EQ(SampleAt(p, 0.7499), 10);
  EXPECT_EQ(SampleAt(p, 0.75), 200);
  EXPECT_EQ(SampleAt(p, 1.0 - 0x1p-53), 200);
  // Greedy needs no draw: temperature 0 gives the argmax whatever the key.
  std::vector<float> logits(256, 0.0f);
  logits[42] = 5.0f;
  for (uint64_t t = 0; t < 50; ++t) EXPECT_EQ(Sample(logits, {0.0f, 1.0f}, DrawKey{t, t, t}), 42);
}

// Chi-square goodness of fit, df = 5, significance 0.001: critical value 20.515 (chi-square table). The keys are
// fixed, so the test is deterministic; a biased sampler (e.g. an off-by-one interval) fails it by a wide margin.
TEST(RecoverableSampling, DistributionMatchesTheProbabilitiesChiSquare) {
  std::vector<float> logits(256, -1e9f);
  const int ids[6] = {1, 17, 64, 65, 128, 255};
  const double weights[6] = {0.30, 0.20, 0.15, 0.15, 0.12, 0.08};
  for (int i = 0; i < 6; ++i) logits[ids[i]] = static_cast<float>(std::log(weights[i]));
  const SamplingParams params{0.9f, 1.0f};  // temperature reshapes the weights; SamplingDistribution gives p
  const std::vector<double> p = SamplingDistribution(logits, params);
  constexpr int kDraws = 60000;
  std::vector<int> counts(256, 0);
  for (int d = 0; d < kDraws; ++d) {
    // Both axes of the key vary: 600 streams (requests) x 100 positions (tokens).
    ++counts[Sample(logits, params, DrawKey{2026, static_cast<uint64_t>(d / 100), static_cast<uint64_t>(d % 100)})];
  }
  double chi2 = 0.0;
  int drawn = 0;
  for (int i = 0; i < 6; ++i) {
    const double expected = p[ids[i]] * kDraws;
    ASSERT_GT(expected, 5.0);
    chi2 += (counts[ids[i]] - expected) * (counts[ids[i]] - expected) / expected;
    drawn += counts[ids[i]];
  }
  EXPECT_EQ(drawn, kDraws) << "an id of probability 0 was drawn";
  std::printf("chi-square %.3f (df 5, critical 20.515 at 0.001)\n", chi2);
  EXPECT_LT(chi2, 20.515);
}

}  // namespace
}  // namespace dhs::model
