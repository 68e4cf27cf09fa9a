// memd's KV event stream (issue 24, "Per-tier hits and KV events"): the decision core (memd/kv_block_ledger.h, fed by
// memd/prefix_pages.h), the wire form and the consumer's sequence check (common/kv_event_stream.h), and the socket
// (memd/kv_events.h) with a real subscriber: a batch per Publish, contiguous numbers, and a subscriber that stops
// reading makes batches drop (counted) instead of blocking, its gap equal to the drops. Chain hashes are computed here
// again from the formula in memd/prefix_pages.h's header, with XXH3.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/kv_event_stream.h"
#include "common/transport.h"
#include "memd/kv_block_ledger.h"
#include "memd/kv_events.h"
#include "memd/prefix_pages.h"
#include "xxhash.h"

namespace dhs::memd {
namespace {

using namespace std::chrono_literals;

// The header's chain hash: t = XXH3(tenant, "DHSTenan"); c_b = XXH3(le64(id_b), seed c_{b-1}), c_{-1} = t.
uint64_t TenantHashOf(std::string_view tenant) {
  return XXH3_64bits_withSeed(tenant.data(), tenant.size(), 0x44485354656e616eull);
}
std::vector<uint64_t> ChainHashes(std::string_view tenant, const std::vector<uint64_t>& ids) {
  std::vector<uint64_t> out;
  uint64_t c = TenantHashOf(tenant);
  for (uint64_t id : ids) {
    c = XXH3_64bits_withSeed(&id, 8, c);
    out.push_back(c);
  }
  return out;
}

TEST(KvBlockLedger, BlockPagesArePagesWhoseLastRowLiesInTheBlock) {
  // T = 32, p = 16: 2 pages per block. T = 4, p = 3: rows 0-3 | 4-7 | 8-11; pages end at rows 2, 5, 8, 11: block 0 has
  // page 0, block 1 page 1, block 2 pages 2 and 3. T = 2, p = 3: block 0 (rows 0-1) has no page of its own.
  EXPECT_EQ(KvBlockLedger::BlockPages(0, 32, 16), 2u);
  EXPECT_EQ(KvBlockLedger::BlockPages(7, 32, 16), 2u);
  EXPECT_EQ(KvBlockLedger::BlockPages(0, 4, 3), 1u);
  EXPECT_EQ(KvBlockLedger::BlockPages(1, 4, 3), 1u);
  EXPECT_EQ(KvBlockLedger::BlockPages(2, 4, 3), 2u);
  EXPECT_EQ(KvBlockLedger::BlockPages(0, 2, 3), 0u);
  EXPECT_EQ(KvBlockLedger::BlockPages(0, 0, 3), 0u);
}

TEST(KvBlockLedger, DisabledEmitsNothing) {
  KvBlockLedger off;
  off.PageConfirmed(KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, 1, 2, 1, 1, 16, 0, 16});
  EXPECT_TRUE(off.Drain().empty());
}

// PrefixPages with the stream on: a block is announced when its last page is confirmed, once; removed when one of
// its pages is evicted; stored again once all are confirmed again. Writing and abandoned pages never count.
TEST(KvBlockLedger, PrefixPagesAnnounceWholeBlocksOnly) {
  auto made = PrefixPages::Create(PrefixConfig{"lru", 0, /*kv_events=*/true});
  ASSERT_TRUE(made.ok());
  PrefixPages pages = std::move(*made);
  // Tenant "acme", blocks {11, 12} of 32 tokens, pages of 16 rows: 4 shareable pages, 2 per block.
  const PrefixChain chain{"acme", {11, 12}, {101, 102}, 32};
  auto ad = PrefixPages::Addresses(chain, 16, 6);
  ASSERT_TRUE(ad.ok());
  ASSERT_EQ(ad->size(), 4u);
  const uint64_t t = TenantHashOf("acme");
  const std::vector<uint64_t> c = ChainHashes("acme", {11, 12});
  std::vector<KvEvent> first = pages.DrainKvEvents();
  ASSERT_EQ(first.size(), 1u);  // the stream's first word: forget what an earlier memd said
  EXPECT_EQ(first[0].kind, KvEventKind::kAllBlocksCleared);
  EXPECT_EQ(first[0].medium, KvMedium::kHost);

  for (uint32_t h = 0; h < 4; ++h) ASSERT_TRUE(pages.BeginWrite((*ad)[h], 100 + h, /*writer=*/7, 0).ok());
  EXPECT_TRUE(pages.DrainKvEvents().empty());  // writing: never announced
  ASSERT_TRUE(pages.AbandonWrite(103).ok());   // block 1 loses a page before it was confirmed
  ASSERT_TRUE(pages.ConfirmWrite(100, 1, 0).ok());
  EXPECT_TRUE(pages.DrainKvEvents().empty());  // block 0 has 1 of 2 pages
  ASSERT_TRUE(pages.ConfirmWrite(101, 1, 0).ok());
  ASSERT_TRUE(pages.ConfirmWrite(102, 1, 0).ok());
  std::vector<KvEvent> stored = pages.DrainKvEvents();
  ASSERT_EQ(stored.size(), 1u);  // block 0 only: block 1's page 3 was abandoned
  EXPECT_EQ(stored[0], (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t, c[0], t, 1, 32, 2, 16}));
  EXPECT_EQ(pages.kv_ledger().stored_blocks(), 1u);

