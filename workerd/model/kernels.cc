#include "workerd/model/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace dhs::model::kernels {
namespace {

static_assert(kDotLanes == 16, "Dot keeps its 16 partial sums in four 4-float vectors");

// 4 floats, one SIMD register (SSE2 on x86-64, NEON on arm64); arithmetic is lane-wise IEEE single precision.
using V4 = float __attribute__((vector_size(16)));

inline V4 Load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof v);  // unaligned load (movups)
  return v;
}

inline void Store4(float* p, V4 v) { std::memcpy(p, &v, sizeof v); }

// The end of Dot: acc[0..15] = lanes of a0 (0-3), a1 (4-7), a2 (8-11), a3 (12-15) after the main loop over j < m.
// Adds the remainder products j = m..n-1 to lanes 0.. in order, then reduces in the fixed tree of kernels.h.
inline float Finish(V4 a0, V4 a1, V4 a2, V4 a3, const float* w, const float* x, int m, int n) {
  if (m < n) {
    float acc[16];
    Store4(acc, a0);
    Store4(acc + 4, a1);
    Store4(acc + 8, a2);
    Store4(acc + 12, a3);
    for (int j = m; j < n; ++j) acc[j - m] += w[j] * x[j];
    a0 = Load4(acc);
    a1 = Load4(acc + 4);
    a2 = Load4(acc + 8);
    a3 = Load4(acc + 12);
  }
  const V4 b0 = a0 + a2;  // acc[l] + acc[l + 8], l = 0..3
  const V4 b1 = a1 + a3;  // acc[l] + acc[l + 8], l = 4..7
  const V4 c = b0 + b1;   // acc[l] + acc[l + 4], l = 0..3
  return (c[0] + c[2]) + (c[1] + c[3]);
}

inline float DotImpl(const float* w, const float* x, int n) {
  V4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  const int m = n - n % kDotLanes;
  for (int j = 0; j < m; j += kDotLanes) {
    a0 += Load4(w + j) * Load4(x + j);
    a1 += Load4(w + j + 4) * Load4(x + j + 4);
    a2 += Load4(w + j + 8) * Load4(x + j + 8);
    a3 += Load4(w + j + 12) * Load4(x + j + 12);
  }
  return Finish(a0, a1, a2, a3, w, x, m, n);
}

// Two Dots sharing the weight row: *y0 = Dot(w, x0, n), *y1 = Dot(w, x1, n), each with exactly Dot's operations (the
// partial sums of the two outputs are independent), so the bits equal DotImpl's.
inline void Dot2(const float* w, const float* x0, const float* x1, int n, float* y0, float* y1) {
  V4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  V4 b0 = {}, b1 = {}, b2 = {}, b3 = {};
  const int m = n - n % kDotLanes;
  for (int j = 0; j < m; j += kDotLanes) {
    const V4 w0 = Load4(w + j), w1 = Load4(w + j + 4), w2 = Load4(w + j + 8), w3 = Load4(w + j + 12);
    a0 += w0 * Load4(x0 + j);
    b0 += w0 * Load4(x1 + j);
    a1 += w1 * Load4(x0 + j + 4);
    b1 += w1 * Load4(x1 + j + 4);
    a2 += w2 * Load4(x0 + j + 8);
    b2 += w2 * Load4(x1 + j + 8);
    a3 += w3 * Load4(x0 + j + 12);
    b3 += w3 * Load4(x1 + j + 12);
  }
  *y0 = Finish(a0, a1, a2, a3, w, x0, m, n);
  *y1 = Finish(b0, b1, b2, b3, w, x1, m, n);
}

// MatMul tiling: a weight block is ~16 KiB (stays in L1 while every query of the tile reads it); a query tile is
// <= 256 KiB of X (stays in L2 while every weight block passes).
constexpr size_t kWeightBlockBytes = 16u << 10;
constexpr size_t kQueryTileBytes = 256u << 10;

}  // namespace

float Dot(const float* w, const float* x, int n) { return DotImpl(w, x, n); }

void MatVec(const float* w, int rows, int cols, const float* x, float* y) {
  for (int i = 0; i < rows; ++i) y[i] = DotImpl(w + static_cast<size_t>(i) * cols, x, cols);
}

void MatMul(const float* w, int rows, int cols, const float* x, int ldx, int n_queries, float* y, int ldy) {
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(std::max(cols, 1));
  const int block = static_cast<int>(std::clamp<size_t>(kWeightBlockBytes / row_bytes, 1, std::max(rows, 1)));
  const int tile = static_cast<int>(std::max<size_t>(kQueryTileBytes / row_bytes, 2));
  for (int q0 = 0; q0 < n_queries; q0 += tile) {
    const int q1 = std::min(n_queries, q0 + tile);
    for (int r0 = 0; r0 < rows; r0 += block) {
      const int r1 = std::min(rows, r0 + block);
      int q = q0;
      for (; q + 1 < q1; q += 2) {
        const float* x0 = x + static_cast<size_t>(q) * ldx;
        const float* x1 = x0 + ldx;
        float* y0 = y + static_cast<size_t>(q) * ldy;
        float* y1 = y0 + ldy;
        for (int r = r0; r < r1; ++r) Dot2(w + static_cast<size_t>(r) * cols, x0, x1, cols, y0 + r, y1 + r);
      }
      if (q < q1) {
        const float* x0 = x + static_cast<size_t>(q) * ldx;
        float* y0 = y + static_cast<size_t>(q) * ldy;
        for (int r = r0; r < r1; ++r) y0[r] = DotImpl(w + static_cast<size_t>(r) * cols, x0, cols);
      }
    }
  }
}

void Axpy(float a, const float* x, int n, float* y) {
  const V4 av = {a, a, a, a};
  int i = 0;
  for (; i + 4 <= n; i += 4) Store4(y + i, Load4(y + i) + av * Load4(x + i));
  for (; i < n; ++i) y[i] += a * x[i];
}

void RmsNorm(const float* x, const float* gain, int n, float eps, float* out) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * gain[i];
}

void Rope(float* v, int n, Position position, float theta) {
  for (int i = 0; i < n / 2; ++i) {
    const double freq = std::pow(static_cast<double>(theta), -2.0 * i / n);
    const double angle = static_cast<double>(position) * freq;
    const float c = static_cast<float>(std::cos(angle));
    const float s = static_cast<float>(std::sin(angle));
    const float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
  }
}

void Silu(float* x, int n) {
  for (int i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void AttendLatent(const float* q_c, const float* q_r, const float* rows, const bool* valid, int n_rows, int d_c,
                  int d_r, float scale, float* out_c) {
  std::fill(out_c, out_c + d_c, 0.0f);
  const int width = d_c + d_r;
  float max_logit = -std::numeric_limits<float>::infinity();
  // Two passes over the rows keep memory O(1): logits are recomputed identically (same order, same operands).
  auto logit = [&](int j) {
    const float* row = rows + static_cast<size_t>(j) * width;
    return (DotImpl(q_c, row, d_c) + DotImpl(q_r, row + d_c, d_r)) * scale;
  };
  bool any = false;
  for (int j = 0; j < n_rows; ++j) {
    if (!valid[j]) continue;
    max_logit = std::max(max_logit, logit(j));
    any = true;
  }
  if (!any) return;
  float sum = 0.0f;
  for (int j = 0; j < n_rows; ++j) {
    if (!valid[j]) continue;
    const float p = std::exp(logit(j) - max_logit);
    sum += p;
    Axpy(p, rows + static_cast<size_t>(j) * width, d_c, out_c);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < d_c; ++d) out_c[d] *= inv;
}

}  // namespace dhs::model::kernels
