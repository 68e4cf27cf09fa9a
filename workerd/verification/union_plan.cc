#include "workerd/verification/union_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"

namespace dhs::spec {
namespace {

// K_r: the number of queries (selections without query_of, else the largest query index + 1).
int64_t QueryCount(const UnionPlanInput& in) {
  if (in.query_of.empty()) return static_cast<int64_t>(in.selections.size());
  int64_t k_r = 0;
  for (int64_t j : in.query_of) k_r = std::max(k_r, j + 1);
  return k_r;
}

absl::Status CheckInput(const UnionPlanInput& in) {
  const bool grouped = !in.query_of.empty();
  if (grouped && in.query_of.size() != in.selections.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("union plan: query_of has %d entries for %d selections",
                                                      in.query_of.size(), in.selections.size()));
  }
  const int64_t k_r = in.selections.empty() ? 0 : QueryCount(in);
  if (k_r < 1 || k_r > in.k_max || in.k < 1 || in.hot_budget < 0 || in.frontier < 0 || !in.ready) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "union plan: K_r=%d must be in [1, K_max=%d], k=%d >= 1, hot_budget=%d >= 0, n_r=%d >= 0, and a ready "
        "predicate given", k_r, in.k_max, in.k, in.hot_budget, in.frontier));
  }
  for (size_t i = 0; i < in.selections.size(); ++i) {
    const int64_t j = grouped ? in.query_of[i] : static_cast<int64_t>(i);
    if (j < 0) return absl::InvalidArgumentError(absl::StrFormat("union plan: selection %d names query %d", i, j));
    const std::span<const Position> s = in.selections[i];
    const auto size = static_cast<int64_t>(s.size());
    if (grouped ? (size < 1 || size > in.k) : size != in.k) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "union plan: selection %d (query %d) has %d entries, expected %s%d", i, j, s.size(),
          grouped ? "1 .. k=" : "k=", in.k));
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
  size_t entries = 0;
  for (const std::span<const Position> sel : in.selections) entries += sel.size();
  plan.reads.reserve(entries);
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
  if (plan.staging_copies > in.k_max * in.k) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "union plan: %d missing rows beyond the hot budget of %d, the staging arena holds K_max * k = %d * %d = %d",
        plan.staging_copies, in.hot_budget, in.k_max, in.k, in.k_max * in.k));
  }
  return plan;
}

}  // namespace dhs::spec
