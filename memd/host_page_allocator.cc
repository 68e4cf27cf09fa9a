#include "memd/host_page_allocator.h"

#include "absl/strings/str_format.h"

namespace dhs::memd {

absl::StatusOr<HostPageAllocator> HostPageAllocator::Create(uint32_t pages, uint64_t page_bytes) {
  if (page_bytes == 0) return absl::InvalidArgumentError("host pool: page_bytes must be > 0");
  return HostPageAllocator(pages, page_bytes);
}

HostPageAllocator::HostPageAllocator(uint32_t pages, uint64_t page_bytes) : page_bytes_(page_bytes), page_(pages) {
  for (PageIndex p = 0; p < pages; ++p) free_.insert(free_.end(), p);
}

absl::StatusOr<std::vector<PageIndex>> HostPageAllocator::Allocate(RequestId request, SourceId source,
                                                                    uint32_t count, uint32_t first_history_page,
                                                                    uint32_t context_pages) {
  if (context_pages == 0) context_pages = count;
  return Take(request, source, count, context_pages, [&](uint32_t i) { return first_history_page + i; });
}

absl::StatusOr<std::vector<PageIndex>> HostPageAllocator::Take(RequestId request, SourceId source, uint32_t count,
                                                               uint32_t context_pages,
                                                               absl::FunctionRef<uint32_t(uint32_t)> history_page) {
  if (count > reusable()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "host pool full: request %d asks %d pages, %d reusable of %d (%d waiting for copy completions)", request,
        count, reusable(), pages(), freed_pinned()));
  }
  std::vector<PageIndex> out;
  out.reserve(count);
  auto& mine = by_request_[request];
  for (uint32_t i = 0; i < count; ++i) {
    PageIndex p = *free_.begin();
    free_.erase(free_.begin());
    page_[p].allocated = true;
    page_[p].owner = request;
    page_[p].source = source;
    mine.insert(p);
    out.push_back(p);
    if (journal_ != nullptr) journal_->Assign(p, request, history_page(i), context_pages);
  }
  allocated_ += count;
  if (mine.empty()) by_request_.erase(request);
  return out;
}

absl::StatusOr<std::vector<PageIndex>> HostPageAllocator::AllocateHistory(RequestId request, SourceId source,
                                                                           std::span<const uint32_t> history_pages,
                                                                           uint32_t context_pages) {
  return Take(request, source, static_cast<uint32_t>(history_pages.size()), context_pages,
              [&](uint32_t i) { return history_pages[i]; });
}

absl::Status HostPageAllocator::AllocateAt(RequestId request, SourceId source, PageIndex page,
                                          uint32_t history_page, uint32_t context_pages) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("host page %d >= %d", page, pages()));
  if (!is_free(page)) {
    return absl::FailedPreconditionError(absl::StrFormat("host page %d is not reusable (owned by request %d)", page,
                                                         page_[page].allocated ? page_[page].owner : 0));
  }
  free_.erase(page);
  held_.erase(page);
  page_[page] = Page{true, 0, request, source};
  by_request_[request].insert(page);
  ++allocated_;
  if (journal_ != nullptr) journal_->Assign(page, request, history_page, context_pages);
  return absl::OkStatus();
}

absl::Status HostPageAllocator::Confirm(PageIndex page, uint64_t checksum) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("host page %d >= %d", page, pages()));
  if (!page_[page].allocated) return absl::FailedPreconditionError(absl::StrFormat("host page %d not allocated", page));
  if (journal_ != nullptr) journal_->Confirm(page, checksum);
  return absl::OkStatus();
}

// The sets are disjoint: the smaller one is merged into the larger (a swap first when needed), O(small log n), so
// a whole pool of millions of pages is held or released in O(1) and memd's loop never stalls on it.
uint32_t HostPageAllocator::HoldReusable() {
  const auto taken = static_cast<uint32_t>(free_.size());
  if (held_.size() < free_.size()) held_.swap(free_);
  held_.merge(free_);
  return taken;
}

uint32_t HostPageAllocator::ReleaseHeld() {
  const auto released = static_cast<uint32_t>(held_.size());
  if (free_.size() < held_.size()) free_.swap(held_);
  free_.merge(held_);
  return released;
}

absl::Status HostPageAllocator::Pin(PageIndex page) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("host page %d >= %d", page, pages()));
  if (!page_[page].allocated) return absl::FailedPreconditionError(absl::StrFormat("host page %d not allocated", page));
  if (page_[page].pins++ == 0) ++pinned_;
  return absl::OkStatus();
}

absl::Status HostPageAllocator::Unpin(PageIndex page) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("host page %d >= %d", page, pages()));
  Page& pg = page_[page];
  if (pg.pins == 0) return absl::FailedPreconditionError(absl::StrFormat("host page %d is not pinned", page));
  if (--pg.pins == 0) {
    --pinned_;
    if (!pg.allocated) free_.insert(page);
  }
  return absl::OkStatus();
}

absl::Status HostPageAllocator::Free(PageIndex page) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("host page %d >= %d", page, pages()));
  Page& pg = page_[page];
  if (!pg.allocated) return absl::FailedPreconditionError(absl::StrFormat("host page %d is not allocated", page));
  auto it = by_request_.find(pg.owner);
  it->second.erase(page);
  if (it->second.empty()) by_request_.erase(it);
  pg.allocated = false;
  --allocated_;
  if (pg.pins == 0) free_.insert(page);
  if (journal_ != nullptr) journal_->Free(page);
  return absl::OkStatus();
}

