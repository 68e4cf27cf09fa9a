// tests/verification/union_plan_test.cc: the union retrieval plan (workerd/verification/union_plan.h, brief §6): hand-computed plans
// (a row selected by three queries and another by two cause exactly two copies; a union larger than the hot budget
// goes on in staging), the refusals, and a randomized run against a naive model (a linear scan of the selections) and
// against the rows' contents: copies are made into simulated hot slots and staging rows, and every (query, entry)
// read through its planned location must give the original bytes of the row it selected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <vector>

#include "workerd/verification/union_plan.h"

namespace dhs::spec {
namespace {

using Sel = std::vector<Position>;

absl::StatusOr<UnionPlan> Plan(const std::vector<Sel>& sels, int64_t k, int64_t k_max, Position n_r, int64_t budget,
                               const std::set<Position>& ready) {
  std::vector<std::span<const Position>> spans(sels.begin(), sels.end());
  return PlanUnion({.selections = spans, .k = k, .k_max = k_max, .frontier = n_r, .hot_budget = budget,
                    .ready = [&](Position t) { return ready.count(t) > 0; }});
}

constexpr ReadLocation kNone{};
constexpr ReadLocation kDirect{ReadFrom::kDirect, -1};
constexpr ReadLocation Hot(int64_t i) { return {ReadFrom::kHot, i}; }
constexpr ReadLocation Stage(int64_t i) { return {ReadFrom::kStaging, i}; }

TEST(UnionPlan, ThreeQueriesOneRowTwoQueriesAnotherTwoCopies) {
  // n_r = 100; 100..102 are the current block (tail), 50 is in the hot cache. Row 10 is selected by all three queries,
  // row 20 by two.
  const std::vector<Sel> sels = {{10, 20, 100, -1}, {20, 10, 101, -1}, {10, 102, 50, -1}};
  absl::StatusOr<UnionPlan> plan = Plan(sels, 4, 4, 100, 8, {50, 100, 101, 102});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->copies, (std::vector<RowCopy>{{10, ReadFrom::kHot, 0}, {20, ReadFrom::kHot, 1}}));
  EXPECT_EQ(plan->reads, (std::vector<ReadLocation>{Hot(0), Hot(1), kDirect, kNone,    //
                                                    Hot(1), Hot(0), kDirect, kNone,    //
                                                    Hot(0), kDirect, kDirect, kNone}));
  EXPECT_EQ(plan->hot_copies, 2);
  EXPECT_EQ(plan->staging_copies, 0);
  EXPECT_EQ(plan->direct_reads, 4);
  EXPECT_EQ(plan->shared_reads, 3);
  // One free hot slot: row 20 goes to staging row 0; none: both staged, still two copies.
  plan = Plan(sels, 4, 4, 100, 1, {50, 100, 101, 102});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->copies, (std::vector<RowCopy>{{10, ReadFrom::kHot, 0}, {20, ReadFrom::kStaging, 0}}));
  EXPECT_EQ(plan->reads[4], Stage(0));
  plan = Plan(sels, 4, 4, 100, 0, {50, 100, 101, 102});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->copies, (std::vector<RowCopy>{{10, ReadFrom::kStaging, 0}, {20, ReadFrom::kStaging, 1}}));
  EXPECT_EQ(plan->reads[8], Stage(0));
}

TEST(UnionPlan, UnionBeyondTheHotBudgetIsStaged) {
  // Each selection (k = 3) fits a budget of 3, the union of 7 missing rows does not.
  const std::vector<Sel> sels = {{0, 1, 2}, {3, 1, 4}, {5, 6, 0}};
  absl::StatusOr<UnionPlan> plan = Plan(sels, 3, 4, 9, 2, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->copies, (std::vector<RowCopy>{{0, ReadFrom::kHot, 0},
                                                {1, ReadFrom::kHot, 1},
                                                {2, ReadFrom::kStaging, 0},
                                                {3, ReadFrom::kStaging, 1},
                                                {4, ReadFrom::kStaging, 2},
                                                {5, ReadFrom::kStaging, 3},
                                                {6, ReadFrom::kStaging, 4}}));
  EXPECT_EQ(plan->reads, (std::vector<ReadLocation>{Hot(0), Hot(1), Stage(0), Stage(1), Hot(1), Stage(2), Stage(3),
                                                    Stage(4), Hot(0)}));
  EXPECT_EQ(plan->shared_reads, 2);
}

