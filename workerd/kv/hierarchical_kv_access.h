// workerd/kv/hierarchical_kv_access.h: dhs::KvAccess over the KV hierarchy (brief §3, §4, §5): tail, hot cache,
// ready map (optional history) and host copies, for a worker with a fixed KvConfig.
//
// Owns the KV pool on the Device (allocated in Create), the per-request state (request_kv.h) and a resolver.
// Append writes the row into the tail by an async copy (its write event); when a page completes for every source,
// its backup into a host page from `allocate_host_page` is issued after the rows' write events, and the page counts
// as backed up only after that copy completed (Poll reports it). A tail slot is overwritten only after its page's
// backup completed. Host pages go back through `free_host_page` only after every copy touching them completed.
// memd-facing operations map memd's orders one to one: BackupPages, WithdrawReady (+ readers fence), Populate
// (published by Poll after the copy completed), Retire.
// Residency plan (docs/protocol.md, conversation contract §2-§3): PlanResidency gives a request its host page per
// history page (memd's AdmitGrant.backup_host_pages) and the optional GPU pages it keeps. A completed page with a kept
// device page is copied device->device from the tail into it (KeepOptional, no host backup; ready after the copy);
// every other completed page is backed up into its planned host page (else one from `allocate_host_page`).
//
// Staging arenas (brief §6 "Staging"; KvConfig.staging_arenas = χ > 0): a second device pool of
// M_stage = χ * N * K_max * k * d_KV bytes (spec::StagingReservationBytes, d_KV the largest row), allocated in Create.
// A Fetch serves the queries of a request in a speculative round (HoldUnverified until CommitVerified) as one union
// (spec::PlanUnion, the decision; this class executes it): its distinct missing rows are copied once each, the first
// ones into the hot cache (as many as it has unprotected slots after this round's hits), the rest from their host
// copies into rows of a staging arena (spec::StagingArenaPool: one arena per source of the group, acquired by the
// Fetch, freed by the ReadersDone of that group), and every query that selected a row reads the same copy. Staged
// rows are not promoted into the hot cache. Other requests' queries, and every query when χ = 0, take the resolver's
// per-query path unchanged.
//
// Thread-safety: driven by one worker thread (KvAccess contract); no method is called concurrently.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "workerd/device/device.h"
#include "workerd/kv/layout.h"
#include "workerd/kv/request_kv.h"
#include "workerd/kv/resolver.h"
#include "workerd/kv_access.h"
#include "workerd/kv_residency.h"
#include "workerd/verification/staging_pool.h"
#include "workerd/verification/union_plan.h"

namespace dhs {

enum class ResolverKind { kFused, kReference };

// What the staging path did (HierarchicalKvAccess::staging_census): Fetches that staged rows, distinct rows copied
// into staging arenas (each once, whatever number of queries selected it), their bytes (all sources of the group),
// and the round unions served (with or without staged rows).
struct StagingCensus {
  uint64_t unions = 0;
  uint64_t staged_fetches = 0;
  uint64_t rows = 0;
  uint64_t bytes = 0;
  bool operator==(const StagingCensus&) const = default;
};

// Host-page integrity (issue 22; common/page_checksum.h): what the checks of confirmed host pages did.
struct HostIntegrityCounters {
  uint64_t pages_checksummed = 0;  // checksums computed of the worker's own completed backups (Poll)
  uint64_t pages_verified = 0;     // host pages checked against their checksum before use (recovery, populate, import)
  uint64_t bytes_verified = 0;     // their bytes (host_page_bytes each)
  uint64_t mismatches = 0;         // pages that did not match (recovery, populate: DATA_LOSS; import: recomputed)
  bool operator==(const HostIntegrityCounters&) const = default;
};

struct HostPoolAccess {
  std::span<uint8_t> bytes;  // host page h at h * layout.host_page_bytes()
  // Returns a free host page, or nullopt (the backup is then deferred until BackupPages).
  std::function<std::optional<PageIndex>()> allocate_host_page;
  std::function<void(PageIndex)> free_host_page;
};

class HierarchicalKvAccess final : public KvAccess, public KvResidency {
 public:
  // Errors: INVALID_ARGUMENT (config, see KvLayout::Create; staging arenas with K_max = 0, or χ below the largest
  // group's source count: a group's sources each stage into their own arena), RESOURCE_EXHAUSTED (device pools).
  static absl::StatusOr<std::unique_ptr<HierarchicalKvAccess>> Create(const KvConfig& config, Device* device,
                                                                      HostPoolAccess host, ResolverKind kind);
  ~HierarchicalKvAccess() override;

