// memd/core_state.h: the state memd's decision core holds, shared by its rooms (internal to the core):
// ResidencyManager (memd/residency_manager.h: admission, reclaim, population, completion), Recovery
// (memd/recovery.h: fence, adopt, interrupt, take-over and their checks) and PrefixSharing (memd/prefix_sharing.h:
// the host tier's shared prefix pages, which it owns, and their references); memd/core_dump.h reads it for the dump.
// They change it only inside one event of ResidencyManager; a request's state only through TransitionRequest
// (memd/request_state.h), a history page's only through TransitionHistory (memd/history_page.h).
//
// The helpers below keep the per-GPU indexes (slots, speculation sums, victim and population candidates) in step with
// a request; the rooms use them.
//
// Thread-safety: none. One loop drives the core.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"
#include "memd/gpu_page_table.h"
#include "memd/history_page.h"
#include "memd/host_page_allocator.h"
#include "memd/orders.h"
#include "memd/population_scheduler.h"
#include "memd/prefix_pages.h"
#include "memd/reclaim_policy.h"
#include "memd/request_state.h"
#include "memd/residency_types.h"
#include "memd/state_dump.h"

namespace dhs::memd::core {

struct Request {
  RequestId id = 0;
  GpuId gpu = 0;
  SlotIndex slot = kNoSlot;  // chosen at the grant
  uint32_t required_count = 0;
  uint32_t imported_pages = 0;  // complete pages of imported history
  uint32_t context_pages = 0;
  bool optional_history = true;
  SpeculationShare speculation;  // part of required_count (issue 13)
  // A resume: history page -> host page of every confirmed host copy taken over from the interrupted request
  // (owned while queued; kHost at the grant, same history page).
  std::map<uint32_t, PageIndex> resumed_host;
  std::map<uint32_t, uint64_t> resumed_checksums;  // their checksums (issue 22; 0 = none known)
  // A resume: the interrupted request it took over at admission (AdmitRequest.resume_of; 0 = not a resume). A fence
  // while it queues makes it interrupted again (not rejected); a reject names it (RejectOrder.took_over).
  RequestId resume_of = 0;
  RequestState state = RequestState::kQueued;
  int64_t time_us = 0;  // queued at, then admitted at
  uint64_t seq = 0;     // admission sequence
  bool wait_sent = false;
  bool backoff = false;  // a backup of its reclaim failed; skipped as a victim for retry_ticks RetryBackups calls
  uint32_t backup_failures = 0;  // consecutive reclaims aborted by a failed backup (reset when one retires)
  uint32_t retry_ticks = 0;      // RetryBackups calls left before it is a victim again: min(2^(failures-1), 64)
  std::optional<ReclaimCandidate> victim_key;  // its key in its GPU's ReclaimIndex while it is a victim candidate
  ReclaimId reclaim = 0;
  std::vector<PageIndex> required;
  std::vector<HistoryPage> history;  // context_pages entries once granted
  // Prefix sharing (issue 24; empty when off or no chain named): the content address of each shareable history page
  // (prefix[h] for h < prefix.size(), memd/prefix_pages.h). At the grant a stored page of the same address and
  // content is imported (the history page gets the shared host page, kHost, one reference); the others it computes
  // are written (writing) and shared once their host copy is confirmed.
  std::vector<PrefixAddress> prefix;
  uint32_t optional = 0;             // a_r: history pages holding a GPU page
  uint32_t host_only = 0;            // history pages in kHost: what population can bring back
};
struct Reclaim {
  ReclaimId id = 0;
  RequestId victim = 0;
  GpuId gpu = 0;
  std::vector<PageIndex> pages;
  uint32_t backups = 0;    // outstanding (its own and adopted ones)
  uint32_t populates = 0;  // outstanding
  bool readers_done = false;
};
struct Copy {
  bool backup = true;  // false: population
  RequestId request = 0;
  GpuId gpu = 0;
  uint32_t history_page = 0;
  PageIndex host_page = 0;
  PageIndex gpu_page = 0;
  OrderId order = 0;       // the wire order the worker reports it under
  ReclaimId reclaim = 0;   // backup: the live reclaim waiting for it (0: detached by an abort)
  bool orphan = false;     // its request completed
};
// A ReclaimOrder or PopulateOrder sent and not finished: the copies it still owes a report for.
struct OrderEntry {
  bool reclaim = true;
  RequestId request = 0;
  GpuId gpu = 0;
  std::map<PageIndex, CopyId> copies;  // GPU page -> copy not yet reported
  bool aborted = false;                // reclaim aborted by a failed backup
};
struct Gpu {
  GpuPageTable table;
  std::deque<RequestId> queue;
  PopulationScheduler scheduler;
  uint32_t reclaiming_pages = 0;  // pages held by live reclaims on this GPU
  uint32_t request_slots = 0;     // N (0: unlimited)
  std::set<SlotIndex> used_slots;
  // Victim candidates (admitted, a_r > 0, not backed off) in the policy's reclaim order: a deficit's choice walks
  // only the victims it takes (issue 14: the choice used to sort every admitted request).
  ReclaimIndex victims;
  // Free slots below slot_high (slots from slot_high up were never taken): the lowest free slot in O(log n).
  std::set<SlotIndex> released_slots;
  SlotIndex slot_high = 0;
  // Population candidates: admitted requests with optional history and host_only > 0 (ascending id, the order
  // Populate hands them to the scheduler), so a tick does not scan every request's history.
  std::set<RequestId> populatable;
  GpuDeclaration declared;    // the Hello's page bytes and speculation totals
  // Sums of the speculation shares of the requests holding their required pages (admitted, reclaiming): part of
  // M_req. Pages at most M; bytes at most M * page_bytes (kMaxGpuPageBytes), so no sum overflows.
  SpeculationShare speculation;
};

// Everything the core knows but the host tier (PrefixSharing's); ResidencyManager owns it, the other rooms hold a
// reference.
struct State {
  using Clock = std::function<int64_t()>;  // microseconds, monotonic

