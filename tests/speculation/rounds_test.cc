// tests/speculation/rounds_test.cc: the commit rule (workerd/speculation/commit.h, brief §6) by hand, and the building blocks
// driven together the way the worker will: many requests with random acceptance, each round planned (union plan),
// staged (arena pool across layer groups), accepted (sampling rule) and committed (target frontier and draft ring
// advance by A_r + 1); at the end every ring slot and staging arena is free and each request committed exactly its
// length. And K_r = 2 with the draft always rejected for many steps: the frontier moves by one each round.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "workerd/speculation/acceptance.h"
#include "workerd/speculation/block_width.h"
#include "workerd/speculation/commit.h"
#include "workerd/speculation/draft_ring.h"
#include "workerd/speculation/keyed_draw.h"
#include "workerd/verification/staging_pool.h"
#include "workerd/verification/union_plan.h"

namespace dhs::spec {
namespace {

using model::kVocab;

TEST(CommitRound, ByHand) {
  // m = 4, n_r = 6, K_r = 5, A_r = 3: keep 6..9, frontier 10, drop 10; row 1 (4..7) completes, row 2 (8..11) not.
  absl::StatusOr<RoundCommit> c = CommitRound(6, 5, 3, 4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->frontier, 10);
  EXPECT_EQ(c->dropped_begin, 10);
  EXPECT_EQ(c->dropped_end, 11);
  EXPECT_EQ(c->complete_begin, 1);
  EXPECT_EQ(c->complete_end, 2);
  // Nothing accepted inside a row: no row completes; m = 1: exactly the kept positions.
  c = CommitRound(8, 4, 0, 4);
  EXPECT_EQ(c->complete_begin, c->complete_end);
  EXPECT_EQ(c->dropped_begin, 9);
  EXPECT_EQ(c->dropped_end, 12);
  c = CommitRound(8, 4, 3, 1);
  EXPECT_EQ(c->complete_begin, 8);
  EXPECT_EQ(c->complete_end, 12);
  EXPECT_EQ(c->dropped_begin, c->dropped_end);  // all accepted: nothing dropped
  EXPECT_EQ(CommitRound(8, 4, 4, 1).status().code(), absl::StatusCode::kInvalidArgument);  // A_r <= K_r - 1
  EXPECT_EQ(CommitRound(8, 0, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CommitRound(-1, 2, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CommitRound(8, 2, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

std::vector<double> RandomDist(std::mt19937_64& rng, int support) {
  std::vector<double> v(kVocab, 0.0);
  double sum = 0.0;
  for (int i = 0; i < support; ++i) {
    const int id = static_cast<int>(rng() % kVocab);
    const double w = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
    v[id] += w;
    sum += w;
  }
  for (double& x : v) x /= sum;
  return v;
}

struct Live {
  RequestId id;
  Position n;     // frontier n_r
  Position end;   // the request finishes when n >= end
};

// One round of request `req` in slot `slot`: draft K_r positions, plan the union, accept, commit. Returns A_r.
int64_t Round(Live& req, SlotIndex slot, int64_t k_r, DraftRing& ring, std::mt19937_64& rng, int64_t k,
              int64_t k_max, int64_t m, int64_t* staged) {
  for (int64_t j = 0; j < k_r; ++j) EXPECT_TRUE(ring.Write(slot).ok());
  std::vector<std::vector<Position>> sels(k_r, std::vector<Position>(k, kNoPosition));
  for (int64_t j = 0; j < k_r; ++j) {
    for (int64_t e = 0; e < k && e <= req.n + j; ++e) sels[j][e] = req.n + j - e * 3 >= 0 ? req.n + j - e * 3 : -1;
  }
  std::vector<std::span<const Position>> spans(sels.begin(), sels.end());
  absl::StatusOr<UnionPlan> plan = PlanUnion({.selections = spans, .k = k, .k_max = k_max, .frontier = req.n,
                                              .hot_budget = static_cast<int64_t>(rng() % (k + 1)),
                                              .ready = [&](Position t) { return t >= req.n || t % 5 == 0; }});
  EXPECT_TRUE(plan.ok()) << plan.status();
  *staged += plan->staging_copies;
  std::vector<std::vector<double>> p(k_r);
  for (auto& row : p) row = RandomDist(rng, 4);
  const RoundKey key{.seed = 77, .request = req.id, .frontier = req.n};
  std::vector<std::vector<double>> qs(k_r);
  std::vector<Proposal> props;
  for (int64_t j = 1; j < k_r; ++j) {
    const std::vector<double> noise = RandomDist(rng, 4);  // a drafter close to the target: q = 0.7 p + 0.3 noise
    qs[j].resize(kVocab);
    for (int y = 0; y < kVocab; ++y) qs[j][y] = 0.7 * p[j - 1][y] + 0.3 * noise[y];
    const double u = KeyedUniform({key.seed, key.request, req.n + j, DrawPurpose::kDraft});
    props.push_back({SampleWithUniform(qs[j], u), qs[j]});
  }
  absl::StatusOr<RoundOutcome> out = AcceptWithDistributions(p, props, key);
  EXPECT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->emitted.size(), static_cast<size_t>(out->accepted + 1));
  absl::StatusOr<RoundCommit> c = CommitRound(req.n, k_r, out->accepted, m);
  EXPECT_TRUE(c.ok());
  EXPECT_EQ(c->frontier - req.n, out->accepted + 1);  // committed length = accepted + 1
  EXPECT_TRUE(ring.Commit(slot, out->accepted + 1).ok());
  req.n = c->frontier;
  EXPECT_EQ(ring.frontier(slot), req.n);
  return out->accepted;
}

TEST(Rounds, ManyRequestsRandomAcceptanceFreeEverythingAtTheEnd) {
  const uint64_t seed = 99;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const uint32_t n_slots = 4, chi = 2, groups = 3;
  const int64_t k_max = 5, k = 6, m = 2;
  absl::StatusOr<DraftRingGeometry> g =
      DraftRingGeometry::Create({.window = 16, .k_max = k_max, .page_rows = 4, .slots = n_slots});
  ASSERT_TRUE(g.ok());
  DraftRing ring(*g);
  StagingArenaPool pool(chi);
  absl::StatusOr<BlockWidthSchedule> sched = BlockWidthSchedule::Parse("1:5,3:3,4:2", k_max);
  ASSERT_TRUE(sched.ok());
  std::deque<Live> waiting;
  for (RequestId r = 1; r <= 40; ++r) {
    const Position start = static_cast<Position>(rng() % 30);
    waiting.push_back({r, start, start + 5 + static_cast<Position>(rng() % 60)});
  }
  std::map<SlotIndex, Live> live;
  int64_t rounds = 0, accepted = 0, staged = 0, waits = 0;
  std::map<int64_t, int64_t> widths;
  while (!waiting.empty() || !live.empty()) {
    for (SlotIndex s = 0; s < n_slots && !waiting.empty(); ++s) {
      if (live.count(s)) continue;
      ASSERT_TRUE(ring.Open(s, waiting.front().n).ok());
      live[s] = waiting.front();
      waiting.pop_front();
    }
    const int64_t k_r = sched->WidthFor(static_cast<int64_t>(live.size()));
    ++widths[k_r];
    // The batch's verification pass: each layer group takes χ arenas; the next group's first source waits until a
    // reader of this group finishes.
    for (uint32_t grp = 0; grp < groups; ++grp) {
      std::vector<uint32_t> arenas;
      for (uint32_t src = 0; src < chi; ++src) {
        absl::StatusOr<uint32_t> a = pool.Acquire(grp, src, 2);
        ASSERT_TRUE(a.ok()) << a.status();
        arenas.push_back(*a);
      }
      waits += pool.Acquire(grp + 1, 0, 1).status().code() == absl::StatusCode::kResourceExhausted;
      for (uint32_t a : arenas) {
        ASSERT_FALSE(*pool.ReleaseReader(a));
        ASSERT_TRUE(*pool.ReleaseReader(a));
      }
    }
    for (auto it = live.begin(); it != live.end();) {
      accepted += Round(it->second, it->first, k_r, ring, rng, k, k_max, m, &staged);
      ++rounds;
      if (it->second.n >= it->second.end) {
        ASSERT_TRUE(ring.Close(it->first).ok());
        it = live.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (SlotIndex s = 0; s < n_slots; ++s) EXPECT_FALSE(ring.open(s));
  EXPECT_EQ(pool.free_arenas(), chi);
  std::printf("%lld rounds, acceptance length mean %.3f, %lld rows staged, %lld group waits; widths:",
              static_cast<long long>(rounds), 1.0 + static_cast<double>(accepted) / rounds,
              static_cast<long long>(staged), static_cast<long long>(waits));
  for (auto [w, n] : widths) std::printf(" K=%lld x%lld", static_cast<long long>(w), static_cast<long long>(n));
  std::printf("\n");
  EXPECT_GT(staged, 0);
  EXPECT_GE(widths.size(), 2u);  // the schedule changed the width as load fell
}

TEST(Rounds, AlwaysRejectedDraftAdvancesByOne) {
  absl::StatusOr<DraftRingGeometry> g =
      DraftRingGeometry::Create({.window = 8, .k_max = 2, .page_rows = 4, .slots = 1});
  ASSERT_TRUE(g.ok());
  DraftRing ring(*g);
  ASSERT_TRUE(ring.Open(0, 3).ok());
  std::vector<double> p(kVocab, 0.0), q(kVocab, 0.0);
  p[1] = 0.6;
  p[2] = 0.4;
  q[9] = 1.0;  // the drafter always proposes 9, which the target never emits: min(1, p/q) = 0
  const std::vector<std::vector<double>> ps = {p, p};
  const std::vector<Proposal> props = {{9, q}};
  Position n = 3;
  int64_t ones = 0;
  for (int step = 0; step < 10000; ++step) {
    ASSERT_TRUE(ring.Write(0).ok());
    ASSERT_TRUE(ring.Write(0).ok());
    absl::StatusOr<RoundOutcome> out = AcceptWithDistributions(ps, props, {.seed = 1, .request = 5, .frontier = n});
    ASSERT_TRUE(out.ok());
    ASSERT_EQ(out->accepted, 0);
    ASSERT_EQ(out->emitted.size(), 1u);
    ASSERT_TRUE(out->emitted[0] == 1 || out->emitted[0] == 2);  // the correction norm(max(0, p - q)) = p
    ones += out->emitted[0] == 1;
    ASSERT_TRUE(ring.Commit(0, 1).ok());
    n = CommitRound(n, 2, 0, 1)->frontier;
    ASSERT_EQ(ring.frontier(0), n);
  }
  EXPECT_EQ(n, 3 + 10000);
  std::printf("corrections: token 1 %lld of 10000 (p = 0.6)\n", static_cast<long long>(ones));
}

}  // namespace
}  // namespace dhs::spec