TEST(UnionPlan, BadSelectionsAreRefused) {
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(Plan({{1, 2}}, 2, 4, 5, 4, {}).status().code(), absl::StatusCode::kOk);
  EXPECT_EQ(Plan({{1, 6}}, 2, 4, 5, 4, {}).status().code(), kBad);           // query 0 sees <= n_r = 5
  EXPECT_EQ(Plan({{1, 2}, {1, 6}}, 2, 4, 5, 4, {}).status().code(), absl::StatusCode::kOk);  // query 1 sees 6
  EXPECT_EQ(Plan({{1, 2}, {1, 7}}, 2, 4, 5, 4, {}).status().code(), kBad);
  EXPECT_EQ(Plan({{1, 1}}, 2, 4, 5, 4, {}).status().code(), kBad);           // repeated in one query
  EXPECT_EQ(Plan({{1, -2}}, 2, 4, 5, 4, {}).status().code(), kBad);
  EXPECT_EQ(Plan({{1, 2, 3}}, 2, 4, 5, 4, {}).status().code(), kBad);        // not k entries
  EXPECT_EQ(Plan({}, 2, 4, 5, 4, {}).status().code(), kBad);                 // K_r = 0
  EXPECT_EQ(Plan({{1}, {2}, {3}}, 1, 2, 5, 4, {}).status().code(), kBad);    // K_r = 3 > K_max = 2
  EXPECT_EQ(Plan({{1}}, 1, 2, 5, -1, {}).status().code(), kBad);
  const std::vector<Position> one = {1};
  const std::span<const Position> one_span(one);
  UnionPlanInput no_pred;  // no ready predicate
  no_pred.selections = std::span(&one_span, 1);
  no_pred.k = 1;
  no_pred.k_max = 1;
  no_pred.frontier = 5;
  EXPECT_EQ(PlanUnion(no_pred).status().code(), kBad);
}

