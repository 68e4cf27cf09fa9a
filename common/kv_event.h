// common/kv_event.h: one KV event (issue 24; brief §12 "KV event"): a block of a prefix chain stored in or removed
// from a medium, or every block of a medium cleared. The value memd's decision core emits (memd/kv_block_ledger.h)
// and the stream carries (common/kv_event_stream.h, schemas/kv_events.fbs); the shape of vLLM's KV events
// (BlockStored / BlockRemoved / AllBlocksCleared with a medium), one block per event.
//
// Header only, no dependencies: the pure core includes it. Thread-safety: a value.
#pragma once

#include <cstdint>
#include <string_view>

namespace dhs {

// Values are the wire's (schemas/kv_events.fbs KvMedium): must not change.
enum class KvMedium : uint8_t { kGpu = 0, kHost = 1, kCluster = 2 };
// Values are the wire's (KvEventKind): must not change.
enum class KvEventKind : uint8_t { kBlockStored = 0, kBlockRemoved = 1, kAllBlocksCleared = 2 };

inline std::string_view KvMediumName(KvMedium m) {
  switch (m) {
    case KvMedium::kGpu: return "gpu";
    case KvMedium::kHost: return "host";
    case KvMedium::kCluster: return "cluster";
  }
  return "unknown";
}
inline std::string_view KvEventKindName(KvEventKind k) {
  switch (k) {
    case KvEventKind::kBlockStored: return "stored";
    case KvEventKind::kBlockRemoved: return "removed";
    case KvEventKind::kAllBlocksCleared: return "cleared";
  }
  return "unknown";
}

struct KvEvent {
  KvEventKind kind = KvEventKind::kBlockStored;
  KvMedium medium = KvMedium::kHost;
  uint64_t tenant = 0;        // the tenant salt's hash t (memd/prefix_pages.h); 0 with kAllBlocksCleared
  uint64_t block_hash = 0;    // c_b: the block chain hash up to this block
  uint64_t parent_hash = 0;   // c_{b-1}; t for the first block (c_{-1} = t)
  uint32_t blocks = 0;        // b + 1
  uint32_t block_tokens = 0;  // tokens (rows) per block
  uint32_t pages = 0;         // host pages of the block (those whose last row lies in it)
  uint32_t page_rows = 0;     // rows per page
  bool operator==(const KvEvent&) const = default;
};

}  // namespace dhs