  // KvAccess. A request not planned by PlanResidency is admitted at its first Append into the lowest free slot
  // (RESOURCE_EXHAUSTED when none): a convenience of KV-only tests; the worker always plans with memd's slot first.
  absl::Status Append(RequestId request, SourceId source, Position position, std::span<const uint8_t> row) override;
  // Issue 27: the rows of a run inside one page go to the tail in ONE copy batch (one event shared by their tail
  // slots); a run crossing a page end is split there, so a page completes (its backup issued) before the next page's
  // rows need tail slots. Append is a run of one row.
  absl::Status AppendRun(RequestId request, SourceId source, Position first, uint32_t count,
                         std::span<const uint8_t> rows) override;
  uint32_t AppendRunRows() const override { return layout_.config().page_rows; }
  absl::Status Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) override;
  // Ends the readers of every group among `sources` (sources out of range are ignored).
  void ReadersDone(std::span<const SourceId> sources) override;
  void Release(RequestId request) override;
  // Copies the keys into the key region of each position's planned host page (PlanResidency's host_pages; a
  // position whose page has none is skipped: nothing would find it; so is a position of a resume's imported page:
  // its confirmed copy holds them already, ImportHostPages). No-op when the layout has no key regions
  // (KvConfig.key_bytes empty). Keys are final once Poll confirmed the page's own host copy (its checksum covers
  // them): a key of such a page is refused, nothing written. Errors: as KvAccess, RESOURCE_EXHAUSTED (no slot for a
  // new request), FAILED_PRECONDITION (a page whose host copy Poll confirmed).
  absl::Status StoreIndexKeys(RequestId request, uint32_t indexer, Position first,
                              std::span<const float> keys) override;

  // Resume from host KV (issue 11), step 1, at the grant: history pages `pages` of `request` (planned, nothing
  // appended yet; any set, gaps allowed) hold a confirmed host copy in their planned host pages (memd's
  // AdmitGrant.host_backed_pages). Each becomes host-ready in its host page at once (population may bring it back;
  // when its rows are appended later, by ImportHostRows or computed, no backup is issued and no key is stored: the
  // confirmed copy is never written again). Nothing is appended: ImportHostRows brings the rows in,
  // in position order, between the recomputed ones.
  // Errors: NOT_FOUND (unknown request), FAILED_PRECONDITION (rows appended already, a page without a planned host
  // page).
  // Before it (issue 22): the caller verifies the pages with CheckHostCopies and imports only those that match; the
  // pages imported are recorded verified with their checksums[i] (same length as pages; empty: none known).
  absl::Status ImportHostPages(RequestId request, std::span<const uint32_t> pages,
                               std::span<const uint64_t> checksums = {});
  // Host-page integrity of a resume (issue 22): each history page pages[i] of `request` (planned host page) is checked
  // against checksums[i] (memd's AdmitGrant.host_backed_checksums; a missing or kNoChecksum entry never matches).
  // Returns the pages that do NOT match, in the order given (each counted in host_integrity().mismatches and logged);
  // the caller recomputes their rows instead of importing them. Errors: NOT_FOUND (unknown request),
  // FAILED_PRECONDITION (a page without a planned host page).
  absl::StatusOr<std::vector<uint32_t>> CheckHostCopies(RequestId request, std::span<const uint32_t> pages,
                                                        std::span<const uint64_t> checksums);
  // Verifies history page `page` of `kv` (host_ready) against its recorded checksum before its host bytes are used
  // (the resolver's recoveries, staging, Populate), once per page: OK when verified before, or when no checksum is
  // recorded yet (its backup completed within the current step; Poll records it before memd hears of the copy: the
  // bytes are the worker's own fresh copy). Errors: DATA_LOSS (the bytes differ; the page stays unverified).
  absl::Status VerifyHostPage(RequestKv& kv, uint32_t page);
  uint64_t HostChecksum(RequestId request, uint32_t page) const override;
  const HostIntegrityCounters& host_integrity() const { return integrity_; }
  // The requests VerifyHostPage found with a changed host page since the last call (each once, with its DATA_LOSS
  // status): the loop fails them (a Fetch or Populate error does not say whose page it was). Emptied by the call.
  std::vector<std::pair<RequestId, absl::Status>> TakeDataLoss() { return std::exchange(data_loss_, {}); }
  // Step 2, when the request's rows reach page `first`: pages first .. first+count-1 (host-ready by ImportHostPages)
  // are taken as appended without computing anything: appended = (first+count) * p on every source (it must be
  // first * p on every source: the earlier pages imported or recomputed), the last min(T, count*p) of their rows copied
  // from host into the tail (the tail always holds the latest T rows; the tail slots they take are freed first, as
  // Append frees them). keys_out[i] receives indexer i's index keys of positions first*p .. (first+count)*p-1 read
  // from the host pages (idx_dim floats each). Errors: NOT_FOUND (unknown request), FAILED_PRECONDITION (appended is
  // not first * p on every source, a page not host-ready), or the tail copy's error.
  absl::Status ImportHostRows(RequestId request, uint32_t first, uint32_t count,
                              std::vector<std::vector<float>>& keys_out);

