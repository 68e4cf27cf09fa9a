// memd/pool_segment.cc: see pool_segment.h.
#include "memd/pool_segment.h"

#include <openssl/evp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace dhs::memd {
namespace {

// Whether `path` is this user's; then its size (bytes) and how long ago it was last modified (s, 0 if in the future).
bool OwnedByMe(const std::filesystem::path& path, int64_t& size, int64_t& age_s) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || st.st_uid != ::geteuid()) return false;
  size = static_cast<int64_t>(st.st_size);
  age_s = std::max<int64_t>(0, static_cast<int64_t>(::time(nullptr)) - static_cast<int64_t>(st.st_mtime));
  return true;
}

// A "dhs-memd-<pid>" segment (memds before issue 11) whose memd is gone: no such pid, or it runs another program.
bool LegacySegmentOfDeadMemd(const std::string& name, int& pid) {
  if (!absl::StartsWith(name, "dhs-memd-") || !absl::SimpleAtoi(name.substr(9), &pid) || pid <= 0) return false;
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string program;
  return !((::kill(pid, 0) == 0 || errno == EPERM) && std::getline(comm, program) && program == "memd");
}

// Why a "dhs-pool-*" segment is stale ("" when it is not): its run directory is gone, or it does not open as a host
// pool and was last modified `unreadable_age` or longer ago (`age_s`). A younger unreadable one is left alone: it may
// be one another memd is creating right now (its header is written last).
std::string StalePoolReason(const std::string& name, int64_t age_s, std::chrono::seconds unreadable_age) {
  if (!absl::StartsWith(name, kPoolSegmentPrefix)) return "";
  auto seg = HostPoolSegment::Open(name);
  if (!seg.ok()) {
    if (absl::IsNotFound(seg.status()) || age_s < unreadable_age.count()) return "";
    return absl::StrFormat("it is not a readable host pool (%s) and was last modified %d s ago (at least %d s: no "
                           "memd is still creating it; a memd killed while creating its pool leaves such a segment)",
                           seg.status().message(), age_s, unreadable_age.count());
  }
  const std::string& dir = (*seg)->owner_tag();
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) {
    return absl::StrFormat("its run directory '%s' no longer exists", dir);
  }
  return "";
}

}  // namespace

std::string PoolSegmentName(const std::string& canonical_run_dir) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(canonical_run_dir.data(), canonical_run_dir.size(), digest, &length, EVP_sha256(), nullptr);
  std::string name = kPoolSegmentPrefix;
  for (int i = 0; i < 8; ++i) absl::StrAppendFormat(&name, "%02x", digest[i]);
  return name;
}

void RemoveStaleSegments(const std::string& own_name, std::chrono::seconds unreadable_age) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(kHostPoolShmDir, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t size = 0, age_s = 0;
    if (name == own_name || !OwnedByMe(entry.path(), size, age_s)) continue;
    int pid = 0;
    std::string why;
    if (LegacySegmentOfDeadMemd(name, pid)) {
      why = absl::StrFormat("the host pool of a memd (pid %d) that is gone", pid);
    } else {
      why = StalePoolReason(name, age_s, unreadable_age);
    }
    if (why.empty() || !HostPoolSegment::Remove(name).ok()) continue;
    spdlog::warn("memd: removed /dev/shm/{} ({} bytes): {}", name, size, why);
  }
}

namespace {

// Why the existing segment `seg` cannot be adopted ("" when it can; then `pool` holds its journal's requests).
std::string CheckLeftover(std::unique_ptr<HostPoolSegment>& seg, uint64_t page_bytes, uint32_t pages,
                          OpenedPool& pool) {
  if (seg->page_bytes() != page_bytes || seg->pages() != pages) {
    return absl::StrFormat("its geometry (%d pages x %d bytes) differs from memd's flags (%d pages x %d bytes)",
                           seg->pages(), seg->page_bytes(), pages, page_bytes);
  }
  auto journal = HostJournal::Attach(seg->journal(), pages);
  if (!journal.ok()) return absl::StrFormat("it has no journal of %d pages", pages);
  auto verified = journal->Verify(&pool.shared);
  if (!verified.ok()) return absl::StrFormat("its journal does not verify: %s", verified.status().message());
  pool.journal.emplace(*journal);
  pool.adopted = std::move(*verified);
  pool.segment = std::move(seg);
  pool.reused = true;
  return "";
}

}  // namespace

