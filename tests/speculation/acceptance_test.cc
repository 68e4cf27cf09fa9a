// tests/speculation/acceptance_test.cc: speculative acceptance (workerd/speculation/acceptance.h, brief §6) and its keyed draws
// (workerd/speculation/keyed_draw.h).
//   - Philox4x32-10 through our key packing reproduces a known-answer vector of Random123 (kat_vectors).
//   - Sampling mode, over 100,000 rounds with distinct seeds per (p, q) pair, K_r = 4: the first emitted token is
//     distributed as p_0 and the second (when x_1 was accepted) as p_1 (Pearson chi-square at significance 0.001,
//     critical value from Boost.Math's chi-square quantile for the pair's degrees of freedom; bins with expected
//     count < 5 pooled), tokens with p = 0 are never emitted, and x_1's acceptance count matches
//     P(accept) = Σ_y min(p_0(y), q_1(y)) computed by hand (chi-square, 1 df). Pairs include q with zeros where p has
//     mass and mass where p has none, q = p and a one-hot q. Power: the drafts themselves (drawn from q) fail the
//     same test against p.
//   - Greedy mode: the emitted tokens are the argmax sequence up to and including the first mismatch; sampling mode
//     at temperature 0 gives the same; ties take the lowest id.
//   - The mean acceptance length with i.i.d. acceptance alpha matches (1 - alpha^K) / (1 - alpha) (z-test, 0.001).
//   - Every round: emitted = accepted + 1 tokens; bonus iff all K_r - 1 accepted; the same key gives the same round.
#include <gtest/gtest.h>

#include <boost/math/distributions/chi_squared.hpp>
#include <boost/math/distributions/normal.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "workerd/speculation/acceptance.h"
#include "workerd/speculation/block_width.h"
#include "workerd/speculation/keyed_draw.h"

