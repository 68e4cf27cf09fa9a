// memd/gpu_page_table.h: GPU page accounting of one GPU (brief §3, §4).
//
// Owns the state and owner of every page of one GPU's KV pools: M pages (from the worker's registration) and the
// admission reserve M_res (configured). It never touches GPU memory; it only records who holds which page.
// Invariant after every call: M_req + M_opt + M_res <= M (equivalently free >= M_res), and every non-free page has
// exactly one owner. Optional pages are those optional-pending, optional-ready or reclaiming.
//
// Thread-safety: none. One owner (ResidencyManager, driven by one loop) calls it.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs::memd {

// The state of one GPU page (brief §3: free, required, optional-pending, optional-ready, being reclaimed).
// Values are shown by dhsctl; append only.
enum class PageState : uint8_t {
  kFree = 0,
  kRequired = 1,         // hot cache + tail + metadata of one request; never lent
  kOptionalPending = 2,  // optional history whose population copy is in flight; not readable via the ready map
  kOptionalReady = 3,    // optional history, copy completed, readable via the ready map
  kReclaiming = 4,       // optional history taken by a reclaim; readable until retired
};

std::string_view PageStateName(PageState state);

inline constexpr RequestId kNoOwner = ~RequestId{0};

class GpuPageTable {
 public:
  // `pages` = M, `reserve_pages` = M_res. Errors: InvalidArgument when M == 0 or M_res > M.
  static absl::StatusOr<GpuPageTable> Create(GpuId gpu, uint32_t pages, uint32_t reserve_pages);

  // Takes `count` free pages for `owner` in `state` (any non-free state but kReclaiming). All or nothing.
  // Returns the page numbers (lowest free first). Errors: InvalidArgument (bad state, owner kNoOwner),
  // ResourceExhausted when it would leave fewer than M_res pages free.
  absl::StatusOr<std::vector<PageIndex>> Take(RequestId owner, uint32_t count, PageState state);

  // Takes exactly the free pages `pages` for `owner` in `state` (a surviving worker's report rebuilds its page table
  // after a memd restart, ResidencyManager::AdoptGpu). All or nothing. Errors: InvalidArgument (bad state, owner
  // kNoOwner, a page named twice), OutOfRange (a page >= M), FailedPrecondition (a page not free),
  // ResourceExhausted (it would leave fewer than M_res pages free).
  absl::Status TakeAt(RequestId owner, std::span<const PageIndex> pages, PageState state);

  // Moves one owned page from `from` to `to`, keeping its owner. Allowed: pending->ready, pending->reclaiming,
  // ready->reclaiming, reclaiming->ready, reclaiming->pending. Errors: OutOfRange, FailedPrecondition.
  absl::Status Transition(PageIndex page, PageState from, PageState to);

  // Returns an owned page to the free list. Errors: OutOfRange, FailedPrecondition (already free).
  absl::Status Release(PageIndex page);

  GpuId gpu() const { return gpu_; }
  uint32_t pages() const { return static_cast<uint32_t>(state_.size()); }  // M
  uint32_t reserve() const { return reserve_; }                            // M_res
  uint32_t required() const { return required_; }                          // M_req
  uint32_t optional() const { return pending_ + ready_ + reclaiming_; }    // M_opt
  uint32_t optional_pending() const { return pending_; }
  uint32_t optional_ready() const { return ready_; }
  uint32_t reclaiming() const { return reclaiming_; }
  uint32_t free() const { return static_cast<uint32_t>(free_list_.size()); }
  // Free pages beyond the reserve: what an admission or a population may take now.
  uint32_t lendable() const { return free() - reserve_; }

  PageState state(PageIndex page) const { return state_[page]; }  // precondition: page < pages()
  RequestId owner(PageIndex page) const { return owner_[page]; }

  // Recounts every page and checks the counters, the free list and M_req + M_opt + M_res <= M.
  absl::Status CheckInvariants() const;

 private:
  GpuPageTable(GpuId gpu, uint32_t pages, uint32_t reserve_pages);
  uint32_t& Counter(PageState state);

  GpuId gpu_;
  uint32_t reserve_;
  uint32_t required_ = 0, pending_ = 0, ready_ = 0, reclaiming_ = 0;
  std::vector<PageState> state_;
  std::vector<RequestId> owner_;
  std::vector<PageIndex> free_list_;  // a stack; top = back; initially lowest page on top
};

}  // namespace dhs::memd
