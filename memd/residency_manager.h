// memd/residency_manager.h: the one owner of memd's residency state (brief §3, §4): GPU page accounting per GPU,
// the host pool's page accounting, admission (resident-first), reclaim, population, decode appends and completion.
//
// Events in, orders out: the daemon loop maps each inbound wire message to one event call below and sends each order
// drained from the outbox (DrainOrders) as one wire message. No sockets, no threads, no wall clock: time comes from
// the injected clock, so every decision is deterministic and testable.
//
// Unit: a "page" is one page of a GPU's KV pools (p positions of the request's payload sources) and one host pool
// page holds the same rows; host pages are accounted under SourceId 0 (kAllSources) per request.
//
// Per request: gpu, slot, required pages, history = complete pages (each: where on GPU + whether a complete host copy
// exists); rows beyond complete pages live in the tail (part of the required allocation, always on GPU).
//
// Decisions (see memd/README.md for the page state diagram):
// - Admission is FIFO per GPU. The head is granted when its required pages fit in the free pages beyond M_res
//   (lendable); its imported history then takes further lendable pages as optional-ready (host backup deferred) and
//   the rest is imported straight to host (host pages allocated at the grant). A deficit Δ = required - lendable -
//   (pages already being reclaimed on that GPU) starts reclaims of whole requests chosen by the ReclaimPolicy. If all
//   optional pages cannot cover Δ, or the host pool cannot take the history that does not fit on GPU, the head waits.
//   An admission that can never fit (required > M - M_res, or history beyond GPU room > host pool) is rejected at
//   once (RejectOrder with ResourceExhausted), never queued, so it blocks nobody behind it.
// - Reclaim of a victim: its optional pages become reclaiming; backups are ordered for pages without a host copy; a
//   page still optional-pending keeps its population copy in flight (it has a host copy already). When no backup and
//   no population copy is outstanding, a WithdrawOrder is sent; OnReadersDone retires the pages (RetireOrder) and
//   frees them for the waiting admission. A failed backup (host pool full or copy error) aborts that victim's reclaim:
//   its pages return to their previous states, its a_r is unchanged, it is skipped by later victim choices until
//   RetryBackups(); backups that did complete stay valid host copies (host coverage only grows).
// - Decode appends: OnTailPageComplete adds a history page that stays in the tail until its host backup completes;
//   it then leaves the tail (the worker may reuse the tail page) and lives on host only until population brings it
//   back as optional history. A tail page whose backup cannot be ordered (host pool full) or failed waits for
//   RetryBackups().
// - Population (Populate()): per GPU with no queued admission, the PopulationScheduler hands out lendable pages,
//   bounded per attempt, as optional-pending; OnPopulateDone makes them optional-ready (or frees them on failure).
// - Complete releases everything: required pages, optional pages (a page with a population copy in flight after that
//   copy's report), host pages (pinned ones after their copy's report); an in-flight reclaim is cancelled.
// Safety invariant (checked by CheckInvariants): every history page of every admitted request is ready on GPU (tail,
// optional-ready, or reclaiming with its data) or has a complete host copy.
//
// Thread-safety: none. One loop drives it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "memd/gpu_page_table.h"
#include "memd/host_page_allocator.h"
#include "memd/orders.h"
#include "memd/population_scheduler.h"
#include "memd/reclaim_policy.h"
#include "memd/state_dump.h"

