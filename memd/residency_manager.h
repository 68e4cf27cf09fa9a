// memd/residency_manager.h: the one owner of memd's residency state (brief §3, §4): GPU page accounting per GPU,
// the host pool's page accounting, request slots, admission (resident-first), reclaim, population and completion.
//
// Events in, orders out: the daemon loop maps each inbound wire message to one event call below and sends each order
// drained from the outbox (DrainOrders) as one wire message. No sockets, no threads, no wall clock: time comes from
// the injected clock, so every decision is deterministic and testable.
//
// Unit: a "page" is one page of a GPU's KV pools (p positions of the request's payload sources) and one host pool
// page holds the same rows; host pages are accounted under SourceId 0 (kAllSources) per request.
//
// Per request: gpu, slot, required pages, history = every page of its full context (input + max_new), each with a
// host page assigned at the grant and a HistoryState (memd/history_page.h); rows of pages not yet confirmed written
// live in the worker's tail (part of the required allocation, always on GPU).
//
// Decisions (see memd/README.md for the page state diagram and docs/protocol.md for the conversation):
// - Admission is FIFO per GPU. The head is granted when its required pages fit in the free pages beyond M_res
//   (lendable), a request slot is free and the host pool can give a host page to every page of its full context (one
//   grant path: host pages are assigned at the grant, so no reclaim ever waits for host pages). Its complete imported
//   history then keeps further lendable pages as optional-ready (host backup deferred), leaving what the admissions
//   queued behind it require; a request without optional history (hisparse) keeps none. A deficit
//   Δ = required - lendable - (pages already being reclaimed on that GPU) starts reclaims of whole requests chosen by
//   the ReclaimPolicy. If all optional pages cannot cover Δ, the head waits. An admission that can never fit
//   (required > M - M_res, or context > host pool) is rejected at once, never queued, so it blocks nobody.
// - Reclaim of a victim: one ReclaimOrder with all its optional pages and the backups of the pages without a host copy
//   (into their assigned host pages); a page being populated keeps its copy in flight. The pages are retired
//   (RetireOrder) once every backup and population copy reported and the worker's ReadersDone arrived, in any order
//   (an early ReadersDone is held). A failed backup aborts the victim's reclaim: its pages return to their previous
//   states, a_r unchanged, it is skipped by victim choice for a back-off of 1, 2, 4 .. 64 RetryBackups() calls
//   (doubling per consecutive failure); backups that completed stay valid.
//   A backup answered deferred lets the reclaim go on: the page is covered by the worker's tail until HostCopyWritten.
// - Population (Populate()): per GPU with no queued admission, the PopulationScheduler hands out lendable pages,
//   bounded per attempt, to pages with a confirmed host copy (kHost), one PopulateOrder per request.
// - Complete releases everything: required pages, optional pages (one with a population copy in flight after that
//   copy's report), host pages (pinned ones after their copy's report), the slot; an in-flight reclaim is cancelled.
// - Recovery (memd/recovery.h, over the state the rooms share, memd/core_state.h): FenceGpu, AdoptHostPages, AdoptGpu,
//   ReleaseHeldPages and a resume's take-over are its steps; this class runs them as events (counts, pumps).
// - Prefix sharing (memd/prefix_sharing.h, issue 24; owns the host tier): an admission's content addresses, a grant's
//   hits and the cached pages it evicts for room, shared pages published once their host copy is confirmed,
//   references released at the end; this class calls it at each of those steps.
// - Introspection: Dump reads the state through memd/core_dump.h.
// History page states: memd/history_page.h; request states: memd/request_state.h. Safety (every history page of every
// admitted request is ready on GPU or has a host copy) holds in every state; CheckInvariants checks the states against
// the page tables and copies.
//
// Thread-safety: none. One loop drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "memd/cluster_sessions.h"
#include "memd/core_state.h"
#include "memd/gpu_page_table.h"
#include "memd/history_page.h"
#include "memd/host_page_allocator.h"
#include "memd/orders.h"
#include "memd/prefix_sharing.h"
#include "memd/reclaim_policy.h"
#include "memd/recovery.h"
#include "memd/residency_types.h"
#include "memd/state_dump.h"

