#include "workerd/speculation/keyed_draw.h"

namespace dhs::spec {

namespace {
model::DrawKey ModelKey(const DrawKey& key) {
  return {.seed = key.seed, .stream = key.request, .position = static_cast<uint64_t>(key.position),
          .purpose = static_cast<uint8_t>(key.purpose)};
}
}  // namespace

std::array<uint32_t, 4> KeyedBits(const DrawKey& key) { return model::DrawBits(ModelKey(key)); }

double KeyedUniform(const DrawKey& key) { return model::UniformAt(ModelKey(key)); }

model::Token SampleWithUniform(std::span<const double> probs, double u) {
  double total = 0.0;
  for (double v : probs) total += v > 0.0 ? v : 0.0;
  if (!(total > 0.0)) return -1;
  return model::SampleAt(probs, u);
}

}  // namespace dhs::spec
