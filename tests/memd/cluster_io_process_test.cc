// tests/memd/cluster_io_process_test.cc: the cluster tier's trips to a real redis-server (memd/cluster_io.h): pages
// published through the write-behind queue and looked up again, checked; a value corrupted in the store, one of
// another geometry and one under another page's key are misses counted by reason; the store killed (the queue goes
// down and sheds), restarted empty (a probe brings it up; old pages are plain misses) and SIGSTOPped (timeouts).
#include "memd/cluster_io.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <random>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/page_checksum.h"
#include "memd/cluster_keys.h"
#include "tests/common/redis_test_util.h"

namespace dhs::memd {
namespace {

using std::chrono::milliseconds;

PageGeometry Geometry(uint64_t model = 7) {
  PageGeometry g;
  g.page_rows = 4;
  g.payload_sources = 1;
  g.index_producers = 1;
  g.index_key_bytes = 16;
  g.page_bytes = 4 * 48;
  g.host_page_bytes = g.page_bytes + 4 * 16;
  const uint64_t rows[] = {48}, keys[] = {16};
  g.layout_digest = LayoutDigest(rows, keys);
  g.model = model;
  return g;
}

std::vector<uint8_t> Page(const PageGeometry& g, uint32_t seed) {
  std::vector<uint8_t> p(g.host_page_bytes);
  std::mt19937 rng(seed);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

PageIdentity Id(uint32_t i) { return PageIdentity{PageValueKind::kPrefix, 0x1000 + i, 0x2000 + i}; }

class ClusterIo : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    server_ = testing::RedisServer::Start(tmp_.path() + "/server", /*cluster=*/false);
    ASSERT_TRUE(server_);
    redis::ClientConfig config;
    config.seeds = {server_->endpoint()};
    auto c = redis::Client::Create(config);
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
    space_ = GeometryFingerprint(geometry_);
  }
  std::string Key(uint32_t i) const { return PrefixPageKey(space_, Id(i).key); }
  PublishItem Item(uint32_t i, const PageGeometry& g) const {
    std::string value;
    DHS_CHECK_OK(EncodePageValue(g, Id(i), Page(g, i), &value));
    return PublishItem{Key(i), std::move(value), 60'000};
  }
  // Pumps until the queue has nothing to send at `now`.
  void Drain(ClusterPublisher& publisher, int64_t now) {
    for (int i = 0; i < 100 && publisher.Pump(now, milliseconds(2000)); ++i) {
    }
  }
  std::vector<PageLookup> Lookups(uint32_t n) const {
    std::vector<PageLookup> out;
    for (uint32_t i = 0; i < n; ++i) out.push_back(PageLookup{Key(i), Id(i)});
    return out;
  }

  testing::ScopedTempDir tmp_{"dhs-redis-"};
  std::unique_ptr<testing::RedisServer> server_;
  std::unique_ptr<redis::Client> client_;
  PageGeometry geometry_ = Geometry();
  uint64_t space_ = 0;
};

TEST_F(ClusterIo, PublishedPagesComeBackCheckedAndBadValuesAreCountedMisses) {
  PublishQueueConfig qc;
  qc.batch_max_entries = 4;
  PublishQueue queue(qc);
  ClusterPublisher publisher(client_.get(), &queue);
  for (uint32_t i = 0; i < 10; ++i) ASSERT_EQ(queue.Offer(Item(i, geometry_), 0).result, OfferResult::kQueued);
  Drain(publisher, 0);
  EXPECT_EQ(queue.counters().written, 10u);
  EXPECT_EQ(queue.counters().batches, 3u);  // 4 + 4 + 2
  EXPECT_EQ(queue.depth(), 0u);
  // The TTL reached the store.
  const int64_t pttl = std::stoll(server_->Cli("pttl " + Key(3)));
  EXPECT_GT(pttl, 50'000);

  // Spoil three of them in the store: a flipped payload byte, another page's value, another geometry's value.
  ASSERT_EQ(server_->Cli("setrange " + Key(4) + " 120 X"), std::to_string(88 + geometry_.host_page_bytes));
  const std::string other_page = Item(6, geometry_).value;
  ASSERT_TRUE(client_->Set(std::vector<redis::SetItem>{{Key(5), other_page, 0}}, milliseconds(2000))[0].ok());
  PageGeometry bigger = Geometry(/*model=*/8);
  const std::string other_geometry = Item(7, bigger).value;
  ASSERT_TRUE(client_->Set(std::vector<redis::SetItem>{{Key(7), other_geometry, 0}}, milliseconds(2000))[0].ok());

  std::vector<PageLookup> lookups = Lookups(10);
  lookups.push_back(PageLookup{Key(99), Id(99)});  // never published
  LookupCounters counters;
  const auto pages = LookupPages(*client_, lookups, geometry_, milliseconds(2000), &counters);
  ASSERT_EQ(pages.size(), 11u);
  for (uint32_t i = 0; i < 10; ++i) {
    if (i == 4 || i == 5 || i == 7) {
      EXPECT_FALSE(pages[i]) << i;
      continue;
    }
    ASSERT_TRUE(pages[i]) << i;
    const std::vector<uint8_t> want = Page(geometry_, i);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), pages[i]->payload().begin(), pages[i]->payload().end())) << i;
    EXPECT_EQ(pages[i]->page_checksum, PageChecksum(want));
  }
  EXPECT_FALSE(pages[10]);
  EXPECT_EQ(counters.lookups, 11u);
  EXPECT_EQ(counters.hits, 7u);
  EXPECT_EQ(counters.hit_bytes, 7 * geometry_.host_page_bytes);
  EXPECT_EQ(counters.misses[static_cast<size_t>(LookupMiss::kAbsent)], 1u);
  EXPECT_EQ(counters.misses[static_cast<size_t>(LookupMiss::kBadValue)], 3u);
  EXPECT_EQ(counters.bad_values[static_cast<size_t>(PageValueError::kChecksumMismatch)], 1u);
  EXPECT_EQ(counters.bad_values[static_cast<size_t>(PageValueError::kAddressMismatch)], 1u);
  EXPECT_EQ(counters.bad_values[static_cast<size_t>(PageValueError::kGeometryMismatch)], 1u);
  EXPECT_EQ(counters.miss_total(), 4u);
}