LeftoverContents LeftoverRequests(const HostPoolSegment& segment) {
  LeftoverContents c;
  if (segment.pages() == 0 || segment.pages() > UINT32_MAX) return c;
  auto journal = HostJournal::Attach(segment.journal(), static_cast<uint32_t>(segment.pages()));
  if (!journal.ok()) return c;
  auto verified = journal->Verify();
  if (!verified.ok()) return c;
  c.journal_verified = true;
  for (const auto& [id, jr] : *verified) {
    if (jr.confirmed.empty() && jr.assigned.empty()) continue;
    ++c.requests;
    c.host_pages += jr.confirmed.size() + jr.assigned.size();
    c.confirmed_pages += jr.confirmed.size();
  }
  return c;
}

absl::StatusOr<OpenedPool> OpenPool(const std::string& name, const std::string& canonical_run_dir, uint64_t page_bytes,
                                    uint32_t pages, bool replace_requests) {
  OpenedPool pool;
  auto existing = HostPoolSegment::Open(name);
  if (existing.ok() && (*existing)->owner_tag() != canonical_run_dir) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "host pool segment /dev/shm/%s belongs to run directory '%s', not '%s'; left alone", name,
        (*existing)->owner_tag(), canonical_run_dir));
  }
  HostPoolExtras extras;
  extras.journal_bytes = HostJournal::BytesFor(pages);
  extras.owner_tag = canonical_run_dir;
  if (!absl::IsNotFound(existing.status())) {
    LeftoverContents held;
    if (existing.ok()) held = LeftoverRequests(**existing);  // before CheckLeftover, which may take the segment
    std::string why = existing.ok() ? CheckLeftover(*existing, page_bytes, pages, pool)
                                    : absl::StrFormat("it is not a readable host pool (%s)", existing.status().message());
    if (why.empty()) {
      spdlog::info("memd: adopting /dev/shm/{} of a previous memd: its journal names {} requests", name,
                   pool.adopted.size());
      return pool;
    }
    const std::string dropped =
        held.requests == 0 ? std::string()
                           : absl::StrFormat("%d requests of a previous memd holding %d host pages (%d with a confirmed "
                                             "host copy)", held.requests, held.host_pages, held.confirmed_pages);
    if (held.requests > 0 && !replace_requests) {  // a wrong flag must not cost the interrupted requests their copies
      return absl::FailedPreconditionError(absl::StrFormat(
          "the leftover host pool /dev/shm/%s holds %s and cannot be adopted: %s. It is kept: start memd with the "
          "pool's geometry (--page-bytes %d --host-pool-pages %d) to adopt them, or give --replace-host-pool to drop "
          "them", name, dropped, why, (*existing)->page_bytes(), (*existing)->pages()));
    }
    // The new pool must fit before the leftover goes: a start that fails for space keeps it (and its requests).
    struct stat st {};
    const uint64_t released =
        ::stat(absl::StrCat(kHostPoolShmDir, "/", name).c_str(), &st) == 0 ? uint64_t(st.st_blocks) * 512 : 0;
    if (absl::Status s = CheckFreeSpace(name, HostPoolSegment::SizeFor(page_bytes, pages, extras), released);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(s.message(), "; the leftover /dev/shm/", name, " is kept"));
    }
    if (held.requests > 0) {
      spdlog::warn("memd: the leftover host pool /dev/shm/{} is replaced (--replace-host-pool): {}; dropped: {}", name,
                   why, dropped);
    } else {
      spdlog::warn("memd: the leftover host pool /dev/shm/{} is replaced: {}", name, why);
    }
    pool = OpenedPool{};
    existing = absl::NotFoundError("");  // unmapped before it is removed
    if (absl::Status s = HostPoolSegment::Remove(name); !s.ok() && !absl::IsNotFound(s)) return s;
  }
  auto created = HostPoolSegment::Create(name, page_bytes, pages, extras);
  if (!created.ok()) return created.status();
  pool.segment = std::move(*created);
  pool.journal.emplace(*HostJournal::Attach(pool.segment->journal(), pages));
  pool.journal->Format();
  return pool;
}

}  // namespace dhs::memd
