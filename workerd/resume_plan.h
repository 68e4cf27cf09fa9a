// workerd/resume_plan.h: which rows of a resumed request are imported from host and which are recomputed from its
// tokens (issue 11 "resume from host KV", issue 22 host-page integrity; docs/protocol.md "Resume"). Pure: a grant's
// host-backed pages and a record's size in, the plan out; no KV, no model, no clock (the worker's ResumeImporter,
// workerd/resume_import.h, carries the plan out).
//
// A resumed request of n tokens (its record's input, then its committed tokens) and page size p rows: history page j
// holds rows [j * p, (j + 1) * p). memd's grant names the pages that hold a confirmed host copy (host-backed). The last
// token is always fed by a model step (its logits give the next token), so only the pages WHOLLY before it, j <
// (n - 1) / p (the usable pages), can be imported; every other row is recomputed from the tokens, in position order
// with the imports, so each recomputed row reads exactly the earlier rows an uninterrupted run had. Every host-backed
// page (usable or not: the record may end before rows the dead worker had backed up) is made host-ready at the grant
// (KvPort::TakeGrantedHostPages), so its confirmed copy is never written again.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs {

// One host-backed history page and the checksum memd keeps of its confirmed copy (0: none known).
struct HostBackedPage {
  uint32_t page = 0;
  uint64_t checksum = 0;
  bool operator==(const HostBackedPage&) const = default;
};

// The host-backed pages of an AdmitGrant, each once, ascending: host_backed_pages[i] with host_backed_checksums[i] (0
// where the checksum list is shorter; a page listed twice keeps the checksum listed last); a grant that lists none (a
// memd that does not send the list) names its leading run 0 .. imported_pages - 1 (page i with
// host_backed_checksums[i] likewise).
std::vector<HostBackedPage> GrantHostBacked(std::span<const uint32_t> host_backed_pages,
                                            std::span<const uint64_t> host_backed_checksums, uint32_t imported_pages);

// The shared prefix pages of a grant (AdmitGrant.shared_pages, issue 24) that are among `kept` (the grant's
// host-backed pages that matched their checksums: KvPort::TakeGrantedHostPages), in the order listed, each once.
std::vector<uint32_t> SharedPagesKept(std::span<const uint32_t> shared_pages, std::span<const HostBackedPage> kept);

// A run of consecutive host-backed pages imported at once: pages first .. first + pages - 1, rows [first * p,
// (first + pages) * p).
struct HostRun {
  uint32_t first = 0;
  uint32_t pages = 0;
  bool operator==(const HostRun&) const = default;
};

// Rows [begin, end) recomputed from the tokens.
struct RowRange {
  Position begin = 0;
  Position end = 0;
  bool operator==(const RowRange&) const = default;
};

struct ResumePlan {
  // Every host-backed page once, ascending (host-ready since the grant), with its checksum (a page listed twice
  // keeps the checksum listed last).
  std::vector<HostBackedPage> host_ready;
  uint32_t usable_pages = 0;    // pages wholly before the last token: (n - 1) / p
  // The maximal runs of host-backed usable pages, in position order (disjoint, never adjacent, none empty).
  std::vector<HostRun> runs;
  // The rows outside the runs, in position order (disjoint, never adjacent, none empty; the last ends at n, so the
  // last token is always recomputed).
  std::vector<RowRange> recompute;
  Position rows_imported = 0;    // rows of the runs: p * their pages
  Position rows_recomputed = 0;  // n - rows_imported
};

// The plan of a resumed request of `tokens` tokens (n >= 1) and `page_rows` rows per page (p >= 1) whose grant names
// `host_backed` (any order; repeats allowed; pages at or beyond the record's end are made host-ready, not imported).
// Errors: INVALID_ARGUMENT (tokens < 1, page_rows = 0); nothing planned.
absl::StatusOr<ResumePlan> PlanResume(std::span<const HostBackedPage> host_backed, Position tokens,
                                      uint32_t page_rows);

}  // namespace dhs