absl::Status HostPageAllocator::Transfer(PageIndex page, RequestId to, uint32_t history_page,
                                         uint32_t context_pages) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("host page %d out of range", page));
  Page& pg = page_[page];
  if (!pg.allocated) return absl::FailedPreconditionError(absl::StrFormat("host page %d is not allocated", page));
  auto it = by_request_.find(pg.owner);
  it->second.erase(page);
  if (it->second.empty()) by_request_.erase(it);
  pg.owner = to;
  by_request_[to].insert(page);
  if (journal_ != nullptr) {
    // Three journal stores (host_journal.h): a kill between them leaves the page free in the journal, so a memd
    // that adopts it loses this one host copy (the worker recomputes its rows), never names a wrong owner.
    const uint64_t checksum = journal_->Read(page).checksum;  // the confirmed copy's, kept with it (issue 22)
    journal_->Free(page);
    journal_->Assign(page, to, history_page, context_pages);
    journal_->Confirm(page, checksum);
  }
  return absl::OkStatus();
}

absl::Status HostPageAllocator::Share(PageIndex page, uint64_t key, uint64_t content, uint64_t checksum) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("host page %d out of range", page));
  Page& pg = page_[page];
  if (!pg.allocated || pg.owner == kSharedOwner) {
    return absl::FailedPreconditionError(absl::StrFormat("host page %d is not a request's page", page));
  }
  auto it = by_request_.find(pg.owner);
  it->second.erase(page);
  if (it->second.empty()) by_request_.erase(it);
  pg.owner = kSharedOwner;
  by_request_[kSharedOwner].insert(page);
  if (journal_ != nullptr) journal_->Share(page, key, content, checksum);
  return absl::OkStatus();
}

std::vector<PageIndex> HostPageAllocator::FirstReusable(uint32_t count) const {
  std::vector<PageIndex> out;
  for (auto it = free_.begin(); it != free_.end() && out.size() < count; ++it) out.push_back(*it);
  return out;
}

absl::Status HostPageAllocator::AdoptShared(PageIndex page, uint64_t key, uint64_t content, uint64_t checksum) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("host page %d out of range", page));
  if (!free_.contains(page)) {
    return absl::FailedPreconditionError(absl::StrFormat("host page %d is not reusable", page));
  }
  free_.erase(page);
  Page& pg = page_[page];
  pg.allocated = true;
  pg.owner = kSharedOwner;
  pg.source = 0;
  by_request_[kSharedOwner].insert(page);
  ++allocated_;
  if (journal_ != nullptr) journal_->Share(page, key, content, checksum);
  return absl::OkStatus();
}

uint32_t HostPageAllocator::ReleaseRequest(RequestId request) {
  auto it = by_request_.find(request);
  if (it == by_request_.end()) return 0;
  std::set<PageIndex> pages = std::move(it->second);
  by_request_.erase(it);
  for (PageIndex p : pages) {
    page_[p].allocated = false;
    if (page_[p].pins == 0) free_.insert(p);
    if (journal_ != nullptr) journal_->Free(p);
  }
  allocated_ -= static_cast<uint32_t>(pages.size());
  return static_cast<uint32_t>(pages.size());
}

uint32_t HostPageAllocator::pages_of(RequestId request) const {
  auto it = by_request_.find(request);
  return it == by_request_.end() ? 0 : static_cast<uint32_t>(it->second.size());
}

absl::Status HostPageAllocator::CheckInvariants() const {
  uint32_t allocated = 0, pinned = 0, reusable = 0;
  for (PageIndex p = 0; p < pages(); ++p) {
    const Page& pg = page_[p];
    allocated += pg.allocated;
    pinned += pg.pins > 0;
    const bool in_free = free_.count(p) > 0, held = held_.count(p) > 0;
    // A free unpinned page is reusable or held, never both; no other page is either.
    if ((in_free && held) || (in_free || held) != (!pg.allocated && pg.pins == 0)) {
      return absl::InternalError(absl::StrFormat("host page %d: free list (or held set) disagrees with its state", p));
    }
    reusable += in_free;
    if (journal_ != nullptr) {
      const JournalEntry e = journal_->Read(p);
      if ((e.state != JournalState::kFree) != pg.allocated || (pg.allocated && e.owner != pg.owner)) {
        return absl::InternalError(absl::StrFormat("host page %d: journal says %s of %d, the allocator %s of %d", p,
                                                   e.state == JournalState::kFree ? "free" : "owned", e.owner,
                                                   pg.allocated ? "owned" : "free", pg.owner));
      }
    }
    if (pg.allocated) {
      auto it = by_request_.find(pg.owner);
      if (it == by_request_.end() || !it->second.count(p)) {
        return absl::InternalError(absl::StrFormat("host page %d missing from request %d's pages", p, pg.owner));
      }
    }
  }
  size_t listed = 0;
  for (const auto& [r, set] : by_request_) listed += set.size();
  if (allocated != allocated_ || pinned != pinned_ || listed != allocated_ || reusable != free_.size()) {
    return absl::InternalError("host pool counters disagree with the page states");
  }
  return absl::OkStatus();
}

}  // namespace dhs::memd
