// memd/host_page_allocator.h: page accounting of the pinned host pool (brief §3 host tier).
//
// Owns which host pool page belongs to which (request, source) and which pages are pinned by an in-flight copy.
// Page count and page bytes come from configuration; the pool's bytes themselves live in shared memory owned
// elsewhere (common/), this class only accounts for them.
// A page handed to a copy is pinned (Pin) until that copy's completion is reported (Unpin). A page freed while
// pinned stays out of the free list until its last Unpin: it is reusable only after the copy completed.
//
// Thread-safety: none. One owner (ResidencyManager) calls it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "memd/host_journal.h"

namespace dhs::memd {

class HostPageAllocator {
 public:
  // `pages` host pages of `page_bytes` bytes each. Errors: InvalidArgument when page_bytes == 0.
  static absl::StatusOr<HostPageAllocator> Create(uint32_t pages, uint64_t page_bytes);

  // Every ownership change from now on is also written to `journal` (nullptr: none; not owned, must outlive this):
  // page i of an Allocate is recorded as history page i of a context of `count` pages; Free and ReleaseRequest free
  // entries; Confirm confirms one. The pages allocated so far must already be in it (a new allocator: none).
  void set_journal(HostJournal* journal) { journal_ = journal; }
  const HostJournal* journal() const { return journal_; }
  // Allocates `count` reusable pages to (request, source); all or nothing, lowest page first.
  // Errors: ResourceExhausted when fewer than `count` pages are reusable.
  // With a journal, page i is journaled as history page first_history_page + i of a context of `context_pages` pages
  // (0: `count`, the whole context; a resume allocates history pages L .. context-1 behind the L it took over).
  absl::StatusOr<std::vector<PageIndex>> Allocate(RequestId request, SourceId source, uint32_t count,
                                                  uint32_t first_history_page = 0, uint32_t context_pages = 0);

  // Allocates one reusable page per entry of `history_pages` to (request, source); all or nothing, lowest page first.
  // With a journal, page i is journaled as history page history_pages[i] of a context of `context_pages` pages (a
  // resume's grant fills the history pages around those it took over). Errors: ResourceExhausted.
  absl::StatusOr<std::vector<PageIndex>> AllocateHistory(RequestId request, SourceId source,
                                                         std::span<const uint32_t> history_pages,
                                                         uint32_t context_pages);

  // Allocates the reusable or held page `page` to (request, source) as history page `history_page` of
  // `context_pages` (adoption of a journal's page, or of the page a surviving worker reports as assigned to it).
  // Errors: OutOfRange, FailedPrecondition (neither reusable nor held).
  absl::Status AllocateAt(RequestId request, SourceId source, PageIndex page, uint32_t history_page,
                          uint32_t context_pages);
  // The host copy in allocated page `page` is confirmed written (journal only). Errors: OutOfRange,
  // FailedPrecondition (not allocated).
  // checksum (issue 22): the confirmed copy's checksum, journaled with it (0 = none known).
  absl::Status Confirm(PageIndex page, uint64_t checksum = 0);
  // Takes every reusable page out of use until ReleaseHeld (after a memd restart: a dead memd's workers may still
  // write them); returns how many were taken. Held pages are neither reusable nor allocated.
  uint32_t HoldReusable();
  // Makes every held page reusable again; returns how many.
  uint32_t ReleaseHeld();
  uint32_t held() const { return static_cast<uint32_t>(held_.size()); }
  bool is_free(PageIndex page) const { return free_.contains(page) || held_.contains(page); }  // reusable or held
  // Pins an allocated page for one copy (pins nest). Errors: OutOfRange, FailedPrecondition (not allocated).
  absl::Status Pin(PageIndex page);
  // Ends one copy's pin. A page freed while pinned becomes reusable at its last Unpin.
  // Errors: OutOfRange, FailedPrecondition (not pinned).
  absl::Status Unpin(PageIndex page);
  // Frees an allocated page (reusable now, or at its last Unpin when pinned). Errors: OutOfRange, FailedPrecondition.
  absl::Status Free(PageIndex page);
  // Hands allocated page `page` to (request `to`, its source unchanged): a resumed request takes over the pages its
  // interrupted predecessor kept (ResidencyManager::Admit with resume_of). Pins are kept. With a journal, the page's
  // entry is rewritten as history page `history_page` of `to`'s `context_pages`, confirmed (it held a confirmed copy).
  // Errors: OutOfRange, FailedPrecondition (not allocated).
  absl::Status Transfer(PageIndex page, RequestId to, uint32_t history_page, uint32_t context_pages);
  // Allocated page `page` becomes a shared prefix page (issue 24, memd/prefix_pages.h): its owner is kSharedOwner from
  // now on (a request's ReleaseRequest no longer frees it; Free does, at its eviction); pins are kept. With a
  // journal, its entry becomes kShared{key, content, checksum}. Errors: OutOfRange, FailedPrecondition (not
  // allocated, or shared already).
  absl::Status Share(PageIndex page, uint64_t key, uint64_t content, uint64_t checksum);
  // A shared page of a dead memd's journal is allocated to kSharedOwner again (the journal keeps its kShared entry).
  // Errors: OutOfRange, FailedPrecondition (not reusable).
  absl::Status AdoptShared(PageIndex page, uint64_t key, uint64_t content, uint64_t checksum);
  // Frees every page of `request` (pinned ones after their copy completes); returns how many were allocated.
  uint32_t ReleaseRequest(RequestId request);

