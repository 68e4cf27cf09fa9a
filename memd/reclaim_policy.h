// memd/reclaim_policy.h: the reclaim order as a pure chooser (brief §4, "Admission", "Reclaim ordering").
//
// A policy only *chooses* victims (Plasma's eviction-policy split): given the admitted requests of one GPU with
// their optional pages a_r, it sorts them into the reclaim order r_1, r_2, ... and returns the first q of them,
// q the smallest count with a_{r_1} + ... + a_{r_q} >= Δ. The ResidencyManager carries the reclaim out.
// Requests with a_r = 0 are skipped (they give nothing). Ties are broken by admission sequence, then request id,
// so the order is deterministic.
//
// Thread-safety: policies are immutable after construction; const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs::memd {

struct ReclaimCandidate {
  RequestId request = 0;
  int64_t admitted_at_us = 0;   // admission time, injected clock (microseconds)
  uint64_t admission_seq = 0;   // admission order on this node (tie breaker)
  uint32_t optional_pages = 0;  // a_r
};

struct VictimChoice {
  std::vector<RequestId> victims;  // r_1 .. r_q in reclaim order
  uint32_t pages = 0;              // a_{r_1} + ... + a_{r_q}
  bool covers = false;             // pages >= Δ; false: all optional pages together do not cover Δ (victims empty)
};

class ReclaimPolicy {
 public:
  virtual ~ReclaimPolicy() = default;
  virtual std::string_view name() const = 0;
  // Sorts `candidates` into the reclaim order r_1, r_2, ... (first = reclaimed first).
  virtual void Order(std::vector<ReclaimCandidate>& candidates) const = 0;
  // The first q requests of the reclaim order covering `deficit_pages` (Δ > 0), brief §4.
  VictimChoice Choose(std::vector<ReclaimCandidate> candidates, uint32_t deficit_pages) const;
};

// Names: "oldest-first" (earliest admission first), "newest-first" (latest admission first),
// "largest-first" (largest a_r first). Errors: InvalidArgument for any other name (the message lists them).
absl::StatusOr<std::unique_ptr<ReclaimPolicy>> MakeReclaimPolicy(std::string_view name);

}  // namespace dhs::memd
