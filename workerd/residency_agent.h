// workerd/residency_agent.h: the worker side of the memd conversation (docs/protocol.md, "Conversation contract
// (worker <-> memd)", brief §4): grants' residency plans, reclaim orders (backups, withdrawal, ReadersDone, Retire),
// populate orders, host copies written outside an order, and the end of a request (Complete).
//
// Owns: per granted request its slot (memd's AdmitGrant.slot, validated here), its host page per history page, memd's
// optional GPU pages of it (history page -> GPU page) and the history pages reported written to host; the reclaim and
// populate orders in flight (by order id); the answers of populate orders whose request ended; the ids of requests
// finished by this process. The KV hierarchy's state (where a page is, its keep plan) stays in the KvResidency.
//
// Events in: OnGrant / OnReclaimOrder / OnRetire / OnPopulateOrder (memd's messages), Poll (KV completions: host
// copies written, populates published, withdrawals done), RebuildKv and EndRequest (the batching loop's decisions).
// Out: messages to memd through the MemdLink (BackupComplete, HostCopyWritten, ReadersDone, ReadyPublish, Complete)
// and, as the Status of OnGrant / RebuildKv, the requests the loop must fail. It never calls back into the loop, has
// no sockets and no clocks (the house model of memd/residency_manager.h).
//
// Keys: a reclaimed page is followed by order id (the order), GPU page (memd's unit on the wire, mapped to the history
// page by the KV's GPU page index) and history page (the KV's and the completions' unit).
//
// Thread-safety: none; one worker thread drives every method.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/types.h"
#include "dhs_generated.h"
#include "workerd/kv_residency.h"
#include "workerd/memd_link.h"

namespace dhs {

// The steps of one reclaim order here (contract §4), changed only through TransitionReclaim(), checked against
// kReclaimTransitions (memd/history_page.h's pattern). A failed backup drops the order (memd keeps the victim).
//   kBackingUp    its backups are issued; BackupComplete goes once their copies ended
//   kBackedUp     BackupComplete ok sent; its held pages are withdrawn once no populate of them is in flight
//   kWithdrawing  withdrawal issued; ReadersDone once the pages' readers finished
//   kReadersDone  ReadersDone sent; waits for memd's Retire
enum class ReclaimStep : uint8_t { kBackingUp, kBackedUp, kWithdrawing, kReadersDone };
std::string_view ReclaimStepName(ReclaimStep step);
inline constexpr std::pair<ReclaimStep, ReclaimStep> kReclaimTransitions[] = {
    {ReclaimStep::kBackingUp, ReclaimStep::kBackedUp},       // every backup copy ended ok: BackupComplete sent
    {ReclaimStep::kBackingUp, ReclaimStep::kWithdrawing},    // an order of a finished request: nothing backed up
    {ReclaimStep::kBackedUp, ReclaimStep::kWithdrawing},     // its held pages withdrawn
    {ReclaimStep::kWithdrawing, ReclaimStep::kReadersDone},  // the withdrawal's readers finished: ReadersDone sent
};
// Moves `step` from `from` to `to`. Errors: FAILED_PRECONDITION when `step` is not `from` or the move is not in
// kReclaimTransitions (`step` unchanged).
absl::Status TransitionReclaim(ReclaimStep& step, ReclaimStep from, ReclaimStep to);

struct ResidencyAgentConfig {
  GpuId gpu = 0;
  uint32_t slots = 1;         // N: a grant's slot must be below it
  bool keep_optional = true;  // adaptive mode: the grant's optional GPU pages keep their history pages (brief §4)
  bool host_tier = true;      // not resident: a grant must name a host page for every page the request completes
};

// Counters since start (WorkerStatsReply), pages.
struct ResidencyStats {
  uint64_t reclaims_obeyed = 0;  // reclaim orders answered with ReadersDone while their request lived
  uint64_t pages_reclaimed = 0;  // GPU pages of those orders
  uint64_t pages_populated = 0;  // pages of populate orders published
  uint64_t pages_kept = 0;       // pages kept on their granted GPU page (no host backup)
  uint64_t pages_backed_up = 0;  // host copies written
};

class ResidencyAgent {
 public:
  // `kv` and `memd` must outlive the agent.
  ResidencyAgent(ResidencyAgentConfig config, KvResidency* kv, MemdLink* memd);

  // AdmitGrant of a request the loop is waiting for (contract §2). `complete_pages`: pages the request will complete
  // (rows ever appended / p). Validates the slot (< N, not another live request's), the host pages (one per complete
  // page with a host tier, segment 0 only) and the optional pages, then plans the request's residency in the KV.
  // Errors (the loop fails the request, then calls EndRequest): INVALID_ARGUMENT, FAILED_PRECONDITION, INTERNAL,
  // UNIMPLEMENTED (segment != 0), or the KV's plan error.
  absl::Status OnGrant(const wire::AdmitGrantT& m, uint64_t complete_pages);
  // AdmitGrant of a request this worker does not serve: released at once (Complete).
  void RefuseGrant(const wire::AdmitGrantT& m);

