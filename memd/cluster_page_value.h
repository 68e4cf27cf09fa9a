// memd/cluster_page_value.h: the value of one host page in the cluster tier (issue 26): what a node publishes to Redis
// and what an importing node checks before a single byte reaches its host pool.
//
// A value is a fixed 88-byte header followed by the page's bytes (payload), all integers little-endian.
// These numbers are written to a shared store read by other builds: they must not change (a change is a new
// kPageValueVersion, and a reader refuses any version but its own).
//
//   offset size field
//    0     4    magic            "DHSP" (0x50534844)
//    4     2    version          kPageValueVersion (1)
//    6     1    kind             PageValueKind (1 prefix page, 2 session page)
//    7     1    reserved         0
//    8     8    payload_bytes    bytes after the header (= geometry.host_page_bytes)
//   16     4    page_rows        p                                      .
//   20     4    payload_sources  L_pay                                  |
//   24     4    index_producers  L_idx                                  | PageGeometry: must equal the importer's
//   28     4    index_key_bytes  d_idx                                  | (brief §8; workerd/kv/layout.h KvLayout)
//   32     8    page_bytes       p * sum of d_KV (the payload rows)     |
//   40     8    layout_digest    LayoutDigest(row bytes, key bytes)     |
//   48     8    model            the model's fingerprint (0: unknown)   /
//   56     8    key              the page's address (prefix: memd/prefix_pages.h PrefixAddress::key; session: the
//                                session page's chain key, memd/cluster_keys.h)
//   64     8    content          what the page must hold (PrefixAddress::content; 0 when the kind has none)
//   72     8    page_checksum    PageChecksum(payload) (common/page_checksum.h: the host page's own checksum)
//   80     8    value_checksum   XXH3_64(bytes 0..79, seed kValueSeed)
//   88     -    payload          the host page: payload rows then index keys (docs/architecture.md "Host pages")
//
// The value checksum covers the header and, through page_checksum (an XXH3-64 of every payload byte), the payload:
// one pass over the payload checks it and yields the checksum the host pool keeps for the imported page.
//
// DecodePageValue checks, in this order, and answers the first failure (never reading outside `value`):
//   1 size < 88                          kTruncated
//   2 magic                              kBadMagic
//   3 version != kPageValueVersion       kWrongVersion
//   4 payload_bytes vs what follows      kTruncated (fewer bytes), kTrailingBytes (more)
//   5 value_checksum, then page_checksum kChecksumMismatch (a corrupted header or payload)
//   6 geometry                           kGeometryMismatch (another model, page size or layout)
//   7 kind, key and content              kAddressMismatch (a value stored under another page's key)
// Every failure is a miss for the caller (counted by reason), never an imported row.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace dhs::memd {

inline constexpr uint32_t kPageValueMagic = 0x50534844;  // "DHSP" as little-endian bytes
inline constexpr uint16_t kPageValueVersion = 1;
inline constexpr size_t kPageValueHeaderBytes = 88;
inline constexpr uint64_t kValueSeed = 0x44485356616c7565ull;  // "DHSValue"

enum class PageValueKind : uint8_t { kPrefix = 1, kSession = 2 };

// What fixes a host page's byte layout: two nodes exchange pages only when every field is equal.
struct PageGeometry {
  uint32_t page_rows = 0;         // p, rows per page
  uint32_t payload_sources = 0;   // L_pay
  uint32_t index_producers = 0;   // L_idx
  uint32_t index_key_bytes = 0;   // d_idx, bytes of one index key
  uint64_t page_bytes = 0;        // the payload rows of a page, bytes (p * sum of d_KV)
  uint64_t host_page_bytes = 0;   // the whole host page, bytes (page_bytes + p * L_idx * d_idx)
  uint64_t layout_digest = 0;     // LayoutDigest of the per-source row bytes and per-indexer key bytes
  uint64_t model = 0;             // the caller's fingerprint of the model (weights, config); 0 = not known
  bool operator==(const PageGeometry&) const = default;
};

// XXH3-64 of (le64 count, le64 each row_bytes[s], le64 count, le64 each key_bytes[i]): the order and sizes of the
// sources and indexers inside a page (workerd/kv/layout.h), which page_bytes alone does not fix.
uint64_t LayoutDigest(std::span<const uint64_t> row_bytes, std::span<const uint64_t> key_bytes);

// A short fingerprint of a geometry (XXH3-64 of its fields): the key schema's space (memd/cluster_keys.h).
uint64_t GeometryFingerprint(const PageGeometry& geometry);

// Who the page is: compared on decode with what the importer asked for.
struct PageIdentity {
  PageValueKind kind = PageValueKind::kPrefix;
  uint64_t key = 0;
  uint64_t content = 0;
  bool operator==(const PageIdentity&) const = default;
};

// Errors: InvalidArgument when payload.size() != geometry.host_page_bytes (nothing encoded).
absl::Status EncodePageValue(const PageGeometry& geometry, const PageIdentity& identity,
                             std::span<const uint8_t> payload, std::string* value);

enum class PageValueError : uint8_t {
  kOk = 0,
  kTruncated,
  kBadMagic,
  kWrongVersion,
  kTrailingBytes,
  kChecksumMismatch,
  kGeometryMismatch,
  kAddressMismatch,
};
inline constexpr size_t kPageValueErrors = 8;
std::string_view PageValueErrorName(PageValueError error);  // "ok", "truncated", ... (metric labels)

struct DecodedPageValue {
  PageValueError error = PageValueError::kOk;
  std::string detail;                   // what differed (empty when ok)
  std::span<const uint8_t> payload;     // into the decoded buffer; valid while it lives (empty unless ok)
  uint64_t page_checksum = 0;           // PageChecksum(payload) (0 unless ok)
  bool ok() const { return error == PageValueError::kOk; }
  // OkStatus, or DataLoss / FailedPrecondition (geometry, version) / NotFound (address) with the detail.
  absl::Status ToStatus() const;
};

// Checks `value` against the importer's geometry and the identity it looked up (see the header comment's order).
DecodedPageValue DecodePageValue(std::span<const uint8_t> value, const PageGeometry& geometry,
                                 const PageIdentity& expected);

}  // namespace dhs::memd
