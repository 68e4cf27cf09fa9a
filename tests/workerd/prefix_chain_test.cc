// tests/workerd/prefix_chain_test.cc: the prefix chain a worker names in its AdmitRequest (workerd/prefix_chain.h,
// issue 24): complete blocks only, ids from hash_ids then derived from the tokens, digests of the tokens computed here
// independently with XXH3, the same ids with other tokens giving other digests (memd's content check then misses),
// BlocksCovered, the row cache's tenant key, and SetPrefixChain (the AdmitRequest's fields) with the record's tenant.
#include "workerd/prefix_chain.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "workerd/prefix_cache.h"
#include "workerd/prefix_import.h"
#include "workerd/request_book.h"
#include "workerd/worker_request.h"
#include "xxhash.h"

namespace dhs {
namespace {

// The header's digest, written out here: XXH3_64 of the tokens as little-endian int32, seed "DHSBDig".
uint64_t ExpectedDigest(const std::vector<model::Token>& tokens, size_t first, size_t n) {
  std::vector<uint8_t> bytes;
  for (size_t i = first; i < first + n; ++i) {
    const auto t = static_cast<uint32_t>(tokens[i]);
    for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<uint8_t>(t >> (8 * k)));
  }
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), 0x44485342446967ull);
}

std::vector<model::Token> Tokens(size_t n, int salt) {
  std::vector<model::Token> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<model::Token>((i * 7 + static_cast<size_t>(salt)) % 256);
  return t;
}

TEST(PrefixChain, CompleteBlocksOnlyWithTheirIdsAndTokenDigests) {
  const std::vector<model::Token> input = Tokens(35, 1);  // blocks of 8: 4 complete (32 tokens), 3 tokens private
  const std::vector<uint64_t> ids = {11, 12, 13, 14, 15};  // a fifth id covers the partial block: not named
  RequestPrefixChain c = PrefixChainOf(input, ids, 8, "tenant-a");
  EXPECT_EQ(c.tenant, "tenant-a");
  EXPECT_EQ(c.block_tokens, 8u);
  EXPECT_EQ(c.block_ids, (std::vector<uint64_t>{11, 12, 13, 14}));
  ASSERT_EQ(c.block_digests.size(), 4u);
  for (size_t b = 0; b < 4; ++b) EXPECT_EQ(c.block_digests[b], ExpectedDigest(input, b * 8, 8)) << b;
  // Shorter than one block: nothing named, block_tokens 0.
  RequestPrefixChain none = PrefixChainOf(Tokens(7, 1), ids, 8, "");
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.block_tokens, 0u);
  EXPECT_TRUE(PrefixChainOf(input, ids, 0, "").empty());
}

TEST(PrefixChain, SameIdsWithOtherTokensHaveOtherDigests) {
  // A client that names another's hash ids with its own tokens: the ids are the same, the digests are not, so memd's
  // content chain differs and nothing stored under those ids is imported (memd/prefix_pages.h).
  const std::vector<uint64_t> ids = {7, 8};
  std::vector<model::Token> mine = Tokens(16, 1), other = Tokens(16, 1);
  other[12] ^= 1;  // one token of block 1
  RequestPrefixChain a = PrefixChainOf(mine, ids, 8, ""), b = PrefixChainOf(other, ids, 8, "");
  EXPECT_EQ(a.block_ids, b.block_ids);
  EXPECT_EQ(a.block_digests[0], b.block_digests[0]);
  EXPECT_NE(a.block_digests[1], b.block_digests[1]);
}

