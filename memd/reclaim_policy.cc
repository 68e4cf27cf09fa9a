#include "memd/reclaim_policy.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_format.h"

namespace dhs::memd {
namespace {

bool EarlierAdmitted(const ReclaimCandidate& a, const ReclaimCandidate& b) {
  return std::tie(a.admitted_at_us, a.admission_seq, a.request) < std::tie(b.admitted_at_us, b.admission_seq, b.request);
}

class OldestFirst final : public ReclaimPolicy {
 public:
  std::string_view name() const override { return "oldest-first"; }
  void Order(std::vector<ReclaimCandidate>& c) const override { std::sort(c.begin(), c.end(), EarlierAdmitted); }
};

class NewestFirst final : public ReclaimPolicy {
 public:
  std::string_view name() const override { return "newest-first"; }
  void Order(std::vector<ReclaimCandidate>& c) const override {
    std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return EarlierAdmitted(b, a); });
  }
};

class LargestFirst final : public ReclaimPolicy {
 public:
  std::string_view name() const override { return "largest-first"; }
  void Order(std::vector<ReclaimCandidate>& c) const override {
    std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
      if (a.optional_pages != b.optional_pages) return a.optional_pages > b.optional_pages;
      return EarlierAdmitted(a, b);
    });
  }
};

}  // namespace

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

absl::StatusOr<std::unique_ptr<ReclaimPolicy>> MakeReclaimPolicy(std::string_view name) {
  if (name == "oldest-first") return std::make_unique<OldestFirst>();
  if (name == "newest-first") return std::make_unique<NewestFirst>();
  if (name == "largest-first") return std::make_unique<LargestFirst>();
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown reclaim policy '%s' (known: oldest-first, newest-first, largest-first)", std::string(name)));
}

}  // namespace dhs::memd