  // Issue 26: up to `count` reusable pages, ascending (where the cluster tier's found pages may be copied).
  std::vector<PageIndex> FirstReusable(uint32_t count) const;
  bool is_reusable(PageIndex page) const { return free_.contains(page); }  // free, not pinned, not held
  uint32_t pages() const { return static_cast<uint32_t>(page_.size()); }
  uint64_t page_bytes() const { return page_bytes_; }
  uint32_t reusable() const { return static_cast<uint32_t>(free_.size()); }  // free and not pinned
  uint32_t allocated() const { return allocated_; }                         // owned by a request
  uint32_t pinned() const { return pinned_; }                               // pinned by >= 1 copy
  uint32_t freed_pinned() const { return pages() - reusable() - allocated_; }  // freed, waiting for a copy (or held)
  uint32_t pages_of(RequestId request) const;
  bool is_allocated(PageIndex page) const { return page < pages() && page_[page].allocated; }
  bool is_pinned(PageIndex page) const { return page < pages() && page_[page].pins > 0; }
  RequestId owner(PageIndex page) const { return page_[page].owner; }   // precondition: is_allocated(page)
  SourceId source(PageIndex page) const { return page_[page].source; }  // precondition: is_allocated(page)

  // Also, with a journal: a page is allocated exactly when its entry is not free, and then to the entry's owner.
  absl::Status CheckInvariants() const;

 private:
  struct Page {
    bool allocated = false;
    uint32_t pins = 0;
    RequestId owner = 0;
    SourceId source = 0;
  };
  HostPageAllocator(uint32_t pages, uint64_t page_bytes);
  // Allocate's body: page i is journaled as history page history_page(i).
  absl::StatusOr<std::vector<PageIndex>> Take(RequestId request, SourceId source, uint32_t count,
                                              uint32_t context_pages,
                                              absl::FunctionRef<uint32_t(uint32_t)> history_page);

  HostJournal* journal_ = nullptr;
  uint64_t page_bytes_;
  uint32_t allocated_ = 0, pinned_ = 0;
  std::vector<Page> page_;
  std::set<PageIndex> free_;                            // reusable pages
  std::set<PageIndex> held_;                            // free, unpinned, out of use until ReleaseHeld
  std::map<RequestId, std::set<PageIndex>> by_request_;  // allocated pages per request
};

}  // namespace dhs::memd