  void OnReclaimOrder(const wire::ReclaimOrderT& m);  // contract §4
  void OnRetire(const wire::RetireT& m);              // contract §4
  void OnPopulateOrder(const wire::PopulateOrderT& m);  // contract §5

  // Reports the KV's completions to memd and advances the reclaim orders (BackupComplete once every copy of an order
  // ended, withdrawal, ReadersDone once its readers finished). Call once or twice per loop iteration.
  void Poll();

  // The loop rebuilds the request's KV from its tokens (a failed batched step, brief §11): the KV is released and the
  // residency planned again. Errors: ABORTED while a reclaim (before ReadersDone) or populate order of it is in
  // flight; the KV's plan error.
  absl::Status RebuildKv(RequestId request);

  // The request ended (finished, failed or cancelled): waits for the copies memd would free pages under, answers its
  // populate orders once their copies ended, forgets its orders, releases its KV and sends Complete (contract §6).
  // `complete`'s output fields (keep_output, output_*) go with it; its request and gpu are set here. With
  // session_page_digests (issue 26) its host backups are waited for and reported (Poll) before anything else.
  void EndRequest(RequestId request, wire::CompleteT complete = {});

  // memd died (issue 11, docs/protocol.md "Re-Hello with a report"; the link's MemdSession serves away: the Worker
  // moved it before this call, and moves it back before ReturnFromAway): its orders are resolved here, nothing is
  // answered to anyone: each population copy in flight finishes and is undone (withdrawn; no GPU page is reported for
  // it); a reclaim whose ReadersDone was sent, or whose pages were being withdrawn after their backups, drops its pages
  // (each has a host copy); any other reclaim is abandoned and its pages stay kept on GPU (a page it only planned to
  // keep is kept again, or counts as on host when its backup was issued already); answers owed for ended requests
  // are dropped once their copies ended. Until ReturnFromAway nothing is sent to memd: host copies that complete are
  // not reported (Poll), Complete is never sent (the loop defers ends).
  void EnterAway();
  // The report of granted request `request` for the re-Hello: slot, required pages, and one page per page of its
  // full context (its grant's host page, whether its host copy was reported to the dead memd, its optional GPU page
  // if it keeps or plans to keep one). The loop adds the request's complete pages, mode and record. nullptr when
  // the request is not granted here.
  std::unique_ptr<wire::ReportedRequestT> Report(RequestId request) const;
  // The new memd accepted the re-Hello: `adopted` are the requests it took over (the others were dropped with
  // Forget). For each, every page with a written host copy and no GPU page is reported again (HostCopyWritten: memd
  // counts only the copies its journal confirmed); host copies that complete later are reported as usual.
  void ReturnFromAway(const std::set<RequestId>& adopted);
  // A granted request memd did not adopt (its report was refused): its copies end, its KV is released and it is
  // forgotten; nothing is sent (memd holds it as interrupted, or not at all).
  void Forget(RequestId request);

  // Orders in flight: reclaims before ReadersDone, populates, answers waiting for copies.
  bool busy() const;
  // Copies and orders in flight (Heartbeat.pending_copies).
  uint32_t pending_orders() const;
  const ResidencyStats& stats() const { return stats_; }
  // The first message memd could not be sent (the conversation is broken from then on), else OK.
  const absl::Status& link_status() const { return link_status_; }
  std::optional<SlotIndex> SlotOf(RequestId request) const;
  // Whether this process ended `request` (among the newest ones; its Complete went out).
  bool Finished(RequestId request) const { return finished_ids_.contains(request); }