namespace dhs::memd {

inline constexpr SourceId kAllSources = 0;

struct ResidencyConfig {
  uint32_t reserve_pages = 0;             // M_res per GPU
  uint32_t host_pages = 0;                // host pool size, pages
  uint64_t host_page_bytes = 1;           // bytes per host page
  uint32_t populate_pages_per_attempt = 8;
  std::string reclaim_policy = "largest-first";  // default chosen by measurement (memd/README.md)
};

struct AdmitRequest {
  RequestId request = 0;
  GpuId gpu = 0;
  SlotIndex slot = 0;
  uint32_t required_pages = 0;  // > 0: hot cache + tail + metadata pages
  uint32_t history_pages = 0;   // complete pages of imported history (candidates for optional history)
  // The worker contract (docs/protocol.md "Conversation contract"): memd assigns a host page to every page of the
  // full context (context_pages >= history_pages) at the grant. History pages not kept on GPU count as host-covered
  // from the grant, but are populated only after OnHostCopyWritten (or a reclaim backup) confirmed their bytes.
  bool assign_host_pages = false;
  uint32_t context_pages = 0;   // pages of the full context (input + max_new), with assign_host_pages
  // false: the request never holds optional history (hisparse mode, issue 5): none of its history is kept on GPU at
  // the grant (it all goes to host pages) and population never brings it back; it is never a reclaim victim.
  bool optional_history = true;
};

class ResidencyManager {
 public:
  using Clock = std::function<int64_t()>;  // microseconds, monotonic

  // Errors: InvalidArgument for an unknown policy name or host_page_bytes == 0.
  static absl::StatusOr<std::unique_ptr<ResidencyManager>> Create(const ResidencyConfig& config, Clock clock);

  // ---- events (each returns a non-OK status for bad input and then changes nothing) ----
  // A worker registered GPU `gpu` with `pages` = M. Errors: AlreadyExists, InvalidArgument (M == 0 or M_res > M).
  absl::Status RegisterGpu(GpuId gpu, uint32_t pages);
  // A new admission (answered by Grant, Wait then Grant, or Reject). Errors: AlreadyExists (id in use),
  // NotFound (gpu not registered), InvalidArgument (required_pages == 0).
  absl::Status Admit(const AdmitRequest& admission);
  // A backup copy finished (ok) or failed. Errors: NotFound (unknown copy id).
  // written = false (with ok; a reclaim backup only): the worker did not copy the page because it held nothing yet
  // (only planned to be kept; its rows are still in the worker's tail, contract §4): the reclaim goes on as if backed
  // up, the page counts as host-covered, and it is populated only after OnHostCopyWritten confirms the bytes (a
  // confirmation that arrived first is kept).
  absl::Status OnBackupDone(CopyId copy, bool ok, bool written = true);
  // A population copy finished and its ready locations were published (ok), or it failed.
  // Errors: NotFound (unknown copy id).
  absl::Status OnPopulateDone(CopyId copy, bool ok);
  // Readers of a withdrawn reclaim finished. Reports for reclaims cancelled by a completion are ignored (OK).
  // Errors: NotFound (never issued), FailedPrecondition (no WithdrawOrder sent yet).
  absl::Status OnReadersDone(ReclaimId reclaim);
  // The worker wrote history page `history_page` of `request` to its assigned host page (BackupComplete with order 0):
  // it is now a complete host copy that population may read. Errors: NotFound (unknown request), FailedPrecondition
  // (queued, or the page has no host page assigned), OutOfRange (no such history page).
  absl::Status OnHostCopyWritten(RequestId request, uint32_t history_page);
  // A tail page of `request` became complete (joins history). Errors: NotFound, FailedPrecondition (queued).
  absl::Status OnTailPageComplete(RequestId request);
  // The request finished (or a queued admission was cancelled). Errors: NotFound.
  absl::Status Complete(RequestId request);
  // One population attempt on every GPU (the daemon calls it on its tick).
  absl::Status Populate();
  // Retries what failed: clears the reclaim back-off of victims whose backup failed and re-orders tail backups.
  absl::Status RetryBackups();

  // ---- outputs ----
  std::vector<Order> DrainOrders();
  const std::vector<Order>& outbox() const { return outbox_; }
  absl::Status CheckInvariants() const;
  StateDump Dump() const;
  const Counters& counters() const { return counters_; }
  const GpuPageTable* gpu_table(GpuId gpu) const;
  const HostPageAllocator& host() const { return host_; }