TEST_F(ClusterIo, AKilledStoreTakesTheQueueDownARestartedOneBringsItBackEmpty) {
  PublishQueueConfig qc;
  qc.batch_max_entries = 1;
  qc.failures_to_down = 2;
  qc.retry_initial_us = 1000;
  qc.retry_max_us = 4000;
  PublishQueue queue(qc);
  ClusterPublisher publisher(client_.get(), &queue);
  queue.Offer(Item(0, geometry_), 0);
  Drain(publisher, 0);
  ASSERT_EQ(queue.counters().written, 1u);

  server_->Kill();
  for (uint32_t i = 1; i <= 4; ++i) queue.Offer(Item(i, geometry_), 10);
  ASSERT_TRUE(publisher.Pump(20, milliseconds(300)));  // refused: failed
  EXPECT_EQ(queue.health(), StoreHealth::kUp);
  ASSERT_TRUE(publisher.Pump(30, milliseconds(300)));  // failed again: down, the rest shed
  EXPECT_EQ(queue.health(), StoreHealth::kDown);
  EXPECT_EQ(queue.counters().failed, 2u);
  EXPECT_EQ(queue.counters().shed[static_cast<size_t>(ShedReason::kStoreDown)], 2u);
  EXPECT_EQ(queue.Offer(Item(5, geometry_), 40).reason, ShedReason::kStoreDown);
  EXPECT_FALSE(publisher.Pump(500, milliseconds(300)));  // before the retry time: nothing sent
  ASSERT_TRUE(publisher.Pump(1030, milliseconds(300)));  // the probe: still dead
  EXPECT_EQ(queue.health(), StoreHealth::kDown);
  EXPECT_EQ(queue.retry_at_us(), 1030 + 2000);

  ASSERT_TRUE(server_->Restart());
  ASSERT_TRUE(publisher.Pump(3030, milliseconds(2000)));  // the probe: PONG
  EXPECT_EQ(queue.health(), StoreHealth::kUp);
  ASSERT_EQ(queue.Offer(Item(6, geometry_), 3040).result, OfferResult::kQueued);
  Drain(publisher, 3050);
  EXPECT_EQ(queue.counters().written, 2u);
  EXPECT_TRUE(queue.CheckInvariants().ok());
  // Page 0 was lost with the old server: a plain miss, not an error; page 6 is there.
  LookupCounters counters;
  std::vector<PageLookup> lookups = {PageLookup{Key(0), Id(0)}, PageLookup{Key(6), Id(6)}};
  const auto pages = LookupPages(*client_, lookups, geometry_, milliseconds(2000), &counters);
  EXPECT_FALSE(pages[0]);
  EXPECT_TRUE(pages[1]);
  EXPECT_EQ(counters.misses[static_cast<size_t>(LookupMiss::kAbsent)], 1u);
  EXPECT_EQ(counters.miss_total(), 1u);
}

TEST_F(ClusterIo, AStoppedStoreIsATimeoutMissAndAFailedBatch) {
  PublishQueue queue(PublishQueueConfig{});
  ClusterPublisher publisher(client_.get(), &queue);
  queue.Offer(Item(0, geometry_), 0);
  Drain(publisher, 0);
  ASSERT_EQ(server_->Signal(SIGSTOP), 0);
  LookupCounters counters;
  const std::vector<PageLookup> lookups = Lookups(1);
  const auto pages = LookupPages(*client_, lookups, geometry_, milliseconds(100), &counters);
  EXPECT_FALSE(pages[0]);
  EXPECT_EQ(counters.misses[static_cast<size_t>(LookupMiss::kTimeout)], 1u);
  queue.Offer(Item(1, geometry_), 10);
  ASSERT_TRUE(publisher.Pump(20, milliseconds(100)));
  EXPECT_EQ(queue.counters().failed, 1u);
  ASSERT_EQ(server_->Signal(SIGCONT), 0);
  const auto again = LookupPages(*client_, lookups, geometry_, milliseconds(2000), &counters);
  EXPECT_TRUE(again[0]);
}

}  // namespace
}  // namespace dhs::memd
