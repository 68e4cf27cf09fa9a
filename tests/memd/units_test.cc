// Unit tests of memd's pure modules: GpuPageTable, HostPageAllocator, ReclaimPolicy, PopulationScheduler.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "memd/gpu_page_table.h"
#include "memd/history_page.h"
#include "memd/host_page_allocator.h"
#include "memd/population_scheduler.h"
#include "memd/request_state.h"
#include "memd/reclaim_policy.h"

namespace dhs::memd {
namespace {

TEST(GpuPageTable, RejectsBadConfiguration) {
  EXPECT_EQ(GpuPageTable::Create(0, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GpuPageTable::Create(0, 4, 5).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GpuPageTable, CountsAndKeepsTheReserve) {
  auto t = *GpuPageTable::Create(1, 10, 3);
  EXPECT_EQ(t.lendable(), 7u);
  auto req = t.Take(5, 4, PageState::kRequired);
  ASSERT_TRUE(req.ok());
  EXPECT_EQ(*req, (std::vector<PageIndex>{0, 1, 2, 3}));
  auto opt = t.Take(6, 3, PageState::kOptionalReady);
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ(t.required(), 4u);
  EXPECT_EQ(t.optional(), 3u);
  EXPECT_EQ(t.free(), 3u);
  // One more page would eat the reserve: M_req + M_opt + M_res <= M.
  EXPECT_EQ(t.Take(5, 1, PageState::kRequired).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t.Take(5, 1, PageState::kReclaiming).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(t.CheckInvariants().ok());
  EXPECT_EQ(t.owner(4), 6u);
}

TEST(GpuPageTable, TransitionsAreChecked) {
  auto t = *GpuPageTable::Create(0, 4, 0);
  PageIndex p = (*t.Take(1, 1, PageState::kOptionalPending))[0];
  EXPECT_EQ(t.Transition(p, PageState::kOptionalReady, PageState::kReclaiming).code(),
            absl::StatusCode::kFailedPrecondition);  // wrong `from`
  EXPECT_TRUE(t.Transition(p, PageState::kOptionalPending, PageState::kReclaiming).ok());
  EXPECT_EQ(t.reclaiming(), 1u);
  EXPECT_EQ(t.optional(), 1u);
  EXPECT_TRUE(t.Transition(p, PageState::kReclaiming, PageState::kOptionalReady).ok());
  EXPECT_EQ(t.Transition(p, PageState::kOptionalReady, PageState::kRequired).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.Transition(9, PageState::kFree, PageState::kRequired).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(t.Release(p).ok());
  EXPECT_EQ(t.Release(p).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.free(), 4u);
  EXPECT_TRUE(t.CheckInvariants().ok());
}

// The eight allowed moves of a request's state, spelled out here independently of kRequestTransitions; every other
// (from, to) pair is refused and leaves the state unchanged, and so is a move from a state the request is not in.
TEST(RequestState, OnlyTheListedTransitionsAreAllowed) {
  using S = RequestState;
  const std::set<std::pair<S, S>> allowed = {
      {S::kQueued, S::kAdmitted},       {S::kAdmitted, S::kReclaiming},    {S::kReclaiming, S::kAdmitted},
      {S::kAdmitted, S::kCompleted},    {S::kReclaiming, S::kCompleted},   {S::kAdmitted, S::kInterrupted},
      {S::kReclaiming, S::kInterrupted}, {S::kQueued, S::kInterrupted}};
  int ok = 0, refused = 0;
  for (int f = 0; f < kRequestStates; ++f) {
    for (int t = 0; t < kRequestStates; ++t) {
      const S from = static_cast<S>(f), to = static_cast<S>(t);
      S state = from;
      const absl::Status s = TransitionRequest(state, from, to);
      EXPECT_EQ(s.ok(), allowed.count({from, to}) > 0) << RequestStateName(from) << " -> " << RequestStateName(to);
      EXPECT_EQ(RequestTransitionAllowed(from, to), s.ok());
      EXPECT_EQ(state, s.ok() ? to : from);
      if (!s.ok()) EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
      ok += s.ok();
      refused += !s.ok();
    }
  }
  EXPECT_EQ(ok, 8);
  EXPECT_EQ(refused, 17);
  // Nothing leaves kCompleted or kInterrupted by a transition (a resume takes an interrupted request over: it ends).
  S state = S::kAdmitted;  // the request is not in `from`: refused, unchanged
  EXPECT_EQ(TransitionRequest(state, S::kQueued, S::kAdmitted).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(state, S::kAdmitted);
  EXPECT_EQ(RequestStateName(S::kInterrupted), "interrupted");
}

// The ten allowed moves of a history page, spelled out here independently of kHistoryTransitions; every other
// (from, to) pair is refused and leaves the page unchanged, and so is a move from a state the page is not in.
TEST(HistoryPage, OnlyTheListedTransitionsAreAllowed) {
  using S = HistoryState;
  const std::set<std::pair<S, S>> allowed = {
      {S::kHostPending, S::kHost},  {S::kGpu, S::kGpuAndHost},        {S::kGpuDeferred, S::kGpuAndHost},
      {S::kGpu, S::kGpuDeferred},   {S::kHost, S::kPopulating},       {S::kPopulating, S::kGpuAndHost},
      {S::kPopulating, S::kHost},   {S::kGpuAndHost, S::kHost},       {S::kGpuDeferred, S::kHostPending},
      {S::kGpu, S::kHost}};
  int ok = 0;
  for (int f = 0; f <= 5; ++f) {
    for (int t = 0; t <= 5; ++t) {
      const S from = static_cast<S>(f), to = static_cast<S>(t);
      HistoryPage page{.state = from};
      const absl::Status s = TransitionHistory(page, from, to);
      EXPECT_EQ(s.ok(), allowed.count({from, to}) > 0) << HistoryStateName(from) << " -> " << HistoryStateName(to);
      EXPECT_EQ(page.state, s.ok() ? to : from);
      ok += s.ok();
    }
  }
  EXPECT_EQ(ok, 10);
  HistoryPage page{.state = S::kHost};
  EXPECT_EQ(TransitionHistory(page, S::kHostPending, S::kHost).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(page.state, S::kHost);
  // Only the states with a GPU page count in a_r.
  EXPECT_FALSE(HoldsGpuPage(S::kHostPending));
  EXPECT_FALSE(HoldsGpuPage(S::kHost));
  EXPECT_TRUE(HoldsGpuPage(S::kPopulating));
  EXPECT_TRUE(HoldsGpuPage(S::kGpu));
  EXPECT_TRUE(HoldsGpuPage(S::kGpuDeferred));
  EXPECT_TRUE(HoldsGpuPage(S::kGpuAndHost));
}

TEST(HostPageAllocator, AllOrNothingAndPerRequest) {
  auto h = *HostPageAllocator::Create(4, 4096);
  EXPECT_EQ(HostPageAllocator::Create(4, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto a = h.Allocate(7, 1, 3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(h.Allocate(8, 0, 2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(h.reusable(), 1u);  // the failed call took nothing
  EXPECT_EQ(h.pages_of(7), 3u);
  EXPECT_EQ(h.source((*a)[0]), 1u);
  EXPECT_EQ(h.ReleaseRequest(7), 3u);
  EXPECT_EQ(h.reusable(), 4u);
  EXPECT_TRUE(h.CheckInvariants().ok());
}

TEST(HostPageAllocator, PinnedPageReusableOnlyAfterCopyCompletes) {
  auto h = *HostPageAllocator::Create(1, 64);
  PageIndex p = (*h.Allocate(1, 0, 1))[0];
  ASSERT_TRUE(h.Pin(p).ok());
  ASSERT_TRUE(h.Free(p).ok());  // freed while a copy is in flight
  EXPECT_EQ(h.reusable(), 0u);
  EXPECT_EQ(h.freed_pinned(), 1u);
  EXPECT_EQ(h.Allocate(2, 0, 1).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(h.Unpin(p).ok());  // the copy reported
  EXPECT_EQ(h.reusable(), 1u);
  EXPECT_EQ((*h.Allocate(2, 0, 1))[0], p);
  EXPECT_EQ(h.Unpin(p).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.Pin(5).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(h.CheckInvariants().ok());
}

TEST(HostPageAllocator, ReleaseRequestDefersPinnedPages) {
  auto h = *HostPageAllocator::Create(3, 64);
  auto pages = *h.Allocate(1, 0, 3);
  ASSERT_TRUE(h.Pin(pages[1]).ok());
  EXPECT_EQ(h.ReleaseRequest(1), 3u);
  EXPECT_EQ(h.reusable(), 2u);
  ASSERT_TRUE(h.Unpin(pages[1]).ok());
  EXPECT_EQ(h.reusable(), 3u);
  EXPECT_TRUE(h.CheckInvariants().ok());
}

// Three admitted requests: A oldest with a=3, B with a=4, C newest with a=5, D with a=0.
std::vector<ReclaimCandidate> Abcd() {
  return {{10, 100, 1, 3}, {11, 200, 2, 4}, {12, 300, 3, 5}, {13, 400, 4, 0}};
}

struct PolicyCase {
  const char* name;
  uint32_t delta;
  std::vector<RequestId> victims;  // the smallest prefix of the reclaim order with sum(a) >= delta
};

TEST(ReclaimPolicy, FirstQCoverTheDeficitExactly) {
  const PolicyCase cases[] = {
      // oldest-first order A(3) B(4) C(5): delta 3 -> A; 4 -> A,B (A alone is short); 8 -> A,B,C.
      {"oldest-first", 3, {10}}, {"oldest-first", 4, {10, 11}}, {"oldest-first", 8, {10, 11, 12}},
      // newest-first order C(5) B(4) A(3): 5 -> C; 6 -> C,B; 10 -> C,B,A.
      {"newest-first", 5, {12}}, {"newest-first", 6, {12, 11}}, {"newest-first", 10, {12, 11, 10}},
      // largest-first order C(5) B(4) A(3): 6 -> C,B; 9 -> C,B; 12 -> C,B,A.
      {"largest-first", 1, {12}}, {"largest-first", 9, {12, 11}}, {"largest-first", 12, {12, 11, 10}},
  };
  for (const PolicyCase& c : cases) {
    SCOPED_TRACE(std::string(c.name) + " delta " + std::to_string(c.delta));
    auto policy = MakeReclaimPolicy(c.name);
    ASSERT_TRUE(policy.ok());
    EXPECT_EQ((*policy)->name(), c.name);
    VictimChoice v = (*policy)->Choose(Abcd(), c.delta);
    EXPECT_TRUE(v.covers);
    EXPECT_EQ(v.victims, c.victims);
    uint32_t sum = 0;
    for (RequestId r : c.victims) sum += r == 10 ? 3 : r == 11 ? 4 : 5;
    EXPECT_EQ(v.pages, sum);
  }
}

TEST(ReclaimPolicy, UncoverableDeficitChoosesNobody) {
  auto policy = *MakeReclaimPolicy("oldest-first");
  VictimChoice v = policy->Choose(Abcd(), 13);  // 3 + 4 + 5 = 12 < 13
  EXPECT_FALSE(v.covers);
  EXPECT_TRUE(v.victims.empty());
}

// ReclaimIndex (what the core uses, issue 14) against the sort-based ReclaimPolicy::Choose (the reference) on random
// states: candidates come and go and are re-keyed (a_r changes) in random order, with few distinct admission times
// and a_r values so that ties must be broken by sequence and request id; every deficit from 1 to the total + 1 is
// asked after every change. The expected answer is the reference's, computed from the plain list of candidates.
TEST(ReclaimIndex, ChoosesWhatTheSortedReferenceChooses) {
  for (const char* name : {"oldest-first", "newest-first", "largest-first"}) {
    SCOPED_TRACE(name);
    auto policy = *MakeReclaimPolicy(name);
    std::mt19937_64 rng(0x14 + name[0]);
    ReclaimIndex index(policy.get());
    std::map<RequestId, ReclaimCandidate> live;  // the reference state: every candidate in the index
    uint64_t seq = 0;
    for (int step = 0; step < 600; ++step) {
      const RequestId id = rng() % 40;
      auto it = live.find(id);
      if (it != live.end()) {
        index.Erase(it->second);
        if (rng() % 3 == 0) {
          live.erase(it);  // no longer a candidate (completed, reclaimed or backed off)
        } else {
          it->second.optional_pages = 1 + static_cast<uint32_t>(rng() % 4);  // re-keyed: a_r changed
          index.Insert(it->second);
        }
      } else {
        const ReclaimCandidate c{id, static_cast<int64_t>(rng() % 5), ++seq, 1 + static_cast<uint32_t>(rng() % 4)};
        live.emplace(id, c);
        index.Insert(c);
      }
      std::vector<ReclaimCandidate> all;
      uint32_t total = 0;
      for (const auto& [rid, c] : live) {
        all.push_back(c);
        total += c.optional_pages;
      }
      all.push_back({1000 + static_cast<RequestId>(step), 0, 0, 0});  // a_r = 0: the reference skips it
      ASSERT_EQ(index.total_pages(), total);
      std::vector<ReclaimCandidate> sorted = all;
      policy->Order(sorted);
      sorted.erase(std::remove_if(sorted.begin(), sorted.end(), [](const auto& c) { return c.optional_pages == 0; }),
                   sorted.end());
      const std::vector<ReclaimCandidate> ordered = index.Ordered();
      ASSERT_EQ(ordered.size(), sorted.size());
      for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(ordered[i].request, sorted[i].request) << "rank " << i;
      for (uint32_t delta = 1; delta <= total + 1; ++delta) {
        const VictimChoice want = policy->Choose(all, delta);
        const VictimChoice have = index.Choose(delta);
        ASSERT_EQ(have.covers, want.covers) << "delta " << delta;
        ASSERT_EQ(have.victims, want.victims) << "delta " << delta;
        ASSERT_EQ(have.pages, want.pages) << "delta " << delta;
      }
    }
  }
}

// The hand-computed cases above, through the index.
TEST(ReclaimIndex, FirstQCoverTheDeficitExactly) {
  auto policy = *MakeReclaimPolicy("largest-first");
  ReclaimIndex index(policy.get());
  for (const ReclaimCandidate& c : Abcd()) {
    if (c.optional_pages > 0) index.Insert(c);
  }
  EXPECT_EQ(index.Choose(6).victims, (std::vector<RequestId>{12, 11}));
  EXPECT_EQ(index.Choose(12).victims, (std::vector<RequestId>{12, 11, 10}));
  EXPECT_FALSE(index.Choose(13).covers);
  EXPECT_TRUE(index.Choose(13).victims.empty());
}

TEST(ReclaimPolicy, UnknownNameIsAClearError) {
  auto p = MakeReclaimPolicy("random");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("oldest-first"), std::string::npos);
}

TEST(PopulationScheduler, RoundRobinBoundedPerAttempt) {
  PopulationScheduler s(5);
  std::vector<PopulationCandidate> c = {{1, 10}, {2, 1}, {3, 10}};
  // Attempt 1 (budget 100, bound 5): 1,2,3,1,3 -> r1: 2, r2: 1, r3: 2.
  auto g = s.Plan(c, 100);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].request, 1u);
  EXPECT_EQ(g[0].pages, 2u);
  EXPECT_EQ(g[1].pages, 1u);
  EXPECT_EQ(g[2].pages, 2u);
  EXPECT_EQ(s.last_served(), 3u);
  // Attempt 2 starts after request 3 (wraps to 1); budget 2 pages: r1 then r3 (r2 no longer misses pages).
  c = {{1, 8}, {3, 8}};
  g = s.Plan(c, 2);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].request, 1u);
  EXPECT_EQ(g[1].request, 3u);
  // Attempt 3 starts after 3 -> 1 again with budget 1.
  g = s.Plan(c, 1);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].request, 1u);
  g = s.Plan(c, 1);
  EXPECT_EQ(g[0].request, 3u);
  EXPECT_TRUE(s.Plan(c, 0).empty());
  EXPECT_TRUE(PopulationScheduler(0).Plan(c, 10).empty());
}

}  // namespace
}  // namespace dhs::memd