  // Block 1 completes through another writer.
  ASSERT_TRUE(pages.BeginWrite((*ad)[3], 200, /*writer=*/8, 0).ok());
  ASSERT_TRUE(pages.ConfirmWrite(200, 1, 0).ok());
  stored = pages.DrainKvEvents();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0], (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t, c[1], c[0], 2, 32, 2, 16}));

  // Released and evicted: the first eviction of a block's page removes it, the second says nothing more.
  for (PageIndex p : {100u, 101u}) ASSERT_TRUE(pages.Release(p, 7, 0).ok());
  ASSERT_TRUE(pages.Evict(100).ok());
  std::vector<KvEvent> removed = pages.DrainKvEvents();
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], (KvEvent{KvEventKind::kBlockRemoved, KvMedium::kHost, t, c[0], t, 1, 32, 2, 16}));
  ASSERT_TRUE(pages.Evict(101).ok());
  EXPECT_TRUE(pages.DrainKvEvents().empty());
  EXPECT_EQ(pages.kv_ledger().stored_blocks(), 1u);
  EXPECT_EQ(pages.kv_ledger().confirmed_pages(), 2u);  // pages 102 and 200 of block 1

  // Stored again once both pages of block 0 are confirmed again.
  ASSERT_TRUE(pages.BeginWrite((*ad)[0], 300, 9, 0).ok());
  ASSERT_TRUE(pages.BeginWrite((*ad)[1], 301, 9, 0).ok());
  ASSERT_TRUE(pages.ConfirmWrite(300, 1, 0).ok());
  ASSERT_TRUE(pages.ConfirmWrite(301, 1, 0).ok());
  stored = pages.DrainKvEvents();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].kind, KvEventKind::kBlockStored);
  EXPECT_EQ(stored[0].block_hash, c[0]);

  // Another tenant, same ids: other hashes (the tenant seeds the chain).
  const PrefixChain other{"", {11, 12}, {101, 102}, 32};
  auto od = PrefixPages::Addresses(other, 16, 6);
  ASSERT_TRUE(od.ok());
  EXPECT_EQ((*od)[0].chain, ChainHashes("", {11})[0]);
  EXPECT_NE((*od)[0].chain, c[0]);
  EXPECT_EQ((*od)[0].parent, TenantHashOf(""));

  // An adopted page (chain unknown) is not announced...
  ASSERT_TRUE(pages.Adopt(400, (*od)[0].key, (*od)[0].content, 1).ok());
  ASSERT_TRUE(pages.Adopt(401, (*od)[1].key, (*od)[1].content, 1).ok());
  EXPECT_TRUE(pages.DrainKvEvents().empty());
  EXPECT_EQ(pages.tenant_pages(0), 2u);
  // ... until a lookup hits it: then its address is known (the lookup's), and once both pages of the block are known
  // the block is announced again. A hit of another content learns nothing.
  PrefixAddress wrong = (*od)[0];
  wrong.content ^= 1;
  EXPECT_FALSE(pages.Lookup(wrong).has_value());
  EXPECT_EQ(pages.Lookup((*od)[0]), PageIndex{400});
  EXPECT_TRUE(pages.DrainKvEvents().empty());
  EXPECT_EQ(pages.Lookup((*od)[1]), PageIndex{401});
  const uint64_t t0 = TenantHashOf("");
  stored = pages.DrainKvEvents();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0], (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t0, ChainHashes("", {11})[0], t0, 1, 32, 2,
                                16}));
  EXPECT_EQ(pages.tenant_pages(0), 0u);
  EXPECT_EQ(pages.tenant_pages(t0), 2u);
  EXPECT_EQ(pages.AtPage(400)->address, (*od)[0]);
  EXPECT_TRUE(pages.CheckInvariants().ok()) << pages.CheckInvariants();
}

