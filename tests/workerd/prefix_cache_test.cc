// tests/workerd/prefix_cache_test.cc: the prepared-prefix row cache (workerd/prefix_cache.h): chain keys, LRU
// eviction by bytes, the disabled cache, and the row capture decorator.
#include "workerd/prefix_cache.h"

#include <cstdint>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace dhs {
namespace {

// A block of `tokens` positions, one source of 1-byte rows filled with `fill` (bytes() == tokens).
PrefixBlock Block(uint32_t tokens, uint8_t fill) {
  PrefixBlock b;
  b.tokens = tokens;
  b.rows = {std::vector<uint8_t>(tokens, fill)};
  return b;
}

TEST(PrefixRowCache, KeyIsTheWholeChainAndTheBlockSize) {
  PrefixRowCache cache(1000);
  const std::vector<uint64_t> ab = {1, 2}, cb = {3, 2}, a = {1};
  ASSERT_TRUE(cache.Insert(ab, 64, Block(10, 7)));
  const PrefixBlock* hit = cache.Find(ab, 64);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->rows[0], std::vector<uint8_t>(10, 7));
  EXPECT_EQ(cache.Find(cb, 64), nullptr);  // same last id, different earlier block: other rows
  EXPECT_EQ(cache.Find(a, 64), nullptr);
  EXPECT_EQ(cache.Find(ab, 32), nullptr);  // same ids, other block size
  EXPECT_FALSE(cache.Insert(ab, 64, Block(10, 9)));  // present already: the first stays
  EXPECT_EQ(cache.Find(ab, 64)->rows[0][0], 7);
  EXPECT_EQ(cache.stats().hits, 2u);
  EXPECT_EQ(cache.stats().misses, 3u);
  EXPECT_EQ(cache.stats().inserted, 1u);
  EXPECT_EQ(cache.stats().bytes, 10u);
}

TEST(PrefixRowCache, EvictsLeastRecentlyUsedToFitTheCapacity) {
  PrefixRowCache cache(30);
  const std::vector<uint64_t> x = {1}, y = {2}, z = {3}, w = {4};
  ASSERT_TRUE(cache.Insert(x, 8, Block(10, 1)));
  ASSERT_TRUE(cache.Insert(y, 8, Block(10, 2)));
  ASSERT_TRUE(cache.Insert(z, 8, Block(10, 3)));
  ASSERT_NE(cache.Find(x, 8), nullptr);  // x becomes most recent; y is now the oldest
  ASSERT_TRUE(cache.Insert(w, 8, Block(15, 4)));  // needs 15 of 30: drops y (10), then z (10)
  EXPECT_EQ(cache.Find(y, 8), nullptr);
  EXPECT_EQ(cache.Find(z, 8), nullptr);
  EXPECT_NE(cache.Find(x, 8), nullptr);
  EXPECT_NE(cache.Find(w, 8), nullptr);
  EXPECT_EQ(cache.stats().evicted, 2u);
  EXPECT_EQ(cache.stats().bytes, 25u);
  EXPECT_EQ(cache.stats().blocks, 2u);
  EXPECT_FALSE(cache.Insert(std::vector<uint64_t>{5}, 8, Block(31, 5)));  // larger than the whole cache
  EXPECT_EQ(cache.stats().blocks, 2u);
}

TEST(PrefixRowCache, ZeroCapacityStoresNothing) {
  PrefixRowCache cache(0);
  const std::vector<uint64_t> x = {1};
  EXPECT_FALSE(cache.Insert(x, 8, Block(1, 1)));
  EXPECT_EQ(cache.Find(x, 8), nullptr);
  EXPECT_EQ(cache.stats().bytes, 0u);
}

TEST(PrefixRowCache, BytesCountRowsAndKeys) {
  PrefixBlock b;
  b.rows = {std::vector<uint8_t>(12), std::vector<uint8_t>(4)};
  b.keys = {std::vector<float>(3)};
  EXPECT_EQ(b.bytes(), 12u + 4u + 3u * sizeof(float));
}

// Records appends; fails the ones of position `fail_at`.
class RecordingKv final : public KvAccess {
 public:
  absl::Status Append(RequestId request, SourceId source, Position position, std::span<const uint8_t> row) override {
    if (position == fail_at) return absl::ResourceExhaustedError("full");
    appended[{request, source}].push_back(row[0]);
    return absl::OkStatus();
  }
  absl::Status Fetch(std::span<const SourceId>, std::span<KvQuery>) override { ++fetches; return absl::OkStatus(); }
  void ReadersDone(std::span<const SourceId>) override { ++readers_done; }
  void Release(RequestId) override { ++releases; }
  Position fail_at = -1;
  std::map<std::pair<RequestId, SourceId>, std::vector<uint8_t>> appended;
  int fetches = 0, readers_done = 0, releases = 0;
};

TEST(RowCapture, RecordsOnlyItsRequestsRowsAndForwardsEverything) {
  RecordingKv inner;
  PrefixBlock block;
  block.rows.resize(2);
  RowCapture capture(&inner, 7, &block);
  const uint8_t r0[2] = {10, 11}, r1[2] = {20, 21}, other[2] = {99, 99};
  ASSERT_TRUE(capture.Append(7, 0, 0, r0).ok());
  ASSERT_TRUE(capture.Append(8, 0, 0, other).ok());  // another request of the same step: forwarded, not captured
  ASSERT_TRUE(capture.Append(7, 1, 0, r1).ok());
  inner.fail_at = 1;
  EXPECT_EQ(capture.Append(7, 0, 1, r0).code(), absl::StatusCode::kResourceExhausted);  // not captured either
  EXPECT_EQ(block.rows[0], (std::vector<uint8_t>{10, 11}));
  EXPECT_EQ(block.rows[1], (std::vector<uint8_t>{20, 21}));
  EXPECT_EQ((inner.appended[{8, 0}]), (std::vector<uint8_t>{99}));
  EXPECT_EQ(capture.Append(7, 2, 0, r0).code(), absl::StatusCode::kInternal);  // a source the block does not have
  std::vector<SourceId> sources = {0};
  std::vector<KvQuery> queries;
  EXPECT_TRUE(capture.Fetch(sources, queries).ok());
  capture.ReadersDone(sources);
  capture.Release(7);
  EXPECT_EQ(inner.fetches, 1);
  EXPECT_EQ(inner.readers_done, 1);
  EXPECT_EQ(inner.releases, 1);
}

}  // namespace
}  // namespace dhs
