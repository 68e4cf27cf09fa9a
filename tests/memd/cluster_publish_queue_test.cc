// tests/memd/cluster_publish_queue_test.cc: the cluster tier's write-behind queue core
// (memd/cluster_publish_queue.h): shedding by reason, coalescing, batches, the store health table, and a randomized
// test that drives it against a simple model written here, checking its invariants after every event.
#include "memd/cluster_publish_queue.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <set>
#include <string>

namespace dhs::memd {
namespace {

PublishItem Item(const std::string& key, size_t value_bytes) { return PublishItem{key, std::string(value_bytes, 'v'), 1000}; }

PublishQueueConfig Small() {
  PublishQueueConfig c;
  c.max_entries = 4;
  c.max_bytes = 400;
  c.batch_max_entries = 2;
  c.batch_max_bytes = 200;
  c.failures_to_down = 2;
  c.retry_initial_us = 100;
  c.retry_max_us = 350;
  return c;
}

TEST(PublishQueue, ValidateRefusesBadLimits) {
  EXPECT_TRUE(PublishQueue::Validate(Small()).ok());
  PublishQueueConfig c = Small();
  c.max_entries = 0;
  EXPECT_FALSE(PublishQueue::Validate(c).ok());
  c = Small();
  c.batch_max_entries = 5;
  EXPECT_FALSE(PublishQueue::Validate(c).ok());
  c = Small();
  c.retry_initial_us = 400;
  EXPECT_FALSE(PublishQueue::Validate(c).ok());
}

TEST(PublishQueue, ShedsByReasonAndNeverGrowsPastItsLimits) {
  PublishQueue q(Small());
  EXPECT_EQ(q.Offer(Item("a", 99), 0).result, OfferResult::kQueued);   // 100 bytes
  EXPECT_EQ(q.Offer(Item("a", 99), 0).result, OfferResult::kCoalesced);
  const OfferDecision big = q.Offer(Item("big", 200), 0);              // 203 bytes > a batch
  EXPECT_EQ(big.result, OfferResult::kShed);
  EXPECT_EQ(big.reason, ShedReason::kTooLarge);
  EXPECT_EQ(q.Offer(Item("b", 149), 0).result, OfferResult::kQueued);  // 250
  EXPECT_EQ(q.Offer(Item("c", 149), 0).result, OfferResult::kQueued);  // 400
  const OfferDecision bytes = q.Offer(Item("d", 9), 0);
  EXPECT_EQ(bytes.reason, ShedReason::kBytesFull);
  EXPECT_EQ(q.depth(), 3u);
  EXPECT_EQ(q.depth_bytes(), 400u);
  // A batch takes the oldest items up to its limits (2 entries, 200 bytes: "a" then "b" would be 250).
  std::optional<PublishBatch> b = q.NextBatch(0);
  ASSERT_TRUE(b);
  ASSERT_EQ(b->items.size(), 1u);
  EXPECT_EQ(b->items[0].key, "a");
  EXPECT_FALSE(q.NextBatch(0));  // one in flight
  EXPECT_EQ(q.Offer(Item("d", 9), 0).result, OfferResult::kQueued);
  EXPECT_EQ(q.Offer(Item("e", 9), 0).result, OfferResult::kQueued);
  EXPECT_EQ(q.Offer(Item("f", 9), 0).reason, ShedReason::kQueueFull);  // 4 entries
  const auto& c = q.counters();
  EXPECT_EQ(c.shed[static_cast<size_t>(ShedReason::kTooLarge)], 1u);
  EXPECT_EQ(c.shed[static_cast<size_t>(ShedReason::kBytesFull)], 1u);
  EXPECT_EQ(c.shed[static_cast<size_t>(ShedReason::kQueueFull)], 1u);
  EXPECT_EQ(c.coalesced, 1u);
  EXPECT_EQ(c.peak_depth, 4u);
  EXPECT_EQ(q.BatchDone(b->id + 1, 1, true, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(q.BatchDone(b->id, 2, true, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(q.BatchDone(b->id, 1, true, 0).ok());
  EXPECT_EQ(q.counters().written, 1u);
  EXPECT_EQ(q.counters().bytes_written, 100u);
  EXPECT_TRUE(q.CheckInvariants().ok());
}

TEST(PublishQueue, DownAfterFailedBatchesThenProbesWithBackoff) {
  PublishQueue q(Small());
  for (const char* k : {"a", "b", "c", "d"}) q.Offer(Item(k, 10), 0);
  auto b1 = q.NextBatch(0);
  ASSERT_TRUE(q.BatchDone(b1->id, 0, false, 10).ok());  // first failure: still up
  EXPECT_EQ(q.health(), StoreHealth::kUp);
  auto b2 = q.NextBatch(10);
  ASSERT_EQ(b2->items.size(), 2u);
  ASSERT_TRUE(q.BatchDone(b2->id, 0, false, 20).ok());  // second in a row: down, the queue dropped
  EXPECT_EQ(q.health(), StoreHealth::kDown);
  EXPECT_EQ(q.depth(), 0u);
  EXPECT_EQ(q.counters().failed, 4u);
  EXPECT_EQ(q.retry_at_us(), 120);
  EXPECT_EQ(q.Offer(Item("e", 10), 30).reason, ShedReason::kStoreDown);
  EXPECT_FALSE(q.NextBatch(119));
  auto probe = q.NextBatch(120);
  ASSERT_TRUE(probe);
  EXPECT_TRUE(probe->probe);
  EXPECT_TRUE(probe->items.empty());
  EXPECT_EQ(q.health(), StoreHealth::kProbing);
  EXPECT_EQ(q.Offer(Item("e", 10), 121).reason, ShedReason::kStoreDown);
  ASSERT_TRUE(q.BatchDone(probe->id, 0, false, 130).ok());  // wait doubles: 200
  EXPECT_EQ(q.retry_at_us(), 330);
  probe = q.NextBatch(330);
  ASSERT_TRUE(q.BatchDone(probe->id, 0, false, 330).ok());  // 400 capped at 350
  EXPECT_EQ(q.retry_at_us(), 680);
  probe = q.NextBatch(700);
  ASSERT_TRUE(q.BatchDone(probe->id, 0, true, 701).ok());
  EXPECT_EQ(q.health(), StoreHealth::kUp);
  EXPECT_EQ(q.Offer(Item("e", 10), 702).result, OfferResult::kQueued);
  EXPECT_EQ(q.counters().went_down, 3u);
  EXPECT_EQ(q.counters().probes, 3u);
  EXPECT_TRUE(q.CheckInvariants().ok());
}

TEST(PublishQueue, OnlyTheTableMovesTheHealth) {
  for (StoreHealth from : {StoreHealth::kUp, StoreHealth::kDown, StoreHealth::kProbing}) {
    for (StoreHealth to : {StoreHealth::kUp, StoreHealth::kDown, StoreHealth::kProbing}) {
      StoreHealth h = from;
      const bool listed = std::find(std::begin(kStoreHealthTransitions), std::end(kStoreHealthTransitions),
                                    std::pair{from, to}) != std::end(kStoreHealthTransitions);
      EXPECT_EQ(TransitionStoreHealth(h, from, to).ok(), listed);
      EXPECT_EQ(h, listed ? to : from);
    }
  }
  StoreHealth h = StoreHealth::kUp;
  EXPECT_FALSE(TransitionStoreHealth(h, StoreHealth::kDown, StoreHealth::kProbing).ok());  // not in `from`
  EXPECT_EQ(h, StoreHealth::kUp);
  // up -> probing and down -> up are not moves.
  EXPECT_FALSE(StoreHealthTransitionAllowed(StoreHealth::kUp, StoreHealth::kProbing));
  EXPECT_FALSE(StoreHealthTransitionAllowed(StoreHealth::kDown, StoreHealth::kUp));
}

// Random events against a model written here (FIFO of keys with sizes, the same limits), invariants after each.
TEST(PublishQueue, RandomizedAgainstAModel) {
  PublishQueueCounters all;  // over every seed: the run reached every path
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    PublishQueueConfig cfg;
    cfg.max_entries = 1 + rng() % 8;
    cfg.batch_max_entries = 1 + rng() % cfg.max_entries;
    cfg.max_bytes = 50 + rng() % 400;
    cfg.batch_max_bytes = 10 + rng() % (cfg.max_bytes - 9);
    cfg.failures_to_down = 1 + rng() % 3;
    cfg.retry_initial_us = 1 + rng() % 50;
    cfg.retry_max_us = cfg.retry_initial_us * (1 + rng() % 8);
    PublishQueue q(cfg);
    std::deque<std::pair<std::string, uint64_t>> model;
    std::optional<PublishBatch> flying;
    StoreHealth health = StoreHealth::kUp;
    int64_t now = 0;
    uint32_t fails = 0;
    uint64_t shed = 0, offered = 0;
    for (int step = 0; step < 3000; ++step) {
      now += rng() % 20;
      const uint32_t what = rng() % 10;
      if (what < 5) {
        PublishItem item = Item("k" + std::to_string(rng() % 12), rng() % 120);
        const uint64_t bytes = item.bytes();
        const std::string key = item.key;
        bool queued_key = false, full_bytes = false;
        uint64_t model_bytes = 0;
        for (auto& [k, b] : model) {
          queued_key |= k == key;
          model_bytes += b;
        }
        full_bytes = model_bytes + bytes > cfg.max_bytes;
        const OfferDecision d = q.Offer(std::move(item), now);
        ++offered;
        if (health != StoreHealth::kUp) {
          ASSERT_EQ(d.result, OfferResult::kShed);
          ASSERT_EQ(d.reason, ShedReason::kStoreDown);
        } else if (bytes > cfg.batch_max_bytes) {
          ASSERT_EQ(d.reason, ShedReason::kTooLarge);
        } else if (queued_key) {
          ASSERT_EQ(d.result, OfferResult::kCoalesced);
        } else if (model.size() >= cfg.max_entries) {
          ASSERT_EQ(d.reason, ShedReason::kQueueFull);
        } else if (full_bytes) {
          ASSERT_EQ(d.reason, ShedReason::kBytesFull);
        } else {
          ASSERT_EQ(d.result, OfferResult::kQueued);
          model.emplace_back(key, bytes);
        }
        shed += d.result == OfferResult::kShed;
      } else if (what < 8) {
        std::optional<PublishBatch> b = q.NextBatch(now);
        if (flying || (health == StoreHealth::kUp && model.empty()) ||
            (health == StoreHealth::kDown && now < q.retry_at_us())) {
          ASSERT_FALSE(b);
        } else if (health == StoreHealth::kDown) {
          ASSERT_TRUE(b && b->probe && b->items.empty());
          health = StoreHealth::kProbing;
          flying = std::move(b);
        } else {
          ASSERT_TRUE(b && !b->probe);
          // The model's oldest items up to the batch limits, in order.
          uint64_t bytes = 0;
          size_t n = 0;
          while (n < model.size() && n < cfg.batch_max_entries && bytes + model[n].second <= cfg.batch_max_bytes) {
            bytes += model[n++].second;
          }
          ASSERT_EQ(b->items.size(), n);
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(b->items[i].key, model[i].first);
          model.erase(model.begin(), model.begin() + static_cast<std::ptrdiff_t>(n));
          flying = std::move(b);
        }
      } else if (flying) {
        const bool answered = rng() % 3 != 0;
        const uint32_t written = answered ? rng() % (flying->items.size() + 1) : 0;
        ASSERT_TRUE(q.BatchDone(flying->id, written, answered, now).ok());
        if (flying->probe) {
          health = answered ? StoreHealth::kUp : StoreHealth::kDown;
          if (answered) fails = 0;
        } else if (written > 0) {
          fails = 0;
        } else if (++fails >= cfg.failures_to_down) {
          health = StoreHealth::kDown;
          model.clear();
        }
        flying.reset();
      } else {
        ASSERT_EQ(q.BatchDone(12345678, 0, true, now).code(), absl::StatusCode::kNotFound);
      }
      ASSERT_EQ(q.health(), health) << seed << " " << step;
      ASSERT_EQ(q.depth(), model.size());
      ASSERT_LE(q.depth(), cfg.max_entries);
      ASSERT_LE(q.depth_bytes(), cfg.max_bytes);
      ASSERT_EQ(q.in_flight(), flying.has_value());
      ASSERT_EQ(q.counters().offered, offered);
      const absl::Status inv = q.CheckInvariants();
      ASSERT_TRUE(inv.ok()) << inv << " seed " << seed << " step " << step;
    }
    EXPECT_GE(q.counters().shed_total(), shed);
    const PublishQueueCounters& c = q.counters();
    all.coalesced += c.coalesced;
    all.written += c.written;
    all.failed += c.failed;
    all.probes += c.probes;
    all.went_down += c.went_down;
    for (size_t r = 0; r < kShedReasons; ++r) all.shed[r] += c.shed[r];
  }
  EXPECT_GT(all.coalesced, 0u);
  EXPECT_GT(all.written, 0u);
  EXPECT_GT(all.failed, 0u);
  EXPECT_GT(all.probes, 0u);
  EXPECT_GT(all.went_down, 0u);
  for (size_t r = 0; r < kShedReasons; ++r) EXPECT_GT(all.shed[r], 0u) << ShedReasonName(static_cast<ShedReason>(r));
}

}  // namespace
}  // namespace dhs::memd