TEST(KvEventWire, BatchRoundTripsAndBadBytesAreRefused) {
  KvEventBatch b;
  b.stream = 0xfeedface12345678ull;
  b.time_us = 1234567;
  b.node = "/tmp/node";
  b.first_seq = 41;
  b.events = {KvEvent{KvEventKind::kAllBlocksCleared, KvMedium::kHost},
              KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, 1, 2, 3, 4, 5, 6, 7},
              KvEvent{KvEventKind::kBlockRemoved, KvMedium::kGpu, 8, 9, 10, 11, 12, 13, 14}};
  const std::string bytes = EncodeKvEventBatch(b);
  auto back = DecodeKvEventBatch(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->stream, b.stream);
  EXPECT_EQ(back->time_us, b.time_us);
  EXPECT_EQ(back->node, b.node);
  EXPECT_EQ(back->first_seq, 41u);
  EXPECT_EQ(back->events, b.events);

  EXPECT_EQ(DecodeKvEventBatch("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeKvEventBatch("not a flatbuffer at all").status().code(), absl::StatusCode::kInvalidArgument);
  std::string truncated = bytes.substr(0, bytes.size() / 2);
  EXPECT_FALSE(DecodeKvEventBatch(truncated).ok());
  KvEventBatch empty = b;
  empty.events.clear();
  EXPECT_EQ(DecodeKvEventBatch(EncodeKvEventBatch(empty)).status().code(), absl::StatusCode::kInvalidArgument);
  // An unknown kind (a newer publisher's) is refused by name, not misread.
  KvEventBatch unknown = b;
  unknown.events[1].kind = static_cast<KvEventKind>(9);
  auto bad = DecodeKvEventBatch(EncodeKvEventBatch(unknown));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown kind 9"), std::string::npos) << bad.status();
}

TEST(KvSequenceCheck, GapsAndNewStreams) {
  KvSequenceCheck check;
  auto batch = [](uint64_t stream, uint64_t first, size_t n) {
    KvEventBatch b;
    b.stream = stream;
    b.first_seq = first;
    b.events.resize(n);
    return b;
  };
  KvSequenceStep s = check.Next(batch(1, 5, 2));  // joined late: not a loss
  EXPECT_TRUE(s.new_stream);
  EXPECT_EQ(s.lost, 0u);
  s = check.Next(batch(1, 7, 3));  // 7, 8, 9: contiguous
  EXPECT_FALSE(s.new_stream);
  EXPECT_EQ(s.lost, 0u);
  s = check.Next(batch(1, 14, 1));  // 10..13 lost
  EXPECT_EQ(s.lost, 4u);
  s = check.Next(batch(2, 0, 1));  // memd restarted
  EXPECT_TRUE(s.new_stream);
  EXPECT_EQ(s.lost, 0u);
  EXPECT_EQ(check.lost(), 4u);
}

class KvEventSocket : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kv_events_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Polls the publisher until it saw `n` subscriptions (a subscription reaches it asynchronously; bounded wait).
  static bool WaitSubscribed(KvEventPublisher& pub, uint64_t n) {
    for (int i = 0; i < 500 && pub.subscriptions() < n; ++i) {
      pub.Poll();
      std::this_thread::sleep_for(10ms);
    }
    return pub.subscriptions() >= n;
  }
  std::string dir_;
};