namespace dhs::memd {

class ResidencyManager {
 public:
  using Clock = std::function<int64_t()>;  // microseconds, monotonic

  // `journal` (nullptr: none; not owned, outlives the core): every host page's owner, history page and confirmed
  // host copy is written to it inside the event that changes it (memd/host_journal.h); it must be formatted (all
  // free) or hold exactly what AdoptHostPages will adopt. Errors: InvalidArgument for an unknown policy name,
  // host_page_bytes == 0, or a journal of another page count.
  static absl::StatusOr<std::unique_ptr<ResidencyManager>> Create(const ResidencyConfig& config, Clock clock,
                                                                  HostJournal* journal = nullptr);

  // ---- events (each returns a non-OK status for bad input and then changes nothing) ----
  // A worker registered GPU `gpu` with `pages` = M and `request_slots` = N slots (0: unlimited). A GPU fenced before
  // registers again with a fresh page table and slots: a new epoch (epoch(gpu) + 1, counted in reregistrations); its
  // interrupted requests stay interrupted (InterruptedRequests lists them for the new worker).
  // `declared`: the Hello's page bytes and speculation totals (what each admission's SpeculationShare is checked
  // against, and what the dump shows per GPU).
  // Errors: AlreadyExists (registered and not fenced), InvalidArgument (M == 0, M > kMaxGpuPages, M_res > M,
  // request_slots > kMaxRequestSlots, declared.page_bytes > kMaxGpuPageBytes), ResourceExhausted (its epoch is
  // kNodeRequestEpochs, common/types.h: the next epoch's node request ids would be epoch 1's).
  absl::Status RegisterGpu(GpuId gpu, uint32_t pages, uint32_t request_slots = 0, const GpuDeclaration& declared = {});
  // The worker of GPU `gpu` is gone (dead peer, heartbeat timeout, an order that could not be sent): the GPU is
  // fenced. Deterministic, all at once:
  // - every copy in flight on it is resolved: its host page is unpinned; a backup's host page counts as a host copy
  //   only if HostCopyWritten had confirmed it (kGpuAndHost), a population copy's GPU page is gone with the GPU;
  // - every ReclaimOrder / PopulateOrder entry of the GPU is dropped (later reports name unknown orders);
  // - queued admissions of the GPU are answered with a RejectOrder (UNAVAILABLE, "GPU n was fenced"), except queued
  //   resumes (Admit with resume_of): they become interrupted again, holding the host pages they took over as kHost
  //   history pages (the rest kLost), so the next worker resumes them (no RejectOrder: their record stays);
  // - admitted requests become kInterrupted: they keep exactly the host pages holding a confirmed host copy (kHost,
  //   kPopulating, kGpuAndHost -> kHost) and free the others (kHostPending, kGpu, kGpuDeferred -> kLost), lose their
  //   GPU pages and slot; Complete ends them (memd answers CompleteAck, released_pages 0);
  // - the GPU's page table, queue and slots are dropped: it is unregistered (fenced) until RegisterGpu.
  // Freed host pages may let admissions of other GPUs through (orders of this event). Errors: NotFound (the GPU is
  // not registered, or already fenced).
  // `why` (for the logs and the daemon's refusals: FenceReason) is kept until the GPU is fenced again.
  absl::Status FenceGpu(GpuId gpu, std::string_view why = {});
  // The first event of a memd that found a dead memd's verified journal (HostJournal::Verify): every request becomes
  // kInterrupted on its GPU exactly as FenceGpu leaves it: history of context_pages pages, kHost (host page allocated,
  // confirmed in the journal) for each of host_pages, kLost for the others; no GPU page, slot or copy. Each GPU named
  // is fenced (known, not registered) at epoch max(its requests' epochs): its next RegisterGpu is a later epoch, its
  // worker finds the requests in InterruptedRequests. Journal entries of pages not adopted (assigned, never
  // confirmed) are freed. Every other host page is held (HostPageAllocator::HoldReusable: the dead memd's workers may
  // still write into it until their epochs end) until ReleaseHeldPages. No orders. Errors (nothing changes): FailedPrecondition (a GPU registered or a request known
  // already), InvalidArgument (a reserved or repeated id, epoch 0, context_pages above the host pool, a history
  // page outside the context, a host page out of range or named twice).
  // `shared` (issue 24): the journal's shared prefix pages (HostJournal::Verify's kShared entries): adopted as cached
  // pages when prefix sharing is on (a memd restart loses no confirmed shared page), freed when it is off. An adopted
  // request's history page whose copy was a shared page is kLost for it (the page itself is cached: a resume that
  // names its chain imports it again).
  absl::Status AdoptHostPages(std::span<const AdoptedRequest> requests,
                              std::span<const AdoptedSharedPage> shared = {});
  // The worker of GPU `gpu` survived a memd restart and says Hello again with a report of its live requests
  // (docs/protocol.md "Re-Hello with a report"): the GPU is registered with `pages` = M and `request_slots` like
  // RegisterGpu, but keeps its epoch: epoch(gpu) becomes `epoch` (the one its node ids carry), not epoch + 1. Each
  // report becomes an admitted request (slot, required GPU pages, optional GPU pages as reported; no orders):
  // - history page h is a host copy only when this memd adopted it from the journal (AdoptHostPages) for the same
  //   request, history page and host page (the journal wins; a copy the worker claims but the journal lacks is none);
  //   then kGpuAndHost with a GPU page, kHost without; otherwise kGpu with a GPU page, kHostPending without (the rows
  //   are in the worker's tail), its reported host page allocated to it again (it must be free or held);
  // - a request the journal adopted (interrupted on this GPU) is replaced by its report; one the journal lacks (no
  //   host page ever confirmed) is admitted from its report alone; interrupted requests not reported stay interrupted.
  // A report that does not fit (unknown-GPU page, page or slot taken or named twice, a host page of another owner, a
  // context other than the journal's, a GPU page kept without optional history) is refused alone and changes nothing
  // of its request (an interrupted one stays interrupted); `outcomes` (optional) gets one status per report.
  // Errors (nothing changes): AlreadyExists (registered), FailedPrecondition (this memd registered or fenced the GPU
  // itself: a fenced worker starts a new epoch; or `epoch` is below the journal's epoch of the GPU), InvalidArgument
  // (epoch 0 and RegisterGpu's bounds). A report's speculation share is checked as Admit checks one.
  absl::Status AdoptGpu(GpuId gpu, uint32_t pages, uint32_t request_slots, uint32_t epoch,
                        std::span<const ReportedRequest> reports, std::vector<absl::Status>* outcomes = nullptr,
                        const GpuDeclaration& declared = {});
  // The pages held since AdoptHostPages become reusable (the daemon calls it once the dead memd's workers cannot write
  // any more: memd --adopt-grace-ms after its start); waiting admissions may be granted (orders). Never fails.
  absl::Status ReleaseHeldPages();
  // A new admission (answered by Grant, Wait then Grant, or Reject). Errors: AlreadyExists (id in use),
  // NotFound (gpu not registered), InvalidArgument (a reserved id: 0 or kNoOwner; required_pages == 0, context_rows
  // beyond 2^32-1 pages, history_pages > context_pages; a speculation share (CheckShare) whose pages exceed
  // required_pages, whose pages are not ceil(bytes / the GPU's page_bytes), or whose bytes exceed the GPU's declared
  // totals). A grant the page tables refuse (a bug) becomes a Reject with
  // Internal: no event aborts memd.
  // Resume (host_backed, resume_of = R): in this one event the new request takes over EVERY kept host page of R
  // (each history page h in kHost, gaps and all: the worker imports those rows and recomputes only the kLost ones)
  // and R ends (its record is the daemon's to drop). The queued request owns those host pages under the same history
  // page h; its grant gives history page h that host page in kHost (GrantOrder.host_backed_pages lists every such h,
  // ascending; GrantOrder.imported_pages = the leading run of them), fresh host pages to the other pages, and no
  // optional GPU page (population brings the kHost pages back). One that can never fit is rejected and its
  // taken-over pages freed. Errors (nothing changed): InvalidArgument (host_backed without resume_of or the reverse; R
  // not interrupted; R of another GPU; a kept page h >= context_pages), NotFound (R unknown).
  absl::Status Admit(const AdmitRequest& admission);
  // BackupComplete of ReclaimOrder `order`: `pages` (GPU pages of its backup_pages; empty = every backup not yet
  // reported) were written (ok) or failed. deferred (with ok): pages the worker had only planned to keep (rows still
  // being written, contract §4): nothing was copied, the reclaim goes on, the page is covered by the worker's tail
  // and populated only after HostCopyWritten. A failure aborts the reclaim (victim untouched, RetryBackups() later).
  // Errors: NotFound (no such reclaim order, or all its backups reported), InvalidArgument (a page not an unreported
  // backup of the order, named twice, or a deferred page not among `pages`).
  // checksums (issue 22): with ok, checksums[i] of pages[i]'s written host copy (kept with the confirmation and
  // journaled; 0 = none known); empty = none, else the length of `pages` (InvalidArgument otherwise).
  absl::Status OnBackupComplete(OrderId order, std::span<const PageIndex> pages, bool ok,
                                std::span<const PageIndex> deferred = {}, std::span<const uint64_t> checksums = {});
  // ReadyPublish of PopulateOrder `order`: `pages` (GPU pages; empty = every page not yet reported) were copied and
  // published (ok), or failed (nothing published: the pages are freed). Errors: NotFound (no such populate order),
  // InvalidArgument (a page not an unreported page of the order, or named twice).
  absl::Status OnReadyPublish(OrderId order, std::span<const PageIndex> pages, bool ok);
  // ReadersDone of ReclaimOrder `order`: the worker withdrew the pages' ready-map entries and their readers finished.
  // May come before the order's backups or population copies reported (held until they did). A report for a reclaim
  // already retired or cancelled by a completion is stale (OK, counted). Errors: NotFound (never issued, or an open
  // populate order), FailedPrecondition (the reclaim was aborted by a failed backup and still waits for backup reports).
  absl::Status OnReadersDone(OrderId order);
  // HostCopyWritten: the worker wrote history pages `history_pages` of `request` to their assigned host pages
  // (host_pages[i] for history_pages[i] when given; empty = not stated). ok = false: the copies failed (counted,
  // nothing changes: the pages stay covered by the worker's tail and are not populated). A kept page (kGpu) reported
  // written outside a reclaim was not kept (the worker's keep copy failed, contract §3): its GPU page is freed (kHost).
  // Errors: NotFound (unknown request), FailedPrecondition (queued), OutOfRange (no such history page),
  // InvalidArgument (host_pages of another length, a history page named twice, or a host page not the one assigned).
  // checksums (issue 22): checksums[i] of history_pages[i]'s host copy, kept with its confirmation (and journaled);
  // a repeated report of a confirmed page records a checksum only when none was known. Empty = none, else the
  // length of history_pages (InvalidArgument otherwise).
  absl::Status OnHostCopyWritten(RequestId request, std::span<const uint32_t> history_pages,
                                 std::span<const PageIndex> host_pages, bool ok,
                                 std::span<const uint64_t> checksums = {});
  // The request finished (or a queued admission was cancelled, or an interrupted request is given up): answered by a
  // CompleteAckOrder. Errors: NotFound.
  absl::Status Complete(RequestId request);
  // One population attempt on every GPU (the daemon calls it on its tick).
  absl::Status Populate();
  // Ends the reclaim back-off of victims whose backup failed once it is due (the daemon calls it every second): after
  // the k-th consecutive aborted reclaim of a victim it sits out min(2^(k-1), kMaxRetryTicks) calls, so a backup that
  // keeps failing is re-ordered after 1, 2, 4, ... 64 calls, then every 64, not on every call.
  absl::Status RetryBackups();

