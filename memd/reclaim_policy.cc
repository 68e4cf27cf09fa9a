#include "memd/reclaim_policy.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace dhs::memd {
namespace {

bool EarlierAdmitted(const ReclaimCandidate& a, const ReclaimCandidate& b) {
  return std::tie(a.admitted_at_us, a.admission_seq, a.request) < std::tie(b.admitted_at_us, b.admission_seq, b.request);
}

class OldestFirst final : public ReclaimPolicy {
 public:
  std::string_view name() const override { return kReclaimPolicyNames[0]; }
  bool Before(const ReclaimCandidate& a, const ReclaimCandidate& b) const override { return EarlierAdmitted(a, b); }
};

class NewestFirst final : public ReclaimPolicy {
 public:
  std::string_view name() const override { return kReclaimPolicyNames[1]; }
  bool Before(const ReclaimCandidate& a, const ReclaimCandidate& b) const override { return EarlierAdmitted(b, a); }
};

class LargestFirst final : public ReclaimPolicy {
 public:
  std::string_view name() const override { return kReclaimPolicyNames[2]; }
  bool Before(const ReclaimCandidate& a, const ReclaimCandidate& b) const override {
    if (a.optional_pages != b.optional_pages) return a.optional_pages > b.optional_pages;
    return EarlierAdmitted(a, b);
  }
};

}  // namespace

void ReclaimPolicy::Order(std::vector<ReclaimCandidate>& candidates) const {
  std::sort(candidates.begin(), candidates.end(),
            [this](const ReclaimCandidate& a, const ReclaimCandidate& b) { return Before(a, b); });
}

VictimChoice ReclaimPolicy::Choose(std::vector<ReclaimCandidate> candidates, uint32_t deficit_pages) const {
  VictimChoice choice;
  uint64_t total = 0;
  for (const auto& c : candidates) total += c.optional_pages;
  if (total < deficit_pages) return choice;
  Order(candidates);
  for (const auto& c : candidates) {
    if (choice.pages >= deficit_pages) break;
    if (c.optional_pages == 0) continue;
    choice.victims.push_back(c.request);
    choice.pages += c.optional_pages;
  }
  choice.covers = true;
  return choice;
}

void ReclaimIndex::Insert(const ReclaimCandidate& candidate) {
  DHS_CHECK_OK(candidate.optional_pages > 0 && set_.insert(candidate).second
                   ? absl::OkStatus()
                   : absl::InternalError(absl::StrFormat("reclaim index: request %d inserted twice or with a_r = 0",
                                                         candidate.request)));
  total_pages_ += candidate.optional_pages;
}

void ReclaimIndex::Erase(const ReclaimCandidate& candidate) {
  DHS_CHECK_OK(set_.erase(candidate) == 1
                   ? absl::OkStatus()
                   : absl::InternalError(absl::StrFormat("reclaim index: request %d not indexed under that key",
                                                         candidate.request)));
  total_pages_ -= candidate.optional_pages;
}

// Walks the order from r_1 until the pages cover Δ: the same victims as ReclaimPolicy::Choose (which skips a_r = 0;
// the index holds none).
VictimChoice ReclaimIndex::Choose(uint32_t deficit_pages) const {
  VictimChoice choice;
  if (total_pages_ < deficit_pages) return choice;
  for (auto it = set_.begin(); it != set_.end() && choice.pages < deficit_pages; ++it) {
    choice.victims.push_back(it->request);
    choice.pages += it->optional_pages;
  }
  choice.covers = true;
  return choice;
}

absl::StatusOr<std::unique_ptr<ReclaimPolicy>> MakeReclaimPolicy(std::string_view name) {
  // One maker per name of kReclaimPolicyNames, in its order.
  using Maker = std::unique_ptr<ReclaimPolicy> (*)();
  static constexpr Maker kMakers[] = {[] { return std::unique_ptr<ReclaimPolicy>(new OldestFirst); },
                                      [] { return std::unique_ptr<ReclaimPolicy>(new NewestFirst); },
                                      [] { return std::unique_ptr<ReclaimPolicy>(new LargestFirst); }};
  static_assert(std::size(kMakers) == std::size(kReclaimPolicyNames), "one maker per policy name");
  for (size_t i = 0; i < std::size(kReclaimPolicyNames); ++i) {
    if (name == kReclaimPolicyNames[i]) return kMakers[i]();
  }
  return absl::InvalidArgumentError(absl::StrFormat("unknown reclaim policy '%s' (known: %s)", std::string(name),
                                                    absl::StrJoin(ReclaimPolicyNames(), ", ")));
}

}  // namespace dhs::memd
