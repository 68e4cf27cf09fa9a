// The content-addressed host tier (issue 24): memd/prefix_pages.h alone (addresses computed here independently with
// XXH3, hits, writing pages never importable, a content mismatch is a miss, eviction order per policy, quota, tenants,
// the one transition table), PrefixSharing's room for a grant alone, and wired into ResidencyManager (a hit granted
// host-backed and counted once in the host pool, references released at Complete, cached pages evicted before an
// admission would wait, tenants never sharing, a fence keeping references and abandoning writes, a memd restart keeping
// confirmed shared pages; sharing off changes nothing). Every value is computed by hand in the comments.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "memd/host_journal.h"
#include "memd/prefix_pages.h"
#include "memd/prefix_sharing.h"
#include "memd/residency_manager.h"
#include "memd/state_dump.h"
#include "tests/memd/residency_test_util.h"
#include "xxhash.h"

namespace dhs::memd {
namespace {

// The header's formulas, typed again from the documentation.
uint64_t Key(std::string_view tenant, std::vector<uint64_t> ids, uint64_t page_rows, uint64_t h,
             uint64_t block_tokens) {
  const uint64_t b = ((h + 1) * page_rows - 1) / block_tokens;
  uint64_t c = XXH3_64bits_withSeed(tenant.data(), tenant.size(), kTenantSeed);
  for (uint64_t i = 0; i <= b; ++i) c = XXH3_64bits_withSeed(&ids[i], 8, c);
  const uint64_t words[3] = {c, page_rows, h};
  return XXH3_64bits_withSeed(words, sizeof(words), kPageSeed);
}

PrefixChain Chain(std::string tenant, std::vector<uint64_t> ids, std::vector<uint64_t> digests, uint32_t tokens) {
  return PrefixChain{std::move(tenant), std::move(ids), std::move(digests), tokens};
}

TEST(PrefixAddresses, HandComputed) {
  // 3 blocks of 4 tokens, pages of 2 rows: floor(12 / 2) = 6 shareable pages, a context of 5 pages keeps 5.
  // Page h's last row is 2h + 1: blocks 0, 0, 1, 1, 2; chain lengths 1, 1, 2, 2, 3.
  const PrefixChain chain = Chain("", {11, 22, 33}, {101, 202, 303}, 4);
  auto a = PrefixPages::Addresses(chain, 2, 5);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 5u);
  const uint32_t blocks[] = {1, 1, 2, 2, 3};
  for (uint32_t h = 0; h < 5; ++h) {
    EXPECT_EQ((*a)[h].page, h);
    EXPECT_EQ((*a)[h].blocks, blocks[h]);
    EXPECT_EQ((*a)[h].key, Key("", {11, 22, 33}, 2, h, 4)) << h;
  }
  // Pages 0 and 1 hold the same block: same content digest, different keys.
  EXPECT_EQ((*a)[0].content, (*a)[1].content);
  EXPECT_NE((*a)[0].key, (*a)[1].key);
  EXPECT_NE((*a)[1].content, (*a)[2].content);
  // Pages of 3 rows: rows 0-2 (block 0), 3-5 (block 1), 6-8 (block 2), 9-11 (block 2): 4 pages.
  auto b = PrefixPages::Addresses(chain, 3, 100);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->size(), 4u);
  EXPECT_EQ((*b)[1].blocks, 2u);
  EXPECT_EQ((*b)[3].blocks, 3u);
  EXPECT_EQ((*b)[3].key, Key("", {11, 22, 33}, 3, 3, 4));
  // A partial block is never shareable: 2 blocks of 4 tokens, pages of 3 rows -> floor(8 / 3) = 2 pages.
  EXPECT_EQ(PrefixPages::Addresses(Chain("", {1, 2}, {1, 2}, 4), 3, 100)->size(), 2u);
  // Another tenant: every key differs, the contents are the same.
  auto t = PrefixPages::Addresses(Chain("tenant-b", {11, 22, 33}, {101, 202, 303}, 4), 2, 5);
  for (uint32_t h = 0; h < 5; ++h) {
    EXPECT_NE((*t)[h].key, (*a)[h].key);
    EXPECT_EQ((*t)[h].key, Key("tenant-b", {11, 22, 33}, 2, h, 4));
    EXPECT_EQ((*t)[h].content, (*a)[h].content);
    EXPECT_NE((*t)[h].tenant, (*a)[h].tenant);
  }
  // Same ids, another token digest in block 1: pages 0-1 equal, pages 2-4 same key, other content.
  auto d = PrefixPages::Addresses(Chain("", {11, 22, 33}, {101, 999, 303}, 4), 2, 5);
  for (uint32_t h = 0; h < 5; ++h) EXPECT_EQ((*d)[h].key, (*a)[h].key);
  EXPECT_EQ((*d)[1].content, (*a)[1].content);
  EXPECT_NE((*d)[2].content, (*a)[2].content);
  EXPECT_NE((*d)[4].content, (*a)[4].content);
  // Bad chains.
  EXPECT_EQ(PrefixPages::Addresses(Chain("", {1, 2}, {1}, 4), 2, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrefixPages::Addresses(Chain("", {1}, {1}, 0), 2, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrefixPages::Addresses(Chain("", {1}, {1}, 4), 0, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PrefixPages::Addresses(Chain("", {}, {}, 0), 0, 5)->empty());
}

// Issue 26 (sessions across nodes): a session address, from the header's formula typed again.
TEST(PrefixAddresses, SessionAddressHandComputed) {
  const uint64_t tenant = XXH3_64bits_withSeed("t", 1, kTenantSeed);
  const PrefixAddress a = PrefixPages::SessionAddress(tenant, 0x5e55, 0xd1, 16, 7);
  const uint64_t words[5] = {tenant, 0x5e55, 0xd1, 16, 7};
  EXPECT_EQ(a.key, XXH3_64bits_withSeed(words, sizeof(words), kSessionPageSeed));
  EXPECT_EQ(a.content, 0xd1u);
  EXPECT_EQ(a.tenant, tenant);
  EXPECT_EQ(a.session, 0x5e55u);
  EXPECT_EQ(a.page, 7u);
  EXPECT_EQ(a.page_rows, 16u);
  EXPECT_EQ(a.blocks, 0u);  // no block: no KV event names it
  EXPECT_EQ(a.chain, 0u);
  // Every field is in the key: another session, digest, page size, page or tenant is another key.
  EXPECT_NE(PrefixPages::SessionAddress(tenant, 0x5e56, 0xd1, 16, 7).key, a.key);
  EXPECT_NE(PrefixPages::SessionAddress(tenant, 0x5e55, 0xd2, 16, 7).key, a.key);
  EXPECT_NE(PrefixPages::SessionAddress(tenant, 0x5e55, 0xd1, 8, 7).key, a.key);
  EXPECT_NE(PrefixPages::SessionAddress(tenant, 0x5e55, 0xd1, 16, 6).key, a.key);
  EXPECT_NE(PrefixPages::SessionAddress(tenant + 1, 0x5e55, 0xd1, 16, 7).key, a.key);
}

TEST(SharedPageState, OnlyTheListedTransitionsAreAllowed) {
  const SharedPageState all[] = {SharedPageState::kWriting, SharedPageState::kShared, SharedPageState::kCached,
                                 SharedPageState::kFree};
  const std::set<std::pair<int, int>> allowed = {{0, 1}, {0, 3}, {1, 2}, {2, 1}, {2, 3}};  // typed from the header
  int refused = 0;
  for (SharedPageState from : all) {
    for (SharedPageState to : all) {
      const bool listed = allowed.contains({static_cast<int>(from), static_cast<int>(to)});
      EXPECT_EQ(SharedPageTransitionAllowed(from, to), listed);
      SharedPage p;
      p.state = from;
      const absl::Status s = TransitionSharedPage(p, from, to);
      if (listed && to != SharedPageState::kFree) {
        EXPECT_TRUE(s.ok());
        EXPECT_EQ(p.state, to);
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_EQ(p.state, from);
        refused += !listed;
      }
    }
  }
  EXPECT_EQ(refused, 16 - 5);
}

PrefixAddress Addr(uint64_t key, uint64_t content = 7, uint64_t tenant = 1) {
  return PrefixAddress{key, content, tenant, 1, 0};
}

TEST(PrefixPages, WritingIsNeverImportableAndRefsCountHolders) {
  auto pp = PrefixPages::Create({});
  ASSERT_TRUE(pp.ok());
  ASSERT_TRUE(pp->BeginWrite(Addr(100), 5, /*writer=*/1, 0).ok());
  EXPECT_FALSE(pp->Lookup(Addr(100)).has_value());  // being written: a miss
  EXPECT_EQ(pp->Acquire(5, 2, 0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pp->BeginWrite(Addr(100), 6, 2, 0).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(pp->writing(), 1u);
  ASSERT_TRUE(pp->ConfirmWrite(5, 0xabc, 1).ok());
  EXPECT_EQ(pp->Lookup(Addr(100)), PageIndex{5});
  ASSERT_TRUE(pp->Acquire(5, 2, 2).ok());
  EXPECT_EQ(pp->AtPage(5)->refs(), 2u);
  EXPECT_EQ(pp->AtPage(5)->checksum, 0xabcu);
  EXPECT_EQ(pp->Acquire(5, 2, 2).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(pp->Release(5, 1, 3).ok());
  EXPECT_EQ(pp->shared(), 1u);
  EXPECT_EQ(pp->Evict(5).code(), absl::StatusCode::kFailedPrecondition);  // held: never evicted
  ASSERT_TRUE(pp->Release(5, 2, 4).ok());
  EXPECT_EQ(pp->cached(), 1u);
  EXPECT_EQ(pp->shared(), 0u);
  EXPECT_EQ(pp->Release(5, 2, 4).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(pp->Evict(5).ok());
  EXPECT_EQ(pp->stored(), 0u);
  EXPECT_FALSE(pp->Lookup(Addr(100)).has_value());
  // Lookups 4: miss (writing), hit, miss (evicted) + the AlreadyExists probe does not count.
  EXPECT_EQ(pp->counters().lookups, 3u);
  EXPECT_EQ(pp->counters().hits, 1u);
  EXPECT_EQ(pp->counters().misses, 2u);
  EXPECT_EQ(pp->counters().evictions, 1u);
  // An abandoned write leaves nothing.
  ASSERT_TRUE(pp->BeginWrite(Addr(200), 9, 3, 5).ok());
  ASSERT_TRUE(pp->AbandonWrite(9).ok());
  EXPECT_EQ(pp->stored(), 0u);
  EXPECT_EQ(pp->counters().abandoned, 1u);
  EXPECT_TRUE(pp->CheckInvariants().ok());
}

TEST(PrefixPages, ContentMismatchIsAMiss) {
  auto pp = PrefixPages::Create({});
  ASSERT_TRUE(pp->BeginWrite(Addr(100, /*content=*/7), 5, 1, 0).ok());
  ASSERT_TRUE(pp->ConfirmWrite(5, 0, 0).ok());
  EXPECT_FALSE(pp->Lookup(Addr(100, /*content=*/8)).has_value());
  EXPECT_EQ(pp->counters().content_mismatches, 1u);
  EXPECT_EQ(pp->counters().misses, 1u);
  EXPECT_EQ(pp->Lookup(Addr(100, 7)), PageIndex{5});
}

// Stores pages 10, 11, 12 (writers 1, 2, 3) and makes them cached in the order 11, 10, 12.
void StoreThree(PrefixPages& pp) {
  for (PageIndex p : {10u, 11u, 12u}) {
    ASSERT_TRUE(pp.BeginWrite(Addr(p), p, p - 9, 0).ok());
    ASSERT_TRUE(pp.ConfirmWrite(p, 0, 0).ok());
  }
  ASSERT_TRUE(pp.Release(11, 2, 1).ok());
  ASSERT_TRUE(pp.Release(10, 1, 2).ok());
  ASSERT_TRUE(pp.Release(12, 3, 3).ok());
}

TEST(PrefixPages, EvictionOrderPerPolicy) {
  auto lru = PrefixPages::Create({});
  StoreThree(*lru);
  EXPECT_EQ(lru->ChooseEvictions(2), (std::vector<PageIndex>{11, 10}));
  // A hit and release of 11 makes it the most recently used: 10, 12, 11.
  ASSERT_TRUE(lru->Acquire(11, 7, 4).ok());
  ASSERT_TRUE(lru->Release(11, 7, 5).ok());
  EXPECT_EQ(lru->ChooseEvictions(3), (std::vector<PageIndex>{10, 12, 11}));
  EXPECT_EQ(lru->ChooseEvictions(3, [](PageIndex p) { return p != 12; }), (std::vector<PageIndex>{10, 11}));
  auto fifo = PrefixPages::Create({.eviction_policy = "fifo"});
  StoreThree(*fifo);
  EXPECT_EQ(fifo->ChooseEvictions(3), (std::vector<PageIndex>{10, 11, 12}));  // stored order
  EXPECT_EQ(PrefixPages::Create({.eviction_policy = "mru"}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrefixPages, TenantQuota) {
  auto pp = PrefixPages::Create({.eviction_policy = "lru", .tenant_quota_pages = 2});
  ASSERT_TRUE(pp->BeginWrite(Addr(1, 7, /*tenant=*/50), 1, 1, 0).ok());
  ASSERT_TRUE(pp->BeginWrite(Addr(2, 7, 50), 2, 1, 0).ok());
  EXPECT_TRUE(pp->AtQuota(50));
  EXPECT_FALSE(pp->QuotaVictim(50).has_value());  // nothing cached to give way
  EXPECT_EQ(pp->BeginWrite(Addr(3, 7, 50), 3, 1, 0).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pp->counters().quota_refusals, 1u);
  ASSERT_TRUE(pp->BeginWrite(Addr(4, 7, /*tenant=*/60), 4, 1, 0).ok());  // another tenant's quota is its own
  ASSERT_TRUE(pp->ConfirmWrite(2, 0, 0).ok());
  ASSERT_TRUE(pp->Release(2, 1, 1).ok());
  EXPECT_EQ(pp->QuotaVictim(50), PageIndex{2});
  EXPECT_FALSE(pp->QuotaVictim(60).has_value());
  ASSERT_TRUE(pp->Evict(2).ok());
  EXPECT_TRUE(pp->BeginWrite(Addr(3, 7, 50), 3, 1, 0).ok());
  EXPECT_EQ(pp->tenant_pages(50), 2u);
  EXPECT_EQ(pp->tenant_pages(60), 1u);
  EXPECT_TRUE(pp->CheckInvariants().ok());
}

// ---------------------------------------------------------------- PrefixSharing, the core's room for the tier

// Room for a grant (issue 23 moved it into PrefixSharing): cached pages are room in the policy's order, but never one
// pinned by a copy or one the same grant imports; with sharing off nothing but free pages is room, and kSharedOwner is
// an ordinary request id.
TEST(PrefixSharing, RoomForCountsOnlyCachedPagesTheGrantMayEvict) {
  core::State state([] { return int64_t{0}; }, *HostPageAllocator::Create(6, 4096));
  PrefixSharing on(state, *PrefixPages::Create({}));
  // A journal's 3 shared pages come back cached on host pages 0, 1, 2 (stored in that order: LRU 0, 1, 2).
  const AdoptedSharedPage adopted[] = {{0, 10, 7, 0}, {1, 11, 7, 0}, {2, 12, 7, 0}};
  EXPECT_EQ(on.Adopt(adopted), 3u);
  EXPECT_EQ(on.PoolPages(), 3u);
  EXPECT_EQ(state.host.reusable(), 3u);  // pages 3, 4, 5
  EXPECT_EQ(on.RoomFor(3, {}), std::vector<PageIndex>{});  // fits in the free pages: nothing evicted
  EXPECT_EQ(on.RoomFor(5, {}), (std::vector<PageIndex>{0, 1}));  // 2 more: the least recently used first
  const PrefixHits hit0 = {{0, PrefixHit{0, 0}}};  // the grant imports host page 0: never its own room
  EXPECT_EQ(on.RoomFor(5, hit0), (std::vector<PageIndex>{1, 2}));
  ASSERT_TRUE(state.host.Pin(1).ok());  // a population copy reads page 1
  EXPECT_EQ(on.RoomFor(4, hit0), (std::vector<PageIndex>{2}));
  EXPECT_FALSE(on.RoomFor(5, hit0).has_value());  // only page 2 may go: 4 pages of room, not 5
  ASSERT_TRUE(state.host.Unpin(1).ok());
  EXPECT_FALSE(on.RoomFor(7, {}).has_value());  // 3 free + 3 cached < 7: the admission waits
  EXPECT_EQ(on.CheckRequestId(kSharedOwner).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(on.CheckInvariants().ok());

  core::State plain([] { return int64_t{0}; }, *HostPageAllocator::Create(6, 4096));
  PrefixSharing off(plain, std::nullopt);
  EXPECT_EQ(off.tier(), nullptr);
  EXPECT_EQ(off.RoomFor(6, {}), std::vector<PageIndex>{});
  EXPECT_FALSE(off.RoomFor(7, {}).has_value());
  EXPECT_TRUE(off.CheckRequestId(kSharedOwner).ok());
  AdmitRequest a;  // a chain without page_rows: ignored while sharing is off, refused while on
  a.request = 5;
  a.prefix = PrefixChain{"", {1}, {1}, 8};
  EXPECT_TRUE(off.Addresses(a, 4)->empty());
  EXPECT_EQ(on.Addresses(a, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(off.Adopt(adopted), 0u);
  EXPECT_EQ(off.PoolPages(), 0u);
  EXPECT_FALSE(off.Dump(true).enabled);
  EXPECT_EQ(on.Dump(true).cached_pages, 3u);
}

// ---------------------------------------------------------------- wired into ResidencyManager

constexpr uint32_t kPageRows = 4, kBlockTokens = 8;

class PrefixResidencyTest : public CoreTest {
 protected:
  void Make(uint32_t host_pages, bool sharing = true, PrefixConfig prefix = {}, HostJournal* journal = nullptr) {
    ResidencyConfig c;
    c.reserve_pages = 0;
    c.host_pages = host_pages;
    c.host_page_bytes = 4096;
    c.prefix_sharing = sharing;
    c.prefix = prefix;
    MakeCore(c, 100, 0, journal);
  }
  // A request of `context_pages` pages (4 rows each) whose first `blocks` blocks of 8 tokens are the chain ids 1, 2,
  // .. with digests `digest_base` + id; no history kept on GPU (hisparse) so every page is host-pending at the grant.
  std::vector<Order> Admit(RequestId r, uint32_t context_pages, uint32_t blocks, std::string tenant = "",
                           uint64_t digest_base = 1000) {
    AdmitRequest a;
    a.request = r;
    a.required_pages = 1;
    a.page_rows = kPageRows;
    a.context_rows = uint64_t{context_pages} * kPageRows;
    a.optional_history = false;
    a.prefix.tenant = tenant;
    a.prefix.block_tokens = kBlockTokens;
    for (uint64_t b = 1; b <= blocks; ++b) {
      a.prefix.block_ids.push_back(b);
      a.prefix.block_digests.push_back(digest_base + b);
    }
    return Do(mgr_->Admit(a));
  }
  // memd died: a new core over `journal` (20 host pages, sharing as given) replaces mgr_; nothing adopted yet.
  void NewCoreOver(HostJournal* journal, bool sharing = true) {
    ResidencyConfig c;
    c.reserve_pages = 0;
    c.host_pages = 20;
    c.host_page_bytes = 4096;
    c.prefix_sharing = sharing;
    auto next = ResidencyManager::Create(c, [this] { return now_us_; }, journal);
    ASSERT_TRUE(next.ok()) << next.status();
    mgr_ = std::move(*next);
  }
  static std::vector<AdoptedSharedPage> AdoptedPages(const std::map<PageIndex, JournaledSharedPage>& shared) {
    std::vector<AdoptedSharedPage> pages;
    for (const auto& [page, sp] : shared) pages.push_back({page, sp.key, sp.content, sp.checksum});
    return pages;
  }
  std::vector<Order> Written(RequestId r, std::vector<uint32_t> pages) {
    std::vector<uint64_t> sums;
    for (uint32_t h : pages) sums.push_back(0x1000 + h);
    return Do(mgr_->OnHostCopyWritten(r, pages, {}, true, sums));
  }
};

TEST_F(PrefixResidencyTest, HitIsGrantedHostBackedAndCountedOnce) {
  Make(20);
  // Request 1: 6 pages, a chain of 2 blocks = 16 rows = 4 shareable pages (h 0..3); nothing stored: 4 misses.
  GrantOrder g1 = OneGrant(Admit(1, 6, 2));
  EXPECT_TRUE(g1.host_backed_pages.empty());
  EXPECT_EQ(mgr_->prefix()->writing(), 4u);
  EXPECT_EQ(mgr_->prefix()->counters().misses, 4u);
  Written(1, {0, 1, 2, 3, 4});  // 0..3 become shared (page 4 is private: beyond the chain)
  EXPECT_EQ(mgr_->prefix()->shared(), 4u);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 6u);
  // Request 2, same chain, 6 pages: 4 hits, granted host-backed, 2 fresh host pages: 8 allocated, not 12.
  GrantOrder g2 = OneGrant(Admit(2, 6, 2));
  EXPECT_EQ(g2.host_backed_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(g2.shared_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(g2.imported_pages, 4u);
  EXPECT_EQ(g2.host_backed_checksums, (std::vector<uint64_t>{0x1000, 0x1001, 0x1002, 0x1003}));
  for (uint32_t h = 0; h < 4; ++h) EXPECT_EQ(g2.host_pages[h], g1.host_pages[h]);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 8u);
  EXPECT_EQ(mgr_->prefix()->counters().hits, 4u);
  for (uint32_t h = 0; h < 4; ++h) EXPECT_EQ(mgr_->prefix()->AtPage(g1.host_pages[h])->refs(), 2u);
  // Complete 1: refs 1, still shared; its private pages 4, 5 freed: 6 allocated.
  Do(mgr_->Complete(1));
  EXPECT_EQ(mgr_->prefix()->shared(), 4u);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 6u);
  // Complete 2: 4 cached pages, still allocated (not free, not private).
  Do(mgr_->Complete(2));
  EXPECT_EQ(mgr_->prefix()->cached(), 4u);
  EXPECT_EQ(mgr_->prefix()->shared(), 0u);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 4u);
  // Request 3: the same chain and tokens, 4 pages: 4 hits.
  GrantOrder g3 = OneGrant(Admit(3, 4, 2, "", /*digest_base=*/1000));
  EXPECT_EQ(g3.shared_pages.size(), 4u);
  Do(mgr_->Complete(3));
  AdmitRequest a;  // by hand: block 2's digest other
  a.request = 4;
  a.required_pages = 1;
  a.page_rows = kPageRows;
  a.context_rows = 4 * kPageRows;
  a.optional_history = false;
  a.prefix = PrefixChain{"", {1, 2}, {1001, 4242}, kBlockTokens};
  GrantOrder g4 = OneGrant(Do(mgr_->Admit(a)));
  EXPECT_EQ(g4.shared_pages, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(mgr_->prefix()->counters().content_mismatches, 2u);
  // Its pages 2 and 3 stay private: the key is taken by the other content.
  EXPECT_EQ(mgr_->prefix()->writing(), 0u);
  Written(4, {2, 3});
  EXPECT_EQ(mgr_->prefix()->stored(), 4u);
  Do(mgr_->Complete(4));
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 4u);  // the 4 cached pages
}

TEST_F(PrefixResidencyTest, CachedPagesNeverStarveAdmissionAndGoLeastRecentlyUsedFirst) {
  Make(8);
  GrantOrder g1 = OneGrant(Admit(1, 4, 2));
  Written(1, {0, 1, 2, 3});
  Do(mgr_->Complete(1));  // released h 0, 1, 2, 3 in that order: the LRU order
  EXPECT_EQ(mgr_->prefix()->cached(), 4u);
  // Request 2 needs 6 host pages, 4 are free: granted at once, evicting 2 cached pages: those of h 0 and 1.
  GrantOrder g2 = OneGrant(Admit(2, 6, 0));
  EXPECT_EQ(mgr_->prefix()->counters().evictions, 2u);
  EXPECT_EQ(mgr_->prefix()->AtPage(g1.host_pages[0]), nullptr);
  EXPECT_EQ(mgr_->prefix()->AtPage(g1.host_pages[1]), nullptr);
  EXPECT_NE(mgr_->prefix()->AtPage(g1.host_pages[2]), nullptr);
  EXPECT_NE(mgr_->prefix()->AtPage(g1.host_pages[3]), nullptr);
  // A request that needs more than free + cached waits (8 pages: 0 free, 2 cached; held pages are not room).
  auto o = Do(mgr_->Admit([] {
    AdmitRequest a;
    a.request = 3;
    a.required_pages = 1;
    a.context_pages = 8;
    a.optional_history = false;
    return a;
  }()));
  EXPECT_EQ(OfType<GrantOrder>(o).size(), 0u);
  EXPECT_EQ(mgr_->prefix()->cached(), 2u);  // nothing evicted for an admission that still waits
  auto done = Do(mgr_->Complete(2));  // 6 free + 2 cached: request 3 granted, both cached pages evicted
  EXPECT_EQ(OfType<GrantOrder>(done).size(), 1u);
  EXPECT_EQ(mgr_->prefix()->stored(), 0u);
  EXPECT_EQ(mgr_->prefix()->counters().evictions, 4u);
}

TEST_F(PrefixResidencyTest, TwoTenantsNeverShare) {
  Make(40);
  OneGrant(Admit(1, 4, 2, "tenant-a"));
  Written(1, {0, 1, 2, 3});
  GrantOrder g2 = OneGrant(Admit(2, 4, 2, "tenant-b"));  // same ids and tokens, another tenant: no hit
  EXPECT_TRUE(g2.shared_pages.empty());
  Written(2, {0, 1, 2, 3});
  EXPECT_EQ(mgr_->prefix()->shared(), 8u);
  GrantOrder g3 = OneGrant(Admit(3, 4, 2, "tenant-a"));
  EXPECT_EQ(g3.shared_pages.size(), 4u);
  for (const auto& [page, p] : mgr_->prefix()->pages()) {
    EXPECT_EQ(p.refs(), p.address.tenant == PrefixPages::TenantHash("tenant-a") ? 2u : 1u);
  }
}

TEST_F(PrefixResidencyTest, QuotaKeepsATenantsOverflowPrivate) {
  Make(40, true, PrefixConfig{.eviction_policy = "lru", .tenant_quota_pages = 3});
  OneGrant(Admit(1, 4, 2, "a"));
  EXPECT_EQ(mgr_->prefix()->writing(), 3u);  // the 4th shareable page is over the quota: private
  EXPECT_EQ(mgr_->prefix()->counters().quota_refusals, 1u);
  Written(1, {0, 1, 2, 3});
  EXPECT_EQ(mgr_->prefix()->shared(), 3u);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 4u);
}

TEST_F(PrefixResidencyTest, FenceKeepsReferencesAndAbandonsWrites) {
  Make(20);
  OneGrant(Admit(1, 4, 2));
  Written(1, {0, 1});  // 0, 1 shared; 2, 3 still writing
  GrantOrder g2 = OneGrant(Admit(2, 4, 2));
  EXPECT_EQ(g2.shared_pages, (std::vector<uint32_t>{0, 1}));  // pages being written are never imported
  EXPECT_EQ(mgr_->prefix()->writing(), 2u);  // request 2 writes nothing: the keys of 2, 3 are taken (writing)
  Do(mgr_->FenceGpu(0, "test"));
  // Request 1 interrupted: keeps 0, 1 (shared, refs stay: 2 each), its writes of 2, 3 abandoned (pages freed).
  EXPECT_EQ(mgr_->prefix()->writing(), 0u);
  EXPECT_EQ(mgr_->prefix()->shared(), 2u);
  for (const auto& [page, p] : mgr_->prefix()->pages()) EXPECT_EQ(p.refs(), 2u);
  EXPECT_EQ(mgr_->prefix()->counters().abandoned, 2u);
  Do(mgr_->Complete(1));
  Do(mgr_->Complete(2));
  EXPECT_EQ(mgr_->prefix()->cached(), 2u);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 2u);
}

TEST_F(PrefixResidencyTest, MemdRestartKeepsConfirmedSharedPages) {
  JournalMemory journal(20);
  Make(20, true, {}, journal.get());
  GrantOrder g1 = OneGrant(Admit(1, 6, 2));
  Written(1, {0, 1, 2});  // 3 shared pages; page 3 still writing (its copy unconfirmed)
  // memd dies: a new core verifies the journal and adopts it.
  std::map<PageIndex, JournaledSharedPage> shared;
  auto verified = journal->Verify(&shared);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(shared.size(), 3u);
  ASSERT_EQ(verified->size(), 1u);
  EXPECT_EQ(verified->at(1).confirmed.size(), 0u);  // its shared pages are the pool's, not its own
  std::vector<AdoptedRequest> requests;
  const std::vector<AdoptedSharedPage> pages = AdoptedPages(shared);
  EXPECT_EQ(pages[0].checksum, 0x1000u);
  NewCoreOver(journal.get());
  Do(mgr_->AdoptHostPages(requests, pages));
  EXPECT_EQ(mgr_->prefix()->cached(), 3u);
  Do(mgr_->ReleaseHeldPages());
  ASSERT_TRUE(mgr_->RegisterGpu(0, 100, 0).ok());
  GrantOrder g2 = OneGrant(Admit(2, 6, 2));
  EXPECT_EQ(g2.shared_pages, (std::vector<uint32_t>{0, 1, 2}));
  for (uint32_t h = 0; h < 3; ++h) EXPECT_EQ(g2.host_pages[h], g1.host_pages[h]);
  EXPECT_EQ(g2.host_backed_checksums, (std::vector<uint64_t>{0x1000, 0x1001, 0x1002}));
  // With sharing off, a restart frees them.
  std::map<PageIndex, JournaledSharedPage> again;
  ASSERT_TRUE(journal->Verify(&again).ok());
  NewCoreOver(journal.get(), /*sharing=*/false);
  const std::vector<AdoptedSharedPage> pages2 = AdoptedPages(again);
  std::vector<AdoptedRequest> reqs2;
  auto journaled = journal->Verify();
  ASSERT_TRUE(journaled.ok());
  for (const auto& [id, jr] : *journaled) {
    reqs2.push_back(AdoptedRequest{id, 0, 1, jr.context_pages, jr.confirmed, jr.checksums});
  }
  Do(mgr_->AdoptHostPages(reqs2, pages2));
  EXPECT_EQ(mgr_->prefix(), nullptr);
  EXPECT_EQ(journal->Verify(&again).ok(), true);
  EXPECT_TRUE(again.empty());
}

// A worker that survives a memd restart reports its requests (docs/protocol.md "Re-Hello with a report"): the shared
// pages they name come back as references (the adopted cached pages become shared again, each held by both
// requests), never as a second owner, and the private pages as before; a report naming a stored page with another
// checksum (other content) is refused alone. Completing both leaves the 4 pages cached, nothing else allocated.
TEST_F(PrefixResidencyTest, ASurvivingWorkersReportHoldsTheSharedPagesItNames) {
  JournalMemory journal(20);
  Make(20, true, {}, journal.get());
  const uint32_t epoch = mgr_->epoch(0);
  GrantOrder g1 = OneGrant(Admit(1, 6, 2));  // h 0..3 shareable; 4, 5 private
  Written(1, {0, 1, 2, 3, 4});               // 0..3 shared, 4 confirmed private, 5 not written yet
  GrantOrder g2 = OneGrant(Admit(2, 6, 2));  // hits on h 0..3
  ASSERT_EQ(g2.shared_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
  // memd dies: a new core adopts the journal (request 1 with its private page 4, the 4 shared pages cached).
  std::map<PageIndex, JournaledSharedPage> shared;
  auto verified = journal->Verify(&shared);
  ASSERT_TRUE(verified.ok()) << verified.status();
  std::vector<AdoptedRequest> requests;
  for (const auto& [id, jr] : *verified) {
    if (!jr.confirmed.empty()) requests.push_back(AdoptedRequest{id, 0, epoch, jr.context_pages, jr.confirmed, jr.checksums});
  }
  ASSERT_EQ(requests.size(), 1u);
  NewCoreOver(journal.get());
  Do(mgr_->AdoptHostPages(requests, AdoptedPages(shared)));
  ASSERT_EQ(mgr_->prefix()->cached(), 4u);
  // Their worker survived and reports both, and a third request that claims page h 0 with other content.
  const auto report = [](const GrantOrder& g, bool wrote_private) {
    ReportedRequest rep{g.request, g.slot, g.required_pages, 0, false, {}};
    for (uint32_t h = 0; h < 6; ++h) {
      const bool confirmed = h < 4 || (h == 4 && wrote_private);
      rep.history.push_back({g.host_pages[h], confirmed, std::nullopt, confirmed ? 0x1000u + h : 0u});
    }
    return rep;
  };
  ReportedRequest liar{3, g2.slot + 1, {g2.required_pages[0] + 1}, 0, false, {}};
  liar.history.push_back({g1.host_pages[0], true, std::nullopt, 0x9999});
  std::vector<absl::Status> outcomes;
  ASSERT_TRUE(mgr_->AdoptGpu(0, 100, 0, epoch, std::vector<ReportedRequest>{report(g1, true), report(g2, false), liar},
                             &outcomes)
                  .ok());
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_TRUE(outcomes[0].ok()) << outcomes[0];
  EXPECT_TRUE(outcomes[1].ok()) << outcomes[1];
  EXPECT_EQ(outcomes[2].code(), absl::StatusCode::kFailedPrecondition) << outcomes[2];
  ASSERT_TRUE(mgr_->CheckInvariants().ok()) << mgr_->CheckInvariants();
  EXPECT_EQ(mgr_->prefix()->shared(), 4u);
  EXPECT_EQ(mgr_->prefix()->cached(), 0u);
  for (uint32_t h = 0; h < 4; ++h) EXPECT_EQ(mgr_->prefix()->AtPage(g1.host_pages[h])->refs(), 2u) << h;
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 4u + 2u + 2u);  // shared once, each request's 2 private pages
  EXPECT_EQ(mgr_->counters().requests_reported, 2u);
  Do(mgr_->Complete(1));
  Do(mgr_->Complete(2));
  ASSERT_TRUE(mgr_->CheckInvariants().ok()) << mgr_->CheckInvariants();
  EXPECT_EQ(mgr_->prefix()->cached(), 4u);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 4u);
}

// memd dies while two requests hold 4 shared pages (request 1 wrote them, request 2 imported them) and neither worker
// survives: the journal keeps only the pages' owner kSharedOwner, the records keep each request's chain (what the
// daemon's AdoptionList passes). The adopted interrupted requests hold the 4 pages again (refs 2, kHost with the
// stored checksums, listed among their confirmed copies) instead of leaving them cached (evictable); a chain whose
// second block has other tokens holds only the first block's 2 pages. Completing all leaves the 4 pages cached.
TEST_F(PrefixResidencyTest, AMemdRestartGivesAdoptedRequestsTheirSharedPagesBack) {
  JournalMemory journal(20);
  Make(20, true, {}, journal.get());
  GrantOrder g1 = OneGrant(Admit(1, 6, 2));
  Written(1, {0, 1, 2, 3, 4});
  GrantOrder g2 = OneGrant(Admit(2, 6, 2));
  ASSERT_EQ(g2.shared_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
  std::map<PageIndex, JournaledSharedPage> shared;
  auto verified = journal->Verify(&shared);
  ASSERT_TRUE(verified.ok()) << verified.status();
  const PrefixChain chain{"", {1, 2}, {1001, 1002}, kBlockTokens};
  std::vector<AdoptedRequest> requests;
  for (RequestId r : {1, 2}) {
    const auto jr = verified->find(r);
    AdoptedRequest a{r, 0, mgr_->epoch(0), 6, {}, {}};
    if (jr != verified->end()) {
      a.host_pages = jr->second.confirmed;
      a.checksums = jr->second.checksums;
    }
    a.prefix = chain;
    a.page_rows = kPageRows;
    requests.push_back(a);
  }
  AdoptedRequest other{3, 0, mgr_->epoch(0), 4, {}, {}};  // block 2 of other tokens: holds block 1's pages only
  other.prefix = PrefixChain{"", {1, 2}, {1001, 4242}, kBlockTokens};
  other.page_rows = kPageRows;
  requests.push_back(other);
  NewCoreOver(journal.get());
  Do(mgr_->AdoptHostPages(requests, AdoptedPages(shared)));
  ASSERT_TRUE(mgr_->CheckInvariants().ok()) << mgr_->CheckInvariants();
  EXPECT_EQ(mgr_->prefix()->shared(), 4u);
  EXPECT_EQ(mgr_->prefix()->cached(), 0u);
  for (uint32_t h = 0; h < 4; ++h) EXPECT_EQ(mgr_->prefix()->AtPage(g1.host_pages[h])->refs(), h < 2 ? 3u : 2u) << h;
  std::map<uint32_t, PageIndex> want1, want2, want3;
  for (uint32_t h = 0; h < 4; ++h) want1[h] = want2[h] = g1.host_pages[h];
  want1[4] = g1.host_pages[4];  // its own confirmed private page
  for (uint32_t h = 0; h < 2; ++h) want3[h] = g1.host_pages[h];
  EXPECT_EQ(mgr_->InterruptedHostPages(1), want1);
  EXPECT_EQ(mgr_->InterruptedHostPages(2), want2);
  EXPECT_EQ(mgr_->InterruptedHostPages(3), want3);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 4u + 1u);  // the shared pages once, request 1's page 4
  for (RequestId r : {1, 2, 3}) Do(mgr_->Complete(r));
  ASSERT_TRUE(mgr_->CheckInvariants().ok()) << mgr_->CheckInvariants();
  EXPECT_EQ(mgr_->prefix()->cached(), 4u);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 4u);
}

TEST_F(PrefixResidencyTest, CountersInStatusAndPrometheusOnlyWhenOn) {
  Make(20);
  OneGrant(Admit(1, 4, 2));
  Written(1, {0, 1, 2, 3});
  OneGrant(Admit(2, 4, 2));  // 4 hits
  Do(mgr_->Complete(1));
  Do(mgr_->Complete(2));  // 4 cached
  const StateDump d = mgr_->Dump();
  const nlohmann::json j = DumpToJson(d, DumpView{});
  ASSERT_TRUE(j.contains("prefix"));
  EXPECT_EQ(j["prefix"]["lookups"], 8);
  EXPECT_EQ(j["prefix"]["hits"], 4);
  EXPECT_EQ(j["prefix"]["misses"], 4);
  EXPECT_EQ(j["prefix"]["cached_pages"], 4);
  EXPECT_EQ(j["prefix"]["eviction_policy"], "lru");
  const std::string prom = RenderPrometheus(d, mgr_->counters(), {});
  EXPECT_NE(prom.find("dhs_memd_prefix_hits_total 4\n"), std::string::npos) << prom;
  EXPECT_NE(prom.find("dhs_memd_prefix_pages{state=\"cached\"} 4\n"), std::string::npos);
  EXPECT_NE(DumpToTable(d, DumpView{}).find("4 cached"), std::string::npos);
  // The prefixes view (dhsctl prefixes): one chain of 2 blocks (pages 2, 3) and one of 1 block (pages 0, 1), cached.
  auto view = ParseDumpView("prefixes");
  ASSERT_TRUE(view.ok());
  const StateDump pd = mgr_->Dump(DumpScopeOf(*view));
  ASSERT_EQ(pd.prefix.chains.size(), 2u);
  EXPECT_EQ(pd.prefix.chains[0].blocks, 1u);
  EXPECT_EQ(pd.prefix.chains[1].blocks, 2u);
  for (const auto& c : pd.prefix.chains) {
    EXPECT_EQ(c.pages, 2u);
    EXPECT_EQ(c.cached, 2u);
    EXPECT_EQ(c.holders, 0u);
    EXPECT_EQ(c.tenant, PrefixPages::TenantHash(""));
  }
  const nlohmann::json pj = DumpToJson(pd, *view);
  EXPECT_EQ(pj["chains"].size(), 2u);
  EXPECT_EQ(pj["chains"][1]["blocks"], 2);
  EXPECT_TRUE(mgr_->Dump().prefix.chains.empty());  // other views do not list them
  EXPECT_NE(DumpToTable(pd, *view).find("holders"), std::string::npos);
  Make(20, /*sharing=*/false);
  EXPECT_EQ(DumpToJson(mgr_->Dump(DumpScopeOf(*view)), *view)["enabled"], false);
  const StateDump off = mgr_->Dump();
  EXPECT_FALSE(DumpToJson(off, DumpView{}).contains("prefix"));
  EXPECT_EQ(RenderPrometheus(off, mgr_->counters(), {}).find("prefix"), std::string::npos);
  EXPECT_EQ(DumpToTable(off, DumpView{}).find("prefix"), std::string::npos);
}

TEST_F(PrefixResidencyTest, SharingOffIgnoresTheChain) {
  Make(20, /*sharing=*/false);
  OneGrant(Admit(1, 4, 2));
  Written(1, {0, 1, 2, 3});
  GrantOrder g2 = OneGrant(Admit(2, 4, 2));
  EXPECT_TRUE(g2.host_backed_pages.empty());
  EXPECT_TRUE(g2.shared_pages.empty());
  EXPECT_EQ(mgr_->prefix(), nullptr);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 8u);
}


// ---------------------------------------------------------------- issue 26: the cluster tier's core side

// Node 1 publishes the pages its request confirmed; node 2 (a fresh core) names the same pages to look up, imports
// them into reusable host pages, and its admission is granted them as host hits with the published checksums.
TEST_F(PrefixResidencyTest, ClusterPagesPublishedByOneCoreAreGrantedAsHostHitsByAnother) {
  PrefixConfig outbox;
  outbox.cluster_outbox = true;
  Make(20, true, outbox);
  OneGrant(Admit(1, 6, 2));
  EXPECT_TRUE(mgr_->DrainClusterPublish().empty());  // writing pages are not confirmed
  Written(1, {0, 1, 2, 3, 4});                       // 0..3 shared; page 4 private (beyond the chain)
  const std::vector<ClusterPublishPage> published = mgr_->DrainClusterPublish();
  ASSERT_EQ(published.size(), 4u);
  for (uint32_t h = 0; h < 4; ++h) {
    EXPECT_EQ(published[h].address.page, h);
    EXPECT_EQ(published[h].checksum, 0x1000u + h);
    EXPECT_EQ(published[h].gpu, 0u);
    EXPECT_EQ(mgr_->prefix()->AtPage(published[h].host_page)->address.key, published[h].address.key);
  }
  EXPECT_TRUE(mgr_->DrainClusterPublish().empty());  // drained once

  Make(20, true, outbox);  // node 2
  AdmitRequest a;
  a.request = 2;
  a.required_pages = 1;
  a.page_rows = kPageRows;
  a.context_rows = 6 * kPageRows;
  a.optional_history = false;
  a.prefix = PrefixChain{"", {1, 2}, {1001, 1002}, kBlockTokens};
  const std::vector<PrefixAddress> wanted = mgr_->ClusterLookups(a);
  ASSERT_EQ(wanted.size(), 4u);
  for (uint32_t h = 0; h < 4; ++h) EXPECT_EQ(wanted[h], published[h].address);
  const std::vector<PageIndex> room = mgr_->ClusterRoom(4);
  ASSERT_EQ(room, (std::vector<PageIndex>{0, 1, 2, 3}));
  // Bad imports change nothing: a host page named twice, a page that is not reusable.
  std::vector<ClusterImport> twice = {{wanted[0], 0, 0x1000}, {wanted[1], 0, 0x1001}};
  EXPECT_TRUE(absl::IsFailedPrecondition(mgr_->ImportClusterPages(twice)));
  EXPECT_TRUE(absl::IsFailedPrecondition(mgr_->ImportClusterPages(std::vector<ClusterImport>{{wanted[0], 99, 1}})));
  EXPECT_EQ(mgr_->prefix()->stored(), 0u);
  std::vector<ClusterImport> imports;
  for (uint32_t h = 0; h < 4; ++h) imports.push_back({wanted[h], room[h], published[h].checksum});
  Do(mgr_->ImportClusterPages(imports));
  EXPECT_EQ(mgr_->prefix()->cached(), 4u);
  EXPECT_EQ(mgr_->prefix()->counters().cluster_imported, 4u);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 4u);
  EXPECT_TRUE(mgr_->ClusterLookups(a).empty());  // stored locally now
  EXPECT_TRUE(mgr_->DrainClusterPublish().empty());  // an import is not published again
  // The same key imported twice is refused.
  EXPECT_TRUE(absl::IsFailedPrecondition(mgr_->ImportClusterPages(std::vector<ClusterImport>{{wanted[0], 5, 1}})));
  GrantOrder g = OneGrant(Do(mgr_->Admit(a)));
  EXPECT_EQ(g.shared_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(g.host_backed_checksums, (std::vector<uint64_t>{0x1000, 0x1001, 0x1002, 0x1003}));
  for (uint32_t h = 0; h < 4; ++h) EXPECT_EQ(g.host_pages[h], room[h]);
  EXPECT_EQ(mgr_->prefix()->counters().hits, 4u);
  Do(mgr_->Complete(2));
  EXPECT_EQ(mgr_->prefix()->cached(), 4u);
}

// Issue 26 (sessions across nodes): an admission with a session names, after its chain's addresses (pages [0, 2) of
// its one block), the session addresses of its further complete input pages (digests of pages 2, 3, 4); found
// pages are imported and granted as host hits like prefix pages (pages [0, 4): prefix then session), counted apart
// (session_hits); a session address is never written locally; a page of other tokens (another digest) is another
// key: a miss, computed. At Complete the turn publishes its own confirmed pages beyond the prefix, not the session
// pages it holds shared.
TEST_F(PrefixResidencyTest, SessionPagesAfterThePrefixPagesAreImportedAndGrantedAsHostHits) {
  Make(20);
  const uint64_t session = 0x5e55, tenant = PrefixPages::TenantHash("");
  const std::vector<uint64_t> digests = {0xd0, 0xd1, 0xd2, 0xd3, 0xd4};
  auto admission = [&](RequestId r, std::vector<uint64_t> d) {
    AdmitRequest a;
    a.request = r;
    a.required_pages = 1;
    a.page_rows = kPageRows;
    a.context_rows = 6 * kPageRows;
    a.optional_history = false;
    a.prefix = PrefixChain{"", {1}, {1001}, kBlockTokens};  // one block: pages 0, 1
    a.session_hash = session;
    a.session_digests = std::move(d);
    return a;
  };
  const AdmitRequest a = admission(1, digests);
  const std::vector<PrefixAddress> wanted = mgr_->ClusterLookups(a);
  ASSERT_EQ(wanted.size(), 5u);
  for (uint32_t h = 0; h < 2; ++h) {  // the chain's: block addresses
    EXPECT_EQ(wanted[h].session, 0u);
    EXPECT_EQ(wanted[h].key, Key("", {1}, kPageRows, h, kBlockTokens));
  }
  for (uint32_t h = 2; h < 5; ++h) {  // then session addresses of digests 2, 3, 4
    EXPECT_EQ(wanted[h].page, h);
    EXPECT_EQ(wanted[h].session, session);
    EXPECT_EQ(wanted[h].content, digests[h]);
    const uint64_t words[5] = {tenant, session, digests[h], kPageRows, h};
    EXPECT_EQ(wanted[h].key, XXH3_64bits_withSeed(words, sizeof(words), kSessionPageSeed));
  }
  // No session without a session hash, or without digests; digests beyond the context are not named.
  AdmitRequest plain = a;
  plain.session_hash = 0;
  EXPECT_EQ(mgr_->ClusterLookups(plain).size(), 2u);
  AdmitRequest only = a;
  only.prefix = {};
  ASSERT_EQ(mgr_->ClusterLookups(only).size(), 5u);  // a session without a chain: session addresses from page 0
  EXPECT_EQ(mgr_->ClusterLookups(only)[0].session, session);
  AdmitRequest longer = a;
  longer.session_digests = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(mgr_->ClusterLookups(longer).size(), 6u);  // the context's 6 pages

  // The store has pages 0..3 (page 4 is not there): imported as a run, then granted as host hits [0, 4).
  const std::vector<PageIndex> room = mgr_->ClusterRoom(4);
  std::vector<ClusterImport> imports;
  for (uint32_t h = 0; h < 4; ++h) imports.push_back({wanted[h], room[h], 0x2000u + h});
  Do(mgr_->ImportClusterPages(imports));
  EXPECT_EQ(mgr_->prefix()->cached(), 4u);
  EXPECT_EQ(mgr_->ClusterLookups(a), (std::vector<PrefixAddress>{wanted[4]}));  // the rest is stored locally
  GrantOrder g = OneGrant(Do(mgr_->Admit(a)));
  EXPECT_EQ(g.shared_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(g.host_backed_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(g.host_backed_checksums, (std::vector<uint64_t>{0x2000, 0x2001, 0x2002, 0x2003}));
  EXPECT_EQ(g.imported_pages, 4u);
  for (uint32_t h = 0; h < 4; ++h) EXPECT_EQ(g.host_pages[h], room[h]);
  EXPECT_EQ(mgr_->prefix()->counters().hits, 2u);          // prefix pages
  EXPECT_EQ(mgr_->prefix()->counters().lookups, 2u);       // session addresses are not prefix lookups
  EXPECT_EQ(mgr_->prefix()->counters().session_hits, 2u);  // pages 2, 3
  EXPECT_EQ(mgr_->prefix()->writing(), 0u);                // page 4 is never written under its session address
  EXPECT_EQ(mgr_->prefix()->shared(), 4u);
  // Its pages 4, 5 are confirmed: its own, published under the session at Complete; pages 2, 3 are held, stored.
  Written(1, {4, 5});
  EXPECT_EQ(mgr_->prefix()->stored(), 4u);
  const std::vector<uint64_t> fed = {0xd0, 0xd1, 0xd2, 0xd3, 0xd4, 0xd5};
  const std::vector<SessionPublishPage> pub = mgr_->SessionPages(1, fed);
  ASSERT_EQ(pub.size(), 2u);
  EXPECT_EQ(pub[0].page, 4u);
  EXPECT_EQ(pub[0].digest, 0xd4u);
  EXPECT_EQ(pub[0].checksum, 0x1004u);
  EXPECT_EQ(pub[1].page, 5u);
  EXPECT_EQ(pub[1].host_page, g.host_pages[5]);

  // Another turn whose page 3 holds other tokens (digest 0xe3, so 0xe4 after it): pages 0..2 hit locally, 3 and 4
  // are asked under their own keys (absent), and granted computed, not the stored page 3.
  const AdmitRequest b = admission(2, {0xd0, 0xd1, 0xd2, 0xe3, 0xe4});
  const std::vector<PrefixAddress> asked = mgr_->ClusterLookups(b);
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[0].page, 3u);
  EXPECT_EQ(asked[0].content, 0xe3u);
  EXPECT_NE(asked[0].key, wanted[3].key);
  GrantOrder g2 = OneGrant(Do(mgr_->Admit(b)));
  EXPECT_EQ(g2.shared_pages, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_NE(g2.host_pages[3], room[3]);
  EXPECT_EQ(mgr_->prefix()->counters().session_hits, 3u);
  Do(mgr_->Complete(1));
  Do(mgr_->Complete(2));
  EXPECT_EQ(mgr_->prefix()->cached(), 4u);
  EXPECT_EQ(mgr_->Dump().host.allocated_pages, 4u);
}

// Only the pages past the local hits whose key is not stored are named; nothing with sharing off or without a chain;
// the outbox is off by default.
TEST_F(PrefixResidencyTest, ClusterLookupsNameOnlyWhatTheHostTierLacks) {
  Make(20);
  OneGrant(Admit(1, 4, 1));  // one block: pages 0, 1 shared
  Written(1, {0, 1});
  EXPECT_TRUE(mgr_->DrainClusterPublish().empty());  // PrefixConfig::cluster_outbox off
  AdmitRequest a;
  a.request = 2;
  a.required_pages = 1;
  a.page_rows = kPageRows;
  a.context_rows = 8 * kPageRows;
  a.optional_history = false;
  a.prefix = PrefixChain{"", {1, 2, 3}, {1001, 1002, 1003}, kBlockTokens};  // 6 shareable pages
  std::vector<PrefixAddress> wanted = mgr_->ClusterLookups(a);
  ASSERT_EQ(wanted.size(), 4u);
  EXPECT_EQ(wanted.front().page, 2u);
  EXPECT_EQ(wanted.back().page, 5u);
  AdmitRequest none = a;
  none.prefix = {};
  EXPECT_TRUE(mgr_->ClusterLookups(none).empty());
  Make(20, /*sharing=*/false);
  EXPECT_TRUE(mgr_->ClusterLookups(a).empty());
  EXPECT_TRUE(mgr_->ClusterRoom(4).empty());
}

}  // namespace
}  // namespace dhs::memd
