// tests/workerd/logits_digest_test.cc: LogitsDigest (workerd/serving.h), the per-token digest the exactness check
// compares (docs/protocol.md: FNV-1a 64 over the bit patterns of the floats, each float's 4 bytes little-endian, in
// order). Expected values come from a byte-wise FNV-1a written here and checked against published test vectors, fed
// with bytes built from the bit patterns by shifts (not by copying floats).
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "workerd/serving.h"

namespace dhs {
namespace {

uint64_t Fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 14695981039346656037ULL;  // offset basis
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 1099511628211ULL;  // FNV 64 prime
  }
  return h;
}

std::vector<uint8_t> Bytes(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// Little-endian bytes of the given bit patterns, and the floats that have them.
std::vector<uint8_t> LeBytes(const std::vector<uint32_t>& bits) {
  std::vector<uint8_t> out;
  for (uint32_t b : bits) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(b >> (8 * i)));
  }
  return out;
}
std::vector<float> Floats(const std::vector<uint32_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) std::memcpy(&out[i], &bits[i], 4);
  return out;
}

TEST(LogitsDigest, ReferenceFnv1aMatchesPublishedVectors) {
  EXPECT_EQ(Fnv1a64({}), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64(Bytes("a")), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64(Bytes("foobar")), 0x85944171f73967e8ULL);
}

TEST(LogitsDigest, SeveralFloatsAreHashedInOrderByTheirBits) {
  // 1.0f, -2.0f, a quiet NaN with payload 1, the smallest subnormal, +inf, 3.14159274f.
  const std::vector<uint32_t> bits = {0x3f800000u, 0xc0000000u, 0x7fc00001u, 0x00000001u, 0x7f800000u, 0x40490fdbu};
  EXPECT_EQ(LogitsDigest(Floats(bits)), Fnv1a64(LeBytes(bits)));
  // The bytes "foobar\0\0" as two floats: 'f','o','o','b' little-endian = 0x626f6f66.
  const std::vector<uint32_t> foobar = {0x626f6f66u, 0x00007261u};
  EXPECT_EQ(LogitsDigest(Floats(foobar)), Fnv1a64(LeBytes(foobar)));
  EXPECT_EQ(Fnv1a64(LeBytes(foobar)), Fnv1a64({'f', 'o', 'o', 'b', 'a', 'r', 0, 0}));
  // A whole vocabulary row (256 logits).
  std::vector<uint32_t> row(256);
  uint32_t x = 12345;
  for (uint32_t& b : row) {
    x = x * 1103515245u + 12345u;
    b = 0x3c000000u | (x >> 8);  // positive finite floats with varied mantissas
  }
  EXPECT_EQ(LogitsDigest(Floats(row)), Fnv1a64(LeBytes(row)));
}

TEST(LogitsDigest, EqualValuesWithDifferentBitsDiffer) {
  // +0 == -0 as values, and NaNs never compare equal, but the digest is of the bits.
  EXPECT_NE(LogitsDigest(Floats({0x00000000u, 0x3f800000u})), LogitsDigest(Floats({0x80000000u, 0x3f800000u})));
  EXPECT_NE(LogitsDigest(Floats({0x7fc00000u})), LogitsDigest(Floats({0x7fc00001u})));  // NaN payloads
  EXPECT_NE(LogitsDigest(Floats({0x7fc00000u})), LogitsDigest(Floats({0xffc00000u})));  // NaN signs
  // The same NaN bits give the same digest.
  EXPECT_EQ(LogitsDigest(Floats({0x7fc00123u, 0x1u})), LogitsDigest(Floats({0x7fc00123u, 0x1u})));
}

TEST(LogitsDigest, OrderMatters) {
  const std::vector<uint32_t> ab = {0x3f800000u, 0x40000000u}, ba = {0x40000000u, 0x3f800000u};
  EXPECT_NE(LogitsDigest(Floats(ab)), LogitsDigest(Floats(ba)));
  EXPECT_EQ(LogitsDigest(Floats(ba)), Fnv1a64(LeBytes(ba)));
}

TEST(LogitsDigest, EveryBitOfEveryLogitChangesTheDigest) {
  std::vector<uint32_t> row(256);
  for (uint32_t i = 0; i < row.size(); ++i) row[i] = 0x3f800000u + i * 977u;
  const uint64_t base = LogitsDigest(Floats(row));
  int same = 0;
  for (size_t i = 0; i < row.size(); ++i) {
    for (int bit = 0; bit < 32; ++bit) {
      std::vector<uint32_t> flipped = row;
      flipped[i] ^= 1u << bit;
      same += LogitsDigest(Floats(flipped)) == base;
    }
  }
  EXPECT_EQ(same, 0);  // FNV-1a: one changed input byte always changes the 64-bit state
}

}  // namespace
}  // namespace dhs