TEST(UnionPlan, WindowsJoinTheirQueryWithQueryOf) {
  // Two queries at n_r = 20 and 21, each a top-k selection (k = 3) and a local window of 2: selections
  // [sel_0, win_0, sel_1, win_1] with query_of {0, 0, 1, 1}. The windows are in the tail (ready); row 5 is selected by
  // both queries, row 21 only by query 1 (it may see it), and is ready too.
  const std::vector<Sel> sels = {{5, 7, -1}, {19, 20}, {21, 5, 9}, {20, 21}};
  const std::vector<int64_t> query_of = {0, 0, 1, 1};
  std::vector<std::span<const Position>> spans(sels.begin(), sels.end());
  const std::set<Position> ready = {19, 20, 21};
  UnionPlanInput in{.selections = spans, .k = 3, .k_max = 2, .frontier = 20, .hot_budget = 1,
                    .ready = [&](Position t) { return ready.count(t) > 0; }, .query_of = query_of};
  absl::StatusOr<UnionPlan> plan = PlanUnion(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->copies, (std::vector<RowCopy>{{5, ReadFrom::kHot, 0}, {7, ReadFrom::kStaging, 0},
                                                {9, ReadFrom::kStaging, 1}}));
  EXPECT_EQ(plan->reads, (std::vector<ReadLocation>{Hot(0), Stage(0), kNone, kDirect, kDirect,  //
                                                    kDirect, Hot(0), Stage(1), kDirect, kDirect}));
  EXPECT_EQ(plan->shared_reads, 1);
  // Query 0's window may not see 21 (the causal mask follows query_of, not the selection's index).
  const std::vector<Sel> bad = {{5, 7, -1}, {20, 21}};
  std::vector<std::span<const Position>> bad_spans(bad.begin(), bad.end());
  const std::vector<int64_t> both0 = {0, 0};
  in.selections = bad_spans;
  in.query_of = both0;
  EXPECT_EQ(PlanUnion(in).status().code(), absl::StatusCode::kInvalidArgument);
  // query_of of the wrong length, a negative query, K_r = 3 > K_max = 2, a selection longer than k: refused.
  const std::vector<int64_t> one = {0};
  in.selections = spans;
  in.query_of = one;
  EXPECT_EQ(PlanUnion(in).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> negative = {0, -1, 1, 1};
  in.query_of = negative;
  EXPECT_EQ(PlanUnion(in).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> three = {0, 0, 1, 2};
  in.query_of = three;
  EXPECT_EQ(PlanUnion(in).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<Sel> wide = {{1, 2, 3, 4}};
  std::vector<std::span<const Position>> wide_spans(wide.begin(), wide.end());
  in.selections = wide_spans;
  in.query_of = one;
  EXPECT_EQ(PlanUnion(in).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UnionPlan, MoreMissingRowsThanBudgetAndArenaIsExhausted) {
  // K_max = 1, k = 2: the arena holds 2 rows. One query whose selection and window miss 4 distinct rows, budget 1:
  // 3 staged rows do not fit. Nothing is planned; with a budget of 2 they fit.
  const std::vector<Sel> sels = {{1, 2}, {3, 4}};
  const std::vector<int64_t> query_of = {0, 0};
  std::vector<std::span<const Position>> spans(sels.begin(), sels.end());
  UnionPlanInput in{.selections = spans, .k = 2, .k_max = 1, .frontier = 10, .hot_budget = 1,
                    .ready = [](Position) { return false; }, .query_of = query_of};
  EXPECT_EQ(PlanUnion(in).status().code(), absl::StatusCode::kResourceExhausted);
  in.hot_budget = 2;
  absl::StatusOr<UnionPlan> plan = PlanUnion(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->staging_copies, 2);
}

int64_t RowBytes(Position t) { return t * 1000003 + 17; }  // the "original bytes" of row t

TEST(UnionPlan, RandomAgainstNaiveModel) {
  const uint64_t seed = 1313;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int64_t total_copies = 0, total_staged = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 12)(rng);
    const int64_t k_max = std::uniform_int_distribution<int64_t>(1, 6)(rng);
    const int64_t k_r = std::uniform_int_distribution<int64_t>(1, k_max)(rng);
    const Position n_r = std::uniform_int_distribution<Position>(k, 60)(rng);
    const int64_t budget = std::uniform_int_distribution<int64_t>(0, 2 * k)(rng);
    std::set<Position> ready;
    for (Position t = 0; t <= n_r + k_r; ++t) {
      if (t >= n_r || std::bernoulli_distribution(0.3)(rng)) ready.insert(t);  // the block is in the tail
    }
    std::vector<Sel> sels(k_r);
    for (int64_t j = 0; j < k_r; ++j) {
      std::vector<Position> visible(n_r + j + 1);
      for (Position t = 0; t <= n_r + j; ++t) visible[t] = t;
      std::shuffle(visible.begin(), visible.end(), rng);
      const int64_t filled = std::uniform_int_distribution<int64_t>(0, std::min<int64_t>(k, n_r + j + 1))(rng);
      sels[j].assign(visible.begin(), visible.begin() + filled);
      sels[j].resize(k, kNoPosition);
      std::shuffle(sels[j].begin(), sels[j].end(), rng);
    }
    absl::StatusOr<UnionPlan> plan = Plan(sels, k, k_max, n_r, budget, ready);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // Naive model: D_r in order of first appearance by a linear scan.
    std::vector<Position> d;
    for (const Sel& s : sels) {
      for (Position t : s) {
        if (t >= 0 && !ready.count(t) && std::find(d.begin(), d.end(), t) == d.end()) d.push_back(t);
      }
    }
    ASSERT_EQ(plan->copies.size(), d.size());
    for (size_t i = 0; i < d.size(); ++i) {
      const int64_t idx = static_cast<int64_t>(i);
      const RowCopy want = idx < budget ? RowCopy{d[i], ReadFrom::kHot, idx} : RowCopy{d[i], ReadFrom::kStaging,
                                                                                     idx - budget};
      ASSERT_EQ(plan->copies[i], want);
    }
    ASSERT_LE(plan->staging_copies, k_max * k);  // the arena of K_max * k rows always suffices
    // Contents: perform the copies, then read every entry through its location.
    std::vector<int64_t> hot(budget, -1), staging(k_max * k, -1);
    for (const RowCopy& c : plan->copies) (c.to == ReadFrom::kHot ? hot : staging)[c.index] = RowBytes(c.row);
    ASSERT_EQ(plan->reads.size(), static_cast<size_t>(k_r * k));
    for (int64_t j = 0; j < k_r; ++j) {
      for (int64_t e = 0; e < k; ++e) {
        const Position t = sels[j][e];
        const ReadLocation at = plan->reads[j * k + e];
        if (t < 0) {
          ASSERT_EQ(at, kNone);
        } else if (ready.count(t)) {
          ASSERT_EQ(at, kDirect);
        } else {
          ASSERT_EQ((at.from == ReadFrom::kHot ? hot : staging)[at.index], RowBytes(t));
        }
      }
    }
    total_copies += plan->copies.size();
    total_staged += plan->staging_copies;
  }
  std::printf("3000 rounds: %lld copies, %lld staged\n", static_cast<long long>(total_copies),
              static_cast<long long>(total_staged));
  EXPECT_GT(total_staged, 0);  // the run exercised staging
}

}  // namespace
}  // namespace dhs::spec
