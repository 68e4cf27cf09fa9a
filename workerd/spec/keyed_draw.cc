#include "workerd/spec/keyed_draw.h"

#include <Random123/philox.h>

namespace dhs::spec {

std::array<uint32_t, 4> KeyedBits(const DrawKey& key) {
  using Philox = r123::Philox4x32;
  const uint64_t pos = static_cast<uint64_t>(key.position);
  Philox::ctr_type ctr = {{static_cast<uint32_t>(key.request), static_cast<uint32_t>(key.request >> 32),
                           static_cast<uint32_t>(pos),
                           (static_cast<uint32_t>(key.purpose) << 24) | static_cast<uint32_t>((pos >> 32) & 0xFFFFFF)}};
  Philox::key_type k = {{static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32)}};
  const Philox::ctr_type out = Philox()(ctr, k);
  return {out[0], out[1], out[2], out[3]};
}

double KeyedUniform(const DrawKey& key) {
  const std::array<uint32_t, 4> w = KeyedBits(key);
  const uint64_t bits = (static_cast<uint64_t>(w[0]) << 32 | w[1]) >> 11;
  return static_cast<double>(bits) * 0x1p-53;
}

model::Token SampleWithUniform(std::span<const double> probs, double u) {
  double total = 0.0;
  for (double v : probs) total += v > 0.0 ? v : 0.0;
  if (!(total > 0.0)) return -1;
  const double target = u * total;
  double acc = 0.0;
  model::Token last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (!(probs[i] > 0.0)) continue;
    acc += probs[i];
    last = static_cast<model::Token>(i);
    if (target < acc) return last;
  }
  return last;
}

}  // namespace dhs::spec
