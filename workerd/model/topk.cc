#include "workerd/model/topk.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dhs::model {

void IndexScores(std::span<const float> q, std::span<const float> w, std::span<const float> keys, int idx_dim,
                 std::span<float> out) {
  const size_t heads = w.size();
  for (size_t s = 0; s < out.size(); ++s) {
    const float* k = keys.data() + s * idx_dim;
    float score = 0.0f;
    for (size_t h = 0; h < heads; ++h) {
      const float* qh = q.data() + h * idx_dim;
      float dot = 0.0f;
      for (int d = 0; d < idx_dim; ++d) dot += qh[d] * k[d];
      score += w[h] * std::max(dot, 0.0f);
    }
    out[s] = score;
  }
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
