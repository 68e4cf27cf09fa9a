#include "workerd/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "Random123/philox.h"

namespace dhs::model {

Token Argmax(std::span<const float> logits) {
  Token best = 0;
  float best_v = -INFINITY;
  bool found = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > best_v) {
      best = static_cast<Token>(i);
      best_v = logits[i];
      found = true;
    }
  }
  return best;
}

std::vector<double> SamplingDistribution(std::span<const float> logits, const SamplingParams& params) {
  std::vector<double> p(logits.size(), 0.0);
  if (p.empty()) return p;
  if (!(params.temperature > 0.0f)) {
    p[Argmax(logits)] = 1.0;
    return p;
  }
  double max_v = -INFINITY;
  for (float v : logits) {
    if (!std::isnan(v)) max_v = std::max(max_v, static_cast<double>(v));
  }
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::isnan(logits[i]) ? 0.0 : std::exp((logits[i] - max_v) / params.temperature);
    sum += p[i];
  }
  for (double& v : p) v /= sum;
  if (params.top_p < 1.0f) {
    std::vector<int> order(p.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
    double mass = 0.0, kept = 0.0;
    size_t keep = 0;
    while (keep < order.size() && (keep == 0 || mass < params.top_p)) mass += p[order[keep++]];
    for (size_t i = keep; i < order.size(); ++i) p[order[i]] = 0.0;
    for (size_t i = 0; i < keep; ++i) kept += p[order[i]];
    for (double& v : p) v /= kept;
  }
  return p;
}

std::array<uint32_t, 4> DrawBits(const DrawKey& key) {
  r123::Philox4x32 philox;
  const r123::Philox4x32::ctr_type ctr = {
      {static_cast<uint32_t>(key.stream), static_cast<uint32_t>(key.stream >> 32), static_cast<uint32_t>(key.position),
       uint32_t{key.purpose} << 24 | (static_cast<uint32_t>(key.position >> 32) & 0xFFFFFFu)}};
  const r123::Philox4x32::key_type k = {{static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32)}};
  const r123::Philox4x32::ctr_type out = philox(ctr, k);
  return {out[0], out[1], out[2], out[3]};
}

double UniformAt(const DrawKey& key) {
  const std::array<uint32_t, 4> out = DrawBits(key);
  const uint64_t word = uint64_t{out[1]} << 32 | out[0];
  return static_cast<double>(word >> 11) * 0x1p-53;  // [0, 1)
}

Token SampleFrom(std::span<const double> probs, std::mt19937_64& rng) {
  return SampleAt(probs, static_cast<double>(rng() >> 11) * 0x1p-53);
}

Token SampleAt(std::span<const double> probs, double u) {
  double total = 0.0;
  for (double v : probs) total += v;
  const double target = u * total;
  double acc = 0.0;
  Token last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0) continue;
    acc += probs[i];
    last = static_cast<Token>(i);
    if (target < acc) return last;
  }
  return last;  // rounding at the top end: the last id with mass
}

Token Sample(std::span<const float> logits, const SamplingParams& params, std::mt19937_64& rng) {
  if (!(params.temperature > 0.0f)) return Argmax(logits);
  const std::vector<double> p = SamplingDistribution(logits, params);
  return SampleFrom(p, rng);
}

Token Sample(std::span<const float> logits, const SamplingParams& params, const DrawKey& key) {
  if (!(params.temperature > 0.0f)) return Argmax(logits);
  const std::vector<double> p = SamplingDistribution(logits, params);
  return SampleAt(p, UniformAt(key));
}

}  // namespace dhs::model
