#include "common/host_pool.h"

#include <fcntl.h>
#include <sys/statvfs.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "boost/interprocess/exceptions.hpp"
#include "boost/interprocess/mapped_region.hpp"
#include "boost/interprocess/permissions.hpp"
#include "boost/interprocess/shared_memory_object.hpp"

namespace dhs {
namespace {

namespace bip = boost::interprocess;

// The header at offset 0 of a segment. Field order and sizes must not change (kHostPoolVersion).
struct SegmentHeader {
  uint64_t magic;       // kHostPoolMagic, written last by Create
  uint32_t version;     // kHostPoolVersion
  uint32_t reserved;
  uint64_t page_bytes;  // bytes per page
  uint64_t pages;       // pages in the segment
  uint64_t header_bytes;  // kHostPoolHeaderBytes
  uint64_t pages_offset;  // version 2: kHostPoolHeaderBytes + the journal region
  uint64_t tag_bytes;     // version 2: bytes of the owner tag that follows
  char tag[kHostPoolMaxTagBytes];
};
static_assert(sizeof(SegmentHeader) <= kHostPoolHeaderBytes);

absl::Status CheckName(std::string_view name) {
  if (name.empty() || name.size() > 200 || name.find('/') != std::string_view::npos || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("bad host pool segment name '", std::string(name), "'"));
  }
  return absl::OkStatus();
}

absl::Status FromInterprocess(const bip::interprocess_exception& e, std::string_view what) {
  const std::string msg = absl::StrCat(std::string(what), ": ", e.what());
  switch (e.get_error_code()) {
    case bip::already_exists_error: return absl::AlreadyExistsError(msg);
    case bip::not_found_error: return absl::NotFoundError(msg);
    case bip::security_error: return absl::PermissionDeniedError(msg);
    case bip::out_of_space_error:
    case bip::out_of_memory_error: return absl::ResourceExhaustedError(msg);
    default: return absl::InternalError(msg);
  }
}

}  // namespace

// Refuses a segment larger than the free space of the filesystem behind POSIX shared memory, before anything is
// created: posix_fallocate of an over-sized segment on tmpfs fills the filesystem page by page (about a minute for a
// terabyte) before it fails with ENOSPC. A filesystem that cannot be queried is left to posix_fallocate.
absl::Status CheckFreeSpace(const std::string& shm_name, uint64_t size, uint64_t released) {
  struct statvfs fs {};
  if (::statvfs(kHostPoolShmDir, &fs) != 0) return absl::OkStatus();
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (size <= free_bytes + released) return absl::OkStatus();
  const uint64_t total_bytes = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
  std::string message = absl::StrCat("segment '", shm_name, "' needs ", size, " bytes but ", kHostPoolShmDir,
                                     " has only ", free_bytes, " bytes free (of ", total_bytes, ")");
  if (released > 0) absl::StrAppend(&message, ", ", released, " more once the segment it replaces is removed");
  absl::StrAppend(&message, "; enlarge it (mount -o remount,size=<bytes> ", kHostPoolShmDir,
                  ") or shrink the host pool");
  return absl::ResourceExhaustedError(message);
}

uint64_t HostPoolSegment::SizeFor(uint64_t page_bytes, uint64_t pages, const HostPoolExtras& extras) {
  if (extras.journal_bytes > (uint64_t{1} << 40)) return 0;
  const uint64_t pages_offset = kHostPoolHeaderBytes + (extras.journal_bytes + 4095) / 4096 * 4096;
  if (page_bytes != 0 && pages > (static_cast<uint64_t>(std::numeric_limits<off_t>::max()) - pages_offset) / page_bytes) {
    return 0;
  }
  return pages_offset + pages * page_bytes;
}

HostPoolSegment::HostPoolSegment(std::string name, std::unique_ptr<bip::mapped_region> region)
    : name_(std::move(name)), region_(std::move(region)), base_(static_cast<uint8_t*>(region_->get_address())) {
  const auto* header = reinterpret_cast<const SegmentHeader*>(base_);
  page_bytes_ = header->page_bytes;
  pages_ = header->pages;
  pages_offset_ = header->pages_offset;
  owner_tag_.assign(header->tag, header->tag_bytes);
}

HostPoolSegment::~HostPoolSegment() = default;

