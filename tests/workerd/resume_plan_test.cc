// tests/workerd/resume_plan_test.cc: the resume plan (workerd/resume_plan.h): which rows of a resumed request are
// imported from host and which recomputed. Hand-computed plans, the grant's page list, errors, and a randomized test
// that checks the plan row by row against the rule (a row is imported iff its page is host-backed and wholly before
// the last token) and the plan's shape (runs and recomputed ranges in position order, disjoint, maximal).
#include "workerd/resume_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

namespace dhs {
namespace {

std::vector<HostBackedPage> Pages(std::initializer_list<uint32_t> pages) {
  std::vector<HostBackedPage> out;
  for (uint32_t j : pages) out.push_back({j, 100 + j});
  return out;
}

TEST(ResumePlan, LeadingRunBeforeTheLastToken) {
  // p = 4, n = 10: the last token is row 9, pages wholly before it: (10 - 1) / 4 = 2 (rows 0..7).
  absl::StatusOr<ResumePlan> plan = PlanResume(Pages({0, 1}), 10, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->usable_pages, 2u);
  EXPECT_EQ(plan->runs, (std::vector<HostRun>{{0, 2}}));
  EXPECT_EQ(plan->recompute, (std::vector<RowRange>{{8, 10}}));
  EXPECT_EQ(plan->rows_imported, 8);
  EXPECT_EQ(plan->rows_recomputed, 2);
  EXPECT_EQ(plan->host_ready, (std::vector<HostBackedPage>{{0, 100}, {1, 101}}));
}

TEST(ResumePlan, APageHoldingTheLastTokenIsRecomputedButHostReady) {
  // p = 4, n = 8: the last token is row 7 of page 1, so only page 0 is imported; page 1 is host-ready all the same.
  absl::StatusOr<ResumePlan> plan = PlanResume(Pages({0, 1}), 8, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->usable_pages, 1u);
  EXPECT_EQ(plan->runs, (std::vector<HostRun>{{0, 1}}));
  EXPECT_EQ(plan->recompute, (std::vector<RowRange>{{4, 8}}));
  EXPECT_EQ(plan->rows_imported, 4);
  EXPECT_EQ(plan->rows_recomputed, 4);
  EXPECT_EQ(plan->host_ready.size(), 2u);
}

TEST(ResumePlan, GapsGiveRunsBetweenRecomputedRowsInPositionOrder) {
  // p = 2, n = 13: usable pages 12 / 2 = 6 (0..5). Backed 5, 1, 2, 4, 9, 7 (any order): runs {1, 2} and {4, 5};
  // recomputed rows 0..1, 6..7 and 12; pages 7 and 9 lie beyond the record: host-ready only.
  absl::StatusOr<ResumePlan> plan = PlanResume(Pages({5, 1, 2, 4, 9, 7}), 13, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->usable_pages, 6u);
  EXPECT_EQ(plan->runs, (std::vector<HostRun>{{1, 2}, {4, 2}}));
  EXPECT_EQ(plan->recompute, (std::vector<RowRange>{{0, 2}, {6, 8}, {12, 13}}));
  EXPECT_EQ(plan->rows_imported, 8);
  EXPECT_EQ(plan->rows_recomputed, 5);
  EXPECT_EQ(plan->host_ready, (std::vector<HostBackedPage>{{1, 101}, {2, 102}, {4, 104}, {5, 105}, {7, 107},
                                                           {9, 109}}));
}

TEST(ResumePlan, NothingBackedRecomputesEveryRow) {
  absl::StatusOr<ResumePlan> plan = PlanResume({}, 5, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->runs.empty());
  EXPECT_TRUE(plan->host_ready.empty());
  EXPECT_EQ(plan->recompute, (std::vector<RowRange>{{0, 5}}));
  EXPECT_EQ(plan->rows_imported, 0);
  EXPECT_EQ(plan->rows_recomputed, 5);
  // One token: no page can be imported, even a backed one.
  plan = PlanResume(Pages({0}), 1, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->usable_pages, 0u);
  EXPECT_TRUE(plan->runs.empty());
  EXPECT_EQ(plan->recompute, (std::vector<RowRange>{{0, 1}}));
}

TEST(ResumePlan, APageListedTwiceKeepsTheChecksumListedLast) {
  const std::vector<HostBackedPage> pages{{3, 7}, {0, 1}, {3, 9}};
  absl::StatusOr<ResumePlan> plan = PlanResume(pages, 100, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->host_ready, (std::vector<HostBackedPage>{{0, 1}, {3, 9}}));
  EXPECT_EQ(plan->runs, (std::vector<HostRun>{{0, 1}, {3, 1}}));
  EXPECT_EQ(plan->recompute, (std::vector<RowRange>{{4, 12}, {16, 100}}));
}

TEST(ResumePlan, BadSizesAreRefused) {
  EXPECT_EQ(PlanResume(Pages({0}), 0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanResume(Pages({0}), -3, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanResume(Pages({0}), 10, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GrantHostBacked, ListedPagesOnceAscendingWithTheirChecksumsElseTheLeadingRun) {
  const std::vector<uint32_t> listed{5, 2, 8, 5};
  const std::vector<uint64_t> sums{7, 3, 4, 6};
  EXPECT_EQ(GrantHostBacked(listed, sums, 9), (std::vector<HostBackedPage>{{2, 3}, {5, 6}, {8, 4}}));
  const std::vector<uint64_t> short_sums{7};
  EXPECT_EQ(GrantHostBacked(std::vector<uint32_t>{5, 2}, short_sums, 9),
            (std::vector<HostBackedPage>{{2, 0}, {5, 7}}));
  const std::vector<uint64_t> lead_sums{11, 12};
  EXPECT_EQ(GrantHostBacked({}, lead_sums, 3), (std::vector<HostBackedPage>{{0, 11}, {1, 12}, {2, 0}}));
  EXPECT_TRUE(GrantHostBacked({}, {}, 0).empty());
}

// Random grants: the plan agrees row by row with the rule and has the documented shape.
TEST(ResumePlan, RandomGrantsFollowTheRule) {
  std::mt19937_64 rng(23);
  for (int iter = 0; iter < 3000; ++iter) {
    const auto p = static_cast<uint32_t>(1 + rng() % 8);
    const auto n = static_cast<Position>(1 + rng() % 200);
    const auto pages_max = static_cast<uint32_t>(n / p + 4);
    std::vector<HostBackedPage> backed;
    const size_t count = rng() % (pages_max + 3);
    std::map<uint32_t, uint64_t> last;  // the expected host-ready list
    for (size_t i = 0; i < count; ++i) {
      const HostBackedPage h{static_cast<uint32_t>(rng() % pages_max), rng() % 5};
      backed.push_back(h);
      last[h.page] = h.checksum;
    }
    SCOPED_TRACE(testing::Message() << "iteration " << iter << ": n " << n << ", p " << p);
    absl::StatusOr<ResumePlan> plan = PlanResume(backed, n, p);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<HostBackedPage> ready;
    for (const auto& [j, sum] : last) ready.push_back({j, sum});
    EXPECT_EQ(plan->host_ready, ready);
    EXPECT_EQ(plan->usable_pages, static_cast<uint32_t>((n - 1) / p));
    // Row by row: imported iff its page is host-backed and wholly before the last token.
    std::vector<int> row_of(static_cast<size_t>(n), 0);  // 0 = unplanned, 1 = imported, 2 = recomputed
    for (size_t i = 0; i < plan->runs.size(); ++i) {
      const HostRun& run = plan->runs[i];
      ASSERT_GE(run.pages, 1u);
      if (i > 0) {
        ASSERT_LT(plan->runs[i - 1].first + plan->runs[i - 1].pages, run.first);  // ordered, never adjacent
      }
      for (Position r = Position{run.first} * p; r < Position{run.first + run.pages} * p; ++r) {
        ASSERT_LT(r, n - 1);  // never the last token
        ASSERT_EQ(row_of[static_cast<size_t>(r)], 0);
        row_of[static_cast<size_t>(r)] = 1;
      }
    }
    for (size_t i = 0; i < plan->recompute.size(); ++i) {
      const RowRange& range = plan->recompute[i];
      ASSERT_LT(range.begin, range.end);
      if (i > 0) {
        ASSERT_LT(plan->recompute[i - 1].end, range.begin);  // ordered, never adjacent
      }
      for (Position r = range.begin; r < range.end; ++r) {
        ASSERT_LT(r, n);
        ASSERT_EQ(row_of[static_cast<size_t>(r)], 0);
        row_of[static_cast<size_t>(r)] = 2;
      }
    }
    ASSERT_FALSE(plan->recompute.empty());
    EXPECT_EQ(plan->recompute.back().end, n);
    Position imported = 0;
    for (Position r = 0; r < n; ++r) {
      const auto page = static_cast<uint32_t>(r / p);
      const bool rule = last.contains(page) && page < (n - 1) / p;
      EXPECT_EQ(row_of[static_cast<size_t>(r)], rule ? 1 : 2) << "row " << r;
      imported += rule;
    }
    EXPECT_EQ(plan->rows_imported, imported);
    EXPECT_EQ(plan->rows_imported + plan->rows_recomputed, n);
  }
}

}  // namespace
}  // namespace dhs