  // ---- outputs ----
  std::vector<Order> DrainOrders();
  absl::Status CheckInvariants() const;
  StateDump Dump(DumpDetail detail = DumpDetail::kFull) const;
  // What one introspection view shows (DumpScopeOf): the counts plus the scope's requests and page rows; its cost
  // does not grow with M except for a runs scan (bounded by M, one byte and one owner compare per page).
  StateDump Dump(const DumpScope& scope) const;
  const Counters& counters() const { return state_.counters; }
  const GpuPageTable* gpu_table(GpuId gpu) const;
  const HostPageAllocator& host() const { return state_.host; }
  size_t open_orders() const { return state_.orders.size(); }  // ReclaimOrders / PopulateOrders still owing reports
  size_t copies_in_flight() const { return state_.copies.size(); }
  // The GPU of a known request / of an order still owing reports; nullopt when unknown (the daemon accepts a report
  // only from the worker of that GPU).
  std::optional<GpuId> GpuOfRequest(RequestId request) const;
  std::optional<GpuId> GpuOfOrder(OrderId order) const;
  // The content-addressed host tier (issue 24): nullptr when prefix sharing is off.
  const PrefixPages* prefix() const { return prefix_.tier(); }
  // Issue 24: the host tier's KV events since the last drain (PrefixPages::DrainKvEvents; empty with sharing or
  // ResidencyConfig::prefix.kv_events off). The daemon publishes them after each event (memd/kv_events.h).
  std::vector<KvEvent> DrainKvEvents() { return prefix_.DrainKvEvents(); }

