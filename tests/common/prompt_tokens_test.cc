// tests/common/prompt_tokens_test.cc: the shared synthetic prompt generator (common/prompt_tokens.h) against an
// independent SplitMix64 written here from its published constants.
#include "common/prompt_tokens.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace dhs {
namespace {

uint64_t RefMix(uint64_t x) {  // SplitMix64 (Steele, Lea, Flood 2014)
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

TEST(PromptTokens, SplitMixMatchesTheReference) {
  // Known first output of SplitMix64 seeded with 0 (state 0 -> 0x9e3779b97f4a7c15 -> 0xe220a8397b1dcdaf).
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafULL);
  for (uint64_t x : {1ull, 42ull, 0xffffffffffffffffull}) EXPECT_EQ(SplitMix64(x), RefMix(x));
}

TEST(PromptTokens, BlocksThenPrivateTokens) {
  const std::vector<uint64_t> ids = {7, 9};
  // 2 blocks of 4 cover 8 of 11 tokens; the last 3 are private to seed 5.
  const std::vector<uint8_t> t = SyntheticPromptTokens(ids, 4, 11, 5, 0, 11);
  ASSERT_EQ(t.size(), 11u);
  for (uint64_t j = 0; j < 4; ++j) {
    EXPECT_EQ(t[j], static_cast<uint8_t>(RefMix(RefMix(7) + j) >> 56));
    EXPECT_EQ(t[4 + j], static_cast<uint8_t>(RefMix(RefMix(9) + j) >> 56));
  }
  for (uint64_t p = 8; p < 11; ++p) {
    EXPECT_EQ(t[p], static_cast<uint8_t>(RefMix(RefMix(5 ^ 0x5265717565737400ULL) + p) >> 56));
  }
  // A sub-range equals the slice of the whole.
  const std::vector<uint8_t> mid = SyntheticPromptTokens(ids, 4, 11, 5, 3, 9);
  EXPECT_EQ(mid, std::vector<uint8_t>(t.begin() + 3, t.begin() + 9));
}

TEST(PromptTokens, SharedIdsShareTokensAndPrivatePartsDiffer) {
  const std::vector<uint64_t> a = {1, 2, 3}, b = {1, 2, 4};
  const auto ta = SyntheticPromptTokens(a, 16, 60, 100, 0, 60);
  const auto tb = SyntheticPromptTokens(b, 16, 60, 101, 0, 60);
  EXPECT_EQ(std::vector<uint8_t>(ta.begin(), ta.begin() + 32), std::vector<uint8_t>(tb.begin(), tb.begin() + 32));
  EXPECT_NE(std::vector<uint8_t>(ta.begin() + 32, ta.begin() + 48),
            std::vector<uint8_t>(tb.begin() + 32, tb.begin() + 48));
  EXPECT_NE(std::vector<uint8_t>(ta.begin() + 48, ta.end()), std::vector<uint8_t>(tb.begin() + 48, tb.end()));
  // A block of a smaller block size is the prefix of the same id's larger block.
  const auto small = SyntheticPromptTokens(a, 5, 5, 0, 0, 5);
  EXPECT_EQ(small, std::vector<uint8_t>(ta.begin(), ta.begin() + 5));
}

TEST(PromptTokens, CoveredTokens) {
  EXPECT_EQ(PrefixCoveredTokens(0, 512, 100), 0u);
  EXPECT_EQ(PrefixCoveredTokens(1, 512, 100), 100u);   // one partial block covers the whole input
  EXPECT_EQ(PrefixCoveredTokens(2, 51, 110), 102u);    // the rest is prompt
  EXPECT_EQ(PrefixCoveredTokens(3, 51, 110), 110u);
  EXPECT_EQ(PrefixCoveredTokens(9, 51, 110), 110u);    // more ids than blocks: clipped (validation rejects it)
  EXPECT_EQ(PrefixCoveredTokens(2, 0, 110), 0u);
}

}  // namespace
}  // namespace dhs
