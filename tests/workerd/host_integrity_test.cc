// tests/workerd/host_integrity_test.cc: host-page integrity in the KV hierarchy (issue 22): the checksum of a
// confirmed host page (payload and keys) computed after the copy, and the check of a page's bytes before they are
// used again: host recovery (fused and reference resolvers), staging, population, and a resume's import. A page whose
// bytes changed after its confirmation is never served: DATA_LOSS (recovery, populate), or recomputed (resume).
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>

#include "common/page_checksum.h"
#include "tests/workerd/kv_test_util.h"

namespace dhs {
namespace {

using test::Harness;
using test::OriginalRow;

KvConfig KeyedConfig() {
  KvConfig c;
  c.row_bytes = {16, 24, 8};
  c.groups = {{0, 1}, {2}};
  c.page_rows = 4;
  c.hot_rows = 6;
  c.k = 4;
  c.tail_rows = 8;
  c.slots = 3;
  c.optional_pages = 6;
  c.key_bytes = {8, 12};  // index keys after the payload rows (KvLayout::KeyInPage)
  return c;
}

std::vector<float> Keys(Position t, uint32_t indexer, size_t floats) {
  std::vector<float> k(floats);
  for (size_t i = 0; i < floats; ++i) k[i] = static_cast<float>(t * 100 + indexer * 10 + i) * 0.5f;
  return k;
}

// The independent checksum: XXH3-64 of the whole host page, straight from libxxhash.
uint64_t Xxh3(const Harness& h, PageIndex host_page) {
  const uint64_t hpb = h.layout.host_page_bytes();
  const uint64_t x = XXH3_64bits(h.host.data() + host_page * hpb, hpb);
  return x == 0 ? 1 : x;
}

// Request 1 planned on `plan` (host page of history page j), `rows` rows appended with their keys, backups polled.
std::vector<KvCompletions::Backup> Fill(Harness& h, const std::vector<PageIndex>& plan, Position rows) {
  EXPECT_TRUE(h.kv->PlanResidency(1, 0, plan, {}).ok());
  for (Position t = 0; t < rows; ++t) {
    EXPECT_TRUE(h.AppendAll(1, t).ok());
    EXPECT_TRUE(h.kv->StoreIndexKeys(1, 0, t, Keys(t, 0, 2)).ok());
    EXPECT_TRUE(h.kv->StoreIndexKeys(1, 1, t, Keys(t, 1, 3)).ok());
  }
  h.device.WaitIdle();
  return h.kv->Poll().backups;
}

absl::Status FetchRows(Harness& h, std::vector<SourceId> sources, std::vector<Position> sel) {
  std::vector<const uint8_t*> out(sources.size() * sel.size());
  KvQuery q{1, sel, out};
  absl::Status s = h.kv->Fetch(sources, {&q, 1});
  if (s.ok()) {
    for (size_t si = 0; si < sources.size(); ++si) {
      for (size_t j = 0; j < sel.size(); ++j) {
        if (sel[j] < 0) continue;
        const auto want = OriginalRow(1, sources[si], sel[j], h.layout.row_bytes(sources[si]));
        EXPECT_EQ(0, std::memcmp(out[si * sel.size() + j], want.data(), want.size())) << sel[j];
      }
    }
  }
  h.kv->ReadersDone(sources);
  return s;
}

TEST(PageChecksum, IsXxh3OfTheBytesAndNeverTheNoChecksumValue) {
  EXPECT_EQ(PageChecksum({}), 0x2D06800538D394C2ull);  // XXH3-64 of no bytes, seed 0 (the xxHash test vectors)
  std::vector<uint8_t> page(4096, 7);
  const uint64_t c = PageChecksum(page);
  EXPECT_NE(c, kNoChecksum);
  EXPECT_TRUE(PageChecksumMatches(page, c));
  page[4095] ^= 1;
  EXPECT_FALSE(PageChecksumMatches(page, c));
  EXPECT_FALSE(PageChecksumMatches(page, kNoChecksum));  // none known never matches
}

// Every completed backup reports the checksum of its whole host page (payload rows and index keys), as a direct
// XXH3 over the host pool computes it after the keys were stored.
TEST(HostIntegrity, ACompletedBackupCarriesTheChecksumOfItsPayloadAndKeys) {
  Harness h(KeyedConfig(), 12);
  const std::vector<PageIndex> plan = {5, 2, 9, 7};
  const auto backups = Fill(h, plan, 16);
  ASSERT_EQ(backups.size(), 4u);
  for (const auto& b : backups) {
    ASSERT_TRUE(b.status.ok());
    EXPECT_EQ(b.host_page, plan[b.page]);
    EXPECT_EQ(b.checksum, Xxh3(h, plan[b.page])) << "page " << b.page;
    EXPECT_EQ(h.kv->HostChecksum(1, b.page), b.checksum);
  }
  EXPECT_EQ(h.kv->host_integrity().pages_checksummed, 4u);
  EXPECT_EQ(h.kv->HostChecksum(1, 4), kNoChecksum);  // no such page
  EXPECT_EQ(h.kv->HostChecksum(2, 0), kNoChecksum);  // no such request
}

class HostIntegrityResolvers : public ::testing::TestWithParam<ResolverKind> {};

// A byte of a confirmed host page changes after its confirmation (payload of page 0, an index key of page 1): the
// next recovery of any row of that page fails with DATA_LOSS and serves nothing (census untouched); a clean page is
// recovered exactly, and verified once however many of its rows are recovered later.
TEST_P(HostIntegrityResolvers, RecoveryOfAChangedPageIsDataLossNeverItsBytes) {
  Harness h(KeyedConfig(), 12, GetParam());
  const std::vector<PageIndex> plan = {5, 2, 9, 7, 3};
  ASSERT_EQ(Fill(h, plan, 20).size(), 5u);  // pages 0..4 backed up; the tail holds positions 12..19
  const uint64_t hpb = h.layout.host_page_bytes();
  h.host[plan[0] * hpb + h.layout.InPage(1, 3) + 5] ^= 0x10;                 // page 0: source 1, row 3, byte 5
  h.host[plan[1] * hpb + h.layout.KeyInPage(1, 2)] ^= 0x01;                  // page 1: indexer 1's key of row 6
  const Census before = h.kv->census(0);
  EXPECT_EQ(FetchRows(h, {0, 1}, {1, 13, -1, -1}).code(), absl::StatusCode::kDataLoss);  // row 1: page 0
  EXPECT_EQ(h.kv->census(0), before);
  EXPECT_EQ(FetchRows(h, {2}, {5, -1, -1, -1}).code(), absl::StatusCode::kDataLoss);  // row 5: page 1 (its key)
  EXPECT_EQ(h.kv->host_integrity().mismatches, 2u);
  // Clean page 2 (rows 8..11): recovered exactly, verified once.
  const uint64_t verified = h.kv->host_integrity().pages_verified;
  EXPECT_TRUE(FetchRows(h, {0, 1}, {8, 9, 14, -1}).ok());
  EXPECT_TRUE(FetchRows(h, {2}, {10, 11, 8, -1}).ok());
  EXPECT_TRUE(FetchRows(h, {0, 1}, {10, 11, -1, -1}).ok());
  EXPECT_EQ(h.kv->host_integrity().pages_verified, verified + 1);
  EXPECT_EQ(h.kv->host_integrity().bytes_verified, (verified + 1) * hpb);
  // The changed pages stay refused (never marked verified).
  EXPECT_EQ(FetchRows(h, {0, 1}, {0, -1, -1, -1}).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(h.kv->host_integrity().mismatches, 3u);
  h.host[plan[0] * hpb + h.layout.InPage(1, 3) + 5] ^= 0x10;  // restored: the page is its confirmed copy again
  EXPECT_TRUE(FetchRows(h, {0, 1}, {0, 3, -1, -1}).ok());
}

INSTANTIATE_TEST_SUITE_P(Kinds, HostIntegrityResolvers,
                         ::testing::Values(ResolverKind::kFused, ResolverKind::kReference),
                         [](const auto& info) { return info.param == ResolverKind::kFused ? "fused" : "reference"; });

// A populate of a page whose bytes changed after its confirmation is refused with DATA_LOSS before any copy: the
// device page stays free, nothing is published.
TEST(HostIntegrity, PopulateOfAChangedPageIsRefusedWithDataLoss) {
  Harness h(KeyedConfig(), 12);
  const std::vector<PageIndex> plan = {5, 2, 9, 7, 3};
  ASSERT_EQ(Fill(h, plan, 20).size(), 5u);
  h.host[plan[1] * h.layout.host_page_bytes() + 3] ^= 0x80;
  EXPECT_EQ(h.kv->Populate(1, 1, 2).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(h.kv->GpuPageOf(1, 2).has_value());
  EXPECT_EQ(h.kv->Find(1)->pages[1].device_page, -1);
  ASSERT_TRUE(h.kv->Populate(1, 2, 2).ok());  // a clean page populates
  h.device.WaitIdle();
  EXPECT_EQ(h.kv->Poll().published.size(), 1u);
  EXPECT_EQ(h.kv->host_integrity().mismatches, 1u);
}

// A resume (issue 11) checks each host-backed page against memd's checksum before importing it: a page whose byte
// changed, one whose checksum is unknown (0) and one whose checksum is wrong are returned (recomputed by the caller);
// the matching ones import and read back exactly.
TEST(HostIntegrity, ResumeImportsOnlyPagesMatchingTheirChecksums) {
  Harness h(KeyedConfig(), 12);
  const std::vector<PageIndex> plan = {5, 2, 9, 7, 3, 11};
  const auto backups = Fill(h, plan, 24);
  ASSERT_EQ(backups.size(), 6u);
  std::map<uint32_t, uint64_t> sums;
  for (const auto& b : backups) sums[b.page] = b.checksum;
  Harness h2(KeyedConfig(), 12);  // the restarted worker's store over the same host pool
  std::copy(h.host.begin(), h.host.end(), h2.host.begin());
  h2.host[plan[2] * h2.layout.host_page_bytes() + h2.layout.KeyInPage(0, 1)] ^= 0x04;  // page 2: a key byte
  ASSERT_TRUE(h2.kv->PlanResidency(1, 0, plan, {}).ok());
  const std::vector<uint32_t> pages = {0, 1, 2, 3, 4};
  const std::vector<uint64_t> given = {sums[0], sums[1], sums[2], 0, sums[4] ^ 1};  // 3: none known; 4: wrong
  absl::StatusOr<std::vector<uint32_t>> bad = h2.kv->CheckHostCopies(1, pages, given);
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(*bad, (std::vector<uint32_t>{2, 3, 4}));
  EXPECT_EQ(h2.kv->host_integrity().mismatches, 3u);
  EXPECT_EQ(h2.kv->host_integrity().pages_verified, 5u);
  EXPECT_EQ(h2.kv->CheckHostCopies(2, pages, given).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(h2.kv->ImportHostPages(1, std::vector<uint32_t>{0, 1}, std::vector<uint64_t>{sums[0], sums[1]}).ok());
  EXPECT_EQ(h2.kv->HostChecksum(1, 1), sums[1]);
  std::vector<std::vector<float>> keys;
  ASSERT_TRUE(h2.kv->ImportHostRows(1, 0, 2, keys).ok());
  for (Position t = 8; t < 24; ++t) ASSERT_TRUE(h2.AppendAll(1, t).ok());  // pages 2..5 recomputed
  const uint64_t verified = h2.kv->host_integrity().pages_verified;
  EXPECT_TRUE(FetchRows(h2, {0, 1}, {0, 5, 2, 7}).ok());  // imported pages: checked at the import, not again
  EXPECT_EQ(h2.kv->host_integrity().pages_verified, verified);
}

// The staging path (brief §6 "Staging"; a speculative round's union beyond the hot cache): a row staged from a host
// page that changed after its confirmation fails the Fetch with DATA_LOSS before any arena is taken, and the KV names
// the request for the loop to fail (TakeDataLoss), once.
TEST(HostIntegrity, AStagedRowOfAChangedPageIsDataLoss) {
  KvConfig c = KeyedConfig();
  c.key_bytes.clear();
  c.hot_rows = 4;
  c.staging_arenas = 2;
  c.staging_k_max = 3;
  Harness h(c, 16);
  for (Position t = 0; t < 17; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());  // tail 9..16; 0..7 on host only
  h.device.WaitIdle();
  h.kv->Poll();
  std::vector<SourceId> src = {2};
  ASSERT_TRUE(FetchRows(h, src, {0, 1, 2, -1}).ok());  // rows 0..2 hot: one unprotected slot left
  ASSERT_TRUE(h.kv->HoldUnverified(1, 17).ok());
  for (Position t = 17; t < 19; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
  const int64_t hp = h.kv->Find(1)->pages[1].host_page;  // rows 4..7
  ASSERT_GE(hp, 0);
  h.host[static_cast<uint64_t>(hp) * h.layout.host_page_bytes() + h.layout.InPage(2, 1)] ^= 0x02;  // row 5, source 2
  const std::vector<std::vector<Position>> sel = {{3, 0, 1, 16}, {2, 3, 5, -1}, {5, 18, 3, 17}};
  std::vector<std::vector<const uint8_t*>> out(3, std::vector<const uint8_t*>(4));
  std::vector<KvQuery> batch;
  for (size_t j = 0; j < 3; ++j) batch.push_back(KvQuery{1, sel[j], out[j], 16 + static_cast<Position>(j)});
  const StagingCensus before = h.kv->staging_census();
  EXPECT_EQ(h.kv->Fetch(src, batch).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(h.kv->staging_census(), before);
  EXPECT_EQ(h.kv->staging_pool()->free_arenas(), 2u);
  const auto lost = h.kv->TakeDataLoss();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].first, 1u);
  EXPECT_EQ(lost[0].second.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(h.kv->TakeDataLoss().empty());
  h.kv->ReadersDone(src);
}

}  // namespace
}  // namespace dhs