  // ---- Issue 26: the cluster tier (docs/cluster_tier.md). The core decides which pages; the daemon does the I/O:
  // ClusterLookups names the pages of an admission to ask the store for (before Admit), ClusterRoom where found pages
  // may be copied, and ImportClusterPages (an event) stores the copied pages as cached shared pages, so that Admit's
  // grant takes them as host hits. No sockets, no clock here.
  // The admission's shareable pages the host tier cannot serve and does not store (PrefixSharing::ClusterLookups):
  // its chain's addresses, then (issue 26, sessions) the session addresses of its further complete input pages
  // (PrefixSharing::Addresses); empty with sharing off, neither chain nor session digests, or an admission Admit
  // would refuse for its chain or rows.
  std::vector<PrefixAddress> ClusterLookups(const AdmitRequest& admission) const;
  std::vector<PageIndex> ClusterRoom(uint32_t count) const { return prefix_.ClusterRoom(count); }
  // Errors: PrefixSharing::ImportCluster's (nothing changes).
  absl::Status ImportClusterPages(std::span<const ClusterImport> pages);
  // The pages confirmed shared since the last drain (PrefixSharing::DrainClusterPublish).
  std::vector<ClusterPublishPage> DrainClusterPublish() { return prefix_.DrainClusterPublish(); }
  // Issue 26, sessions: the history pages of request `request` to publish under its session at its Complete
  // (memd/cluster_sessions.h SessionPagesToPublish, `digests` = Complete.session_page_digests; the shared pages it
  // holds are not its own: skipped); empty for an unknown request. Nothing changes: the daemon reads the pages'
  // bytes before the Complete event frees them.
  std::vector<SessionPublishPage> SessionPages(RequestId request, std::span<const uint64_t> digests) const;
  // Accepted registrations of `gpu` (0: never registered; 1 after the first; +1 per RegisterGpu after a fence).
  uint32_t epoch(GpuId gpu) const { return recovery_.epoch(gpu); }
  // True when `gpu` was registered and is fenced now (no page accounting until it registers again).
  bool fenced(GpuId gpu) const { return recovery_.fenced(gpu); }
  // Why `gpu` was fenced (FenceGpu's `why`; "" when it is up, or fenced by AdoptHostPages): the daemon's refusal of
  // the fenced worker's messages names it.
  std::string FenceReason(GpuId gpu) const { return recovery_.FenceReason(gpu); }
  // Interrupted requests of `gpu` (ascending id): what a re-registering worker must resume or Complete. The hook of
  // a later resume from host KV: each keeps its kHost pages (InterruptedHostPages).
  std::vector<RequestId> InterruptedRequests(GpuId gpu) const { return recovery_.InterruptedRequests(gpu); }
  // History page -> host page of every confirmed host copy an interrupted request kept (empty: unknown or not
  // interrupted).
  std::map<uint32_t, PageIndex> InterruptedHostPages(RequestId request) const {
    return recovery_.InterruptedHostPages(request);
  }

