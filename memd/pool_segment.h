// memd/pool_segment.h: the host-pool segment of a node's run directory (issue 11, "memd restart"): its name, finding a
// dead memd's segment and deciding whether its journal is adopted, and removing the segments nobody will use again.
//
// Name: "dhs-pool-" + the first 16 hex digits of the SHA-256 of the canonical run directory (25 characters, far under
// NAME_MAX 255 and HostPoolSegment's 200); the canonical path is also written into the segment header (owner tag), so
// a segment is matched to its run directory by content, not only by name.
//
// Thread-safety: plain functions, called by memd's start.
#pragma once

#include <chrono>
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

// Removes, before a memd creates or opens its own, the segments of this user (owner uid = ours) that no memd will use
// again, logging each with its size and why (docs/operations.md "Host-pool segments"):
//   - "dhs-pool-*" segments whose owner tag names a run directory that no longer exists;
//   - "dhs-pool-*" segments that are not a readable host pool (no header yet, truncated, another format) and were last
//     modified `unreadable_age` or longer ago (memd --unreadable-segment-age-s, default 3600): a memd killed while
//     creating its pool leaves one, and nobody could tell its run directory. A younger one is left alone: another
//     memd may be creating it right now (its header is written last); its own memd replaces it (OpenPool);
//   - the "dhs-memd-<pid>" segments of memds before issue 11's naming whose pid is gone or runs another program.
// `own_name` (this node's segment) is never removed here (OpenPool decides about it).
void RemoveStaleSegments(const std::string& own_name, std::chrono::seconds unreadable_age = std::chrono::hours(1));

// The pool a memd starts with.
struct OpenedPool {
  std::unique_ptr<HostPoolSegment> segment;
  std::optional<HostJournal> journal;              // over segment->journal()
  std::map<RequestId, JournaledRequest> adopted;   // the verified journal's requests (empty: a new pool)
  std::map<PageIndex, JournaledSharedPage> shared;  // its shared prefix pages (issue 24; empty: a new pool)
  bool reused = false;                             // a dead memd's segment whose journal verified
};

// What a leftover host pool holds that its journal names (LeftoverRequests): requests and their host pages.
struct LeftoverContents {
  bool journal_verified = false;  // the journal verified with the segment's own geometry (else nothing is known)
  size_t requests = 0;            // requests that own a host page
  size_t host_pages = 0;          // host pages they own (assigned or confirmed)
  size_t confirmed_pages = 0;     // of which with a confirmed host copy
};
// Reads the journal of `segment` with the segment's own geometry, whatever memd's flags say.
LeftoverContents LeftoverRequests(const HostPoolSegment& segment);

// Opens segment `name` of `canonical_run_dir` when it exists with the same geometry (page_bytes, pages) and a journal
// that verifies (its requests are returned for AdoptHostPages), else creates it (journal formatted). A start that
// fails here never touches a pool it could adopt and never loses a pool's requests by mistake (issue 22):
//   - a leftover with another geometry whose journal (read with its own geometry) names requests is kept and the start
//     refused (FAILED_PRECONDITION naming the requests, their host pages and the pool's geometry: start memd with
//     that geometry to adopt them) unless `replace_requests` (memd --replace-host-pool): then it is replaced and the
//     warning says what was dropped;
//   - before any leftover is removed, the new pool must fit /dev/shm's free space plus the leftover's bytes, else
//     RESOURCE_EXHAUSTED and the leftover is kept.
// A leftover that holds nothing adoptable (not a host pool, a journal that does not verify, another geometry with no
// request) is logged with the reason and replaced: it never blocks a start. Errors: ALREADY_EXISTS (the segment's
// owner tag names another run directory: a hash collision or a shared segment name; it is left alone), the two
// above, HostPoolSegment::Create's.
absl::StatusOr<OpenedPool> OpenPool(const std::string& name, const std::string& canonical_run_dir, uint64_t page_bytes,
                                    uint32_t pages, bool replace_requests = false);

}  // namespace dhs::memd