  // Residency plan of `request` in slot `slot` (memd's AdmitGrant.slot; admits it there when new).
  // host_pages[j]: host page of history page j (memd's grant; pages beyond it come from allocate_host_page);
  // keep: (history page, optional device page) pairs kept on GPU when the page completes (adaptive mode).
  // Errors: INVALID_ARGUMENT (slot >= N, device page outside the optional pool, host page outside the host pool),
  // FAILED_PRECONDITION (the slot is another request's, the request has another slot, a kept device page is in use,
  // or the history page is already complete).
  absl::Status PlanResidency(RequestId request, SlotIndex slot, std::span<const PageIndex> host_pages,
                             std::span<const std::pair<uint32_t, PageIndex>> keep) override;
  PageResidency Residency(RequestId request, uint32_t page) const override;
  std::optional<GpuPageUse> GpuPageOf(RequestId request, PageIndex device_page) const override;
  // Forgets the keep plan of history page `page` that has not completed yet (its device page was reclaimed before it
  // held anything); the page is then backed up to its host page when it completes. Returns whether a plan existed.
  bool DropKeep(RequestId request, uint32_t page) override;
  // A reclaim (docs/protocol.md, contract §4) took the device page planned to keep history page `page` before the
  // page was kept (the request is still writing its rows): the keep plan is replaced by a backup into `host_page`,
  // issued now when the page is complete (from the tail), else as soon as its last row is appended (the copy waits for
  // the rows' write events). Either way Poll reports the backup once the copy ended. Returns true when issued now.
  // Errors: NOT_FOUND (unknown request), INVALID_ARGUMENT (host page outside the host pool), FAILED_PRECONDITION (the
  // page already has a host copy or a device page, or its rows left the tail).
  absl::StatusOr<bool> BackupInsteadOfKeep(RequestId request, uint32_t page, PageIndex host_page) override;
  // Undoes BackupInsteadOfKeep after that reclaim's backup failed (memd then leaves the victim's pages as they were):
  // history page `page` is kept on `device_page` again: planned when not complete yet, else copied device->device from
  // the tail now (published by Poll after the copy). Errors: NOT_FOUND (unknown request), INVALID_ARGUMENT (device
  // page outside the optional pool), FAILED_PRECONDITION (device page in use; the page has a host copy or a device
  // page, or its rows left the tail).
  absl::Status RestoreKeep(RequestId request, uint32_t page, PageIndex device_page) override;
  // Backs up page `page`, held on an optional GPU page, into `host_page` after its keep/populate copy ended (from the
  // tail while the rows are still there, else from the GPU page); reported by Poll. Errors: as BackupPages.
  absl::Status BackupHeldPage(RequestId request, uint32_t page, PageIndex host_page) override;
  // The history page whose optional-history device page is `device_page` (pending or ready), or nullopt. O(1).
  std::optional<uint32_t> HistoryPageOf(RequestId request, PageIndex device_page) const;

  // memd away (issue 11, docs/protocol.md "Re-Hello with a report"): while host writes are paused nothing is written
  // to a host page (a new memd may not have adopted it): a completed page without a kept GPU page is not backed up
  // (its rows stay in the tail), and index keys (StoreIndexKeys) are held in memory. Copies issued before the pause
  // still finish. ResumeHostWrites writes the held keys, then issues the deferred backups (reported by Poll as usual).
  // Errors (Resume): a backup's issue error (the page stays in the tail, not backed up).
  void PauseHostWrites() { host_writes_paused_ = true; }
  absl::Status ResumeHostWrites();
  bool host_writes_paused() const { return host_writes_paused_; }
  // Whether `rows` more rows can be appended to every source of `request` without reusing a tail slot whose page has
  // neither a host copy (written or writing) nor a GPU page: with host writes paused such an Append would fail (the
  // tail is full). True for an unknown request (its first Append admits it).
  bool TailHasRoom(RequestId request, Position rows) const;
  // The same for source `source` alone (libdhs's layer-wise appends, where sources hold different lengths).
  bool TailHasRoom(RequestId request, SourceId source, Position rows) const;
  // The rows `source` of `request` holds (positions 0 .. n-1); 0 for a request never appended to or a source out of
  // range. libdhs reads it after an AppendRun that failed part way (the rows before the failure stay appended).
  Position AppendedRows(RequestId request, SourceId source) const;
  // The `from` of `request`'s speculative hold (HoldUnverified until CommitVerified), -1 when none (or unknown).
  Position HoldFrom(RequestId request) const;
  // Speculative rounds (KvAccess; brief §6 "Commit"): while held, a page with a row at a position >= `from` is not
  // completed at Append; CommitVerified drops rows >= length on every source (tail only: they were never backed up
  // nor kept), ends the hold and completes the pages now whole below `length` (backup into the planned host page, or
  // the kept device->device copy in adaptive mode), in page order. Errors: as KvAccess; INVALID_ARGUMENT for a `from`
  // below a source's appended rows or a `length` outside [from, appended]; FAILED_PRECONDITION for a hold while one
  // is held (KvAccess: one round at a time).
  absl::Status HoldUnverified(RequestId request, Position from) override;
  absl::Status CommitVerified(RequestId request, Position length) override;

