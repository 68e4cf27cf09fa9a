// memd/cluster_page_value.cc: see cluster_page_value.h.
#include "memd/cluster_page_value.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "common/page_checksum.h"

namespace dhs::memd {
namespace {

void PutLe(uint8_t* at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLe(const uint8_t* at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{at[i]} << (8 * i);
  return v;
}
void Append64(std::string& out, uint64_t v) {
  uint8_t b[8];
  PutLe(b, v, 8);
  out.append(reinterpret_cast<const char*>(b), 8);
}

// Field offsets (the table of the header comment).
constexpr size_t kMagicAt = 0, kVersionAt = 4, kKindAt = 6, kReservedAt = 7, kPayloadBytesAt = 8, kPageRowsAt = 16,
                 kSourcesAt = 20, kIndexersAt = 24, kKeyBytesAt = 28, kPageBytesAt = 32, kLayoutAt = 40,
                 kModelAt = 48, kKeyAt = 56, kContentAt = 64, kPageChecksumAt = 72, kValueChecksumAt = 80;
static_assert(kValueChecksumAt + 8 == kPageValueHeaderBytes);

uint64_t HeaderChecksum(const uint8_t* header) { return XXH3_64bits_withSeed(header, kValueChecksumAt, kValueSeed); }

DecodedPageValue Fail(PageValueError error, std::string detail) {
  DecodedPageValue d;
  d.error = error;
  d.detail = std::move(detail);
  return d;
}

}  // namespace

uint64_t LayoutDigest(std::span<const uint64_t> row_bytes, std::span<const uint64_t> key_bytes) {
  std::string buf;
  Append64(buf, row_bytes.size());
  for (uint64_t b : row_bytes) Append64(buf, b);
  Append64(buf, key_bytes.size());
  for (uint64_t b : key_bytes) Append64(buf, b);
  return XXH3_64bits(buf.data(), buf.size());
}

uint64_t GeometryFingerprint(const PageGeometry& g) {
  std::string buf;
  for (uint64_t v : {uint64_t{g.page_rows}, uint64_t{g.payload_sources}, uint64_t{g.index_producers},
                     uint64_t{g.index_key_bytes}, g.page_bytes, g.host_page_bytes, g.layout_digest, g.model}) {
    Append64(buf, v);
  }
  return XXH3_64bits(buf.data(), buf.size());
}

absl::Status EncodePageValue(const PageGeometry& geometry, const PageIdentity& identity,
                             std::span<const uint8_t> payload, std::string* value) {
  if (payload.size() != geometry.host_page_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("page value: payload is %d bytes, the geometry's host page %d",
                                                      payload.size(), geometry.host_page_bytes));
  }
  uint8_t h[kPageValueHeaderBytes] = {};
  PutLe(h + kMagicAt, kPageValueMagic, 4);
  PutLe(h + kVersionAt, kPageValueVersion, 2);
  h[kKindAt] = static_cast<uint8_t>(identity.kind);
  h[kReservedAt] = 0;
  PutLe(h + kPayloadBytesAt, payload.size(), 8);
  PutLe(h + kPageRowsAt, geometry.page_rows, 4);
  PutLe(h + kSourcesAt, geometry.payload_sources, 4);
  PutLe(h + kIndexersAt, geometry.index_producers, 4);
  PutLe(h + kKeyBytesAt, geometry.index_key_bytes, 4);
  PutLe(h + kPageBytesAt, geometry.page_bytes, 8);
  PutLe(h + kLayoutAt, geometry.layout_digest, 8);
  PutLe(h + kModelAt, geometry.model, 8);
  PutLe(h + kKeyAt, identity.key, 8);
  PutLe(h + kContentAt, identity.content, 8);
  PutLe(h + kPageChecksumAt, PageChecksum(payload), 8);
  PutLe(h + kValueChecksumAt, HeaderChecksum(h), 8);
  value->assign(reinterpret_cast<const char*>(h), kPageValueHeaderBytes);
  value->append(reinterpret_cast<const char*>(payload.data()), payload.size());
  return absl::OkStatus();
}

std::string_view PageValueErrorName(PageValueError error) {
  switch (error) {
    case PageValueError::kOk: return "ok";
    case PageValueError::kTruncated: return "truncated";
    case PageValueError::kBadMagic: return "bad_magic";
    case PageValueError::kWrongVersion: return "wrong_version";
    case PageValueError::kTrailingBytes: return "trailing_bytes";
    case PageValueError::kChecksumMismatch: return "checksum_mismatch";
    case PageValueError::kGeometryMismatch: return "geometry_mismatch";
    case PageValueError::kAddressMismatch: return "address_mismatch";
  }
  return "unknown";
}

absl::Status DecodedPageValue::ToStatus() const {
  const std::string msg = absl::StrFormat("page value %s: %s", PageValueErrorName(error), detail);
  switch (error) {
    case PageValueError::kOk: return absl::OkStatus();
    case PageValueError::kWrongVersion:
    case PageValueError::kGeometryMismatch: return absl::FailedPreconditionError(msg);
    case PageValueError::kAddressMismatch: return absl::NotFoundError(msg);
    default: return absl::DataLossError(msg);
  }
}

DecodedPageValue DecodePageValue(std::span<const uint8_t> value, const PageGeometry& geometry,
                                 const PageIdentity& expected) {
  if (value.size() < kPageValueHeaderBytes) {
    return Fail(PageValueError::kTruncated, absl::StrFormat("%d bytes, shorter than the %d-byte header", value.size(),
                                                            kPageValueHeaderBytes));
  }
  const uint8_t* h = value.data();
  if (GetLe(h + kMagicAt, 4) != kPageValueMagic) {
    return Fail(PageValueError::kBadMagic, absl::StrFormat("magic 0x%08x", GetLe(h + kMagicAt, 4)));
  }
  if (GetLe(h + kVersionAt, 2) != kPageValueVersion) {
    return Fail(PageValueError::kWrongVersion,
                absl::StrFormat("version %d, this build reads %d", GetLe(h + kVersionAt, 2), kPageValueVersion));
  }
  const uint64_t payload_bytes = GetLe(h + kPayloadBytesAt, 8);
  const uint64_t follow = value.size() - kPageValueHeaderBytes;
  if (payload_bytes > follow) {
    return Fail(PageValueError::kTruncated,
                absl::StrFormat("header says %d payload bytes, %d follow", payload_bytes, follow));
  }
  if (payload_bytes < follow) {
    return Fail(PageValueError::kTrailingBytes,
                absl::StrFormat("header says %d payload bytes, %d follow", payload_bytes, follow));
  }
  if (HeaderChecksum(h) != GetLe(h + kValueChecksumAt, 8)) {
    return Fail(PageValueError::kChecksumMismatch, "the header's checksum differs");
  }
  const std::span<const uint8_t> payload = value.subspan(kPageValueHeaderBytes);
  const uint64_t page_checksum = PageChecksum(payload);
  if (page_checksum != GetLe(h + kPageChecksumAt, 8)) {
    return Fail(PageValueError::kChecksumMismatch, "the payload's checksum differs");
  }
  PageGeometry got;
  got.page_rows = static_cast<uint32_t>(GetLe(h + kPageRowsAt, 4));
  got.payload_sources = static_cast<uint32_t>(GetLe(h + kSourcesAt, 4));
  got.index_producers = static_cast<uint32_t>(GetLe(h + kIndexersAt, 4));
  got.index_key_bytes = static_cast<uint32_t>(GetLe(h + kKeyBytesAt, 4));
  got.page_bytes = GetLe(h + kPageBytesAt, 8);
  got.host_page_bytes = payload_bytes;
  got.layout_digest = GetLe(h + kLayoutAt, 8);
  got.model = GetLe(h + kModelAt, 8);
  if (!(got == geometry)) {
    return Fail(PageValueError::kGeometryMismatch,
                absl::StrFormat("published with p=%d sources=%d indexers=%d d_idx=%d page_bytes=%d host_page_bytes=%d "
                                "layout=%016x model=%016x; this node has p=%d sources=%d indexers=%d d_idx=%d "
                                "page_bytes=%d host_page_bytes=%d layout=%016x model=%016x",
                                got.page_rows, got.payload_sources, got.index_producers, got.index_key_bytes,
                                got.page_bytes, got.host_page_bytes, got.layout_digest, got.model, geometry.page_rows,
                                geometry.payload_sources, geometry.index_producers, geometry.index_key_bytes,
                                geometry.page_bytes, geometry.host_page_bytes, geometry.layout_digest,
                                geometry.model));
  }
  PageIdentity id;
  id.kind = static_cast<PageValueKind>(h[kKindAt]);
  id.key = GetLe(h + kKeyAt, 8);
  id.content = GetLe(h + kContentAt, 8);
  if (!(id == expected)) {
    return Fail(PageValueError::kAddressMismatch,
                absl::StrFormat("holds kind %d key %016x content %016x, asked for kind %d key %016x content %016x",
                                static_cast<int>(id.kind), id.key, id.content, static_cast<int>(expected.kind),
                                expected.key, expected.content));
  }
  DecodedPageValue d;
  d.payload = payload;
  d.page_checksum = page_checksum;
  return d;
}

}  // namespace dhs::memd
