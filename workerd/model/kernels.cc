#include "workerd/model/kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dhs::model::kernels {

void MatVec(const float* w, int rows, int cols, const float* x, float* y) {
  for (int i = 0; i < rows; ++i) {
    const float* wr = w + static_cast<size_t>(i) * cols;
    float acc = 0.0f;
    for (int j = 0; j < cols; ++j) acc += wr[j] * x[j];
    y[i] = acc;
  }
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
    float dot = 0.0f;
    for (int d = 0; d < d_c; ++d) dot += q_c[d] * row[d];
    for (int d = 0; d < d_r; ++d) dot += q_r[d] * row[d_c + d];
    return dot * scale;
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
    const float* row = rows + static_cast<size_t>(j) * width;
    for (int d = 0; d < d_c; ++d) out_c[d] += p * row[d];
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < d_c; ++d) out_c[d] *= inv;
}

}  // namespace dhs::model::kernels