 private:
  struct Granted {
    SlotIndex slot = 0;
    std::vector<PageIndex> required;          // AdmitGrant.required_pages (reported at a re-Hello)
    std::vector<PageIndex> host_pages;        // host page by history page, fixed at the grant
    std::map<uint32_t, PageIndex> gpu_pages;  // history page -> optional GPU page memd gave it (grant, populate)
    std::set<uint32_t> reported;              // history pages reported to memd with a host copy
    // GPU page -> history page: optional pages memd gave this request that hold nothing because the page was not kept
    // there after all (its keep copy failed, or a failed reclaim left it written to host instead). memd frees such a
    // page at the page's HostCopyWritten, or retires it through a ReclaimOrder that names it (contract §3-§4); until
    // then an order naming it is mapped here and answered, never refused.
    std::map<PageIndex, uint32_t> lost;
  };
  struct Reclaim {
    wire::ReclaimOrderT order;
    // History pages whose host copy is not written yet (copies in flight, pages still being written whose backup
    // replaces their keep plan); their completions come from Poll.
    std::set<uint32_t> awaiting;
    // Pages only planned to be kept (history -> GPU page): kept again if the order fails.
    std::map<uint32_t, PageIndex> planned;
    std::vector<PageIndex> deferred;        // GPU pages of backup_pages not written yet (BackupComplete.deferred_pages)
    std::vector<uint32_t> backup_history;   // history pages of the backup pages, deferred ones excepted
    std::map<PageIndex, uint32_t> history_of;  // backup page (GPU page) -> its history page (checksums, issue 22)
    uint64_t copies = 0;                    // host copies this order wrote
    absl::Status backup_status;             // the first failed copy (or issue) of the order
    ReclaimStep step = ReclaimStep::kBackingUp;
    CopyEvent withdraw;                     // kWithdrawing: the withdrawal's readers
  };
  struct Populate {
    wire::PopulateOrderT order;
    std::set<uint32_t> pending;       // history pages whose copy is in flight
    absl::Status status;
    std::vector<uint32_t> published;  // history pages issued and completed ok
  };
  struct Cancelled {  // a populate order of an ended request, answered once its copies ended
    wire::ReadyPublishT answer;
    std::vector<CopyEvent> copies;
  };
  struct BackupItem {
    uint32_t page;  // history page
    PageIndex target;
    bool held;
    bool lost = false;  // Granted::lost: the GPU page holds nothing, the rows are in the tail or on host
  };

  Granted* Find(RequestId request);
  void RememberFinished(RequestId request);
  absl::Status CheckGrant(const wire::AdmitGrantT& m, uint64_t complete_pages) const;
  absl::Status PlanKv(RequestId request, const Granted& g);
  // Pass 1 of a reclaim: every backup page mapped to its history page; an error refuses the order.
  absl::Status MapBackupPages(const Granted& g, const wire::ReclaimOrderT& m, std::vector<BackupItem>& items) const;
  // Page `page` of `request` is not on GPU page `dp` that memd gave it (Granted::lost).
  void LoseGpuPage(RequestId request, uint32_t page, PageIndex dp);
  // Complete{request} to memd (the end of a request, or a grant refused).
  void SendComplete(RequestId request, wire::CompleteT c = {});
  void IssueBackup(const wire::ReclaimOrderT& m, size_t i, const BackupItem& item, Reclaim& rc);
  void AdvanceReclaims();
  // Step 1 of a reclaim: BackupComplete once its copies ended. Returns false while it must wait, or when the order
  // failed and was dropped (`erased` set).
  bool ReportBackup(Reclaim& rc, Granted* g, bool& erased);
  // Step 2: withdraw the held pages; ReadersDone once their readers finished.
  void Withdraw(Reclaim& rc, Granted* g);
  bool BackupInFlight(const Reclaim& rc) const;
  bool PopulateInFlight(RequestId request, std::span<const PageIndex> device_pages) const;
  // The reclaim order still awaiting the host copy of (request, history page), or nullptr.
  Reclaim* AwaitingOrder(RequestId request, uint32_t page);
  void ReportBackups(const std::vector<KvCompletions::Backup>& backups);
  void ReportPublished(const std::vector<KvCompletions::Published>& published);
  void AnswerPopulate(Populate& po);
  // `history_of` (GPU page -> history page of the order's backup pages): with an ok status, each written page's
  // checksum goes with it (issue 22); nullptr: none.
  void SendBackupComplete(const wire::ReclaimOrderT& m, const absl::Status& status,
                          std::vector<PageIndex> deferred = {},
                          const std::map<PageIndex, uint32_t>* history_of = nullptr);
  void Sent(const absl::Status& s, const char* what);
  // EnterAway's parts: a population undone once its copies ended; a reclaim resolved.
  void UndoPopulate(Populate& po);
  void ResolveReclaim(Reclaim& rc);
  void WaitCopy(const CopyEvent& e, RequestId request, const char* what);

  ResidencyAgentConfig config_;
  KvResidency* kv_;
  MemdLink* memd_;
  std::map<RequestId, Granted> granted_;
  std::map<uint64_t, Reclaim> reclaims_;    // by order id
  std::map<uint64_t, Populate> populates_;  // by order id
  std::vector<Cancelled> cancelled_;
  // Requests this process finished (newest kFinishedMemory): an order for one of them crossed its Complete; an order
  // for a request neither served nor finished here (admitted through an earlier worker process) is refused.
  static constexpr size_t kFinishedMemory = size_t{1} << 16;
  std::deque<RequestId> finished_order_;
  absl::flat_hash_set<RequestId> finished_ids_;
  ResidencyStats stats_;
  absl::Status link_status_;
};

}  // namespace dhs
