// tests/workerd/kv_page_test.cc: the worker's page record (workerd/kv/kv_page.h): every move of a page's host copy and
// GPU copy is accepted exactly when kHostCopyTransitions / kGpuCopyTransitions list it (each pair of states tried,
// the refused ones leave the page unchanged), the derived predicates (HostReady, Ready, Verified, Imported) per state,
// and a random walk through RequestKv::Transition that keeps the resolver's hot index in step with the record.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <set>
#include <utility>

#include "tests/workerd/kv_test_util.h"
#include "workerd/kv/kv_page.h"
#include "workerd/kv/request_kv.h"

namespace dhs {
namespace {

constexpr HostCopy kHostStates[] = {HostCopy::kNone, HostCopy::kWriting, HostCopy::kWritten, HostCopy::kVerified,
                                    HostCopy::kImported};
constexpr GpuCopy kGpuStates[] = {GpuCopy::kNone, GpuCopy::kFilling, GpuCopy::kReady};

// The moves the brief's page life allows, written out here independently of the tables.
const std::set<std::pair<HostCopy, HostCopy>> kHostAllowed = {
    {HostCopy::kNone, HostCopy::kWriting},   {HostCopy::kWriting, HostCopy::kWritten},
    {HostCopy::kWriting, HostCopy::kNone},   {HostCopy::kWritten, HostCopy::kVerified},
    {HostCopy::kNone, HostCopy::kImported}};
const std::set<std::pair<GpuCopy, GpuCopy>> kGpuAllowed = {
    {GpuCopy::kNone, GpuCopy::kFilling}, {GpuCopy::kFilling, GpuCopy::kReady},
    {GpuCopy::kFilling, GpuCopy::kNone}, {GpuCopy::kReady, GpuCopy::kNone}};

TEST(KvPage, EveryHostCopyMoveNotInTheTableIsRefused) {
  int refused = 0;
  for (HostCopy from : kHostStates) {
    for (HostCopy to : kHostStates) {
      KvPage pg;
      pg.host = from;
      pg.gpu = GpuCopy::kReady;
      const absl::Status s = TransitionPage(pg, from, to);
      if (kHostAllowed.contains({from, to})) {
        EXPECT_TRUE(s.ok()) << HostCopyName(from) << " -> " << HostCopyName(to) << ": " << s;
        EXPECT_EQ(pg.host, to);
      } else {
        ++refused;
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << HostCopyName(from) << " -> " << HostCopyName(to);
        EXPECT_EQ(pg.host, from) << "a refused move changed the page";
      }
      EXPECT_EQ(pg.gpu, GpuCopy::kReady) << "a host copy move changed the GPU copy";
      // The page is not in `from` (any other state): refused, unchanged.
      for (HostCopy other : kHostStates) {
        if (other == from) continue;
        KvPage q;
        q.host = other;
        EXPECT_EQ(TransitionPage(q, from, to).code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_EQ(q.host, other);
      }
    }
  }
  EXPECT_EQ(refused, 25 - 5);
  EXPECT_EQ(std::size(kHostCopyTransitions), kHostAllowed.size());
}

TEST(KvPage, EveryGpuCopyMoveNotInTheTableIsRefused) {
  int refused = 0;
  for (GpuCopy from : kGpuStates) {
    for (GpuCopy to : kGpuStates) {
      KvPage pg;
      pg.gpu = from;
      pg.host = HostCopy::kWriting;
      const absl::Status s = TransitionPage(pg, from, to);
      if (kGpuAllowed.contains({from, to})) {
        EXPECT_TRUE(s.ok()) << GpuCopyName(from) << " -> " << GpuCopyName(to) << ": " << s;
        EXPECT_EQ(pg.gpu, to);
      } else {
        ++refused;
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << GpuCopyName(from) << " -> " << GpuCopyName(to);
        EXPECT_EQ(pg.gpu, from) << "a refused move changed the page";
      }
      EXPECT_EQ(pg.host, HostCopy::kWriting) << "a GPU copy move changed the host copy";
      for (GpuCopy other : kGpuStates) {
        if (other == from) continue;
        KvPage q;
        q.gpu = other;
        EXPECT_EQ(TransitionPage(q, from, to).code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_EQ(q.gpu, other);
      }
    }
  }
  EXPECT_EQ(refused, 9 - 4);
  EXPECT_EQ(std::size(kGpuCopyTransitions), kGpuAllowed.size());
}

TEST(KvPage, PredicatesByState) {
  KvPage pg;
  const std::pair<HostCopy, std::array<bool, 3>> host[] = {  // HostReady, Verified, Imported
      {HostCopy::kNone, {false, false, false}},    {HostCopy::kWriting, {false, false, false}},
      {HostCopy::kWritten, {true, false, false}},  {HostCopy::kVerified, {true, true, false}},
      {HostCopy::kImported, {true, true, true}}};
  for (const auto& [state, want] : host) {
    pg.host = state;
    EXPECT_EQ(pg.HostReady(), want[0]) << HostCopyName(state);
    EXPECT_EQ(pg.Verified(), want[1]) << HostCopyName(state);
    EXPECT_EQ(pg.Imported(), want[2]) << HostCopyName(state);
  }
  for (GpuCopy state : kGpuStates) {
    pg.gpu = state;
    EXPECT_EQ(pg.Ready(), state == GpuCopy::kReady) << GpuCopyName(state);
  }
}

// 20,000 random moves (allowed or not) over 8 pages of one request through RequestKv::Transition: accepted exactly
// when allowed, and after every move the hot index (ready_page, host_ready) equals the record.
TEST(KvPage, RandomWalkKeepsTheHotIndexInStep) {
  std::mt19937_64 rng(23);
  RequestKv kv;
  kv.id = 7;
  kv.GrowPages(8);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    const auto page = static_cast<uint32_t>(rng() % 8);
    KvPage& pg = kv.pages[page];
    if (rng() % 2 == 0) {
      const HostCopy from = rng() % 4 == 0 ? kHostStates[rng() % 5] : pg.host, to = kHostStates[rng() % 5];
      const bool ok = from == pg.host && kHostAllowed.contains({from, to});
      if (ok && from == HostCopy::kNone) pg.host_page = static_cast<int64_t>(page) + 100;
      ASSERT_EQ(kv.Transition(page, from, to).ok(), ok) << i;
      if (ok && to == HostCopy::kNone) pg.host_page = -1;
      (ok ? accepted : refused)++;
    } else {
      const GpuCopy from = rng() % 4 == 0 ? kGpuStates[rng() % 3] : pg.gpu, to = kGpuStates[rng() % 3];
      const bool ok = from == pg.gpu && kGpuAllowed.contains({from, to});
      if (ok && from == GpuCopy::kNone) pg.device_page = static_cast<int64_t>(page) + 3;
      ASSERT_EQ(kv.Transition(page, from, to).ok(), ok) << i;
      if (ok && to == GpuCopy::kNone) pg.device_page = -1;
      (ok ? accepted : refused)++;
    }
    ASSERT_TRUE(test::IndexInStep(kv)) << "move " << i;
  }
  EXPECT_GT(accepted, 3000);
  EXPECT_GT(refused, 3000);
}

}  // namespace
}  // namespace dhs