 private:
  using Request = core::Request;
  using Reclaim = core::Reclaim;
  using Copy = core::Copy;
  using OrderEntry = core::OrderEntry;
  using Gpu = core::Gpu;

  ResidencyManager(const ResidencyConfig& config, Clock clock, HostPageAllocator host,
                   std::unique_ptr<ReclaimPolicy> policy, std::optional<PrefixPages> tier);
  // RegisterGpu's checks and table.
  absl::Status AddGpu(GpuId gpu, uint32_t pages, uint32_t request_slots, const GpuDeclaration& declared);
  absl::Status Finish(absl::Status status);  // counts the event, then Pump()s when OK
  absl::Status FinishTick();                 // counts the tick (Populate, RetryBackups), then Pump()s
  void Pump();
  void PumpGpu(GpuId gpu_id, Gpu& gpu);
  void SendWaits(GpuId gpu_id, Gpu& gpu);
  absl::Status NeverFits(const Request& r, const Gpu& gpu) const;
  // Grants the queue head if it fits (true: the caller pops it; it may have been rejected and erased instead).
  bool TryGrant(Request& r, Gpu& gpu);
  // Optional pages r's grant keeps on GPU (resident-first, leaving what the admissions queued behind require); 0 when
  // `host_backed` (taken-over or shared) pages are imported instead.
  uint32_t KeptOnGpu(const Request& r, const Gpu& gpu, uint32_t host_backed) const;
  // A grant the page tables refused (a bug): what it took is given back, r rejected (Internal) and erased.
  void RejectRefusedGrant(Request& r, Gpu& gpu, const absl::StatusOr<std::vector<PageIndex>>& required,
                          const absl::StatusOr<std::vector<PageIndex>>& optional, const absl::Status& host,
                          const PrefixHits& hits);
  void MarkRegranted(GrantOrder& grant);
  // A grant's history: page h gets its taken-over host page in kHost (listed in grant.host_backed_pages; the leading
  // run counted in grant.imported_pages), else the fresh host page fresh_host[i] of h = fresh[i], kept on
  // optional[h] (kGpu) for h < optional.size(), else kHostPending. Fills grant.host_pages.
  // Shared prefix pages (issue 24) `hits` (history page -> host page, referenced by r) are granted like a resume's.
  void AssignHistory(Request& r, std::span<const uint32_t> fresh, std::span<const PageIndex> fresh_host,
                     std::span<const PageIndex> optional, const PrefixHits& hits, GrantOrder& grant);
  void StartReclaim(Request& victim, Gpu& gpu);
  void AdvanceReclaim(Reclaim& rc);
  void RetireReclaim(ReclaimId id);
  void AbortReclaim(Request& victim, Gpu& gpu);
  void EraseOrderIfDone(OrderId order);
  absl::Status CheckReportedPages(const OrderEntry& entry, OrderId order, std::span<const PageIndex> pages,
                                  std::vector<PageIndex>& out) const;
  // OnHostCopyWritten's checks of the report against `r` (nothing changed on error), and the confirmation of one
  // history page's host copy `h` (with its checksum).
  absl::Status CheckHostCopyReport(const Request& r, std::span<const uint32_t> history_pages,
                                   std::span<const PageIndex> host_pages, std::span<const uint64_t> checksums) const;
  void ConfirmHostCopy(Request& r, Gpu& gpu, uint32_t h, uint64_t checksum);
  void BackupDone(CopyId copy, bool ok, bool written, uint64_t checksum = 0);
  void PopulateDone(CopyId copy, bool ok);
  void PopulateRequest(GpuId gpu_id, Gpu& gpu, Request& r, uint32_t pages);
  uint32_t ReleaseAdmitted(Request& r, Gpu& gpu);
  // CheckInvariants parts (an interrupted request, a queued resume and the journal: Recovery's checks).
  absl::Status CheckQueues() const;
  absl::Status CheckRequest(const Request& r, std::map<GpuId, std::vector<RequestId>>& owner,
                            std::set<PageIndex>& host_pages) const;
  absl::Status CheckHistoryPage(const Request& r, uint32_t h) const;
  absl::Status CheckCopiesAndOrders(std::map<GpuId, std::vector<RequestId>>& owner) const;
  absl::Status CheckReclaims() const;
  absl::Status CheckVictimIndex() const;

  ResidencyConfig config_;
  std::unique_ptr<ReclaimPolicy> policy_;
  core::State state_;    // the state the rooms share (memd/core_state.h)
  PrefixSharing prefix_;  // the host tier's shared prefix pages (issue 24): over state_
  Recovery recovery_;    // fence, adopt, interrupt, take-over: over state_ (and prefix_'s references)
};

}  // namespace dhs::memd
