#include "workerd/speculation/commit.h"

#include "absl/strings/str_format.h"

namespace dhs::spec {

absl::StatusOr<RoundCommit> CommitRound(Position n_r, int64_t k_r, int64_t accepted, int64_t m) {
  constexpr int64_t kMax = int64_t{1} << 56;
  if (n_r < 0 || n_r > kMax || k_r < 1 || k_r > kMax || accepted < 0 || accepted > k_r - 1 || m < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "commit: n_r=%d >= 0, K_r=%d >= 1, A_r=%d in [0, K_r - 1], m=%d >= 1 required", n_r, k_r, accepted, m));
  }
  RoundCommit c;
  c.frontier = n_r + accepted + 1;
  c.dropped_begin = c.frontier;
  c.dropped_end = n_r + k_r;
  c.complete_begin = n_r / m;
  c.complete_end = c.frontier / m;
  return c;
}

}  // namespace dhs::spec
