// memd/orders.h: the orders memd's decision core emits (one struct per outbound wire message).
//
// ResidencyManager appends orders to its outbox while it handles an event; the daemon loop drains the outbox and
// sends each order as one wire message to the worker of `gpu` (Grant/Wait/Reject answer an admission).
// CopyId and ReclaimId are unique for the life of a ResidencyManager and come back in the worker's reports.
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

using CopyId = uint64_t;     // one backup or population copy; 0 is never used
using ReclaimId = uint64_t;  // one reclaim of one victim request; 0 is never used

// Admission granted. History page h (0-based, complete pages of the imported history) goes to
// history_gpu_pages[h] for h < history_gpu_pages.size() (optional-ready, no host copy yet: backup deferred), and to
// host page history_host_pages[h - history_gpu_pages.size()] otherwise (imported straight to host). The worker writes
// the imported history into these places before the request's first query; memd counts it present from the grant.
struct GrantOrder {
  RequestId request = 0;
  GpuId gpu = 0;
  SlotIndex slot = 0;
  std::vector<PageIndex> required_pages;  // the required allocation (hot cache + tail + metadata)
  std::vector<PageIndex> history_gpu_pages;
  std::vector<PageIndex> history_host_pages;
  // Only for an admission with assign_host_pages (the worker contract, docs/protocol.md): the host page of history
  // page j for EVERY page j of the full context (history_host_pages is then empty). Pages j >= history_gpu_pages.size()
  // count as host-covered from the grant (the worker keeps their rows in its tail until their backup completed).
  std::vector<PageIndex> context_host_pages;
};

// The admission is queued (sent once, when it first cannot be granted).
struct WaitOrder {
  RequestId request = 0;
  GpuId gpu = 0;
  uint32_t queue_position = 0;  // 0 = head
  uint32_t deficit_pages = 0;   // Δ at the time (GPU pages)
};

// The admission can never fit (or is otherwise refused); `error` says why.
struct RejectOrder {
  RequestId request = 0;
  GpuId gpu = 0;
  absl::Status error;
};

// Copy history page `history_page` of `request` from GPU to host page `host_page`; report with OnBackupDone(copy).
// from_tail: the page is a just-completed tail page (gpu_page is then meaningless: the rows are in the tail).
struct BackupOrder {
  CopyId copy = 0;
  RequestId request = 0;
  GpuId gpu = 0;
  uint32_t history_page = 0;
  bool from_tail = false;
  PageIndex gpu_page = 0;
  PageIndex host_page = 0;
  ReclaimId reclaim = 0;  // the reclaim that ordered it (follows its ReclaimStartOrder); 0 for a tail backup
};

// Copy history page `history_page` from host page `host_page` into GPU page `gpu_page`, publish its ready-map entries
// after the copy completed, then report OnPopulateDone(copy).
struct PopulateOrder {
  CopyId copy = 0;
  RequestId request = 0;
  GpuId gpu = 0;
  uint32_t history_page = 0;
  PageIndex host_page = 0;
  PageIndex gpu_page = 0;
};

// Reclaim: withdraw the ready-map entries of `gpu_pages` (all backups done), wait until every reader that could read
// them finished, then report OnReadersDone(reclaim).
struct WithdrawOrder {
  ReclaimId reclaim = 0;
  RequestId request = 0;
  GpuId gpu = 0;
  std::vector<PageIndex> gpu_pages;
};

// The reclaimed pages are retired: they no longer belong to `request` (its history is on host only).
struct RetireOrder {
  ReclaimId reclaim = 0;
  RequestId request = 0;
  GpuId gpu = 0;
  std::vector<PageIndex> gpu_pages;
};

// A reclaim of one victim started: `gpu_pages` (all its optional pages) are now reclaiming. Emitted before the
// BackupOrders of the same reclaim (they carry `reclaim`); the daemon sends both as one wire ReclaimOrder.
struct ReclaimStartOrder {
  ReclaimId reclaim = 0;
  RequestId request = 0;
  GpuId gpu = 0;
  std::vector<PageIndex> gpu_pages;
};

using Order = std::variant<GrantOrder, WaitOrder, RejectOrder, BackupOrder, PopulateOrder, WithdrawOrder, RetireOrder,
                           ReclaimStartOrder>;

// "grant", "wait", "reject", "backup", "populate", "withdraw", "retire", "reclaim".
std::string_view OrderName(const Order& order);

}  // namespace dhs::memd
