// common/host_pool.h: one segment of the host tier (brief §3): a POSIX shared-memory object of
// fixed-size host pages, created by memd (the owner) and mapped read/write by workers (peers), on
// Boost.Interprocess. Workers pin the mapping (cudaHostRegister) themselves.
//
// Layout (header version 2): a header of kHostPoolHeaderBytes (magic, version, page_bytes, pages, the
// journal's size and the owner tag), then the journal region (journal_bytes rounded up to 4096; memd's
// page-ownership journal, memd/host_journal.h; 0 bytes when none), then `pages` pages of `page_bytes`
// bytes; page i starts at byte offset PageOffset(i). The segment outlives every process that maps it
// (a worker may die, memd may die: a restarted memd opens it again); only Remove() deletes it.
//
// Thread-safety: a HostPoolSegment is immutable after Create/Open and its methods are
// thread-safe; the bytes of the pages are not synchronised (callers own that, brief §4 orders).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace boost::interprocess {
class mapped_region;
}

namespace dhs {

// A host page: segment index (as listed in HelloReply.segments) + page index in that segment.
struct HostPageRef {
  uint32_t segment = 0;
  PageIndex page = 0;
  friend bool operator==(const HostPageRef&, const HostPageRef&) = default;
};

// Bytes reserved at the start of a segment for the header; pages start after it (page-aligned).
inline constexpr uint64_t kHostPoolHeaderBytes = 4096;
inline constexpr uint64_t kHostPoolMagic = 0x4448535f484f5354ull;  // "DHS_HOST"; must not change
inline constexpr uint32_t kHostPoolVersion = 2;                     // header layout version (2: journal, tag)
// The longest owner tag a header holds (memd writes the canonical run directory), bytes.
inline constexpr size_t kHostPoolMaxTagBytes = 3072;

// What a segment holds besides its pages (HostPoolSegment::Create).
struct HostPoolExtras {
  uint64_t journal_bytes = 0;  // size of the journal region (rounded up to 4096 in the layout)
  std::string owner_tag;       // free text kept in the header (memd: its canonical run directory), <= kHostPoolMaxTagBytes
};
// The filesystem behind POSIX shared memory on Linux (shm_open); Create checks its free space.
inline constexpr char kHostPoolShmDir[] = "/dev/shm";

// OK when a segment of `size` bytes named `shm_name` fits in the free space of kHostPoolShmDir (statvfs f_bavail *
// f_frsize) plus `released` bytes (those of a segment that would be removed first: memd replacing a leftover pool,
// issue 22), or when that space cannot be queried (posix_fallocate decides then); RESOURCE_EXHAUSTED naming the sizes
// and the fix otherwise. HostPoolSegment::Create checks it first; memd --check-config too (dhs-node --check).
absl::Status CheckFreeSpace(const std::string& shm_name, uint64_t size, uint64_t released = 0);

class HostPoolSegment {
 public:
  // Creates shm object `name` (plain name, no '/', 1..200 chars) with mode 0600, sized
  // kHostPoolHeaderBytes + pages * page_bytes, and reserves every page with posix_fallocate, so an
  // over-committed /dev/shm fails here (RESOURCE_EXHAUSTED) instead of with SIGBUS later. A size above
  // the free space of kHostPoolShmDir (statvfs f_bavail * f_frsize) fails at once, before the object
  // is created, with a message naming both sizes; nothing is left behind on any failure.
  // page_bytes must be a positive multiple of 64; pages > 0. An existing object -> ALREADY_EXISTS.
  // `extras`: a journal region (zeroed) and an owner tag; INVALID_ARGUMENT for a tag over kHostPoolMaxTagBytes.
  static absl::StatusOr<std::unique_ptr<HostPoolSegment>> Create(std::string_view name, uint64_t page_bytes,
                                                                 uint64_t pages, const HostPoolExtras& extras = {});
  // The bytes Create(name, page_bytes, pages, extras) makes: the header, the journal region (rounded up to 4096),
  // then the pages; 0 when they overflow a file size. Create's layout: memd checks the free space with it before it
  // replaces a leftover segment (issue 22).
  static uint64_t SizeFor(uint64_t page_bytes, uint64_t pages, const HostPoolExtras& extras = {});
  // Maps an existing segment read/write and validates its header: missing -> NOT_FOUND,
  // garbage or truncated -> DATA_LOSS.
  static absl::StatusOr<std::unique_ptr<HostPoolSegment>> Open(std::string_view name);
  // Deletes the shm object (mappings stay valid until unmapped). Missing -> NOT_FOUND.
  static absl::Status Remove(std::string_view name);

  ~HostPoolSegment();  // unmaps; never removes the object
  HostPoolSegment(const HostPoolSegment&) = delete;
  HostPoolSegment& operator=(const HostPoolSegment&) = delete;

  const std::string& name() const { return name_; }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t pages() const { return pages_; }
  uint64_t size_bytes() const { return pages_offset_ + pages_ * page_bytes_; }
  // The journal region (empty when the segment has none): journal_bytes rounded up to 4096.
  std::span<uint8_t> journal() const { return {base_ + kHostPoolHeaderBytes, pages_offset_ - kHostPoolHeaderBytes}; }
  // The owner tag written by Create (memd: the canonical run directory).
  const std::string& owner_tag() const { return owner_tag_; }

  // Byte offset of `page` from the start of the segment; OUT_OF_RANGE when page >= pages().
  absl::StatusOr<uint64_t> PageOffset(PageIndex page) const;
  // Start of `page` (page_bytes() bytes); OUT_OF_RANGE when page >= pages().
  absl::StatusOr<uint8_t*> PageData(PageIndex page) const;
  // Start of the mapping (header included), for pinning the whole segment.
  uint8_t* base() const { return base_; }

 private:
  HostPoolSegment(std::string name, std::unique_ptr<boost::interprocess::mapped_region> region);
  std::string name_;
  std::unique_ptr<boost::interprocess::mapped_region> region_;
  uint8_t* base_ = nullptr;
  uint64_t page_bytes_ = 0;
  uint64_t pages_ = 0;
  uint64_t pages_offset_ = kHostPoolHeaderBytes;
  std::string owner_tag_;
};

}  // namespace dhs