  // Drops rows at positions >= length (rejected speculative rows, brief §6). Only rows not yet in a complete page
  // can be dropped: FAILED_PRECONDITION otherwise.
  absl::Status Truncate(RequestId request, Position length);

  // memd orders. Pages are page indices of the request (positions [page*p, page*p+p)).
  // Back up complete pages from the tail or the ready map into the given host pages; reported by Poll.
  absl::StatusOr<CopyEvent> BackupPages(RequestId request, std::span<const uint32_t> pages,
                                        std::span<const PageIndex> host_pages);
  // Withdraws ready-map entries now; the returned event completes when their readers finished.
  absl::StatusOr<CopyEvent> WithdrawReady(RequestId request, std::span<const uint32_t> pages) override;
  // Populates device page `device_page` from the page's host copy; published by Poll after the copy completed.
  absl::StatusOr<CopyEvent> Populate(RequestId request, uint32_t page, PageIndex device_page) override;
  // The device pages are retired (back to memd). FAILED_PRECONDITION if still mapped or read.
  absl::Status Retire(std::span<const PageIndex> device_pages) override;
  // Publishes completed populates, records completed backups, frees host pages whose copies finished.
  KvCompletions Poll() override;
  // Keep/populate copies into the request's GPU pages and host backups still being written.
  RequestCopies CopiesInFlight(RequestId request) const override;

  // Staging (see the top of this file): the bytes of the staging pool, M_stage (0 without arenas); the arena
  // bookkeeping (nullptr without arenas; every arena free between steps); what the staging path did.
  int64_t staging_bytes() const { return staging_bytes_; }
  const spec::StagingArenaPool* staging_pool() const { return arenas_ ? &*arenas_ : nullptr; }
  const StagingCensus& staging_census() const { return staging_census_; }

  const KvLayout& layout() const { return layout_; }
  const Census& census(uint32_t group) const { return resolver_->census(group); }
  // The census summed over every group, staged rows included as host recoveries (host, bytes_recovered).
  Census TotalCensus() const;
  PoolId pool() const { return pool_; }
  // Test/introspection: the request's state, or nullptr.
  const RequestKv* Find(RequestId request) const;
  FusedResolver* fused_resolver() { return dynamic_cast<FusedResolver*>(resolver_.get()); }
  // True when resolves run the resolver kernel on the device (KernelResolver: a device with a compute side and the
  // process's plan runner set); false when the fused (or reference) resolver runs on the host.
  bool resolves_on_device() const;

