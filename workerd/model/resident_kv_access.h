// workerd/model/resident_kv_access.h: the `resident` KvAccess: every row of every source in one arena.
//
// Owns one byte arena split into pages of `page_rows` rows (page bytes = page_rows * the largest row of any source);
// each (request, source) holds a list of pages filled in position order. Fetch only looks rows up, so this is the
// exactness oracle of brief §7 (hierarchical serving must match it bit for bit). Release returns a request's pages.
// Thread-safety: none; one worker thread drives it (workerd/kv_access.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "workerd/kv_access.h"
#include "workerd/model/config.h"

namespace dhs::model {

class ResidentKvAccess final : public KvAccess {
 public:
  // row_bytes[s]: bytes of one row of source s (> 0). arena_bytes: the arena size (rounded down to whole pages of
  // page_rows rows of the widest source). memory: empty: the arena is allocated here; else the caller's memory of at
  // least arena_bytes bytes (libdhs's resident mode: the engine's pool or the device region, so that a row's location
  // is an offset into it), which must outlive this object.
  ResidentKvAccess(std::vector<size_t> row_bytes, size_t arena_bytes, size_t page_rows = 64,
                   std::span<uint8_t> memory = {});
  // Every source of `config` with its d_KV (config.row_bytes()).
  static std::unique_ptr<ResidentKvAccess> ForModel(const ModelConfig& config, size_t arena_bytes,
                                                    size_t page_rows = 64);

  // Errors: INVALID_ARGUMENT (unknown source, row size != row_bytes(source), position != appended length),
  // RESOURCE_EXHAUSTED (no free page).
  absl::Status Append(RequestId request, SourceId source, Position position, std::span<const uint8_t> row) override;
  // Fills rows_out with pointers into the arena. Errors (the batch is checked whole before any output is written):
  // INVALID_ARGUMENT (unknown source, rows_out size != sources * selection size, a selected position < -1 or not yet
  // appended for one of the sources).
  absl::Status Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) override;
  void ReadersDone(std::span<const SourceId> sources) override {}
  void Release(RequestId request) override;
  // Speculative rounds (KvAccess): nothing is ever published here, so the hold only records `from`;
  // CommitVerified drops rows >= length and returns pages no longer used to the free stack.
  absl::Status HoldUnverified(RequestId request, Position from) override;
  absl::Status CommitVerified(RequestId request, Position length) override;

  // Rows appended so far for (request, source); 0 for an unknown request.
  Position appended_rows(RequestId request, SourceId source) const;
  // HoldUnverified's `from` until CommitVerified (or Release); -1 when `request` holds no round.
  Position held_from(RequestId request) const {
    auto it = held_.find(request);
    return it == held_.end() ? kNoPosition : it->second;
  }
  size_t free_pages() const { return free_pages_.size(); }
  size_t total_pages() const { return total_pages_; }

 private:
  struct Stream {
    std::vector<uint32_t> pages;
    Position rows = 0;
  };
  const uint8_t* RowAt(const Stream& stream, SourceId source, Position position) const;

  std::vector<size_t> row_bytes_;
  size_t page_rows_;
  size_t page_bytes_;
  size_t total_pages_;
  std::unique_ptr<uint8_t[]> owned_;  // the arena when allocated here
  uint8_t* arena_ = nullptr;
  std::vector<uint32_t> free_pages_;  // a stack: the most recently freed page is reused first
  absl::flat_hash_map<RequestId, std::vector<Stream>> streams_;  // per request: one stream per source
  absl::flat_hash_map<RequestId, Position> held_;  // HoldUnverified's `from`, until CommitVerified
};

}  // namespace dhs::model
