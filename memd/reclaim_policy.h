// memd/reclaim_policy.h: the reclaim order as a pure chooser (brief §4, "Admission", "Reclaim ordering").
//
// A policy only *chooses* victims (Plasma's eviction-policy split): it defines the reclaim order r_1, r_2, ... over
// the admitted requests of one GPU with their optional pages a_r (Before), and a choice returns the first q of them,
// q the smallest count with a_{r_1} + ... + a_{r_q} >= Δ. The ResidencyManager carries the reclaim out.
// Requests with a_r = 0 are skipped (they give nothing). Ties are broken by admission sequence, then request id,
// so the order is a strict total order over distinct request ids and deterministic.
//
// Two ways to choose, with the same answer (tests/memd/units_test.cc compares them on random states):
// - ReclaimPolicy::Choose sorts a candidate list per call: O(n log n) in the admitted requests; the reference.
// - ReclaimIndex keeps the candidates of one GPU ordered by the policy (updated on the events that change a
//   request's key: O(log n) each), so a choice costs O(q + 1). The ResidencyManager uses it (issue 14).
//
// Thread-safety: policies are immutable after construction; const methods may be called from any thread.
// A ReclaimIndex is not thread-safe (one owner, the ResidencyManager's loop).
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <set>
#include <string>
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
  // The reclaim order: true when `a` is reclaimed before `b`. A strict total order over distinct request ids; it
  // reads every field of ReclaimCandidate that the policy orders by (a change of one re-keys the candidate).
  virtual bool Before(const ReclaimCandidate& a, const ReclaimCandidate& b) const = 0;
  // Sorts `candidates` into the reclaim order r_1, r_2, ... (first = reclaimed first). O(n log n).
  void Order(std::vector<ReclaimCandidate>& candidates) const;
  // The first q requests of the reclaim order covering `deficit_pages` (Δ > 0), brief §4. Sorts every candidate:
  // the reference for ReclaimIndex::Choose (and what the core did before issue 14).
  VictimChoice Choose(std::vector<ReclaimCandidate> candidates, uint32_t deficit_pages) const;
};

// The victim candidates of one GPU (admitted, a_r > 0, not backed off), kept in `policy`'s reclaim order.
// The owner inserts a request's candidate when it becomes one and erases exactly the key it inserted before any field
// of it changes (then inserts the new key). total_pages() is the sum of a_r over the candidates.
class ReclaimIndex {
 public:
  explicit ReclaimIndex(const ReclaimPolicy* policy) : set_(Less{policy}) {}  // `policy` outlives the index
  // O(log n). Precondition: candidate.optional_pages > 0 and no candidate of that request in the index.
  void Insert(const ReclaimCandidate& candidate);
  // O(log n). Precondition: `candidate` is exactly a key inserted before (same fields).
  void Erase(const ReclaimCandidate& candidate);
  // Same answer as ReclaimPolicy::Choose over the candidates in the index; O(q + 1).
  VictimChoice Choose(uint32_t deficit_pages) const;
  uint64_t total_pages() const { return total_pages_; }
  size_t size() const { return set_.size(); }
  // The candidates in reclaim order (for checks and tests). O(n).
  std::vector<ReclaimCandidate> Ordered() const { return {set_.begin(), set_.end()}; }

 private:
  struct Less {
    const ReclaimPolicy* policy;
    bool operator()(const ReclaimCandidate& a, const ReclaimCandidate& b) const { return policy->Before(a, b); }
  };
  std::set<ReclaimCandidate, Less> set_;
  uint64_t total_pages_ = 0;
};

// THE list of reclaim policy names (memd owns the vocabulary; memd --reclaim-policy, dhs-replay --reclaim-policy and
// dhs-node's [memd] reclaim_policy ask it): "oldest-first" (earliest admission first), "newest-first" (latest
// admission first), "largest-first" (largest a_r first, the default). Header constants: checking a name links nothing.
inline constexpr std::string_view kReclaimPolicyNames[] = {"oldest-first", "newest-first", "largest-first"};
inline constexpr std::string_view kDefaultReclaimPolicy = kReclaimPolicyNames[2];
// kReclaimPolicyNames as strings, in order (CLI11 IsMember, help texts).
inline std::vector<std::string> ReclaimPolicyNames() {
  return {std::begin(kReclaimPolicyNames), std::end(kReclaimPolicyNames)};
}

// The policy named `name` (kReclaimPolicyNames). Errors: InvalidArgument for any other name (the message lists them).
absl::StatusOr<std::unique_ptr<ReclaimPolicy>> MakeReclaimPolicy(std::string_view name);

}  // namespace dhs::memd
