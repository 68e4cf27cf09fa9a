// tests/speculation/synthetic_proposer_test.cc: the benchmark-only synthetic proposer (workerd/speculation/synthetic_proposer.h):
// corruption 0 proposes the continuation, 1 never does; replacements are uniform over the other 255 ids (chi-square
// at significance 0.001, Boost.Math's critical value); with greedy acceptance on logits whose argmax is the
// continuation, the mean acceptance length over 100,000 rounds matches ExpectedAcceptanceLength(1 - corruption, K)
// (two-sided z-test at 0.001); bad input is refused.
#include <gtest/gtest.h>

#include <boost/math/distributions/chi_squared.hpp>
#include <boost/math/distributions/normal.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

#include "workerd/speculation/acceptance.h"
#include "workerd/speculation/block_width.h"
#include "workerd/speculation/synthetic_proposer.h"

namespace dhs::spec {
namespace {

using model::kVocab;
using model::Token;
constexpr double kAlpha = 0.001;

TEST(SyntheticProposer, CorruptionZeroAndOne) {
  const std::vector<Token> cont = {5, 0, 255, 17, 17};
  for (RequestId r = 1; r < 200; ++r) {
    EXPECT_EQ(*SyntheticProposals(cont, 0.0, {.seed = 1, .request = r, .frontier = 40}), cont);
    absl::StatusOr<std::vector<Token>> all = SyntheticProposals(cont, 1.0, {.seed = 1, .request = r, .frontier = 40});
    ASSERT_TRUE(all.ok());
    ASSERT_EQ(all->size(), cont.size());
    for (size_t j = 0; j < cont.size(); ++j) {
      EXPECT_NE((*all)[j], cont[j]);
      EXPECT_GE((*all)[j], 0);
      EXPECT_LT((*all)[j], kVocab);
    }
    EXPECT_EQ(*all, *SyntheticProposals(cont, 1.0, {.seed = 1, .request = r, .frontier = 40}));  // reproducible
  }
}

TEST(SyntheticProposer, ReplacementsAreUniformOverTheOtherIds) {
  const Token g = 7;
  const int64_t draws = 255 * 200;
  std::vector<int64_t> counts(kVocab, 0);
  for (int64_t i = 0; i < draws; ++i) {
    const std::vector<Token> one = {g};
    ++counts[(*SyntheticProposals(one, 1.0, {.seed = 3, .request = 9, .frontier = i}))[0]];
  }
  ASSERT_EQ(counts[g], 0);
  const double e = static_cast<double>(draws) / (kVocab - 1);
  double stat = 0.0;
  for (int y = 0; y < kVocab; ++y) {
    if (y != g) stat += (counts[y] - e) * (counts[y] - e) / e;
  }
  const double crit = boost::math::quantile(boost::math::complement(boost::math::chi_squared(kVocab - 2), kAlpha));
  std::printf("replacements: chi2 = %.1f, df = %d, critical = %.1f\n", stat, kVocab - 2, crit);
  EXPECT_LT(stat, crit);
}

TEST(SyntheticProposer, GreedyAcceptanceLengthMatchesOneMinusCorruption) {
  const int k_r = 5;
  const double corruption = 0.3;
  const std::vector<Token> cont = {11, 200, 3, 3, 90};  // greedy tokens at n_r + 1 .. n_r + 5
  std::vector<float> logits(k_r * kVocab, 0.0f);
  for (int j = 0; j < k_r; ++j) logits[j * kVocab + cont[j]] = 4.0f;  // query j's argmax is cont[j]
  const int64_t rounds = 100000;
  double sum = 0.0, sum_sq = 0.0;
  for (int64_t r = 0; r < rounds; ++r) {
    const RoundKey key{.seed = 8, .request = static_cast<RequestId>(r) + 1, .frontier = 1000};
    absl::StatusOr<std::vector<Token>> x =
        SyntheticProposals(std::span<const Token>(cont).first(k_r - 1), corruption, key);
    ASSERT_TRUE(x.ok());
    std::vector<Proposal> props;
    for (Token t : *x) props.push_back({t, {}});
    absl::StatusOr<RoundOutcome> out = AcceptRound(AcceptMode::kGreedy, logits, {}, props, key);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->emitted, std::vector<Token>(cont.begin(), cont.begin() + out->accepted + 1));
    sum += out->accepted + 1.0;
    sum_sq += (out->accepted + 1.0) * (out->accepted + 1.0);
  }
  const double mean = sum / rounds;
  const double se = std::sqrt((sum_sq / rounds - mean * mean) / (rounds - 1));
  const double want = *ExpectedAcceptanceLength(1.0 - corruption, k_r);  // 1 + .7 + .49 + .343 + .2401
  EXPECT_NEAR(want, 2.7731, 1e-12);
  const double z_crit = boost::math::quantile(boost::math::complement(boost::math::normal(), kAlpha / 2));
  std::printf("synthetic corruption %.1f, K=%d: acceptance length %.4f (formula %.4f), z = %.2f, critical %.2f\n",
              corruption, k_r, mean, want, (mean - want) / se, z_crit);
  EXPECT_LT(std::fabs(mean - want) / se, z_crit);
}

TEST(SyntheticProposer, BadInputIsRefused) {
  const std::vector<Token> cont = {1, 2};
  const std::vector<Token> bad = {1, 256};
  EXPECT_EQ(SyntheticProposals(cont, -0.1, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SyntheticProposals(cont, 1.5, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SyntheticProposals(cont, NAN, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SyntheticProposals(bad, 0.5, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SyntheticProposals(cont, 0.5, {.frontier = -3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SyntheticProposals({}, 0.5, {}).ok());
}

}  // namespace
}  // namespace dhs::spec
