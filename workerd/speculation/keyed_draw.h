// workerd/speculation/keyed_draw.h: counter-based random draws keyed by (seed, request, position, purpose), so a speculative
// round is reproducible whatever the batch, the order of requests or a retry (brief §6 acceptance; §7 determinism).
//
// The draws are model::DrawBits / model::UniformAt (workerd/model/sampling.h: Philox4x32-10 of Random123, key = seed,
// counter = (request, position, purpose)), the generator the worker's plain sampling uses with purpose 0: one
// counter-based generator serves both, and distinct purposes give independent draws at one position. Positions must
// be in [0, 2^56).
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "common/types.h"
#include "workerd/model/config.h"
#include "workerd/model/sampling.h"

namespace dhs::spec {

// What a draw is for; one position may need several (a proposal's acceptance and the correction at the same position).
enum class DrawPurpose : uint8_t {
  kDraft = 1,       // the drafter's own choice of proposal x at this position (from q)
  kAccept = 2,      // the uniform u of accept-iff u * q(x) < p(x)
  kCorrection = 3,  // the sample from norm(max(0, p - q)) at the first rejection
  kBonus = 4,       // the sample from p when every proposal was accepted
};

struct DrawKey {
  uint64_t seed = 0;
  RequestId request = 0;
  Position position = 0;
  DrawPurpose purpose = DrawPurpose::kAccept;
};

// The four 32-bit words of Philox4x32-10 for this key.
std::array<uint32_t, 4> KeyedBits(const DrawKey& key);

// A uniform double in [0, 1) from the first 53 bits of KeyedBits.
double KeyedUniform(const DrawKey& key);

// Inverse CDF over `probs` (non-negative, any positive total): the first id whose running mass exceeds u * total;
// ids with probability 0 are never returned (rounding at the top end gives the last id with mass). -1 when the total
// is not positive. Same rule as model::SampleFrom, with the uniform given.
model::Token SampleWithUniform(std::span<const double> probs, double u);

}  // namespace dhs::spec
