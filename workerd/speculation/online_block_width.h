// workerd/speculation/online_block_width.h: the block width chosen online from measured acceptance, step time and free
// memory (issue 13, "Block width by load ... an online mode"; brief §6 "When speculation pays": the width should
// narrow as load nears the limit, and choosing it online from load and memory is a goal of this design).
//
// Decision core in the house style (memd/residency_manager.h): events in, a decision out, no clocks (times are passed
// in), no sockets, no device. The worker feeds it and asks it once per step; tests drive it with made-up figures.
//
// The model (all terms measured, none assumed):
// - Acceptance: alpha = accepted proposals / proposals verified, over the rounds observed (exponentially weighted,
//   `acceptance_weight` per round), so a block of K queries emits E[L](alpha, K) = (1 - alpha^K) / (1 - alpha) tokens
//   per round (K when alpha = 1; Leviathan et al. 2023 eq. 1, `ExpectedAcceptanceLength`).
// - Step time: a batched target step of Q queries takes t(Q) = a + b * Q; a and b are the least-squares fit over the
//   last `window` steps observed (plain steps count one query per request, verification passes K_r). a is the cost
//   every step pays whatever its width (weights read, launch, host fetches of a step), b the cost per query.
// - Load and memory: n = decoding sessions + admissions that wait and fit in the free memory memd reports (they join
//   within a few steps, so the width is narrowed before they arrive, not after).
// The width is the K in [1, k_max] that maximizes the node's output tokens/s with n sessions of width K:
//   throughput(K) = n * E[L](alpha, K) / t(n * K)
// (ties: the narrower). With a >> b * n * K (few sessions) wide blocks are nearly free and win; as n grows the per-query
// term dominates and the optimum narrows, down to K = 1 (no speculation) when alpha is too low to pay for a query.
// Before `min_rounds` rounds and `min_steps` steps with at least two distinct Q have been observed, the fit is not
// trusted and the fallback width (the fixed block or the schedule's) is used.
//
// Thread-safety: none (one owner, the worker's loop).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dhs::spec {

struct OnlineBlockWidthOptions {
  int64_t k_max = 8;                 // widest block (queries per round, anchor included), >= 1
  int64_t window = 64;               // steps kept for the step-time fit, >= 2
  int64_t min_steps = 8;             // steps before the fit is trusted, in [2, window]
  int64_t min_rounds = 8;            // verified rounds before alpha is trusted, >= 1
  double acceptance_weight = 0.05;   // weight of one round in alpha's moving average, in (0, 1]
};

// One decision with the figures behind it (the worker reports the chosen widths; tests check the arithmetic).
struct WidthDecision {
  int64_t width = 1;
  bool fitted = false;      // false: the fallback width (not enough observations yet)
  double alpha = 0.0;       // acceptance per proposal used
  double step_a_us = 0.0;   // fitted fixed cost per step, microseconds
  double step_b_us = 0.0;   // fitted cost per query, microseconds
  int64_t sessions = 0;     // n the width was planned for
  double tokens_per_s = 0;  // the model's throughput at `width` (0 when not fitted)
};

class OnlineBlockWidth {
 public:
  // INVALID_ARGUMENT naming the field for options outside the ranges above.
  static absl::StatusOr<OnlineBlockWidth> Create(const OnlineBlockWidthOptions& options);

  // One verified round of one request: `proposals` verified (K_r - 1) and `accepted` of them (A_r <= proposals).
  // Rounds without proposals are ignored. INVALID_ARGUMENT (nothing changes) when accepted > proposals or negative.
  absl::Status ObserveRound(int64_t proposals, int64_t accepted);
  // One batched target step of `queries` queries (>= 1) that took `step_us` (> 0) microseconds.
  // INVALID_ARGUMENT (nothing changes) otherwise.
  absl::Status ObserveStep(int64_t queries, double step_us);

  // The width for the next step: `decoding` sessions decode now, `waiting_that_fit` admissions wait and fit in the
  // free memory memd reports; `fallback` (in [1, k_max], clamped) until the model is trusted.
  WidthDecision Decide(int64_t decoding, int64_t waiting_that_fit, int64_t fallback) const;

  double alpha() const { return alpha_; }
  int64_t rounds() const { return rounds_; }
  // The fit t(Q) = a + b * Q over the kept steps; nullopt before min_steps steps with two distinct Q.
  struct Fit {
    double a_us = 0, b_us = 0;
  };
  std::optional<Fit> StepFit() const;

 private:
  explicit OnlineBlockWidth(const OnlineBlockWidthOptions& o) : options_(o) {}
  OnlineBlockWidthOptions options_;
  double alpha_ = 0.0;
  int64_t rounds_ = 0;
  std::deque<std::pair<int64_t, double>> steps_;  // (queries, step_us), newest last, at most `window`
};

}  // namespace dhs::spec
