#include "workerd/spec/union_plan.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"

namespace dhs::spec {
namespace {

absl::Status CheckInput(const UnionPlanInput& in) {
  const int64_t k_r = static_cast<int64_t>(in.selections.size());
  if (k_r < 1 || k_r > in.k_max || in.k < 1 || in.hot_budget < 0 || in.frontier < 0 || !in.ready) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "union plan: K_r=%d must be in [1, K_max=%d], k=%d >= 1, hot_budget=%d >= 0, n_r=%d >= 0, and a ready "
        "predicate given", k_r, in.k_max, in.k, in.hot_budget, in.frontier));
  }
  for (int64_t j = 0; j < k_r; ++j) {
    const std::span<const Position> s = in.selections[j];
    if (static_cast<int64_t>(s.size()) != in.k) {
      return absl::InvalidArgumentError(
          absl::StrFormat("union plan: query %d selects %d entries, expected k=%d", j, s.size(), in.k));
    }
    absl::flat_hash_set<Position> seen;
    seen.reserve(s.size());
    for (Position t : s) {
      if (t == kNoPosition) continue;
      if (t < kNoPosition || t > in.frontier + j) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "union plan: query %d selects position %d outside [0, n_r + %d = %d] (causal mask)", j, t, j,
            in.frontier + j));
      }
      if (!seen.insert(t).second) {
        return absl::InvalidArgumentError(absl::StrFormat("union plan: query %d selects position %d twice", j, t));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UnionPlan> PlanUnion(const UnionPlanInput& in) {
  if (absl::Status s = CheckInput(in); !s.ok()) return s;
  UnionPlan plan;
  plan.reads.reserve(in.selections.size() * in.k);
  absl::flat_hash_map<Position, ReadLocation> placed;  // rows of D_r already given a copy
  placed.reserve(in.selections.size() * in.k);
  for (const std::span<const Position> sel : in.selections) {
    for (Position t : sel) {
      if (t == kNoPosition) {
        plan.reads.push_back({});
        continue;
      }
      if (in.ready(t)) {
        plan.reads.push_back({ReadFrom::kDirect, -1});
        ++plan.direct_reads;
        continue;
      }
      auto [it, fresh] = placed.try_emplace(t);
      if (fresh) {
        const bool hot = plan.hot_copies < in.hot_budget;
        it->second = hot ? ReadLocation{ReadFrom::kHot, plan.hot_copies++}
                         : ReadLocation{ReadFrom::kStaging, plan.staging_copies++};
        plan.copies.push_back({t, it->second.from, it->second.index});
      } else {
        ++plan.shared_reads;
      }
      plan.reads.push_back(it->second);
    }
  }
  return plan;
}

}  // namespace dhs::spec
