// tests/workerd/client_outbox_test.cc: ClientOutbox (workerd/client_outbox.h), the send-side back-pressure decisions
// towards clients. Scenario tests with hand-computed byte counts, then a randomized run against a simple model of
// the socket (each client's socket takes a random number of replies per round, some clients go away) that checks the
// invariants after every event and that every client receives exactly the replies queued for it, in order.
#include "workerd/client_outbox.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dhs {
namespace {

std::string Bytes(size_t n, char c = 'x') { return std::string(n, c); }

// Sends to `peer` while `take` replies are accepted by its socket; returns what was sent.
std::vector<std::string> Drain(ClientOutbox& box, const std::string& peer, size_t take) {
  std::vector<std::string> out;
  while (out.size() < take) {
    const std::string* front = box.Front(peer);
    if (front == nullptr) break;
    out.push_back(*front);
    box.Sent(peer);
  }
  return out;
}

TEST(ClientOutbox, AClientThatStopsReadingGetsBoundedBufferingThenItsStreamIsRefusedButItsEndIsKept) {
  ClientOutbox box({/*per_client_bytes=*/1000, /*total_bytes=*/10000});
  // 100-byte chunks: the 10th fits exactly (1000 bytes), the 11th would make 1100 > 1000.
  for (int i = 0; i < 10; ++i) ASSERT_EQ(box.Push("slow", Bytes(100, 'a' + i), ReplyKind::kStream), PushVerdict::kQueued);
  EXPECT_EQ(box.Push("slow", Bytes(100), ReplyKind::kStream), PushVerdict::kRefused);
  EXPECT_TRUE(box.Full("slow"));
  // The request's final chunk (with the error) is queued beyond the limit: its end is never lost.
  EXPECT_EQ(box.Push("slow", Bytes(70, 'E'), ReplyKind::kEnd), PushVerdict::kQueued);
  EXPECT_EQ(box.queued_bytes("slow"), 1070u);
  EXPECT_EQ(box.stats().streams_refused, 1u);
  EXPECT_EQ(box.stats().peak_queued_bytes, 1070u);
  // Another client is not affected by the slow one's buffer (per-client limit; total 1070 of 10000).
  EXPECT_EQ(box.Push("fast", Bytes(100), ReplyKind::kStream), PushVerdict::kQueued);
  EXPECT_TRUE(box.CheckInvariants().ok()) << box.CheckInvariants();
  // The slow client reads again: it gets the 10 queued chunks in order, then the end.
  const std::vector<std::string> got = Drain(box, "slow", 100);
  ASSERT_EQ(got.size(), 11u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(got[i], Bytes(100, 'a' + i));
  EXPECT_EQ(got[10], Bytes(70, 'E'));
  EXPECT_EQ(box.Front("slow"), nullptr);
  EXPECT_FALSE(box.Full("slow"));
  EXPECT_EQ(box.Backlogged(), std::vector<std::string>{"fast"});
  EXPECT_TRUE(box.CheckInvariants().ok()) << box.CheckInvariants();
}

TEST(ClientOutbox, TheTotalLimitBoundsAllClientsTogether) {
  ClientOutbox box({/*per_client_bytes=*/600, /*total_bytes=*/1000});
  ASSERT_EQ(box.Push("a", Bytes(600), ReplyKind::kStream), PushVerdict::kQueued);
  ASSERT_EQ(box.Push("b", Bytes(400), ReplyKind::kReply), PushVerdict::kQueued);  // total 1000: full
  EXPECT_EQ(box.Push("b", Bytes(1), ReplyKind::kStream), PushVerdict::kRefused);
  EXPECT_EQ(box.Push("c", Bytes(1), ReplyKind::kReply), PushVerdict::kRefused);  // a third client too
  EXPECT_EQ(box.stats().streams_refused, 1u);
  EXPECT_EQ(box.stats().replies_dropped, 1u);
  // kEnd replies are queued beyond the limits (a request's end is never lost).
  EXPECT_EQ(box.Push("c", Bytes(50), ReplyKind::kEnd), PushVerdict::kQueued);
  EXPECT_EQ(box.stats().queued_bytes, 1050u);
  Drain(box, "a", 1);  // a's 600 bytes leave: room for c, whose kEnd counts against its limit (50 + 551 > 600)
  EXPECT_EQ(box.Push("c", Bytes(551), ReplyKind::kStream), PushVerdict::kRefused);
  EXPECT_EQ(box.Push("c", Bytes(550), ReplyKind::kStream), PushVerdict::kQueued);
  EXPECT_TRUE(box.Full("c"));
  EXPECT_TRUE(box.CheckInvariants().ok()) << box.CheckInvariants();
}

TEST(ClientOutbox, AGoneClientLosesItsQueueCountedAndIsReportedOnce) {
  ClientOutbox box({1000, 1000});
  box.Push("g", Bytes(10), ReplyKind::kStream);
  box.Push("g", Bytes(20), ReplyKind::kEnd);
  box.Push("h", Bytes(30), ReplyKind::kStream);
  box.PeerGone("g");
  EXPECT_EQ(box.stats().dropped_for_gone, 2u);
  EXPECT_EQ(box.queued_bytes("g"), 0u);
  EXPECT_EQ(box.stats().queued_bytes, 30u);
  EXPECT_EQ(box.TakeGonePeers(), std::vector<std::string>{"g"});
  EXPECT_TRUE(box.TakeGonePeers().empty());
  EXPECT_TRUE(box.CheckInvariants().ok()) << box.CheckInvariants();
}

// Random pushes (kinds, sizes, 4 clients), random socket capacity per round, random disconnects. The model: what
// each client was promised (queued replies not yet sent) and the limits recomputed from that list alone.
TEST(ClientOutbox, RandomizedRunsKeepTheInvariantsAndDeliverEveryQueuedReplyInOrder) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    std::mt19937_64 rng(seed);
    const ClientOutboxLimits limits{200 + rng() % 800, 500 + rng() % 2000};
    ClientOutbox box(limits);
    const std::vector<std::string> peers = {"p0", "p1", "p2", "p3"};
    std::map<std::string, std::vector<std::pair<std::string, ReplyKind>>> promised;  // queued, not yet sent
    uint64_t counter = 0;
    for (int step = 0; step < 3000; ++step) {
      const std::string& peer = peers[rng() % peers.size()];
      const uint32_t what = static_cast<uint32_t>(rng() % 10);
      if (what < 6) {
        const auto kind = static_cast<ReplyKind>(rng() % 3);
        std::string bytes = std::to_string(counter++) + ":" + Bytes(rng() % 120);
        uint64_t mine = 0, all = 0;
        for (const auto& [p, list] : promised) {
          for (const auto& [b, k] : list) {
            all += b.size();
            if (p == peer) mine += b.size();
          }
        }
        const bool fits = mine + bytes.size() <= limits.per_client_bytes && all + bytes.size() <= limits.total_bytes;
        const PushVerdict expect = kind == ReplyKind::kEnd || fits ? PushVerdict::kQueued : PushVerdict::kRefused;
        ASSERT_EQ(box.Push(peer, bytes, kind), expect) << "seed " << seed << " step " << step;
        if (expect == PushVerdict::kQueued) promised[peer].emplace_back(bytes, kind);
      } else if (what < 9) {
        const size_t take = rng() % 5;
        const std::vector<std::string> got = Drain(box, peer, take);
        auto& list = promised[peer];
        ASSERT_LE(got.size(), list.size());
        for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], list[i].first) << "seed " << seed;
        ASSERT_TRUE(got.size() == take || got.size() == list.size());
        list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(got.size()));
      } else {
        box.PeerGone(peer);
        promised[peer].clear();
        ASSERT_EQ(box.TakeGonePeers(), std::vector<std::string>{peer});
      }
      ASSERT_TRUE(box.CheckInvariants().ok()) << "seed " << seed << " step " << step << ": " << box.CheckInvariants();
    }
  }
}

}  // namespace
}  // namespace dhs
