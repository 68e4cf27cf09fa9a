// Issue 26 (sessions across nodes): common/session_digest.h, the page digests of a session's history.
#include "common/session_digest.h"

#include <xxhash.h>

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace dhs {
namespace {

// The chain written out independently of the implementation's loop.
uint64_t Start(uint32_t p) {
  const uint8_t b[4] = {static_cast<uint8_t>(p), static_cast<uint8_t>(p >> 8), static_cast<uint8_t>(p >> 16),
                        static_cast<uint8_t>(p >> 24)};
  return XXH3_64bits_withSeed(b, 4, kSessionDigestSeed);
}

TEST(SessionDigestTest, ChainOfXxh3OverCompletePages) {
  std::vector<uint8_t> tokens(10);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint8_t>(3 * i + 1);
  const std::vector<uint64_t> d = SessionPageDigests(tokens, 4);
  ASSERT_EQ(d.size(), 2u);  // 10 tokens: pages [0,4) and [4,8) complete, [8,10) not
  const uint64_t d0 = XXH3_64bits_withSeed(tokens.data(), 4, Start(4));
  EXPECT_EQ(d[0], d0);
  EXPECT_EQ(d[1], XXH3_64bits_withSeed(tokens.data() + 4, 4, d0));
}

TEST(SessionDigestTest, EqualPrefixesShareDigestsUpToTheFirstDifferentPage) {
  std::vector<uint8_t> a(64), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
  b = a;
  b[40] ^= 1;  // page 2 of 16-token pages differs
  const std::vector<uint64_t> da = SessionPageDigests(a, 16), db = SessionPageDigests(b, 16);
  ASSERT_EQ(da.size(), 4u);
  ASSERT_EQ(db.size(), 4u);
  EXPECT_EQ(da[0], db[0]);
  EXPECT_EQ(da[1], db[1]);
  EXPECT_NE(da[2], db[2]);
  EXPECT_NE(da[3], db[3]);  // a page's digest covers everything before it
  // A next turn whose prompt is the previous turn's history plus more tokens names the same pages.
  std::vector<uint8_t> longer = a;
  longer.insert(longer.end(), {1, 2, 3, 4, 5});
  const std::vector<uint64_t> dl = SessionPageDigests(longer, 16);
  EXPECT_EQ(std::vector<uint64_t>(dl.begin(), dl.begin() + 4), da);
}

TEST(SessionDigestTest, PageSizeIsPartOfTheDigest) {
  std::vector<uint8_t> tokens(32, 9);
  EXPECT_NE(SessionPageDigests(tokens, 16)[0], SessionPageDigests(tokens, 8)[1]);  // same 16 tokens, other p
  EXPECT_TRUE(SessionPageDigests(tokens, 0).empty());
  EXPECT_TRUE(SessionPageDigests(std::vector<uint8_t>(15, 9), 16).empty());
}

TEST(SessionDigestTest, ModelTokensAreTheirBytes) {
  const std::vector<int32_t> model_tokens = {1, 2, 255, 0, 7, 8, 9, 10};
  const std::vector<uint8_t> bytes = {1, 2, 255, 0, 7, 8, 9, 10};
  EXPECT_EQ(SessionPageDigests(std::span<const int32_t>(model_tokens), 4), SessionPageDigests(bytes, 4));
}

}  // namespace
}  // namespace dhs
