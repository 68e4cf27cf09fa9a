// memd/orders.h: the orders memd's decision core emits, one struct per outbound wire message (docs/protocol.md).
//
// ResidencyManager appends orders to its outbox while it handles an event; the daemon drains the outbox and encodes
// each order as exactly one wire message, with no decision of its own:
//   GrantOrder -> AdmitGrant, WaitOrder -> AdmitWait, RejectOrder -> AdmitReject (answers of an admission),
//   ReclaimOrder -> ReclaimOrder, PopulateOrder -> PopulateOrder, RetireOrder -> Retire (to the worker of `gpu`),
//   CompleteAckOrder -> CompleteAck (the answer of the Complete that produced it).
// OrderId is the wire order id of a ReclaimOrder or PopulateOrder (one counter for both, unique for the life of a
// ResidencyManager, 0 never used); the worker's reports (BackupComplete, ReadersDone, ReadyPublish) name it.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"

namespace dhs::memd {

using OrderId = uint64_t;   // a ReclaimOrder or PopulateOrder; 0 is never used
using ReclaimId = OrderId;  // a reclaim of one victim is named by its ReclaimOrder's id

// Admission granted (-> AdmitGrant). The request runs in `slot` (chosen by memd, 0 .. request_slots-1).
// History page h (0-based page of the full context) is kept on GPU in optional_pages[h] for h < optional_pages.size()
// (optional-ready, no host copy yet: backup deferred). Every page j of the full context has host page host_pages[j]
// (the host pool); pages j >= optional_pages.size() count as host-covered from the grant (the worker keeps their
// rows in its tail until it reports them written with HostCopyWritten).
struct GrantOrder {
  RequestId request = 0;
  GpuId gpu = 0;
  SlotIndex slot = 0;
  std::vector<PageIndex> required_pages;  // the required allocation (hot cache + tail + metadata), GPU pages
  std::vector<PageIndex> optional_pages;  // GPU page of history page h = index
  std::vector<PageIndex> host_pages;      // host page of context page j = index (context_pages entries)
  // A resume (AdmitRequest.resume_of): history pages 0 .. imported_pages-1 have a confirmed host copy (payload and
  // index keys) in host_pages, taken over from the interrupted request: the leading run of host_backed_pages.
  uint32_t imported_pages = 0;
  // A resume: EVERY history page with a confirmed host copy taken over from the interrupted request (ascending; same
  // history page as there, its host page in host_pages): the worker imports those rows and recomputes the others.
  std::vector<uint32_t> host_backed_pages;
  // Issue 22: the checksum memd keeps of each host_backed_pages[i]'s confirmed copy (same length; 0 = none known).
  std::vector<uint64_t> host_backed_checksums;
  // Issue 24 (prefix sharing): the host_backed_pages that are shared prefix pages (ascending): their host pages are
  // immutable and held by other requests too; the worker imports them and never writes them.
  std::vector<uint32_t> shared_pages;
};

// The admission is queued (-> AdmitWait; sent once, when it first cannot be granted).
struct WaitOrder {
  RequestId request = 0;
  GpuId gpu = 0;
  uint32_t queue_position = 0;  // 0 = head
  uint32_t deficit_pages = 0;   // Δ at the time (GPU pages)
};

// The admission can never fit (or is otherwise refused) (-> AdmitReject); `error` says why.
struct RejectOrder {
  RequestId request = 0;
  GpuId gpu = 0;
  absl::Status error;
  RequestId took_over = 0;  // a resume's interrupted request, taken over at admission and ended with it (0: none)
};

// Reclaim all optional pages `gpu_pages` of victim `request` (-> ReclaimOrder): back up backup_pages[i] into host page
// backup_host_pages[i] (the pages without a host copy), withdraw their ready-map entries, wait for their readers.
// The worker answers BackupComplete(order) for the backups, then ReadersDone(order); memd answers RetireOrder.
struct ReclaimOrder {
  OrderId order = 0;
  RequestId request = 0;
  GpuId gpu = 0;
  std::vector<PageIndex> gpu_pages;
  std::vector<PageIndex> backup_pages;       // subset of gpu_pages
  std::vector<PageIndex> backup_host_pages;  // host page for backup_pages[i] (the one assigned at the grant)
};

// Copy history page history_pages[i] of `request` from host page host_pages[i] into GPU page gpu_pages[i], publish
// its ready-map entries after the copy completed, then report ReadyPublish(order) (-> PopulateOrder).
struct PopulateOrder {
  OrderId order = 0;
  RequestId request = 0;
  GpuId gpu = 0;
  std::vector<PageIndex> gpu_pages;
  std::vector<uint32_t> history_pages;
  std::vector<PageIndex> host_pages;
};

// The reclaimed pages are retired (-> Retire): they no longer belong to `request` (its history is on host only).
// regranted_to: the admission granted by the same event whose required allocation took some of them (0: none).
struct RetireOrder {
  OrderId order = 0;
  RequestId request = 0;
  GpuId gpu = 0;
  std::vector<PageIndex> gpu_pages;
  RequestId regranted_to = 0;
};

// The request finished (-> CompleteAck): released_pages = GPU pages it held (required + optional, a page with a
// population copy in flight included: it is freed when that copy reports); 0 for a queued admission cancelled.
struct CompleteAckOrder {
  RequestId request = 0;
  GpuId gpu = 0;
  uint32_t released_pages = 0;
};

using Order =
    std::variant<GrantOrder, WaitOrder, RejectOrder, ReclaimOrder, PopulateOrder, RetireOrder, CompleteAckOrder>;

// "grant", "wait", "reject", "reclaim", "populate", "retire", "complete-ack".
std::string_view OrderName(const Order& order);

}  // namespace dhs::memd