namespace dhs::spec {
namespace {

using model::kVocab;
using model::Token;
constexpr double kAlpha = 0.001;  // significance level of every chi-square test here

double Critical(int df) {
  return boost::math::quantile(boost::math::complement(boost::math::chi_squared(df), kAlpha));
}

std::vector<double> Dist(const std::map<int, double>& mass) {
  std::vector<double> v(kVocab, 0.0);
  for (auto [id, m] : mass) v[id] = m;
  return v;
}

// Pearson chi-square of `counts` (n samples) against `p`; bins with expected < 5 pooled into one. Returns
// {statistic, degrees of freedom}; asserts no count where p is 0.
std::pair<double, int> ChiSquare(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double stat = 0.0, pooled_e = 0.0;
  int64_t pooled_o = 0;
  int bins = 0;
  for (int y = 0; y < kVocab; ++y) {
    if (p[y] == 0.0) {
      EXPECT_EQ(counts[y], 0) << "token " << y << " has p = 0 but was emitted";
      continue;
    }
    const double e = p[y] * static_cast<double>(n);
    if (e < 5.0) {
      pooled_e += e;
      pooled_o += counts[y];
      continue;
    }
    stat += (counts[y] - e) * (counts[y] - e) / e;
    ++bins;
  }
  if (pooled_e > 0.0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  }
  return {stat, bins - 1};
}

TEST(KeyedDraw, PhiloxKnownAnswerThroughTheKeyPacking) {
  // Random123 kat_vectors: philox4x32 10 rounds, ctr {243f6a88 85a308d3 13198a2e 03707344}, key {a4093822 299f31d0}
  // -> {d16cfe09 94fdcceb 5001e420 24126ea1}. Counter word 3 = purpose 3 << 24 | position bits 32..55 (0x707344).
  const DrawKey key{.seed = 0x299f31d0a4093822ULL, .request = 0x85a308d3243f6a88ULL,
                    .position = (Position{0x707344} << 32) | 0x13198a2e, .purpose = DrawPurpose::kCorrection};
  const std::array<uint32_t, 4> w = KeyedBits(key);
  EXPECT_EQ(w[0], 0xd16cfe09u);
  EXPECT_EQ(w[1], 0x94fdccebu);
  EXPECT_EQ(w[2], 0x5001e420u);
  EXPECT_EQ(w[3], 0x24126ea1u);
  EXPECT_EQ(KeyedUniform(key), static_cast<double>((uint64_t{0x94fdcceb} << 32 | 0xd16cfe09) >> 11) * 0x1p-53);
}

TEST(KeyedDraw, SampleWithUniformIsTheInverseCdf) {
  const std::vector<double> p = Dist({{2, 0.25}, {5, 0.5}, {9, 0.25}});
  EXPECT_EQ(SampleWithUniform(p, 0.0), 2);
  EXPECT_EQ(SampleWithUniform(p, 0.2499), 2);
  EXPECT_EQ(SampleWithUniform(p, 0.25), 5);
  EXPECT_EQ(SampleWithUniform(p, 0.7499), 5);
  EXPECT_EQ(SampleWithUniform(p, 0.75), 9);
  EXPECT_EQ(SampleWithUniform(p, 0.9999999), 9);
  EXPECT_EQ(SampleWithUniform(std::vector<double>(kVocab, 0.0), 0.5), -1);
}

TEST(Chi, BoostQuantileMatchesTables) {  // the tables' 5% and 0.1% points
  EXPECT_NEAR(boost::math::quantile(boost::math::complement(boost::math::chi_squared(1), 0.05)), 3.841, 1e-3);
  EXPECT_NEAR(Critical(1), 10.828, 1e-3);
  EXPECT_NEAR(Critical(4), 18.467, 1e-3);
}

struct Pair {
  const char* name;
  std::vector<double> p0, p1, q;
  double accept;  // Σ_y min(p0(y), q(y)), by hand
};

std::vector<Pair> Pairs() {
  std::vector<Pair> v;
  const auto p_a = Dist({{3, 0.4}, {7, 0.25}, {11, 0.2}, {20, 0.1}, {200, 0.05}});
  const auto p_b = Dist({{3, 0.1}, {7, 0.1}, {11, 0.3}, {20, 0.3}, {201, 0.2}});
  // .1 + .1 + .2 + .1 + .05
  v.push_back({"q overlapping p", p_a, p_b, Dist({{3, 0.1}, {7, 0.1}, {11, 0.5}, {20, 0.2}, {200, 0.1}}), 0.55});
  // q has zeros at 11, 20, 200 where p has mass, and mass at 9 where p has none: min = .4 + .25
  v.push_back({"q with zeros", p_a, p_b, Dist({{3, 0.5}, {7, 0.3}, {9, 0.2}}), 0.65});
  v.push_back({"q equals p", p_a, p_b, p_a, 1.0});
  v.push_back({"q one-hot", p_a, p_b, Dist({{7, 1.0}}), 0.25});
  return v;
}

void RunPair(const Pair& pr) {
  const int64_t rounds = 100000;
  const int k_r = 4;
  std::vector<std::vector<double>> p = {pr.p0, pr.p1, pr.p1, pr.p0};
  std::vector<int64_t> first(kVocab, 0), second(kVocab, 0), drafts(kVocab, 0);
  int64_t n_second = 0, accepted_1 = 0;
  for (int64_t r = 0; r < rounds; ++r) {
    const RoundKey key{.seed = static_cast<uint64_t>(r) * 7919 + 1, .request = 42, .frontier = 1000};
    std::vector<Proposal> props;
    for (int j = 1; j < k_r; ++j) {
      const double u = KeyedUniform({key.seed, key.request, key.frontier + j, DrawPurpose::kDraft});
      props.push_back({SampleWithUniform(pr.q, u), pr.q});
    }
    absl::StatusOr<RoundOutcome> out = AcceptWithDistributions(p, props, key);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->emitted.size(), static_cast<size_t>(out->accepted) + 1);
    ASSERT_EQ(out->bonus, out->accepted == k_r - 1);
    for (int j = 0; j < out->accepted; ++j) ASSERT_EQ(out->emitted[j], props[j].token);
    ++first[out->emitted[0]];
    ++drafts[props[0].token];
    if (out->accepted >= 1) {
      ++accepted_1;
      ++second[out->emitted[1]];
      ++n_second;
    }
  }
  const auto [s1, df1] = ChiSquare(first, pr.p0, rounds);
  std::printf("%-16s first token: chi2 = %.2f, df = %d, critical(%.3f) = %.2f\n", pr.name, s1, df1, kAlpha,
              Critical(df1));
  EXPECT_LT(s1, Critical(df1)) << pr.name;
  const auto [s2, df2] = ChiSquare(second, pr.p1, n_second);
  std::printf("%-16s second token (%lld rounds): chi2 = %.2f, df = %d, critical = %.2f\n", pr.name,
              static_cast<long long>(n_second), s2, df2, Critical(df2));
  EXPECT_LT(s2, Critical(df2)) << pr.name;
  if (pr.accept < 1.0) {
    const double e_a = pr.accept * rounds, e_r = (1.0 - pr.accept) * rounds;
    const double s_a = (accepted_1 - e_a) * (accepted_1 - e_a) / e_a +
                       (rounds - accepted_1 - e_r) * (rounds - accepted_1 - e_r) / e_r;
    std::printf("%-16s acceptance of x_1: %.4f (expected %.4f), chi2 = %.2f, critical = %.2f\n", pr.name,
                static_cast<double>(accepted_1) / rounds, pr.accept, s_a, Critical(1));
    EXPECT_LT(s_a, Critical(1)) << pr.name;
    // Power: the drafts are drawn from q != p, and the same test rejects them.
    double stat = 0.0;
    for (int y = 0; y < kVocab; ++y) {
      const double e = pr.p0[y] * rounds;
      if (e > 0.0) stat += (drafts[y] - e) * (drafts[y] - e) / e;
      else if (drafts[y] > 0) stat = INFINITY;
    }
    EXPECT_GT(stat, Critical(df1)) << pr.name;
  } else {
    EXPECT_EQ(accepted_1, rounds);
  }
}

TEST(Acceptance, EmittedTokensFollowTheTargetDistribution) {
  for (const Pair& pr : Pairs()) RunPair(pr);
}

// With the same p and q at every position, each proposal is accepted independently with alpha = Σ min(p, q) = 0.55
// (pair "q overlapping p"): the mean acceptance length over 100,000 rounds of K_r = 6 must match
// ExpectedAcceptanceLength(0.55, 6) = (1 - 0.55^6) / 0.45 = 2.160707... (two-sided z-test at significance 0.001, the
// standard error from the sample variance).
TEST(Acceptance, MeanAcceptanceLengthMatchesTheFormula) {
  const Pair pr = Pairs()[0];
  const int k_r = 6;
  const std::vector<std::vector<double>> p(k_r, pr.p0);
  const int64_t rounds = 100000;
  double sum = 0.0, sum_sq = 0.0;
  for (int64_t r = 0; r < rounds; ++r) {
    const RoundKey key{.seed = 17, .request = static_cast<RequestId>(r) + 1, .frontier = 5};
    std::vector<Proposal> props;
    for (int j = 1; j < k_r; ++j) {
      props.push_back({SampleWithUniform(pr.q, KeyedUniform({key.seed, key.request, 5 + j, DrawPurpose::kDraft})),
                       pr.q});
    }
    absl::StatusOr<RoundOutcome> out = AcceptWithDistributions(p, props, key);
    ASSERT_TRUE(out.ok()) << out.status();
    const double len = out->accepted + 1.0;
    sum += len;
    sum_sq += len * len;
  }
  const double mean = sum / rounds;
  const double se = std::sqrt((sum_sq / rounds - mean * mean) / (rounds - 1));
  const double want = *ExpectedAcceptanceLength(pr.accept, k_r);
  EXPECT_NEAR(want, (1.0 - std::pow(0.55, 6)) / 0.45, 1e-12);
  const double z_crit = boost::math::quantile(boost::math::complement(boost::math::normal(), kAlpha / 2));
  std::printf("acceptance length mean %.4f (formula %.4f), z = %.2f, critical %.2f\n", mean, want,
              (mean - want) / se, z_crit);
  EXPECT_LT(std::fabs(mean - want) / se, z_crit);
}

TEST(Acceptance, FromLogitsWithTemperatureAndTopP) {
  // p from SamplingDistribution over all 256 ids (temperature 0.8, top-p 0.9); q a different softmax.
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int k_r = 3;
  std::vector<float> logits(k_r * kVocab);
  for (float& x : logits) x = nd(rng);
  const model::SamplingParams params{.temperature = 0.8f, .top_p = 0.9f};
  const std::vector<double> p0 =
      model::SamplingDistribution(std::span<const float>(logits).subspan(0, kVocab), params);
  std::vector<double> q(kVocab);
  double sum = 0.0;
  for (int y = 0; y < kVocab; ++y) sum += q[y] = std::exp(nd(rng) / 2.0);
  for (double& x : q) x /= sum;
  const int64_t rounds = 60000;
  std::vector<int64_t> first(kVocab, 0);
  for (int64_t r = 0; r < rounds; ++r) {
    const RoundKey key{.seed = 99, .request = static_cast<RequestId>(r) + 1, .frontier = 77};
    std::vector<Proposal> props;
    for (int j = 1; j < k_r; ++j) {
      props.push_back({SampleWithUniform(q, KeyedUniform({key.seed, key.request, 77 + j, DrawPurpose::kDraft})), q});
    }
    absl::StatusOr<RoundOutcome> out = AcceptRound(AcceptMode::kSampling, logits, params, props, key);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->emitted.size(), static_cast<size_t>(out->accepted) + 1);
    ++first[out->emitted[0]];
  }
  const auto [stat, df] = ChiSquare(first, p0, rounds);
  std::printf("logits (T=0.8, top-p 0.9): chi2 = %.2f, df = %d, critical = %.2f\n", stat, df, Critical(df));
  EXPECT_LT(stat, Critical(df));
}

