// workerd/speculation/online_block_width.cc: see online_block_width.h.
#include "workerd/speculation/online_block_width.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_format.h"
#include "workerd/speculation/block_width.h"

namespace dhs::spec {

absl::StatusOr<OnlineBlockWidth> OnlineBlockWidth::Create(const OnlineBlockWidthOptions& o) {
  auto bad = [](const char* what) {
    return absl::InvalidArgumentError(absl::StrFormat("online block width: %s", what));
  };
  if (o.k_max < 1) return bad("k_max must be >= 1");
  if (o.window < 2) return bad("window must be >= 2 steps");
  if (o.min_steps < 2 || o.min_steps > o.window) return bad("min_steps must be in [2, window]");
  if (o.min_rounds < 1) return bad("min_rounds must be >= 1");
  if (!(o.acceptance_weight > 0.0 && o.acceptance_weight <= 1.0)) return bad("acceptance_weight must be in (0, 1]");
  return OnlineBlockWidth(o);
}

absl::Status OnlineBlockWidth::ObserveRound(int64_t proposals, int64_t accepted) {
  if (proposals < 0 || accepted < 0 || accepted > proposals) {
    return absl::InvalidArgumentError(
        absl::StrFormat("online block width: round with %d accepted of %d proposals", accepted, proposals));
  }
  if (proposals == 0) return absl::OkStatus();
  const double rate = static_cast<double>(accepted) / static_cast<double>(proposals);
  // The first round sets alpha; later ones move it by the weight (an exponentially weighted mean over rounds).
  alpha_ = rounds_ == 0 ? rate : alpha_ + options_.acceptance_weight * (rate - alpha_);
  ++rounds_;
  return absl::OkStatus();
}

absl::Status OnlineBlockWidth::ObserveStep(int64_t queries, double step_us) {
  if (queries < 1 || !(step_us > 0.0) || !std::isfinite(step_us)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("online block width: step of %d queries taking %g us", queries, step_us));
  }
  steps_.emplace_back(queries, step_us);
  while (static_cast<int64_t>(steps_.size()) > options_.window) steps_.pop_front();
  return absl::OkStatus();
}

std::optional<OnlineBlockWidth::Fit> OnlineBlockWidth::StepFit() const {
  if (static_cast<int64_t>(steps_.size()) < options_.min_steps) return std::nullopt;
  // Ordinary least squares of step_us on queries.
  const double n = static_cast<double>(steps_.size());
  double sq = 0, st = 0;
  for (const auto& [q, t] : steps_) {
    sq += static_cast<double>(q);
    st += t;
  }
  const double mq = sq / n, mt = st / n;
  double sqq = 0, sqt = 0;
  for (const auto& [q, t] : steps_) {
    sqq += (static_cast<double>(q) - mq) * (static_cast<double>(q) - mq);
    sqt += (static_cast<double>(q) - mq) * (t - mt);
  }
  if (sqq == 0.0) return std::nullopt;  // one distinct Q: the per-query cost cannot be told from the fixed cost
  Fit f;
  // Costs cannot be negative: a noisy fit with b < 0 means the per-query cost is lost in the noise (b = 0, a = mean);
  // a < 0 means the fixed cost is (a = 0, b through the origin).
  f.b_us = sqt / sqq;
  f.a_us = mt - f.b_us * mq;
  if (f.b_us < 0) {
    f.b_us = 0;
    f.a_us = mt;
  } else if (f.a_us < 0) {
    double num = 0, den = 0;
    for (const auto& [q, t] : steps_) {
      num += static_cast<double>(q) * t;
      den += static_cast<double>(q) * static_cast<double>(q);
    }
    f.a_us = 0;
    f.b_us = num / den;
  }
  return f;
}

WidthDecision OnlineBlockWidth::Decide(int64_t decoding, int64_t waiting_that_fit, int64_t fallback) const {
  WidthDecision d;
  d.sessions = std::max<int64_t>(1, std::max<int64_t>(decoding, 0) + std::max<int64_t>(waiting_that_fit, 0));
  d.alpha = alpha_;
  d.width = std::clamp<int64_t>(fallback, 1, options_.k_max);
  const std::optional<Fit> fit = StepFit();
  if (!fit || rounds_ < options_.min_rounds) return d;
  d.fitted = true;
  d.step_a_us = fit->a_us;
  d.step_b_us = fit->b_us;
  const double n = static_cast<double>(d.sessions);
  double best = -1;
  for (int64_t k = 1; k <= options_.k_max; ++k) {
    const double tokens = n * *ExpectedAcceptanceLength(std::clamp(alpha_, 0.0, 1.0), k);  // alpha, k in range
    const double t_us = fit->a_us + fit->b_us * n * static_cast<double>(k);
    const double rate = t_us > 0 ? tokens / t_us * 1e6 : 0.0;
    if (rate > best * (1 + 1e-12)) {  // strictly better: ties keep the narrower width
      best = rate;
      d.width = k;
      d.tokens_per_s = rate;
    }
  }
  return d;
}

}  // namespace dhs::spec
