// The multi-node router's invariants (tools/replay/router.h, issue 26) under random events, against a brute-force
// model: loads, round-robin order, sticky sessions, and prefix routing's longest held prefix with ties and misses by
// load; plus hand-worked cases.
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tools/replay/router.h"

namespace dhs::replay {
namespace {

TEST(ReplayRouterTest, ParsesPolicies) {
  EXPECT_EQ(*ParseRoutePolicy("round-robin"), RoutePolicy::kRoundRobin);
  EXPECT_EQ(*ParseRoutePolicy("session"), RoutePolicy::kSession);
  EXPECT_EQ(*ParseRoutePolicy("prefix"), RoutePolicy::kPrefix);
  EXPECT_FALSE(ParseRoutePolicy("random").ok());
  EXPECT_FALSE(Router::Create(0, RoutePolicy::kPrefix).ok());
}

TEST(ReplayRouterTest, PrefixPicksTheLongestHeldPrefixThenLoad) {
  Router r = *Router::Create(3, RoutePolicy::kPrefix);
  r.BlockStored(1, 10, 1);
  r.BlockStored(1, 11, 1);
  r.BlockStored(2, 10, 1);
  auto d = *r.Route({0, 0, {10, 11, 12}});
  EXPECT_EQ(d.node, 1);
  EXPECT_EQ(d.matched_blocks, 2);
  EXPECT_EQ(d.reason, RouteReason::kPrefixHit);
  // Node 1 holds (10, 11) but a request of chain (10, 13) matches 1 block on nodes 1 and 2: node 2 has no load.
  d = *r.Route({1, 1, {10, 13}});
  EXPECT_EQ(d.node, 2);
  EXPECT_EQ(d.matched_blocks, 1);
  // A miss goes to the least loaded: node 0.
  d = *r.Route({2, 2, {99}});
  EXPECT_EQ(d.node, 0);
  EXPECT_EQ(d.reason, RouteReason::kPrefixMiss);
  // Removing block 11 from node 1's only medium: it no longer holds it; stored in two media, one removal keeps it.
  r.BlockStored(1, 11, 0);
  r.BlockRemoved(1, 11, 1);
  EXPECT_EQ(r.HeldPrefix(1, {10, 11}), 2);
  r.BlockRemoved(1, 11, 0);
  EXPECT_EQ(r.HeldPrefix(1, {10, 11}), 1);
  r.NodeCleared(1);
  EXPECT_EQ(r.HeldPrefix(1, {10, 11}), 0);
  EXPECT_FALSE(r.Route({0, 0, {}}).ok());  // routed twice
  EXPECT_TRUE(r.Finished(0).ok());
  EXPECT_FALSE(r.Finished(0).ok());        // ended already
  EXPECT_FALSE(r.Finished(77).ok());       // never routed
}

// Blocks smaller than a page (the 1/64-scaled Mooncake trace: T = 8 tokens, 64-row pages): memd announces only the
// block holding a page's last row (blocks 7, 15, ...; memd/kv_block_ledger.h), never c_0.
TEST(ReplayRouterTest, BlocksSmallerThanAPageMatchByTheAnnouncedBlocks) {
  EXPECT_FALSE(BlockAnnounced(0, 8, 64));
  EXPECT_FALSE(BlockAnnounced(6, 8, 64));
  EXPECT_TRUE(BlockAnnounced(7, 8, 64));
  EXPECT_TRUE(BlockAnnounced(15, 8, 64));
  EXPECT_FALSE(BlockAnnounced(-1, 8, 64));
  EXPECT_TRUE(BlockAnnounced(0, 64, 64));
  EXPECT_TRUE(BlockAnnounced(0, 0, 0));  // no geometry: every block
  // T = 96, p = 64: block 0 holds row 63 (page 0), block 1 rows 127 and 191 (pages 1, 2): all announced.
  EXPECT_TRUE(BlockAnnounced(0, 96, 64));
  EXPECT_TRUE(BlockAnnounced(1, 96, 64));
  // T = 24, p = 64: pages end in blocks 2 (row 63), 5 (row 127), 7 (row 191): floor((b+1)*24/64) grows there.
  std::vector<bool> got;
  for (int b = 0; b < 8; ++b) got.push_back(BlockAnnounced(b, 24, 64));
  EXPECT_EQ(got, (std::vector<bool>{false, false, true, false, false, true, false, true}));
  EXPECT_EQ(LastAnnouncedBlock(20, 8, 64), 15);
  EXPECT_EQ(LastAnnouncedBlock(16, 8, 64), 15);
  EXPECT_EQ(LastAnnouncedBlock(7, 8, 64), -1);  // less than a page: nothing announced, nothing to wait for
  EXPECT_EQ(LastAnnouncedBlock(0, 8, 64), -1);
  EXPECT_EQ(LastAnnouncedBlock(3, 0, 0), 2);

  std::vector<uint64_t> chain;
  for (uint64_t b = 0; b < 20; ++b) chain.push_back(100 + b);
  Router r = *Router::Create(2, RoutePolicy::kPrefix);
  r.BlockStored(1, chain[7], 1);   // node 1 announced the chain's two complete pages
  r.BlockStored(1, chain[15], 1);
  r.BlockStored(0, chain[15], 1);  // node 0: the second page only (the first evicted): nothing importable
  EXPECT_EQ(r.HeldPrefix(1, chain, 8, 64), 16);
  EXPECT_EQ(r.HeldPrefix(0, chain, 8, 64), 0);
  EXPECT_EQ(r.HeldPrefix(1, chain), 0);  // block by block: c_0 is never announced
  ASSERT_EQ(r.Route({0, 0, {}})->node, 0);  // a miss each: loads 1 and 1, node 1 no lighter than node 0
  ASSERT_EQ(r.Route({1, 1, {}})->node, 1);
  auto d = *r.Route({2, 2, chain, 8, 64});
  EXPECT_EQ(d.node, 1);
  EXPECT_EQ(d.reason, RouteReason::kPrefixHit);
  EXPECT_EQ(d.matched_blocks, 16);
  // A chain of 10 blocks of which node 1 holds the first page: 8 blocks importable.
  std::vector<uint64_t> shorter(chain.begin(), chain.begin() + 10);
  EXPECT_EQ(r.HeldPrefix(1, shorter, 8, 64), 8);
}

TEST(ReplayRouterTest, SessionsStickAndNewSessionsRoundRobin) {
  Router r = *Router::Create(2, RoutePolicy::kSession);
  // Sessions: rows 0 (s0), 1 (s1), 2 (s0), 3 (s3), 4 (s1), 5 (s3): new ones alternate 0, 1, 0; turns follow.
  const int64_t sessions[] = {0, 1, 0, 3, 1, 3};
  const int expected[] = {0, 1, 0, 0, 1, 0};
  for (int i = 0; i < 6; ++i) {
    auto d = *r.Route({i, sessions[i], {}});
    EXPECT_EQ(d.node, expected[i]) << i;
    EXPECT_EQ(d.reason, sessions[i] == i ? RouteReason::kSessionNew : RouteReason::kSessionSticky) << i;
  }
}

// Random events on 1..4 nodes, checked against a model after every step.
TEST(ReplayRouterTest, RandomEventsKeepTheInvariants) {
  std::mt19937_64 rng(26);
  for (int round = 0; round < 300; ++round) {
    const int nodes = 1 + static_cast<int>(rng() % 4);
    const auto policy = static_cast<RoutePolicy>(rng() % 3);
    Router r = *Router::Create(nodes, policy);
    std::set<std::tuple<int, uint64_t, uint8_t>> stored;  // (node, hash, medium)
    std::map<int64_t, int> in_flight;                      // trace index -> node
    std::map<int64_t, int> session_node;
    std::vector<int64_t> load(nodes, 0);
    int64_t routed = 0, new_sessions = 0;
    auto held = [&](int n, uint64_t h) {
      for (uint8_t m = 0; m < 3; ++m) {
        if (stored.contains({n, h, m})) return true;
      }
      return false;
    };
    auto prefix = [&](int n, const std::vector<uint64_t>& chain) {
      int64_t k = 0;
      while (k < static_cast<int64_t>(chain.size()) && held(n, chain[k])) ++k;
      return k;
    };
    for (int step = 0; step < 200; ++step) {
      const int what = static_cast<int>(rng() % 10);
      const int n = static_cast<int>(rng() % nodes);
      const uint64_t h = rng() % 6;  // few hashes: chains hit often
      const auto m = static_cast<uint8_t>(rng() % 3);
      if (what < 3) {
        r.BlockStored(n, h, m);
        stored.insert({n, h, m});
      } else if (what < 4) {
        r.BlockRemoved(n, h, m);
        stored.erase({n, h, m});
      } else if (what < 5 && rng() % 8 == 0) {
        r.NodeCleared(n);
        std::erase_if(stored, [&](const auto& t) { return std::get<0>(t) == n; });
      } else if (what < 7 && !in_flight.empty()) {
        auto it = in_flight.begin();
        std::advance(it, rng() % in_flight.size());
        ASSERT_TRUE(r.Finished(it->first).ok());
        --load[it->second];
        in_flight.erase(it);
      } else {
        RouteQuery q;
        q.trace_index = routed;
        q.session = static_cast<int64_t>(rng() % 12);
        for (size_t b = 0, len = rng() % 4; b < len; ++b) q.chain.push_back(rng() % 6);
        std::vector<int64_t> before = load;
        auto d = r.Route(q);
        ASSERT_TRUE(d.ok());
        ASSERT_GE(d->node, 0);
        ASSERT_LT(d->node, nodes);
        switch (policy) {
          case RoutePolicy::kRoundRobin:
            EXPECT_EQ(d->node, routed % nodes);
            break;
          case RoutePolicy::kSession:
            if (session_node.contains(q.session)) {
              EXPECT_EQ(d->node, session_node[q.session]);
              EXPECT_EQ(d->reason, RouteReason::kSessionSticky);
            } else {
              EXPECT_EQ(d->node, new_sessions++ % nodes);
              EXPECT_EQ(d->reason, RouteReason::kSessionNew);
            }
            break;
          case RoutePolicy::kPrefix: {
            int64_t best = 0;
            for (int k = 0; k < nodes; ++k) best = std::max(best, prefix(k, q.chain));
            EXPECT_EQ(d->matched_blocks, best);
            EXPECT_EQ(prefix(d->node, q.chain), best);
            EXPECT_EQ(d->reason, best > 0 ? RouteReason::kPrefixHit : RouteReason::kPrefixMiss);
            for (int k = 0; k < nodes; ++k) {  // no other node with the same prefix has less load
              if (prefix(k, q.chain) == best) EXPECT_LE(before[d->node], before[k]);
            }
            break;
          }
        }
        session_node[q.session] = d->node;
        in_flight[routed] = d->node;
        ++load[d->node];
        ++routed;
      }
      for (int k = 0; k < nodes; ++k) ASSERT_EQ(r.load(k), load[k]) << "node " << k;
      for (int k = 0; k < nodes; ++k) {
        for (uint64_t x = 0; x < 6; ++x) ASSERT_EQ(r.HeldPrefix(k, {x}), held(k, x) ? 1 : 0);
      }
    }
  }
}

}  // namespace
}  // namespace dhs::replay