TEST(Acceptance, GreedyEmitsTheArgmaxSequence) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd;
  for (int trial = 0; trial < 500; ++trial) {
    const int k_r = 1 + trial % 8;
    std::vector<float> logits(k_r * kVocab);
    for (float& x : logits) x = nd(rng);
    std::vector<Token> argmax(k_r);
    for (int j = 0; j < k_r; ++j) {
      int best = 0;
      for (int y = 1; y < kVocab; ++y) best = logits[j * kVocab + y] > logits[j * kVocab + best] ? y : best;
      argmax[j] = best;
    }
    // Proposals: the argmax with probability 0.8, another token otherwise.
    std::vector<Proposal> props;
    std::vector<std::vector<double>> qs(k_r);
    for (int j = 1; j < k_r; ++j) {
      const bool right = std::bernoulli_distribution(0.8)(rng);
      const Token x = right ? argmax[j - 1] : (argmax[j - 1] + 1 + static_cast<Token>(rng() % 255)) % kVocab;
      qs[j] = Dist({{x, 1.0}});
      props.push_back({x, qs[j]});
    }
    int expect_a = 0;
    while (expect_a < k_r - 1 && props[expect_a].token == argmax[expect_a]) ++expect_a;
    const RoundKey key{.seed = 5, .request = 9, .frontier = trial};
    absl::StatusOr<RoundOutcome> g = AcceptRound(AcceptMode::kGreedy, logits, {}, props, key);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_EQ(g->accepted, expect_a);
    ASSERT_EQ(g->emitted, std::vector<Token>(argmax.begin(), argmax.begin() + expect_a + 1));
    ASSERT_EQ(g->bonus, expect_a == k_r - 1);
    // Sampling mode at temperature 0 (p one-hot at the argmax) decides the same.
    absl::StatusOr<RoundOutcome> s = AcceptRound(AcceptMode::kSampling, logits, {.temperature = 0.0f}, props, key);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->emitted, g->emitted);
  }
  // Ties: lowest id.
  std::vector<float> tie(kVocab, 0.0f);
  tie[40] = tie[12] = 3.0f;
  absl::StatusOr<RoundOutcome> t = AcceptRound(AcceptMode::kGreedy, tie, {}, {}, {});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->emitted, std::vector<Token>{12});
  EXPECT_TRUE(t->bonus);
}

