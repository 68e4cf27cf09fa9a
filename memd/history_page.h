// memd/history_page.h: the state of one history page of one admitted request (brief §4), as memd's core tracks it.
//
// A request's history is every page of its full context (input + max_new, pages of p rows); each page has a host
// page assigned at the grant for the request's life. Its state says where its rows are readable and whether the host
// copy is complete, and changes only through TransitionHistory(), which checks the move against kHistoryTransitions.
// Safety (brief §4: every row is ready on GPU or has a host copy) holds by construction in every state:
//
//   state          GPU page (PageState)                  host page                        populated from host?
//   kHostPending   none                                  assigned, not confirmed written   no (rows in the worker's tail)
//   kHost          none                                  complete copy                     yes (candidate)
//   kPopulating    optional-pending or reclaiming        complete copy (being read)        copy in flight
//   kGpu           optional-ready or reclaiming          assigned, no copy (deferred)      -
//                  (HostCopyWritten outside a reclaim: the worker did not keep the page; the GPU page is freed, kHost)
//   kGpuDeferred   reclaiming (backup answered deferred) covered by the worker's tail      -
//   kGpuAndHost    optional-ready or reclaiming          complete copy                     -
//   kLost          none (GPU fenced)                     freed                             - (interrupted request)
//   FenceGpu moves kHost, kPopulating and kGpuAndHost to kHost (kept) and the others to kLost.
//
// A copy in flight (a backup of a kGpu page, a population of a kPopulating page) is referenced by the page, not a
// state of its own: a kGpu page may be confirmed written (kGpuAndHost) while its backup is still in flight.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "common/types.h"

namespace dhs::memd {

using CopyId = uint64_t;  // one backup or population copy; 0 is never used

enum class HistoryState : uint8_t {
  kHostPending = 0,  // rows in the worker's tail, host page assigned, bytes not confirmed: host-covered, not populated
  kHost = 1,         // complete host copy, not on GPU: a population candidate
  kPopulating = 2,   // complete host copy, population copy into its GPU page in flight (not readable there yet)
  kGpu = 3,          // on GPU (optional history kept at the grant), no host copy yet: must be backed up before retire
  kGpuDeferred = 4,  // on GPU (reclaiming); backup answered deferred: host-covered by the worker's tail, not confirmed
  kGpuAndHost = 5,   // on GPU and a complete host copy
  kLost = 6,         // request interrupted by a fence: the rows were only on the dead GPU (or in its worker's tail);
                     // no GPU page, host page freed; a resume recomputes them from the request's tokens
};

std::string_view HistoryStateName(HistoryState state);

// True in the states that hold a GPU page (kPopulating, kGpu, kGpuDeferred, kGpuAndHost): the page counts in a_r.
bool HoldsGpuPage(HistoryState state);

// Every allowed move, with the event that makes it (nothing else may change a history page's state):
inline constexpr std::pair<HistoryState, HistoryState> kHistoryTransitions[] = {
    {HistoryState::kHostPending, HistoryState::kHost},        // HostCopyWritten
    {HistoryState::kGpu, HistoryState::kGpuAndHost},          // HostCopyWritten in a reclaim, or its backup completed
    {HistoryState::kGpu, HistoryState::kHost},                // HostCopyWritten outside a reclaim: the keep failed
    {HistoryState::kGpuDeferred, HistoryState::kGpuAndHost},  // HostCopyWritten of a deferred page (before retire)
    {HistoryState::kGpu, HistoryState::kGpuDeferred},         // a reclaim backup answered deferred
    {HistoryState::kHost, HistoryState::kPopulating},         // PopulateOrder
    {HistoryState::kPopulating, HistoryState::kGpuAndHost},   // ReadyPublish ok
    {HistoryState::kPopulating, HistoryState::kHost},         // ReadyPublish failed (nothing published)
    {HistoryState::kGpuAndHost, HistoryState::kHost},         // Retire
    {HistoryState::kGpuDeferred, HistoryState::kHostPending}, // Retire of a deferred page
    {HistoryState::kHostPending, HistoryState::kLost},        // FenceGpu: the rows were in the dead worker's tail
    {HistoryState::kGpu, HistoryState::kLost},                // FenceGpu: on the dead GPU only (a backup unconfirmed)
    {HistoryState::kGpuDeferred, HistoryState::kLost},        // FenceGpu: deferred backup, never confirmed
};

struct HistoryPage {
  HistoryState state = HistoryState::kHostPending;
  PageIndex host_page = 0;  // assigned at the grant (host pool page)
  PageIndex gpu_page = 0;   // valid while HoldsGpuPage(state)
  CopyId copy = 0;          // the backup (kGpu, kGpuAndHost) or population (kPopulating) copy in flight; 0 none
  // Host-page integrity (issue 22): the checksum the worker reported with the page's confirmation (payload and keys,
  // common/page_checksum.h); valid while the state holds a complete host copy (kHost, kPopulating, kGpuAndHost);
  // 0 = none known. Journaled with the confirmation; handed to a resume (GrantOrder.host_backed_checksums).
  uint64_t checksum = 0;
};

// Moves `page` from `from` to `to`. Errors: FailedPrecondition when the page is not in `from` or the move is not in
// kHistoryTransitions (the page is then unchanged).
absl::Status TransitionHistory(HistoryPage& page, HistoryState from, HistoryState to);

}  // namespace dhs::memd
