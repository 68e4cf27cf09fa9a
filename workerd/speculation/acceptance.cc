#include "workerd/speculation/acceptance.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_format.h"
#include "workerd/speculation/keyed_draw.h"

namespace dhs::spec {
namespace {

// OK when v is kVocab finite non-negative probabilities summing to 1 within 1e-6.
absl::Status CheckDistribution(std::span<const double> v, const char* what, size_t j) {
  if (v.size() != static_cast<size_t>(model::kVocab)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %d has %d entries, expected %d", what, j, v.size(),
                                                      model::kVocab));
  }
  double sum = 0.0;
  for (double x : v) {
    if (!std::isfinite(x) || x < 0.0) {
      return absl::InvalidArgumentError(absl::StrFormat("%s %d has an entry %g (not a probability)", what, j, x));
    }
    sum += x;
  }
  if (std::fabs(sum - 1.0) > 1e-6) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %d sums to %.9f, not 1", what, j, sum));
  }
  return absl::OkStatus();
}

absl::Status CheckProposal(const Proposal& x, size_t j, bool need_q) {
  if (x.token < 0 || x.token >= model::kVocab) {
    return absl::InvalidArgumentError(absl::StrFormat("proposal %d: token %d outside [0, %d)", j, x.token,
                                                      model::kVocab));
  }
  if (!need_q) return absl::OkStatus();
  if (absl::Status s = CheckDistribution(x.q, "draft distribution q of proposal", j); !s.ok()) return s;
  if (!(x.q[x.token] > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("proposal %d: token %d has q = 0 (a drafter never proposes what it gives no mass)", j,
                        x.token));
  }
  return absl::OkStatus();
}

// The sampling rule over p rows obtained lazily from `row_p(j)` (which may fail).
using RowFn = std::function<absl::StatusOr<std::vector<double>>(size_t)>;

absl::StatusOr<RoundOutcome> SampleRound(size_t k_r, const RowFn& row_p, std::span<const Proposal> proposals,
                                         const RoundKey& key) {
  RoundOutcome out;
  for (size_t j = 1; j < k_r; ++j) {
    absl::StatusOr<std::vector<double>> p = row_p(j - 1);
    if (!p.ok()) return p.status();
    const Proposal& x = proposals[j - 1];
    const Position at = key.frontier + static_cast<Position>(j);
    const double u = KeyedUniform({key.seed, key.request, at, DrawPurpose::kAccept});
    if (u * x.q[x.token] < (*p)[x.token]) {
      out.emitted.push_back(x.token);
      ++out.accepted;
      continue;
    }
    std::vector<double> residual(p->size());
    for (size_t y = 0; y < residual.size(); ++y) residual[y] = std::max(0.0, (*p)[y] - x.q[y]);
    const double v = KeyedUniform({key.seed, key.request, at, DrawPurpose::kCorrection});
    model::Token b = SampleWithUniform(residual, v);
    if (b < 0) b = SampleWithUniform(*p, v);  // rounding only: p == q up to the last bit
    out.emitted.push_back(b);
    return out;
  }
  absl::StatusOr<std::vector<double>> p = row_p(k_r - 1);
  if (!p.ok()) return p.status();
  const Position at = key.frontier + static_cast<Position>(k_r);
  out.emitted.push_back(SampleWithUniform(*p, KeyedUniform({key.seed, key.request, at, DrawPurpose::kBonus})));
  out.bonus = true;
  return out;
}

absl::Status CheckRound(size_t k_r, size_t rows, std::span<const Proposal> proposals, bool need_q,
                        const RoundKey& key) {
  constexpr Position kMaxPosition = Position{1} << 56;  // keyed draws take positions below 2^56
  if (key.frontier < 0 || key.frontier > kMaxPosition - static_cast<Position>(k_r) - 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("speculative round: frontier n_r=%d outside [0, 2^56 - K_r - 1]", key.frontier));
  }
  if (k_r < 1 || rows != k_r || proposals.size() + 1 != k_r) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "speculative round: %d target rows and %d proposals; expected K_r >= 1 rows and K_r - 1 proposals", rows,
        proposals.size()));
  }
  for (size_t j = 0; j < proposals.size(); ++j) {
    if (absl::Status s = CheckProposal(proposals[j], j + 1, need_q); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RoundOutcome> AcceptWithDistributions(std::span<const std::vector<double>> p,
                                                     std::span<const Proposal> proposals, const RoundKey& key) {
  if (absl::Status s = CheckRound(p.size(), p.size(), proposals, true, key); !s.ok()) return s;
  for (size_t j = 0; j < p.size(); ++j) {
    if (absl::Status s = CheckDistribution(p[j], "target distribution p of query", j); !s.ok()) return s;
  }
  return SampleRound(p.size(), [&](size_t j) -> absl::StatusOr<std::vector<double>> { return p[j]; }, proposals,
                     key);
}

absl::StatusOr<RoundOutcome> AcceptRound(AcceptMode mode, std::span<const float> target_logits,
                                         const model::SamplingParams& params, std::span<const Proposal> proposals,
                                         const RoundKey& key) {
  const size_t vocab = static_cast<size_t>(model::kVocab);
  if (target_logits.size() % vocab != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("speculative round: %d logits are not rows of %d",
                                                      target_logits.size(), vocab));
  }
  const size_t k_r = target_logits.size() / vocab;
  const bool sampling = mode == AcceptMode::kSampling;
  if (absl::Status s = CheckRound(proposals.size() + 1, k_r, proposals, sampling, key); !s.ok()) return s;
  auto row = [&](size_t j) { return target_logits.subspan(j * vocab, vocab); };
  if (sampling) {
    return SampleRound(k_r, [&](size_t j) -> absl::StatusOr<std::vector<double>> {
      std::vector<double> p = model::SamplingDistribution(row(j), params);
      if (absl::Status s = CheckDistribution(p, "target distribution p of query", j); !s.ok()) return s;
      return p;
    }, proposals, key);
  }
  RoundOutcome out;
  for (size_t j = 1; j < k_r; ++j) {
    const model::Token best = model::Argmax(row(j - 1));
    out.emitted.push_back(best);
    if (proposals[j - 1].token != best) return out;
    ++out.accepted;
  }
  out.emitted.push_back(model::Argmax(row(k_r - 1)));
  out.bonus = true;
  return out;
}

}  // namespace dhs::spec
