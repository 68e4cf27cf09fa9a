// memd/pool_segment.h: the host-pool segment of a node's run directory (issue 11, "memd restart"): its name, finding a
// dead memd's segment and deciding whether its journal is adopted, and removing the segments nobody will use again.
//
// Name: "dhs-pool-" + the first 16 hex digits of the SHA-256 of the canonical run directory (25 characters, far under
// NAME_MAX 255 and HostPoolSegment's 200); the canonical path is also written into the segment header (owner tag), so
// a segment is matched to its run directory by content, not only by name.
//
// Thread-safety: plain functions, called by memd's start.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/host_pool.h"
#include "memd/host_journal.h"

namespace dhs::memd {

inline constexpr char kPoolSegmentPrefix[] = "dhs-pool-";

// "dhs-pool-<16 hex>" of `canonical_run_dir` (an absolute path without symlinks, std::filesystem::canonical).
std::string PoolSegmentName(const std::string& canonical_run_dir);

// Removes, before a memd creates or opens its own, the segments of this user that no memd will use again, logging
// each with its size: "dhs-pool-*" segments whose owner tag names a run directory that no longer exists (one that is
// not a readable host pool is left: another memd may be creating it; its own memd replaces it), and the "dhs-memd-<pid>" segments of memds before issue 11's naming whose pid is gone or
// runs another program. `own_name` is never removed here (OpenPool decides about it).
void RemoveStaleSegments(const std::string& own_name);

// The pool a memd starts with.
struct OpenedPool {
  std::unique_ptr<HostPoolSegment> segment;
  std::optional<HostJournal> journal;              // over segment->journal()
  std::map<RequestId, JournaledRequest> adopted;   // the verified journal's requests (empty: a new pool)
  bool reused = false;                             // a dead memd's segment whose journal verified
};

// Opens segment `name` of `canonical_run_dir` when it exists with the same geometry (page_bytes, pages) and a journal
// that verifies (its requests are returned for AdoptHostPages), else creates it (journal formatted). A leftover that
// cannot be used (not a host pool, another geometry, no journal, a journal that does not verify) is logged with the
// reason and replaced: it never blocks a start. Errors: ALREADY_EXISTS (the segment's owner tag names another run
// directory: a hash collision or a shared segment name; it is left alone), HostPoolSegment::Create's.
absl::StatusOr<OpenedPool> OpenPool(const std::string& name, const std::string& canonical_run_dir, uint64_t page_bytes,
                                    uint32_t pages);

}  // namespace dhs::memd
