// workerd/speculation/block_width.h: how many target queries a round gets (brief §6 "Proposal modes", "When speculation
// pays": the block width narrows as load nears the limit).
//
// BlockWidthSchedule: a table from live sessions to block width K (queries per round, anchor included, 1 <= K <=
// K_max; K = 1 is no speculation). Text form: comma-separated "from_sessions:width" entries, from_sessions strictly
// increasing and the first one 1; the width at n sessions is that of the last entry with from_sessions <= n.
// "1:8,33:6,128:4" is 8 up to 32 sessions, 6 from 33 (so at 64), 4 from 128. Spaces around entries are allowed.
//
// ConfidencePrefix: the DSpark-like per-request rule: the drafter stops proposing at the first proposal whose
// confidence (the drafter's probability of the token it proposes, q(x)) falls below the threshold.
// Thread-safety: pure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace dhs::spec {

class BlockWidthSchedule {
 public:
  struct Step {
    int64_t from_sessions = 1;
    int64_t width = 1;
  };
  // INVALID_ARGUMENT naming the entry for: empty text, an entry not "N:K" with decimal integers, from_sessions not
  // strictly increasing or the first not 1, a width outside [1, k_max].
  static absl::StatusOr<BlockWidthSchedule> Parse(absl::string_view text, int64_t k_max);

  // The width for `sessions` live sessions (sessions <= 1 gives the first entry's).
  int64_t WidthFor(int64_t sessions) const;
  const std::vector<Step>& steps() const { return steps_; }
  std::string ToString() const;  // the canonical text form ("1:8,33:6,128:4")

 private:
  std::vector<Step> steps_;
};

// The number of proposals to verify (0 .. max_proposals): the length of the prefix of `confidences` (one per drafted
// proposal, in order) that are all >= threshold, capped at max_proposals. INVALID_ARGUMENT when the threshold is not
// in [0, 1], max_proposals < 0, or a confidence is not in [0, 1].
absl::StatusOr<int64_t> ConfidencePrefix(std::span<const double> confidences, double threshold,
                                         int64_t max_proposals);

// The mean acceptance length (accepted proposals + 1 per round) of a block of `width` queries when every proposal is
// accepted independently with probability alpha (Leviathan et al. 2023, eq. 1): 1 + alpha + .. + alpha^(width-1)
// = (1 - alpha^width) / (1 - alpha); width when alpha = 1. INVALID_ARGUMENT unless alpha in [0, 1] and width >= 1.
absl::StatusOr<double> ExpectedAcceptanceLength(double alpha, int64_t width);

}  // namespace dhs::spec
