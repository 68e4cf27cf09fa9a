#include "memd/gpu_page_table.h"

#include <set>

#include "absl/strings/str_format.h"

namespace dhs::memd {

std::string_view PageStateName(PageState state) {
  switch (state) {
    case PageState::kFree: return "free";
    case PageState::kRequired: return "required";
    case PageState::kOptionalPending: return "optional-pending";
    case PageState::kOptionalReady: return "optional-ready";
    case PageState::kReclaiming: return "reclaiming";
  }
  return "unknown";
}

absl::StatusOr<GpuPageTable> GpuPageTable::Create(GpuId gpu, uint32_t pages, uint32_t reserve_pages) {
  if (pages == 0) return absl::InvalidArgumentError(absl::StrFormat("GPU %d: M must be > 0 pages", gpu));
  if (reserve_pages > pages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GPU %d: admission reserve M_res=%d pages exceeds M=%d pages", gpu, reserve_pages, pages));
  }
  return GpuPageTable(gpu, pages, reserve_pages);
}

GpuPageTable::GpuPageTable(GpuId gpu, uint32_t pages, uint32_t reserve_pages)
    : gpu_(gpu), reserve_(reserve_pages), state_(pages, PageState::kFree), owner_(pages, kNoOwner) {
  free_list_.reserve(pages);
  for (uint32_t p = pages; p > 0; --p) free_list_.push_back(p - 1);
}

uint32_t& GpuPageTable::Counter(PageState state) {
  switch (state) {
    case PageState::kRequired: return required_;
    case PageState::kOptionalPending: return pending_;
    case PageState::kOptionalReady: return ready_;
    default: return reclaiming_;
  }
}

absl::StatusOr<std::vector<PageIndex>> GpuPageTable::Take(RequestId owner, uint32_t count, PageState state) {
  if (state == PageState::kFree || state == PageState::kReclaiming) {
    return absl::InvalidArgumentError(absl::StrFormat("cannot take pages in state %s", PageStateName(state)));
  }
  if (owner == kNoOwner) return absl::InvalidArgumentError("cannot take pages for kNoOwner");
  if (count > lendable()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "GPU %d: %d pages asked, %d lendable (free %d, reserve M_res %d)", gpu_, count, lendable(), free(), reserve_));
  }
  std::vector<PageIndex> pages;
  pages.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    PageIndex p = free_list_.back();
    free_list_.pop_back();
    state_[p] = state;
    owner_[p] = owner;
    pages.push_back(p);
  }
  Counter(state) += count;
  return pages;
}

absl::Status GpuPageTable::TakeAt(RequestId owner, std::span<const PageIndex> pages, PageState state) {
  if (state == PageState::kFree || state == PageState::kReclaiming) {
    return absl::InvalidArgumentError(absl::StrFormat("cannot take pages in state %s", PageStateName(state)));
  }
  if (owner == kNoOwner) return absl::InvalidArgumentError("cannot take pages for kNoOwner");
  std::set<PageIndex> want;
  for (PageIndex p : pages) {
    if (p >= this->pages()) {
      return absl::OutOfRangeError(absl::StrFormat("GPU %d: page %d >= M=%d", gpu_, p, this->pages()));
    }
    if (state_[p] != PageState::kFree) {
      return absl::FailedPreconditionError(absl::StrFormat("GPU %d page %d is %s, not free (owner %d)", gpu_, p,
                                                           PageStateName(state_[p]), owner_[p]));
    }
    if (!want.insert(p).second) {
      return absl::InvalidArgumentError(absl::StrFormat("GPU %d page %d named twice", gpu_, p));
    }
  }
  if (want.size() > lendable()) {
    return absl::ResourceExhaustedError(absl::StrFormat("GPU %d: %d pages asked, %d lendable (free %d, M_res %d)",
                                                        gpu_, want.size(), lendable(), free(), reserve_));
  }
  std::erase_if(free_list_, [&](PageIndex p) { return want.contains(p); });
  for (PageIndex p : want) {
    state_[p] = state;
    owner_[p] = owner;
  }
  Counter(state) += static_cast<uint32_t>(want.size());
  return absl::OkStatus();
}

absl::Status GpuPageTable::Transition(PageIndex page, PageState from, PageState to) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("GPU %d: page %d >= M=%d", gpu_, page, pages()));
  if (state_[page] != from) {
    return absl::FailedPreconditionError(absl::StrFormat("GPU %d page %d is %s, expected %s", gpu_, page,
                                                         PageStateName(state_[page]), PageStateName(from)));
  }
  using S = PageState;
  const bool allowed = (from == S::kOptionalPending && (to == S::kOptionalReady || to == S::kReclaiming)) ||
                       (from == S::kOptionalReady && to == S::kReclaiming) ||
                       (from == S::kReclaiming && (to == S::kOptionalReady || to == S::kOptionalPending));
  if (!allowed) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GPU %d page %d: no transition %s -> %s", gpu_, page, PageStateName(from), PageStateName(to)));
  }
  Counter(from) -= 1;
  Counter(to) += 1;
  state_[page] = to;
  return absl::OkStatus();
}

absl::Status GpuPageTable::Release(PageIndex page) {
  if (page >= pages()) return absl::OutOfRangeError(absl::StrFormat("GPU %d: page %d >= M=%d", gpu_, page, pages()));
  if (state_[page] == PageState::kFree) {
    return absl::FailedPreconditionError(absl::StrFormat("GPU %d page %d is already free", gpu_, page));
  }
  Counter(state_[page]) -= 1;
  state_[page] = PageState::kFree;
  owner_[page] = kNoOwner;
  free_list_.push_back(page);
  return absl::OkStatus();
}

absl::Status GpuPageTable::CheckInvariants() const {
  uint32_t counts[5] = {0, 0, 0, 0, 0};
  for (PageIndex p = 0; p < pages(); ++p) {
    counts[static_cast<int>(state_[p])]++;
    if ((state_[p] == PageState::kFree) != (owner_[p] == kNoOwner)) {
      return absl::InternalError(absl::StrFormat("GPU %d page %d: state %s with owner %d", gpu_, p,
                                                 PageStateName(state_[p]), owner_[p]));
    }
  }
  if (counts[0] != free() || counts[1] != required_ || counts[2] != pending_ || counts[3] != ready_ ||
      counts[4] != reclaiming_) {
    return absl::InternalError(absl::StrFormat("GPU %d: page counters disagree with the page states", gpu_));
  }
  std::vector<bool> seen(pages(), false);
  for (PageIndex p : free_list_) {
    if (p >= pages() || seen[p] || state_[p] != PageState::kFree) {
      return absl::InternalError(absl::StrFormat("GPU %d: free list holds page %d twice or not free", gpu_, p));
    }
    seen[p] = true;
  }
  if (required_ + optional() + reserve_ > pages()) {
    return absl::InternalError(absl::StrFormat("GPU %d: M_req %d + M_opt %d + M_res %d > M %d", gpu_, required_,
                                               optional(), reserve_, pages()));
  }
  return absl::OkStatus();
}

}  // namespace dhs::memd