TEST(Acceptance, SameKeySameRoundOtherRequestOtherDraws) {
  const std::vector<double> p = Dist({{1, 0.5}, {2, 0.5}});
  const std::vector<double> q = Dist({{1, 0.9}, {2, 0.1}});
  std::vector<std::vector<double>> ps = {p, p};
  const std::vector<Proposal> props = {{1, q}};
  int differ = 0;
  for (RequestId r = 1; r <= 64; ++r) {
    absl::StatusOr<RoundOutcome> a = AcceptWithDistributions(ps, props, {3, r, 10});
    absl::StatusOr<RoundOutcome> b = AcceptWithDistributions(ps, props, {3, r, 10});
    absl::StatusOr<RoundOutcome> c = AcceptWithDistributions(ps, props, {3, r + 1000, 10});
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(a->emitted, b->emitted);
    differ += a->emitted != c->emitted;
  }
  EXPECT_GT(differ, 0);
}

TEST(Acceptance, BadInputIsRefused) {
  const std::vector<double> p = Dist({{1, 0.5}, {2, 0.5}});
  const std::vector<double> q = Dist({{1, 1.0}});
  const std::vector<double> q_short(10, 0.1);
  const std::vector<double> q_not_one = Dist({{1, 0.5}});
  std::vector<std::vector<double>> ps = {p, p};
  auto code = [&](std::vector<Proposal> props, std::vector<std::vector<double>> rows) {
    return AcceptWithDistributions(rows, props, {}).status().code();
  };
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code({{1, q}, {1, q}}, ps), kBad);           // K_r - 1 = 1 proposal expected
  EXPECT_EQ(code({}, {}), kBad);                         // K_r = 0
  EXPECT_EQ(code({{2, q}}, ps), kBad);                   // q(x) = 0
  EXPECT_EQ(code({{300, q}}, ps), kBad);                 // token out of range
  EXPECT_EQ(code({{1, q_short}}, ps), kBad);             // q not kVocab entries
  EXPECT_EQ(code({{1, q_not_one}}, ps), kBad);           // q sums to 0.5
  EXPECT_EQ(code({{1, q}}, {p, q_not_one}), kBad);       // p_1 not a distribution
  EXPECT_EQ(AcceptWithDistributions(ps, std::vector<Proposal>{{1, q}}, {.frontier = -1}).status().code(), kBad);
  EXPECT_EQ(AcceptWithDistributions(ps, std::vector<Proposal>{{1, q}}, {.frontier = Position{1} << 56})
                .status().code(), kBad);
  std::vector<float> logits(2 * kVocab, 0.0f);
  EXPECT_EQ(AcceptRound(AcceptMode::kSampling, std::span<const float>(logits).first(kVocab + 3), {}, {}, {})
                .status().code(), kBad);
  std::vector<float> nan(kVocab, NAN);
  EXPECT_EQ(AcceptRound(AcceptMode::kSampling, nan, {}, {}, {}).status().code(), kBad);  // p is all NaN
  const std::vector<Proposal> no_q = {{0, {}}};
  EXPECT_TRUE(AcceptRound(AcceptMode::kGreedy, logits, {}, no_q, {}).ok());  // greedy needs no q
}

}  // namespace
}  // namespace dhs::spec