absl::StatusOr<std::unique_ptr<HostPoolSegment>> HostPoolSegment::Create(std::string_view name, uint64_t page_bytes,
                                                                         uint64_t pages, const HostPoolExtras& extras) {
  if (absl::Status status = CheckName(name); !status.ok()) return status;
  if (extras.owner_tag.size() > kHostPoolMaxTagBytes) {
    return absl::InvalidArgumentError(absl::StrCat("owner tag of ", extras.owner_tag.size(), " bytes exceeds ",
                                                   kHostPoolMaxTagBytes));
  }
  if (extras.journal_bytes > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("journal of ", extras.journal_bytes, " bytes is too large"));
  }
  const uint64_t pages_offset = kHostPoolHeaderBytes + (extras.journal_bytes + 4095) / 4096 * 4096;
  if (page_bytes == 0 || page_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_bytes ", page_bytes, " must be a positive multiple of 64"));
  }
  if (pages == 0 || pages > std::numeric_limits<PageIndex>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("pages ", pages, " must be in 1..2^32-1"));
  }
  if (pages > (static_cast<uint64_t>(std::numeric_limits<off_t>::max()) - pages_offset) / page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(pages, " pages of ", page_bytes, " bytes overflow a file size"));
  }
  const uint64_t size = SizeFor(page_bytes, pages, extras);
  const std::string shm_name(name);
  if (absl::Status status = CheckFreeSpace(shm_name, size); !status.ok()) return status;
  try {
    bip::permissions perm;
    perm.set_permissions(0600);
    bip::shared_memory_object shm(bip::create_only, shm_name.c_str(), bip::read_write, perm);
    // Reserve every page now: tmpfs refuses (ENOSPC) instead of a SIGBUS on first touch later.
    // A signal (memd's SIGTERM during its start) interrupts tmpfs's fallocate with EINTR: the pages reserved so far
    // stay reserved, so it is called again.
    int err;
    do {
      err = ::posix_fallocate(shm.get_mapping_handle().handle, 0, static_cast<off_t>(size));
    } while (err == EINTR);
    if (err != 0) {
      shm.remove(shm_name.c_str());
      return absl::ResourceExhaustedError(absl::StrCat("cannot reserve ", size, " bytes of shared memory for '",
                                                       shm_name, "': ", std::strerror(err)));
    }
    auto region = std::make_unique<bip::mapped_region>(shm, bip::read_write, 0, size);
    auto* header = static_cast<SegmentHeader*>(region->get_address());
    header->version = kHostPoolVersion;
    header->reserved = 0;
    header->page_bytes = page_bytes;
    header->pages = pages;
    header->header_bytes = kHostPoolHeaderBytes;
    header->pages_offset = pages_offset;
    header->tag_bytes = extras.owner_tag.size();
    std::memcpy(header->tag, extras.owner_tag.data(), extras.owner_tag.size());
    std::atomic_thread_fence(std::memory_order_release);
    header->magic = kHostPoolMagic;  // last: an Open of a half-made segment sees no magic
    return std::unique_ptr<HostPoolSegment>(new HostPoolSegment(shm_name, std::move(region)));
  } catch (const bip::interprocess_exception& e) {
    return FromInterprocess(e, absl::StrCat("create host pool segment '", shm_name, "'"));
  }
}

absl::StatusOr<std::unique_ptr<HostPoolSegment>> HostPoolSegment::Open(std::string_view name) {
  if (absl::Status status = CheckName(name); !status.ok()) return status;
  const std::string shm_name(name);
  try {
    bip::shared_memory_object shm(bip::open_only, shm_name.c_str(), bip::read_write);
    bip::offset_t size = 0;
    if (!shm.get_size(size) || size < static_cast<bip::offset_t>(kHostPoolHeaderBytes)) {
      return absl::DataLossError(absl::StrCat("host pool segment '", shm_name, "' is ", size,
                                              " bytes, smaller than its header"));
    }
    auto region = std::make_unique<bip::mapped_region>(shm, bip::read_write, 0, static_cast<size_t>(size));
    const auto* header = static_cast<const SegmentHeader*>(region->get_address());
    if (header->magic != kHostPoolMagic) {
      return absl::DataLossError(absl::StrCat("'", shm_name, "' is not a host pool segment (bad magic)"));
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (header->version != kHostPoolVersion || header->header_bytes != kHostPoolHeaderBytes) {
      return absl::DataLossError(absl::StrCat("host pool segment '", shm_name, "' has header version ",
                                              header->version, ", expected ", kHostPoolVersion));
    }
    const uint64_t page_bytes = header->page_bytes;
    const uint64_t pages = header->pages;
    const uint64_t pages_offset = header->pages_offset;
    if (pages_offset < kHostPoolHeaderBytes || pages_offset % 4096 != 0 || pages_offset > static_cast<uint64_t>(size) ||
        header->tag_bytes > kHostPoolMaxTagBytes) {
      return absl::DataLossError(absl::StrCat("host pool segment '", shm_name, "' header: journal end ", pages_offset,
                                              " or tag of ", header->tag_bytes, " bytes out of bounds"));
    }
    if (page_bytes == 0 || pages == 0 ||
        pages > (static_cast<uint64_t>(size) - pages_offset) / page_bytes) {
      return absl::DataLossError(absl::StrCat("host pool segment '", shm_name, "' header claims ", pages,
                                              " pages of ", page_bytes, " bytes in ", size, " bytes"));
    }
    return std::unique_ptr<HostPoolSegment>(new HostPoolSegment(shm_name, std::move(region)));
  } catch (const bip::interprocess_exception& e) {
    return FromInterprocess(e, absl::StrCat("open host pool segment '", shm_name, "'"));
  }
}

absl::Status HostPoolSegment::Remove(std::string_view name) {
  if (absl::Status status = CheckName(name); !status.ok()) return status;
  const std::string shm_name(name);
  if (!bip::shared_memory_object::remove(shm_name.c_str())) {
    return absl::NotFoundError(absl::StrCat("no host pool segment '", shm_name, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HostPoolSegment::PageOffset(PageIndex page) const {
  if (page >= pages_) {
    return absl::OutOfRangeError(absl::StrCat("host page ", page, " outside segment '", name_, "' of ", pages_, " pages"));
  }
  return pages_offset_ + static_cast<uint64_t>(page) * page_bytes_;
}

absl::StatusOr<uint8_t*> HostPoolSegment::PageData(PageIndex page) const {
  absl::StatusOr<uint64_t> offset = PageOffset(page);
  if (!offset.ok()) return offset.status();
  return base_ + *offset;
}

}  // namespace dhs
