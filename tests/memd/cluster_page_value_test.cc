// tests/memd/cluster_page_value_test.cc: the cluster tier's page value format (memd/cluster_page_value.h): the byte
// layout read back field by field (offsets from the header comment, checksums recomputed here with libxxhash), a round
// trip, each distinct error, and every truncation / every single-byte corruption of a value (never a read past the
// buffer: each case decodes a vector of exactly that size, which ASan builds check).
#include "memd/cluster_page_value.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <set>
#include <string>
#include <vector>

namespace dhs::memd {
namespace {

uint64_t Le(const std::string& v, size_t at, int bytes) {
  uint64_t x = 0;
  for (int i = 0; i < bytes; ++i) x |= uint64_t{static_cast<uint8_t>(v[at + i])} << (8 * i);
  return x;
}

PageGeometry Geometry() {
  PageGeometry g;
  g.page_rows = 4;
  g.payload_sources = 2;
  g.index_producers = 1;
  g.index_key_bytes = 8;
  g.page_bytes = 4 * (16 + 24);  // p * (d_KV of source 0 + source 1)
  g.host_page_bytes = g.page_bytes + 4 * 1 * 8;
  const uint64_t rows[] = {16, 24}, keys[] = {8};
  g.layout_digest = LayoutDigest(rows, keys);
  g.model = 0x1234;
  return g;
}

std::vector<uint8_t> Payload(const PageGeometry& g, uint32_t seed) {
  std::vector<uint8_t> p(g.host_page_bytes);
  std::mt19937 rng(seed);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

const PageIdentity kId{PageValueKind::kPrefix, 0xabcdef0123456789ull, 0x1111222233334444ull};

TEST(ClusterPageValue, LayoutFieldByField) {
  const PageGeometry g = Geometry();
  const std::vector<uint8_t> payload = Payload(g, 1);
  std::string v;
  ASSERT_TRUE(EncodePageValue(g, kId, payload, &v).ok());
  ASSERT_EQ(v.size(), 88 + g.host_page_bytes);
  EXPECT_EQ(v.substr(0, 4), "DHSP");
  EXPECT_EQ(Le(v, 4, 2), 1u);
  EXPECT_EQ(Le(v, 6, 1), 1u);
  EXPECT_EQ(Le(v, 7, 1), 0u);
  EXPECT_EQ(Le(v, 8, 8), g.host_page_bytes);
  EXPECT_EQ(Le(v, 16, 4), 4u);
  EXPECT_EQ(Le(v, 20, 4), 2u);
  EXPECT_EQ(Le(v, 24, 4), 1u);
  EXPECT_EQ(Le(v, 28, 4), 8u);
  EXPECT_EQ(Le(v, 32, 8), 160u);
  EXPECT_EQ(Le(v, 40, 8), g.layout_digest);
  EXPECT_EQ(Le(v, 48, 8), 0x1234u);
  EXPECT_EQ(Le(v, 56, 8), kId.key);
  EXPECT_EQ(Le(v, 64, 8), kId.content);
  EXPECT_EQ(Le(v, 72, 8), XXH3_64bits(payload.data(), payload.size()));  // the host page's checksum (seed 0)
  EXPECT_EQ(Le(v, 80, 8), XXH3_64bits_withSeed(v.data(), 80, 0x44485356616c7565ull));
  EXPECT_EQ(v.substr(88), std::string(payload.begin(), payload.end()));
  // The layout digest: XXH3 of le64 counts and sizes.
  std::string buf;
  for (uint64_t x : {2ull, 16ull, 24ull, 1ull, 8ull}) {
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<char>(x >> (8 * i)));
  }
  EXPECT_EQ(g.layout_digest, XXH3_64bits(buf.data(), buf.size()));
}

TEST(ClusterPageValue, RoundTripGivesThePayloadAndItsChecksum) {
  const PageGeometry g = Geometry();
  const std::vector<uint8_t> payload = Payload(g, 2);
  std::string v;
  ASSERT_TRUE(EncodePageValue(g, kId, payload, &v).ok());
  const DecodedPageValue d = DecodePageValue(Bytes(v), g, kId);
  ASSERT_TRUE(d.ok()) << d.detail;
  EXPECT_TRUE(d.ToStatus().ok());
  EXPECT_EQ(std::vector<uint8_t>(d.payload.begin(), d.payload.end()), payload);
  EXPECT_EQ(d.page_checksum, XXH3_64bits(payload.data(), payload.size()));
}

TEST(ClusterPageValue, EncodeRefusesAPayloadOfAnotherSize) {
  const PageGeometry g = Geometry();
  std::vector<uint8_t> payload(g.host_page_bytes - 1);
  std::string v = "untouched";
  EXPECT_EQ(EncodePageValue(g, kId, payload, &v).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v, "untouched");
}

TEST(ClusterPageValue, DistinctErrors) {
  const PageGeometry g = Geometry();
  std::string v;
  ASSERT_TRUE(EncodePageValue(g, kId, Payload(g, 3), &v).ok());
  auto decode = [&](const std::string& value, const PageGeometry& geometry = Geometry(),
                    const PageIdentity& id = kId) {
    return DecodePageValue(Bytes(value), geometry, id).error;
  };
  EXPECT_EQ(decode(v.substr(0, 87)), PageValueError::kTruncated);
  EXPECT_EQ(decode(v.substr(0, v.size() - 1)), PageValueError::kTruncated);
  EXPECT_EQ(decode(v + "x"), PageValueError::kTrailingBytes);
  std::string bad = v;
  bad[0] = 'X';
  EXPECT_EQ(decode(bad), PageValueError::kBadMagic);
  bad = v;
  bad[4] = 2;
  EXPECT_EQ(decode(bad), PageValueError::kWrongVersion);
  bad = v;
  bad[100] ^= 1;  // a payload byte
  EXPECT_EQ(decode(bad), PageValueError::kChecksumMismatch);
  bad = v;
  bad[60] ^= 1;  // a header byte (the key)
  EXPECT_EQ(decode(bad), PageValueError::kChecksumMismatch);
  PageGeometry other = g;
  other.model = 0x9999;
  EXPECT_EQ(decode(v, other), PageValueError::kGeometryMismatch);
  other = g;
  const uint64_t rows[] = {24, 16}, keys[] = {8};  // same sizes, other order of sources
  other.layout_digest = LayoutDigest(rows, keys);
  EXPECT_EQ(decode(v, other), PageValueError::kGeometryMismatch);
  PageIdentity id = kId;
  id.content ^= 1;  // the same key with other content: never imported
  EXPECT_EQ(decode(v, g, id), PageValueError::kAddressMismatch);
  id = kId;
  id.kind = PageValueKind::kSession;
  EXPECT_EQ(decode(v, g, id), PageValueError::kAddressMismatch);
  // A page published by a node of another geometry (another page size): decoded as such, refused here.
  PageGeometry bigger = g;
  bigger.page_rows = 8;
  bigger.page_bytes *= 2;
  bigger.host_page_bytes *= 2;
  std::string theirs;
  ASSERT_TRUE(EncodePageValue(bigger, kId, Payload(bigger, 4), &theirs).ok());
  const DecodedPageValue d = DecodePageValue(Bytes(theirs), g, kId);
  EXPECT_EQ(d.error, PageValueError::kGeometryMismatch);
  EXPECT_EQ(d.ToStatus().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(d.payload.empty());
  EXPECT_EQ(DecodePageValue(Bytes(v.substr(0, 10)), g, kId).ToStatus().code(), absl::StatusCode::kDataLoss);
}

// Every prefix of a value is truncated; every single-byte change is refused (never ok, never a read past the end).
TEST(ClusterPageValue, EveryTruncationAndEveryByteFlipIsRefused) {
  const PageGeometry g = Geometry();
  std::string v;
  ASSERT_TRUE(EncodePageValue(g, kId, Payload(g, 5), &v).ok());
  for (size_t n = 0; n < v.size(); ++n) {
    const std::vector<uint8_t> cut(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
    const DecodedPageValue d = DecodePageValue(cut, g, kId);
    EXPECT_FALSE(d.ok()) << n;
    if (n >= 88) {
      EXPECT_EQ(d.error, PageValueError::kTruncated) << n;
    }
  }
  std::mt19937 rng(7);
  for (size_t at = 0; at < v.size(); ++at) {
    std::vector<uint8_t> flipped(v.begin(), v.end());
    flipped[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    const DecodedPageValue d = DecodePageValue(flipped, g, kId);
    EXPECT_FALSE(d.ok()) << at;
    EXPECT_NE(d.error, PageValueError::kGeometryMismatch) << at;  // the checksum catches it first
    EXPECT_NE(d.error, PageValueError::kAddressMismatch) << at;
  }
  // Random buffers of random sizes: never ok.
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> junk(rng() % 400);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    if (junk.size() >= 8 && i % 2 == 0) std::copy(v.begin(), v.begin() + 8, junk.begin());  // a valid start
    EXPECT_FALSE(DecodePageValue(junk, g, kId).ok());
  }
}

TEST(ClusterPageValue, ErrorNamesAreDistinct) {
  std::set<std::string_view> names;
  for (size_t e = 0; e < kPageValueErrors; ++e) names.insert(PageValueErrorName(static_cast<PageValueError>(e)));
  EXPECT_EQ(names.size(), kPageValueErrors);
  EXPECT_FALSE(names.contains("unknown"));
}

TEST(ClusterPageValue, GeometryFingerprintSeesEveryField) {
  const PageGeometry g = Geometry();
  std::set<uint64_t> prints{GeometryFingerprint(g)};
  for (int f = 0; f < 8; ++f) {
    PageGeometry h = g;
    switch (f) {
      case 0: ++h.page_rows; break;
      case 1: ++h.payload_sources; break;
      case 2: ++h.index_producers; break;
      case 3: ++h.index_key_bytes; break;
      case 4: ++h.page_bytes; break;
      case 5: ++h.host_page_bytes; break;
      case 6: ++h.layout_digest; break;
      case 7: ++h.model; break;
    }
    prints.insert(GeometryFingerprint(h));
  }
  EXPECT_EQ(prints.size(), 9u);
}

}  // namespace
}  // namespace dhs::memd
