#include "workerd/model/topk.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dhs::model {

namespace {

// One key's score in the fixed order of topk.h (dims ascending, then heads ascending).
float OneScore(const float* q, std::span<const float> w, const float* k, int idx_dim) {
  float score = 0.0f;
  for (size_t h = 0; h < w.size(); ++h) {
    const float* qh = q + h * idx_dim;
    float dot = 0.0f;
    for (int d = 0; d < idx_dim; ++d) dot += qh[d] * k[d];
    score += w[h] * std::max(dot, 0.0f);
  }
  return score;
}

}  // namespace

// Keys in blocks of kLanes: the block is transposed to dim-major (kt[d][j]) so that the kLanes dot products advance
// side by side (independent chains the compiler vectorizes), each still summed over d ascending and then over heads
// ascending, exactly as OneScore: the same float operations in the same order per key (the build has
// -ffp-contract=off), so the scores are bit-identical to the one-key loop (tests/model/topk_test.cc). Issue 27: at
// 32K visible positions the one-chain loop was the decode step's largest part on the CPU backend.
void IndexScores(std::span<const float> q, std::span<const float> w, std::span<const float> keys, int idx_dim,
                 std::span<float> out) {
  constexpr size_t kLanes = 8;
  constexpr int kMaxBlockedDim = 128;
  const size_t n = out.size(), heads = w.size();
  size_t s = 0;
  if (idx_dim <= kMaxBlockedDim) {
    alignas(64) float kt[kMaxBlockedDim][kLanes];
    for (; s + kLanes <= n; s += kLanes) {
      const float* k0 = keys.data() + s * idx_dim;
      for (int d = 0; d < idx_dim; ++d) {
        for (size_t j = 0; j < kLanes; ++j) kt[d][j] = k0[j * idx_dim + d];
      }
      float score[kLanes] = {};
      for (size_t h = 0; h < heads; ++h) {
        const float* qh = q.data() + h * idx_dim;
        float dot[kLanes] = {};
        for (int d = 0; d < idx_dim; ++d) {
          const float qd = qh[d];
          for (size_t j = 0; j < kLanes; ++j) dot[j] += qd * kt[d][j];
        }
        const float wh = w[h];
        for (size_t j = 0; j < kLanes; ++j) score[j] += wh * std::max(dot[j], 0.0f);
      }
      for (size_t j = 0; j < kLanes; ++j) out[s + j] = score[j];
    }
  }
  for (; s < n; ++s) out[s] = OneScore(q.data(), w, keys.data() + s * idx_dim, idx_dim);
}

void TopK::Select(std::span<const float> scores, std::span<Position> out) {
  const size_t k = out.size();
  const size_t n = scores.size();
  const size_t take = std::min(k, n);
  std::fill(out.begin(), out.end(), kNoPosition);
  if (take == 0) return;
  auto key = [&](Position s) {
    const float v = scores[static_cast<size_t>(s)];
    return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
  };
  // Strict total order: score descending, then position ascending (positions are distinct).
  auto before = [&](Position a, Position b) {
    const float ka = key(a), kb = key(b);
    return ka != kb ? ka > kb : a < b;
  };
  order_.resize(n);
  for (size_t s = 0; s < n; ++s) order_[s] = static_cast<Position>(s);
  std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(take), order_.end(), before);
  std::copy_n(order_.begin(), take, out.begin());
}

}  // namespace dhs::model