TEST_F(KvEventSocket, BatchesArriveInOrderWithContiguousNumbers) {
  auto pub = KvEventPublisher::Bind(dir_, {100, "/node"});
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/kv-events.sock"));
  EXPECT_EQ(KvEventPublisher::Bind(dir_, {0, ""}).status().code(), absl::StatusCode::kInvalidArgument);
  auto sub = KvEventSubscriber::Connect(IpcEndpoint(dir_, kKvEventsSocket), {});
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(WaitSubscribed(**pub, 1));
  const KvEvent e1{KvEventKind::kBlockStored, KvMedium::kHost, 1, 2, 1, 1, 32, 2, 16};
  const KvEvent e2{KvEventKind::kBlockRemoved, KvMedium::kHost, 1, 2, 1, 1, 32, 2, 16};
  (*pub)->Publish(std::vector<KvEvent>{e1, e1}, 10);
  (*pub)->Publish(std::vector<KvEvent>{}, 11);  // nothing: no batch, no number
  (*pub)->Publish(std::vector<KvEvent>{e2}, 12);
  auto b1 = (*sub)->Next(5000ms);
  ASSERT_TRUE(b1.ok() && b1->has_value());
  EXPECT_EQ((*b1)->first_seq, 0u);
  EXPECT_EQ((*b1)->events, (std::vector<KvEvent>{e1, e1}));
  EXPECT_EQ((*b1)->stream, (*pub)->stream());
  EXPECT_EQ((*b1)->node, "/node");
  auto b2 = (*sub)->Next(5000ms);
  ASSERT_TRUE(b2.ok() && b2->has_value());
  EXPECT_EQ((*b2)->first_seq, 2u);
  EXPECT_EQ((*b2)->events, (std::vector<KvEvent>{e2}));
  EXPECT_EQ((*pub)->published(), 3u);
  EXPECT_EQ((*pub)->dropped(), 0u);
}

// A subscriber that does not read: its queues fill (receive HWM 1, a small socket buffer; memd's send HWM 1), then
// every Publish returns at once with the batch dropped and counted. The loop ends on the first drop, so it cannot pass
// by timing: were Publish to block, the test would hang (and time out) instead. Reading again, the subscriber sees
// exactly the dropped events as gaps: received + dropped = numbered.
TEST_F(KvEventSocket, AStalledSubscriberMakesBatchesDropNeverWait) {
  auto pub = KvEventPublisher::Bind(dir_, {1, "/node"});
  ASSERT_TRUE(pub.ok());
  auto sub = KvEventSubscriber::Connect(IpcEndpoint(dir_, kKvEventsSocket), {1, 4096});
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(WaitSubscribed(**pub, 1));
  const KvEvent e{KvEventKind::kBlockStored, KvMedium::kHost, 1, 2, 1, 1, 32, 2, 16};
  const std::vector<KvEvent> three{e, e, e};
  int batches = 0;
  while ((*pub)->dropped() == 0 && batches < 1000000) {
    (*pub)->Publish(three, batches++);
  }
  ASSERT_GT((*pub)->dropped(), 0u) << "a subscriber that reads nothing never filled its queues";
  for (int i = 0; i < 50; ++i) (*pub)->Publish(three, batches++);  // more drops while it is stalled
  const uint64_t dropped = (*pub)->dropped();
  EXPECT_EQ(dropped % 3, 0u);  // whole batches
  EXPECT_EQ((*pub)->published() + dropped, (*pub)->next_seq());
  // The subscriber reads again: everything that was queued; then batches pass again once the publisher sees the
  // room (it learns it asynchronously: batches before that are dropped too, counted), and the next one received shows
  // the gap.
  uint64_t received = 0;
  KvSequenceCheck check;
  auto drain_until = [&](uint64_t want) {
    while (received < want) {
      auto b = (*sub)->Next(10000ms);
      ASSERT_TRUE(b.ok()) << b.status();
      ASSERT_TRUE(b->has_value()) << "received " << received << " of " << want;
      check.Next(**b);
      received += (*b)->events.size();
    }
  };
  drain_until((*pub)->published());
  const uint64_t before = (*pub)->published();
  while ((*pub)->published() == before) {
    (*pub)->Publish(three, batches++);
    std::this_thread::sleep_for(1ms);
  }
  drain_until((*pub)->published());
  EXPECT_EQ(received, (*pub)->published());
  EXPECT_EQ(check.lost(), (*pub)->dropped());
  EXPECT_GE((*pub)->dropped(), dropped);
  EXPECT_EQ(received + check.lost(), (*pub)->next_seq());
  std::printf("kv events: first drop after %d batches of 3 events; %llu events received, %llu dropped\n", batches,
              static_cast<unsigned long long>(received), static_cast<unsigned long long>((*pub)->dropped()));
}

}  // namespace
}  // namespace dhs::memd