TEST(PrefixChain, DerivedIdsFollowTheWholeEarlierContent) {
  // No hash ids: ids derived from the tokens, chained: block 1's id depends on block 0's tokens too.
  std::vector<model::Token> x = Tokens(24, 3), y = Tokens(24, 3);
  y[2] ^= 1;  // block 0 differs, blocks 1 and 2 are equal
  RequestPrefixChain a = PrefixChainOf(x, {}, 8, ""), b = PrefixChainOf(y, {}, 8, "");
  ASSERT_EQ(a.block_ids.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(a.block_ids[i], b.block_ids[i]) << i;
  EXPECT_EQ(a.block_digests[1], b.block_digests[1]);
  EXPECT_EQ(PrefixChainOf(x, {}, 8, "").block_ids, a.block_ids);  // deterministic
  // Given ids first, derived after them.
  RequestPrefixChain mixed = PrefixChainOf(x, std::vector<uint64_t>{5}, 8, "");
  EXPECT_EQ(mixed.block_ids[0], 5u);
  EXPECT_NE(mixed.block_ids[1], a.block_ids[1]);  // seeded by id 5, not by block 0's derived id
}

TEST(PrefixChain, BlocksCoveredCountsBlocksWhoseEveryRowIsInAPage) {
  // Pages of 4 rows, blocks of 6 tokens: block 0 = rows 0..5 (pages 0, 1), block 1 = rows 6..11 (pages 1, 2).
  EXPECT_EQ(BlocksCovered(std::vector<uint32_t>{0, 1, 2}, 4, 6, 2), 2u);
  EXPECT_EQ(BlocksCovered(std::vector<uint32_t>{0, 1}, 4, 6, 2), 1u);
  EXPECT_EQ(BlocksCovered(std::vector<uint32_t>{1, 2}, 4, 6, 2), 1u);
  EXPECT_EQ(BlocksCovered(std::vector<uint32_t>{0, 2}, 4, 6, 2), 0u);
  EXPECT_EQ(BlocksCovered(std::vector<uint32_t>{0, 1, 2}, 4, 6, 1), 1u);  // only `blocks` blocks are counted
  EXPECT_EQ(BlocksCovered(std::vector<uint32_t>{0}, 0, 6, 1), 0u);
}

TEST(PrefixRowCache, ATenantNeverSeesAnotherTenantsBlock) {
  PrefixRowCache cache(1000);
  PrefixBlock block;
  block.tokens = 4;
  block.rows = {std::vector<uint8_t>(4, 9)};
  const std::vector<uint64_t> chain = {1, 2};
  ASSERT_TRUE(cache.Insert(chain, 4, block, "a"));
  EXPECT_NE(cache.Find(chain, 4, "a"), nullptr);
  EXPECT_EQ(cache.Find(chain, 4, "b"), nullptr);
  EXPECT_EQ(cache.Find(chain, 4), nullptr);  // the default tenant is another tenant
  EXPECT_TRUE(cache.Insert(chain, 4, block, "b"));  // stored once per tenant
  EXPECT_EQ(cache.stats().blocks, 2u);
}

TEST(PrefixChainAdmit, TheAdmitRequestNamesTheChainOfTheInputExceptInResidentMode) {
  // A prepared prefix of 2 hash ids (blocks of 16) and 9 prompt bytes: input 41 tokens, 2 complete blocks.
  RequestBook book(0, ResumedOutputLimits{});
  wire::SubmitRequestT s;
  s.request = 1;
  s.hash_ids = {501, 502};
  s.prefix_block_tokens = 16;
  s.input_tokens = 41;
  s.prompt = std::vector<uint8_t>(9, 'q');
  s.max_new_tokens = 2;
  s.tenant = "t1";
  absl::StatusOr<RequestLife*> life = book.Open(s, ClientRef{"peer", 1}, false, 16);
  ASSERT_TRUE(life.ok()) << life.status();
  std::unique_ptr<WorkerRequest> r = NewWorkerRequest(**life, std::chrono::steady_clock::now());
  ASSERT_EQ(r->input.size(), 41u);
  wire::AdmitRequestT a;
  SetPrefixChain(*r, WorkerMode::kHisparse, a);
  EXPECT_EQ(a.tenant, "t1");
  EXPECT_EQ(a.prefix_block_ids, (std::vector<uint64_t>{501, 502}));
  EXPECT_EQ(a.prefix_block_tokens, 16u);
  ASSERT_EQ(a.prefix_block_digests.size(), 2u);
  EXPECT_EQ(a.prefix_block_digests[0], ExpectedDigest(r->input, 0, 16));
  EXPECT_EQ(a.prefix_block_digests[1], ExpectedDigest(r->input, 16, 16));
  // The record keeps the tenant: a resume names its chain under it.
  EXPECT_EQ(SubmitOfRecord(*RecordOf(**life, {}, {})).tenant, "t1");
  wire::AdmitRequestT resident;
  SetPrefixChain(*r, WorkerMode::kResident, resident);
  EXPECT_TRUE(resident.prefix_block_ids.empty());
  EXPECT_TRUE(resident.prefix_block_digests.empty());
}

}  // namespace
}  // namespace dhs
