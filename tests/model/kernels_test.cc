// The model's numeric kernels (workerd/model/kernels.h): Dot follows its documented fixed reduction order bit for bit
// (checked against a plain scalar transcription of that order), MatVec and MatMul are Dot per output element, so
// MatMul is bit-identical to per-query MatVec whatever the batch (brief §7, §11: batch invariance), including across
// its weight blocks and query tiles and with strided X / Y; Axpy is elementwise.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "workerd/model/kernels.h"

namespace dhs::model::kernels {
namespace {

// The order documented in kernels.h, written out lane by lane in scalar code (independent of the SIMD kernel).
float RefDot(const float* w, const float* x, int n) {
  float acc[16];
  for (float& a : acc) a = 0.0f;
  const int m = n - n % 16;
  for (int i = 0; i < m; i += 16) {
    for (int l = 0; l < 16; ++l) acc[l] = acc[l] + w[i + l] * x[i + l];
  }
  for (int j = m; j < n; ++j) acc[j - m] = acc[j - m] + w[j] * x[j];
  for (int l = 0; l < 8; ++l) acc[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] = acc[l] + acc[l + 4];
  for (int l = 0; l < 2; ++l) acc[l] = acc[l] + acc[l + 2];
  return acc[0] + acc[1];
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Values spanning several magnitudes, so that different summation orders round differently.
std::vector<float> Values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (float& f : v) {
    const double u = static_cast<double>(rng() >> 11) * 0x1p-53 * 2.0 - 1.0;
    const int e = static_cast<int>(rng() % 13) - 6;
    f = static_cast<float>(std::ldexp(u, e));
  }
  return v;
}

TEST(DotTest, FollowsTheDocumentedOrderBitForBit) {
  int order_matters = 0;
  for (int n : {0, 1, 3, 8, 15, 16, 17, 31, 32, 33, 64, 72, 100, 128, 1000, 1024, 1030, 1536}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const auto w = Values(n, seed), x = Values(n, seed + 100);
      const float got = Dot(w.data(), x.data(), n);
      EXPECT_TRUE(SameBits(got, RefDot(w.data(), x.data(), n))) << "n = " << n << " seed = " << seed;
      float sequential = 0.0f;
      for (int j = 0; j < n; ++j) sequential += w[j] * x[j];
      if (!SameBits(got, sequential)) order_matters++;
      // And it is a dot product: close to the exact value (error bound n * eps * Σ|w x|).
      double exact = 0, mag = 0;
      for (int j = 0; j < n; ++j) {
        exact += static_cast<double>(w[j]) * x[j];
        mag += std::fabs(static_cast<double>(w[j]) * x[j]);
      }
      EXPECT_NEAR(got, exact, (n + 1) * 0x1p-23 * mag + 1e-30) << "n = " << n;
    }
  }
  EXPECT_GT(order_matters, 0);  // the inputs do tell the lane order from a sequential sum
  EXPECT_TRUE(SameBits(Dot(nullptr, nullptr, 0), 0.0f));
}

TEST(DotTest, MatVecIsDotPerRow) {
  const int rows = 21, cols = 77;
  const auto w = Values(rows * cols, 5), x = Values(cols, 6);
  std::vector<float> y(rows);
  MatVec(w.data(), rows, cols, x.data(), y.data());
  for (int r = 0; r < rows; ++r) EXPECT_TRUE(SameBits(y[r], RefDot(w.data() + r * cols, x.data(), cols))) << r;
}

// MatMul over Q queries with strides: every element equals MatVec of that query alone (and the reference Dot); the
// padding of Y is left untouched. Shapes cover weight blocks of many rows / one row, remainder rows, odd Q (a query
// without a pair), Q spanning several query tiles (cols 4096: 16 queries per tile), and cols below/off 16.
TEST(MatMulTest, BitIdenticalToPerQueryMatVec) {
  struct Shape {
    int rows, cols, q;
  };
  const float kSentinel = -7.25f;
  for (const Shape& s : std::vector<Shape>{{1, 1, 1},    {3, 7, 5},     {5, 16, 2},    {70, 64, 9},   {256, 64, 16},
                                           {37, 1030, 7}, {9, 4096, 37}, {6, 1536, 4}, {130, 72, 33}, {2, 1024, 1}}) {
    const int ldx = s.cols + 3, ldy = s.rows + 2;
    const auto w = Values(static_cast<size_t>(s.rows) * s.cols, s.rows * 31 + s.cols);
    const auto x = Values(static_cast<size_t>(s.q) * ldx, s.q * 17 + 3);
    std::vector<float> y(static_cast<size_t>(s.q) * ldy, kSentinel);
    MatMul(w.data(), s.rows, s.cols, x.data(), ldx, s.q, y.data(), ldy);
    std::vector<float> alone(s.rows);
    for (int q = 0; q < s.q; ++q) {
      MatVec(w.data(), s.rows, s.cols, x.data() + static_cast<size_t>(q) * ldx, alone.data());
      for (int r = 0; r < s.rows; ++r) {
        const float got = y[static_cast<size_t>(q) * ldy + r];
        ASSERT_TRUE(SameBits(got, alone[r])) << s.rows << "x" << s.cols << " Q=" << s.q << " q=" << q << " r=" << r;
        ASSERT_TRUE(SameBits(got, RefDot(w.data() + static_cast<size_t>(r) * s.cols,
                                         x.data() + static_cast<size_t>(q) * ldx, s.cols)));
      }
      for (int r = s.rows; r < ldy; ++r) EXPECT_EQ(y[static_cast<size_t>(q) * ldy + r], kSentinel);
    }
    // The same queries in a smaller batch (a prefix of them) give the same bits.
    const int half = (s.q + 1) / 2;
    std::vector<float> y2(static_cast<size_t>(half) * ldy, kSentinel);
    MatMul(w.data(), s.rows, s.cols, x.data(), ldx, half, y2.data(), ldy);
    EXPECT_EQ(std::memcmp(y2.data(), y.data(), y2.size() * sizeof(float)), 0);
  }
}

TEST(AxpyTest, Elementwise) {
  for (int n = 0; n <= 13; ++n) {
    const auto x = Values(n, n + 40);
    auto y = Values(n, n + 80);
    auto expect = y;
    const float a = 0.3f + n;
    for (int i = 0; i < n; ++i) expect[i] = expect[i] + a * x[i];
    Axpy(a, x.data(), n, y.data());
    for (int i = 0; i < n; ++i) EXPECT_TRUE(SameBits(y[i], expect[i])) << "n = " << n << " i = " << i;
  }
}

}  // namespace
}  // namespace dhs::model::kernels
