#include "workerd/spec/synthetic_proposer.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "workerd/spec/keyed_draw.h"

namespace dhs::spec {

absl::StatusOr<std::vector<model::Token>> SyntheticProposals(std::span<const model::Token> continuation,
                                                             double corruption, const RoundKey& key) {
  constexpr Position kMaxPosition = Position{1} << 56;
  const Position n = static_cast<Position>(continuation.size());
  if (!(corruption >= 0.0 && corruption <= 1.0) || key.frontier < 0 || n > kMaxPosition ||
      key.frontier > kMaxPosition - n - 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "synthetic proposer: corruption %g must be in [0, 1] and frontier %d in [0, 2^56 - %d - 1]", corruption,
        key.frontier, n));
  }
  // corruption * 2^32 as an integer threshold: word0 < threshold corrupts (exactly never at 0, always at 1).
  const uint64_t threshold = static_cast<uint64_t>(std::ldexp(corruption, 32));
  std::vector<model::Token> out;
  out.reserve(continuation.size());
  for (size_t j = 0; j < continuation.size(); ++j) {
    const model::Token g = continuation[j];
    if (g < 0 || g >= model::kVocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("synthetic proposer: continuation token %d is %d, outside [0, %d)", j, g, model::kVocab));
    }
    const std::array<uint32_t, 4> w =
        KeyedBits({key.seed, key.request, key.frontier + static_cast<Position>(j) + 1, DrawPurpose::kDraft});
    if (w[0] >= threshold) {
      out.push_back(g);
      continue;
    }
    const model::Token other = static_cast<model::Token>(w[1] % (model::kVocab - 1));  // one of the other ids
    out.push_back(other < g ? other : other + 1);
  }
  return out;
}

}  // namespace dhs::spec
