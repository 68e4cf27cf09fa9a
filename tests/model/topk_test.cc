// Top-k selection and indexer scores (brief §2 selection, §11): tie rule, padding, causal history sizes, stale
// buffers, dense equivalence of attention over a full selection.
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "workerd/model/kernels.h"
#include "workerd/model/topk.h"

namespace dhs::model {
namespace {

// Independent reference: position s is selected at rank r = number of positions that beat it (higher score, or equal
// score and lower position); ranks >= k are dropped, missing ranks are -1.
std::vector<Position> BruteForce(const std::vector<float>& scores, size_t k) {
  std::vector<Position> out(k, -1);
  for (size_t s = 0; s < scores.size(); ++s) {
    size_t rank = 0;
    for (size_t o = 0; o < scores.size(); ++o) {
      if (scores[o] > scores[s] || (scores[o] == scores[s] && o < s)) rank++;
    }
    if (rank < k) out[rank] = static_cast<Position>(s);
  }
  return out;
}

std::vector<float> RandomScores(size_t n, uint64_t seed, int distinct_values) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(static_cast<int>(rng() % distinct_values)) * 0.25f - 1.0f;
  return v;
}

TEST(TopKTest, HistoriesAroundK) {
  const size_t k = 16;
  TopK topk;
  for (size_t n : {k - 1, k, k + 1}) {
    const auto scores = RandomScores(n, n, 1000);
    std::vector<Position> out(k, 12345);
    topk.Select(scores, out);
    EXPECT_EQ(out, BruteForce(scores, k)) << "n = " << n;
    const size_t padded = static_cast<size_t>(std::count(out.begin(), out.end(), kNoPosition));
    EXPECT_EQ(padded, n < k ? k - n : 0) << "n = " << n;
    if (n <= k) {  // every visible position is selected
      std::vector<Position> sorted(out.begin(), out.begin() + n);
      std::sort(sorted.begin(), sorted.end());
      for (size_t s = 0; s < n; ++s) EXPECT_EQ(sorted[s], static_cast<Position>(s));
    }
  }
}

TEST(TopKTest, ManyExactTiesFollowTieRule) {
  TopK topk;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const auto scores = RandomScores(100 + seed, seed, 3);  // only 3 distinct values: massive ties
    std::vector<Position> out(32);
    topk.Select(scores, out);
    EXPECT_EQ(out, BruteForce(scores, 32)) << "seed " << seed;
  }
  // All equal: the lowest positions in ascending order.
  std::vector<float> equal(40, 0.5f);
  std::vector<Position> out(8);
  topk.Select(equal, out);
  EXPECT_EQ(out, (std::vector<Position>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(TopKTest, ReusedBufferNeverLeaksStalePositions) {
  TopK topk;
  std::vector<Position> out(8);
  topk.Select(RandomScores(50, 1, 1000), out);
  EXPECT_EQ(std::count(out.begin(), out.end(), kNoPosition), 0);
  const std::vector<float> three = {0.1f, 0.3f, 0.2f};
  topk.Select(three, out);
  EXPECT_EQ(out, (std::vector<Position>{1, 2, 0, -1, -1, -1, -1, -1}));
  topk.Select({}, out);
  EXPECT_EQ(out, std::vector<Position>(8, -1));
}

TEST(TopKTest, NanRanksLast) {
  TopK topk;
  const std::vector<float> scores = {NAN, -5.0f, NAN, 2.0f};
  std::vector<Position> out(4);
  topk.Select(scores, out);
  EXPECT_EQ(out, (std::vector<Position>{3, 1, 0, 2}));
}

TEST(IndexScoresTest, MatchesFormula) {
  // I(t,s) = Σ_h w(t,h) * ReLU(q(t,h)·k(s)), checked in double on small integers (exact in float).
  const int heads = 3, dim = 4, n = 7;
  std::mt19937_64 rng(3);
  auto small = [&] { return static_cast<float>(static_cast<int>(rng() % 7) - 3); };
  std::vector<float> q(heads * dim), w(heads), keys(n * dim), out(n);
  for (auto& v : q) v = small();
  for (auto& v : w) v = small();
  for (auto& v : keys) v = small();
  IndexScores(q, w, keys, dim, out);
  for (int s = 0; s < n; ++s) {
    double expect = 0;
    for (int h = 0; h < heads; ++h) {
      double dot = 0;
      for (int d = 0; d < dim; ++d) dot += double(q[h * dim + d]) * keys[s * dim + d];
      expect += w[h] * std::max(dot, 0.0);
    }
    EXPECT_EQ(out[s], static_cast<float>(expect)) << "s = " << s;
  }
}

TEST(IndexScoresTest, BitIdenticalToTheOneKeyLoopAtEveryLengthAndWidth) {
  // The blocked loop (8 keys side by side, issue 27) must give, bit for bit, the fixed order of topk.h for every key:
  // dot = ((q0*k0 + q1*k1) + ...) over d ascending, score = ((0 + w0*relu(dot0)) + w1*relu(dot1)) + ... over heads,
  // in float, with random values (rounding differs with any other order). Lengths around the block of 8, dims of
  // the presets (16, 32), an odd one, and one above the blocked limit (129: the one-key path).
  std::mt19937_64 rng(27);
  auto uni = [&] { return static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-53 * 2.0 - 1.0); };
  for (int dim : {1, 16, 32, 33, 129}) {
    for (int heads : {1, 2, 4}) {
      for (int n : {0, 1, 7, 8, 9, 16, 17, 1000}) {
        std::vector<float> q(heads * dim), w(heads), keys(static_cast<size_t>(n) * dim), out(n, -7.0f);
        for (auto& v : q) v = uni();
        for (auto& v : w) v = uni();
        for (auto& v : keys) v = uni();
        IndexScores(q, w, keys, dim, out);
        for (int s = 0; s < n; ++s) {
          float score = 0.0f;
          for (int h = 0; h < heads; ++h) {
            float dot = 0.0f;
            for (int d = 0; d < dim; ++d) dot = dot + q[h * dim + d] * keys[static_cast<size_t>(s) * dim + d];
            score = score + w[h] * (dot < 0.0f ? 0.0f : dot);  // std::max(dot, 0.0f)
          }
          ASSERT_EQ(std::bit_cast<uint32_t>(out[s]), std::bit_cast<uint32_t>(score))
              << "dim " << dim << " heads " << heads << " n " << n << " s " << s;
        }
      }
    }
  }
}

TEST(AttentionTest, FullSelectionEqualsDenseAttention) {
  // With at most k visible rows the selection holds all of them (in score order); attention over it must equal
  // dense softmax attention over positions 0..n-1 (computed independently here, in double, in position order).
  const int d_c = 8, d_r = 4, width = d_c + d_r, k = 16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(width));
  std::mt19937_64 rng(9);
  auto uni = [&] { return static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-53 * 2.0 - 1.0); };
  for (int n : {1, 5, k - 1, k}) {
    std::vector<float> rows(n * width), qc(d_c), qr(d_r), scores(n);
    for (auto& v : rows) v = uni();
    for (auto& v : qc) v = uni();
    for (auto& v : qr) v = uni();
    for (auto& v : scores) v = uni();
    TopK topk;
    std::vector<Position> sel(k);
    topk.Select(scores, sel);
    std::vector<float> gathered(k * width, 0.0f);
    std::unique_ptr<bool[]> valid(new bool[k]);
    for (int j = 0; j < k; ++j) {
      valid[j] = sel[j] >= 0;
      if (valid[j]) std::copy_n(rows.begin() + sel[j] * width, width, gathered.begin() + j * width);
    }
    std::vector<float> out(d_c);
    kernels::AttendLatent(qc.data(), qr.data(), gathered.data(), valid.get(), k, d_c, d_r, scale, out.data());

    std::vector<double> logit(n), dense(d_c, 0.0);
    double mx = -1e300, sum = 0;
    for (int s = 0; s < n; ++s) {
      double dot = 0;
      for (int d = 0; d < width; ++d) dot += double(d < d_c ? qc[d] : qr[d - d_c]) * rows[s * width + d];
      logit[s] = dot * scale;
      mx = std::max(mx, logit[s]);
    }
    for (int s = 0; s < n; ++s) sum += std::exp(logit[s] - mx);
    for (int s = 0; s < n; ++s) {
      for (int d = 0; d < d_c; ++d) dense[d] += std::exp(logit[s] - mx) / sum * rows[s * width + d];
    }
    for (int d = 0; d < d_c; ++d) EXPECT_NEAR(out[d], dense[d], 1e-5) << "n = " << n << " d = " << d;
  }
}

}  // namespace
}  // namespace dhs::model