 private:
  struct HistoryPage {
    enum class Where : uint8_t { kNone, kTail, kPage };
    Where where = Where::kNone;
    PageIndex gpu_page = 0;   // valid when where == kPage
    CopyId populate = 0;      // a population copy into gpu_page in flight (0: none)
    CopyId backup = 0;        // a backup copy in flight (0: none)
    bool has_host = false;    // a complete host copy exists in host_page (or counts as one: see awaiting_write)
    PageIndex host_page = 0;
    bool host_reserved = false;  // host_page is assigned (assign_host_pages) but holds no copy yet
    bool awaiting_write = false; // has_host from the grant; the worker has not confirmed the bytes: not populated
  };
  using Where = HistoryPage::Where;
  struct Request {
    RequestId id = 0;
    GpuId gpu = 0;
    SlotIndex slot = 0;
    uint32_t required_count = 0;
    uint32_t imported_pages = 0;
    bool assign_host_pages = false;
    uint32_t context_pages = 0;
    bool optional_history = true;
    RequestState state = RequestState::kQueued;
    int64_t time_us = 0;  // queued at, then admitted at
    uint64_t seq = 0;     // admission sequence
    bool wait_sent = false;
    bool backoff = false;  // a backup of its reclaim failed; skipped as a victim until RetryBackups
    ReclaimId reclaim = 0;
    std::vector<PageIndex> required;
    std::vector<HistoryPage> history;
    uint32_t optional = 0;             // a_r
    std::vector<uint32_t> tail_retry;  // history pages in the tail whose backup must be (re)ordered
  };
  struct Reclaim {
    ReclaimId id = 0;
    RequestId victim = 0;
    GpuId gpu = 0;
    std::vector<PageIndex> pages;
    uint32_t backups = 0;    // outstanding
    uint32_t populates = 0;  // outstanding
    bool withdrawn = false;
  };
  struct Copy {
    bool backup = true;  // false: population
    RequestId request = 0;
    GpuId gpu = 0;
    uint32_t history_page = 0;
    PageIndex host_page = 0;
    PageIndex gpu_page = 0;
    bool from_tail = false;
    ReclaimId reclaim = 0;   // backup ordered by this reclaim (0: none or detached)
    bool orphan = false;     // its request completed
  };
  struct Gpu {
    GpuPageTable table;
    std::deque<RequestId> queue;
    PopulationScheduler scheduler;
    uint32_t reclaiming_pages = 0;  // pages held by live reclaims on this GPU
  };

  ResidencyManager(const ResidencyConfig& config, Clock clock, HostPageAllocator host,
                   std::unique_ptr<ReclaimPolicy> policy);
  absl::Status Finish(absl::Status status);  // counts the event, then Pump()s when OK
  void Pump();
  void PumpGpu(GpuId gpu_id, Gpu& gpu);
  absl::Status NeverFits(const Request& r, const Gpu& gpu) const;
  bool TryGrant(Request& r, Gpu& gpu);
  bool GrantWithHostPages(Request& r, Gpu& gpu, uint32_t on_gpu);
  bool StartReclaim(Request& victim, Gpu& gpu);
  void RetireReclaim(ReclaimId id);
  void AbortReclaim(Request& victim, Gpu& gpu);
  void AdvanceReclaim(Reclaim& rc);
  void OrderTailBackups(Request& r);
  std::vector<ReclaimCandidate> Candidates(GpuId gpu, bool skip_backoff) const;

  ResidencyConfig config_;
  Clock clock_;
  HostPageAllocator host_;
  std::unique_ptr<ReclaimPolicy> policy_;
  std::map<GpuId, Gpu> gpus_;
  std::map<RequestId, Request> requests_;
  std::map<ReclaimId, Reclaim> reclaims_;
  std::map<CopyId, Copy> copies_;
  std::vector<Order> outbox_;
  Counters counters_;
  uint64_t next_seq_ = 1;
  CopyId next_copy_ = 1;
  ReclaimId next_reclaim_ = 1;
};

}  // namespace dhs::memd