 private:
  HierarchicalKvAccess(KvLayout layout, Device* device, HostPoolAccess host);
  absl::StatusOr<RequestKv*> Admit(RequestId request, SlotIndex slot);
  absl::StatusOr<RequestKv*> AdmitAnySlot(RequestId request);
  // Sets (dp >= 0) or clears (dp = -1) the keep plan of `page`, keeping the GPU page index in step.
  void SetKeepPlan(RequestKv& kv, uint32_t page, int64_t dp);
  // Maps (or unmaps, request = -1) optional GPU page `dp` in the GPU page index.
  void SetGpuPageOwner(PageIndex dp, int64_t request, uint32_t page);
  absl::StatusOr<CopyEvent> IssueBackup(RequestKv& kv, uint32_t page, PageIndex host_page);
  absl::Status KeepOptional(RequestKv& kv, uint32_t page, PageIndex device_page);
  // Before the tail slot of row `old` is reused: waits for its page's copies (see the .cc). Errors: a failed copy's.
  absl::Status FreeTailSlot(RequestKv& kv, Position old);
  absl::Status OnPageComplete(RequestKv& kv, uint32_t page);
  bool Complete(const RequestKv& kv, uint32_t page) const;  // every source appended the whole page
  bool InTail(const RequestKv& kv, uint32_t page) const;    // every source still holds the page in its tail
  void FreeHostPageAfter(PageIndex host_page, std::vector<CopyEvent> events);
  // Fetch with staging arenas: the queries of requests in a round served as one union each (see the top of this
  // file), the others as usual. Errors: Fetch's; RESOURCE_EXHAUSTED (no free arena, or a union beyond the hot cache
  // and the arena); nothing is resolved nor held after an error.
  absl::Status FetchWithStaging(uint32_t group, std::span<const SourceId> sources, std::span<KvQuery> batch);
  // FetchWithStaging's phases, in order (hierarchical_kv_access.cc), over its state `StagedFetch`: the batch sorted
  // into plain queries and round unions; each union planned (spec::PlanUnion); the staging copies issued into
  // arenas it acquires; after the resolver, the rows published to one reader and counted.
  struct RoundUnion;
  struct StagedFetch;
  absl::Status SortStagedBatch(StagedFetch& f);
  absl::Status PlanRoundUnion(StagedFetch& f, RoundUnion& r);
  absl::Status IssueStagingCopies(StagedFetch& f);
  void ReleaseStagingArenas(StagedFetch& f);
  void PublishStagedReads(StagedFetch& f);
  void CountStagedFetch(const StagedFetch& f);
  void Update();  // the state part of Poll; completions accumulate in completions_
  uint64_t TailUploadOffset(SourceId s, Position t) const;
  // The first byte of host page `host_page` in the mapped pool (payload rows, then index keys; KvLayout).
  uint8_t* HostPageData(int64_t host_page) const {
    return host_.bytes.data() + static_cast<uint64_t>(host_page) * layout_.host_page_bytes();
  }

  KvLayout layout_;
  Device* device_;
  HostPoolAccess host_;
  PoolId pool_ = 0;
  // Where a Fetch's rows_out points: the host address of the row where the device's memory is host-visible (the CPU
  // backend, CUDA managed pools), else its device address (CUDA device memory: libdhs's engine pool of plain device
  // memory, which only offsets and the engine's kernels read); nullptr out of range.
  const uint8_t* RowAddress(PoolId pool, Location offset) const;
  std::unique_ptr<Resolver> resolver_;
  absl::flat_hash_map<RequestId, std::unique_ptr<RequestKv>> requests_;
  std::vector<bool> slot_used_;
  // The GPU page index, by optional GPU page: the request holding it (pending or ready; -1 free) and its history page,
  // and the request planning to keep a page in it (-1 none) with that history page.
  std::vector<int64_t> device_page_owner_;
  std::vector<uint32_t> device_page_page_;
  std::vector<int64_t> keep_planner_;
  std::vector<uint32_t> keep_planned_page_;
  std::vector<std::vector<ReaderId>> readers_;  // per group: readers of the last Fetches
  // Staging arenas (KvConfig.staging_arenas > 0): their pool, shape, bookkeeping, and per group the arenas its
  // outstanding Fetches hold (one reader each, released by ReadersDone).
  PoolId staging_pool_id_ = 0;
  spec::StagingShape staging_shape_;
  int64_t staging_bytes_ = 0;
  std::optional<spec::StagingArenaPool> arenas_;
  std::vector<std::vector<uint32_t>> staging_held_;
  uint32_t staging_serial_ = 0;  // the `group` key of StagingArenaPool::Acquire: one per Fetch
  StagingCensus staging_census_;
  struct PendingFree { PageIndex host_page; std::vector<CopyEvent> events; };
  std::vector<PendingFree> pending_free_;
  struct PendingBackup { RequestId request; uint32_t page; };
  std::vector<PendingBackup> pending_backups_;
  struct PendingPopulate { RequestId request; uint32_t page; bool kept; };
  std::vector<PendingPopulate> pending_populates_;
  // Per slot: the tail upload buffer, host memory holding tail rows while their host->device write is in flight (not
  // the "staging arena" of brief §6).
  std::vector<std::vector<uint8_t>> tail_upload_;
  KvCompletions completions_;
  bool host_writes_paused_ = false;
  HostIntegrityCounters integrity_;
  std::vector<std::pair<RequestId, absl::Status>> data_loss_;  // TakeDataLoss
  struct HeldKey { int64_t host_page; uint64_t offset; std::vector<uint8_t> bytes; };
  std::vector<HeldKey> held_keys_;  // StoreIndexKeys while host writes are paused
};

}  // namespace dhs