  State(Clock clock_in, HostPageAllocator host_in) : clock(std::move(clock_in)), host(std::move(host_in)) {}

  Clock clock;
  HostPageAllocator host;
  std::map<GpuId, Gpu> gpus;          // registered and not fenced
  std::map<GpuId, uint32_t> epochs;   // every GPU ever registered: its epoch (fenced = here but not in gpus)
  std::set<GpuId> journal_gpus;       // fenced by AdoptHostPages and not registered since: AdoptGpu may take them
  std::map<RequestId, Request> requests;
  std::map<ReclaimId, Reclaim> reclaims;
  std::map<CopyId, Copy> copies;
  std::map<OrderId, OrderEntry> orders;
  std::set<RequestId> backoff;  // requests with backoff set (RetryBackups visits only these)
  std::vector<Order> outbox;
  Counters counters;
  uint64_t next_seq = 1;
  CopyId next_copy = 1;
  OrderId next_order = 1;
};

// A speculation share of a request with `required` pages on a GPU that declared `declared` (Admit's and AdoptGpu's
// check, issue 13): InvalidArgument naming the numbers, else OK.
absl::Status CheckShare(RequestId request, uint32_t required, const SpeculationShare& share,
                        const GpuDeclaration& declared);
// Adds (+1) or removes (-1) a request's share to / from its GPU's in-use sums (at the grant, the report's adoption,
// the release).
void CountShare(Gpu& gpu, const SpeculationShare& share, int sign);
// The lowest free slot of `gpu` (kNoSlot: all N taken); TakeSlot / ReleaseSlot keep used_slots, released_slots and
// slot_high in step (a slot above slot_high, a report's, frees the slots it skips).
SlotIndex FreeSlot(const Gpu& gpu);
void TakeSlot(Gpu& gpu, SlotIndex slot);
void ReleaseSlot(Gpu& gpu, SlotIndex slot);
// The victim candidates of `gpu` (admitted, a_r > 0; without the backed-off ones when `skip_backoff`), ascending
// request id, unordered by the policy: the reference the ReclaimIndex is checked against, and the dump's ranks.
std::vector<ReclaimCandidate> VictimCandidates(const State& s, GpuId gpu, bool skip_backoff);

// Re-keys `r` in its GPU's ReclaimIndex and population candidates after a change of its state, a_r, host_only,
// backoff or admission time (or removes it).
void Reindex(Request& r, Gpu& gpu);

}  // namespace dhs::memd::core
