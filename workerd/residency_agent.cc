// workerd/residency_agent.cc: see residency_agent.h.
#include "workerd/residency_agent.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/fault_point.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dhs {
namespace {

bool HasHostCopy(PageResidency r) { return r == PageResidency::kHostWriting || r == PageResidency::kHostWritten; }

bool Contains(std::span<const PageIndex> pages, PageIndex dp) {
  return std::find(pages.begin(), pages.end(), dp) != pages.end();
}

}  // namespace

std::string_view ReclaimStepName(ReclaimStep step) {
  switch (step) {
    case ReclaimStep::kBackingUp: return "backing-up";
    case ReclaimStep::kBackedUp: return "backed-up";
    case ReclaimStep::kWithdrawing: return "withdrawing";
    case ReclaimStep::kReadersDone: return "readers-done";
  }
  return "unknown";
}

absl::Status TransitionReclaim(ReclaimStep& step, ReclaimStep from, ReclaimStep to) {
  if (step != from) {
    return absl::FailedPreconditionError(
        absl::StrFormat("reclaim is %s, expected %s", ReclaimStepName(step), ReclaimStepName(from)));
  }
  const bool allowed = std::find(std::begin(kReclaimTransitions), std::end(kReclaimTransitions),
                                 std::pair{from, to}) != std::end(kReclaimTransitions);
  if (!allowed) {
    return absl::FailedPreconditionError(
        absl::StrFormat("no reclaim transition %s -> %s", ReclaimStepName(from), ReclaimStepName(to)));
  }
  step = to;
  return absl::OkStatus();
}

ResidencyAgent::ResidencyAgent(ResidencyAgentConfig config, KvResidency* kv, MemdLink* memd)
    : config_(config), kv_(kv), memd_(memd) {}

ResidencyAgent::Granted* ResidencyAgent::Find(RequestId request) {
  auto it = granted_.find(request);
  return it == granted_.end() ? nullptr : &it->second;
}

std::optional<SlotIndex> ResidencyAgent::SlotOf(RequestId request) const {
  auto it = granted_.find(request);
  if (it == granted_.end()) return std::nullopt;
  return it->second.slot;
}

void ResidencyAgent::Sent(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  if (absl::IsAborted(s)) {
    // This worker's epoch ended (fenced, or memd lost): memd dropped the epoch's state, so the message (e.g. the
    // Complete of a request ended by Abandon / StopAll) has nothing left to release. Expected and harmless; the end of
    // the epoch itself is reported once, by the process (exit 75).
    spdlog::debug("worker: {} not sent to memd: this worker's epoch ended, memd holds nothing of it ({})", what,
                  std::string(s.message()));
  } else {
    spdlog::error("worker: cannot send {} to memd: {}", what, s.ToString());
  }
  // ABORTED (the epoch ended: memd lost, or this worker fenced) stays ABORTED, so the worker exits 75 for its
  // supervisor as for any end of its epoch; any other send failure is UNAVAILABLE.
  const absl::StatusCode code = absl::IsAborted(s) ? absl::StatusCode::kAborted : absl::StatusCode::kUnavailable;
  if (link_status_.ok()) link_status_ = absl::Status(code, absl::StrCat("cannot send ", what, " to memd: ", s.message()));
}

void ResidencyAgent::WaitCopy(const CopyEvent& e, RequestId request, const char* what) {
  // Only that the copy ended matters here (memd may hand its page on); a failure was reported by Poll or is moot.
  if (absl::Status s = e.Wait(); !s.ok()) {
    spdlog::debug("worker: {} of request {} ended with {}", what, request, s.ToString());
  }
}

void ResidencyAgent::RememberFinished(RequestId request) {
  if (!finished_ids_.insert(request).second) return;
  finished_order_.push_back(request);
  if (finished_order_.size() > kFinishedMemory) {
    finished_ids_.erase(finished_order_.front());
    finished_order_.pop_front();
  }
}

// ---- grants ----

absl::Status ResidencyAgent::CheckGrant(const wire::AdmitGrantT& m, uint64_t complete_pages) const {
  if (m.slot >= config_.slots) {
    return absl::InvalidArgumentError(absl::StrCat("memd granted slot ", m.slot, " to request ", m.request,
                                                   "; this worker has N = ", config_.slots, " slots"));
  }
  for (const auto& [id, g] : granted_) {
    if (g.slot == m.slot && id != m.request) {
      return absl::FailedPreconditionError(absl::StrCat("memd granted slot ", m.slot, " to request ", m.request,
                                                        " while request ", id, " holds it"));
    }
  }
  if (config_.host_tier && m.backup_host_pages.size() < complete_pages) {
    return absl::InternalError(absl::StrCat("memd granted ", m.backup_host_pages.size(), " host pages for ",
                                            complete_pages, " complete pages of request ", m.request));
  }
  for (const auto& ref : m.backup_host_pages) {
    if (ref.segment() != 0) {
      return absl::UnimplementedError(absl::StrCat("host page in segment ", ref.segment(),
                                                   ": this worker maps segment 0 only"));
    }
  }
  if (m.optional_pages.size() != m.optional_history_pages.size()) {
    return absl::InternalError("AdmitGrant: optional_pages and optional_history_pages differ in length");
  }
  return absl::OkStatus();
}

absl::Status ResidencyAgent::PlanKv(RequestId request, const Granted& g) {
  std::vector<std::pair<uint32_t, PageIndex>> keep;
  if (config_.keep_optional) keep.assign(g.gpu_pages.begin(), g.gpu_pages.end());
  return kv_->PlanResidency(request, g.slot, g.host_pages, keep);
}

absl::Status ResidencyAgent::OnGrant(const wire::AdmitGrantT& m, uint64_t complete_pages) {
  if (absl::Status s = CheckGrant(m, complete_pages); !s.ok()) return s;
  Granted g;
  g.slot = m.slot;
  g.required = m.required_pages;
  for (const auto& ref : m.backup_host_pages) g.host_pages.push_back(ref.page());
  for (size_t i = 0; i < m.optional_pages.size(); ++i) g.gpu_pages[m.optional_history_pages[i]] = m.optional_pages[i];
  // A resume's host-backed pages: memd holds their confirmed host copies already (never reported again). A memd that
  // does not list them: the leading run 0 .. imported_pages-1.
  for (uint32_t j : m.host_backed_pages) {
    if (j < g.host_pages.size()) g.reported.insert(j);
  }
  for (uint32_t j = 0; m.host_backed_pages.empty() && j < m.imported_pages && j < g.host_pages.size(); ++j) {
    g.reported.insert(j);
  }
  if (absl::Status s = PlanKv(m.request, g); !s.ok()) return s;
  granted_[m.request] = std::move(g);
  return absl::OkStatus();
}

void ResidencyAgent::RefuseGrant(const wire::AdmitGrantT& m) { SendComplete(m.request); }

void ResidencyAgent::SendComplete(RequestId request, wire::CompleteT c) {
  c.request = request;
  c.gpu = config_.gpu;
  Sent(memd_->SendComplete(c), "Complete");
}

// ---- reclaim orders ----

void ResidencyAgent::SendBackupComplete(const wire::ReclaimOrderT& m, const absl::Status& status,
                                        std::vector<PageIndex> deferred,
                                        const std::map<PageIndex, uint32_t>* history_of) {
  wire::BackupCompleteT done;
  done.order = m.order;
  done.request = m.request;
  done.gpu = config_.gpu;
  done.pages = m.backup_pages;
  done.host_pages = m.backup_targets;
  done.ok = status.ok();
  if (status.ok() && history_of != nullptr) {  // issue 22: each written page's checksum (0: deferred, none known)
    for (PageIndex dp : m.backup_pages) {
      auto h = history_of->find(dp);
      const bool later = std::find(deferred.begin(), deferred.end(), dp) != deferred.end();
      done.checksums.push_back(h == history_of->end() || later ? 0 : kv_->HostChecksum(m.request, h->second));
    }
  }
  if (status.ok()) done.deferred_pages = std::move(deferred);
  if (!status.ok()) {
    done.error = ToWireError(status);
    done.message = std::string(status.message());
  }
  Sent(memd_->SendBackupComplete(done), "BackupComplete");
}

absl::Status ResidencyAgent::MapBackupPages(const Granted& g, const wire::ReclaimOrderT& m,
                                            std::vector<BackupItem>& items) const {
  for (size_t i = 0; i < m.backup_pages.size(); ++i) {
    const PageIndex dp = m.backup_pages[i];
    std::optional<GpuPageUse> use = kv_->GpuPageOf(m.request, dp);
    bool lost = false;
    if (auto it = g.lost.find(dp); !use && it != g.lost.end()) {  // memd's page, not used: it holds nothing
      use = GpuPageUse{it->second, false};
      lost = true;
    }
    if (!use) {
      return absl::FailedPreconditionError(absl::StrCat("ReclaimOrder ", m.order, ": GPU page ", dp,
                                                        " holds no history page of request ", m.request, " here"));
    }
    if (m.backup_targets[i].segment() != 0) {
      return absl::UnimplementedError(absl::StrCat("ReclaimOrder ", m.order, ": host page in segment ",
                                                   m.backup_targets[i].segment(), ": this worker maps segment 0 only"));
    }
    // The host page of a history page is fixed at the grant (contract §2): an order naming another is refused.
    const uint32_t j = use->page;
    if (j >= g.host_pages.size() || g.host_pages[j] != m.backup_targets[i].page()) {
      return absl::InvalidArgumentError(absl::StrCat("ReclaimOrder ", m.order, ": backup target host page ",
                                                     m.backup_targets[i].page(), " of history page ", j,
                                                     " differs from the grant"));
    }
    items.push_back(BackupItem{j, m.backup_targets[i].page(), use->held, lost});
  }
  return absl::OkStatus();
}

void ResidencyAgent::IssueBackup(const wire::ReclaimOrderT& m, size_t i, const BackupItem& item, Reclaim& rc) {
  const uint32_t j = item.page;  // item.target is the grant's host page of j (MapBackupPages)
  const PageResidency where = kv_->Residency(m.request, j);
  if (HasHostCopy(where)) {  // written, or being written: that copy's completion is this order's
    rc.backup_history.push_back(j);
    if (where == PageResidency::kHostWriting) rc.awaiting.insert(j);
    return;
  }
  absl::Status issued;
  if (item.held) {
    issued = kv_->BackupHeldPage(m.request, j, item.target);
  } else {
    // The GPU page holds nothing: the page was only planned to be kept there, or it is lost (its keep copy failed and
    // so did its fallback host copy). Its rows are still in the tail (a page without a host copy never leaves it). A
    // page whose rows are all written is backed up from there now and awaited; one the victim is still writing is
    // *deferred* (contract §4): it goes to its host page when it completes (HostCopyWritten), and the order does not
    // wait for the victim's prefill (a lost page was complete: never deferred). Only a planned page is kept again if
    // the order fails; a lost one stays lost.
    if (!item.lost) rc.planned[j] = m.backup_pages[i];
    absl::StatusOr<bool> now = kv_->BackupInsteadOfKeep(m.request, j, item.target);
    issued = now.status();
    if (now.ok() && !*now) {
      rc.deferred.push_back(m.backup_pages[i]);
      return;
    }
  }
  rc.backup_history.push_back(j);
  if (issued.ok()) {
    rc.awaiting.insert(j);
  } else if (rc.backup_status.ok()) {
    rc.backup_status = issued;
  }
}

void ResidencyAgent::OnReclaimOrder(const wire::ReclaimOrderT& m) {
  Reclaim rc;
  rc.order = m;
  if (m.backup_pages.size() != m.backup_targets.size()) {
    SendBackupComplete(m, absl::InvalidArgumentError("ReclaimOrder: backup_pages and backup_targets differ in length"));
    return;
  }
  Granted* g = Find(m.request);
  if (g == nullptr && !Finished(m.request)) {
    // Never served by this worker process (admitted through an earlier one that died): nothing of it was written
    // here, so no host copy may be reported. memd keeps the victim as it was.
    if (!m.backup_pages.empty()) {
      SendBackupComplete(m, absl::FailedPreconditionError(absl::StrCat("ReclaimOrder ", m.order, ": request ",
                                                                       m.request, " is unknown to this worker "
                                                                       "process; no host copy written")));
      return;
    }
  }
  if (g == nullptr) {
    // Finished here: its Complete crossed the order and memd dropped the reclaim and the request's pages with it.
    // The answer only closes memd's orphaned copies (contract, details); ReadersDone follows (nothing is mapped).
    if (!m.backup_pages.empty()) SendBackupComplete(m, absl::OkStatus());
    reclaims_[m.order] = std::move(rc);
    AdvanceReclaims();
    return;
  }
  std::vector<BackupItem> items;
  if (absl::Status s = MapBackupPages(*g, m, items); !s.ok()) {  // a bad order: refused, nothing changed
    SendBackupComplete(m, s);
    return;
  }
  // Pages named without a backup (memd has their host copy) and only planned: the plan is dropped; they go to host
  // when they complete (HostCopyWritten).
  for (PageIndex dp : m.pages) {
    if (Contains(m.backup_pages, dp)) continue;
    std::optional<GpuPageUse> use = kv_->GpuPageOf(m.request, dp);
    if (use && !use->held) kv_->DropKeep(m.request, use->page);
  }
  for (size_t i = 0; i < items.size(); ++i) rc.history_of[m.backup_pages[i]] = items[i].page;
  for (size_t i = 0; i < items.size(); ++i) IssueBackup(m, i, items[i], rc);
  ReachFaultPoint(FaultPoint::kReclaim);  // test-only (common/fault_point.h)
  reclaims_[m.order] = std::move(rc);
  AdvanceReclaims();
}

bool ResidencyAgent::BackupInFlight(const Reclaim& rc) const {
  for (uint32_t j : rc.awaiting) {
    if (HasHostCopy(kv_->Residency(rc.order.request, j))) return true;  // issued; its completion not polled yet
  }
  return false;
}

bool ResidencyAgent::ReportBackup(Reclaim& rc, Granted* g, bool& erased) {
  const wire::ReclaimOrderT& m = rc.order;
  // Every backup page's host copy written -> BackupComplete ok. A failure is reported once none of the order's copies
  // is still writing (memd may hand the host pages on after it); pages not issued yet are not waited for.
  if (!rc.awaiting.empty() && (rc.backup_status.ok() || BackupInFlight(rc))) return false;
  if (!m.backup_pages.empty()) SendBackupComplete(m, rc.backup_status, rc.deferred, &rc.history_of);
  if (!rc.backup_status.ok()) {
    // memd leaves the victim untouched and may retry: a page only planned to be kept is kept again on its GPU page
    // (its rows are still in the tail: a page without a host copy never leaves it).
    spdlog::warn("worker: backup of reclaim order {} failed: {}", m.order, rc.backup_status.ToString());
    wire::HostCopyWrittenT written;
    for (const auto& [j, dp] : rc.planned) {
      const PageResidency where = kv_->Residency(m.request, j);
      if (HasHostCopy(where)) {
        // Its backup was written, but memd counts none of the failed order's copies: the page is on host, not on its
        // GPU page. Reported like any page written outside an order (memd frees the GPU page, contract §4).
        LoseGpuPage(m.request, j, dp);
        if (where == PageResidency::kHostWritten && j < g->host_pages.size() && g->reported.insert(j).second) {
          written.history_pages.push_back(j);
          written.host_pages.emplace_back(0, g->host_pages[j]);  // the order's target (IssueBackup keeps it there)
          written.checksums.push_back(kv_->HostChecksum(m.request, j));
          ++stats_.pages_backed_up;
        }  // (still writing: Poll reports it, the order being gone)
        continue;
      }
      if (absl::Status s = kv_->RestoreKeep(m.request, j, dp); !s.ok()) {
        spdlog::error("worker: keeping page {} of request {} again failed: {}", j, m.request, s.ToString());
      }
    }
    if (!written.history_pages.empty()) {
      written.request = m.request;
      written.gpu = config_.gpu;
      written.ok = true;
      Sent(memd_->SendHostCopyWritten(written), "HostCopyWritten");
    }
    erased = true;
    return false;
  }
  DHS_CHECK_OK(TransitionReclaim(rc.step, ReclaimStep::kBackingUp, ReclaimStep::kBackedUp));
  for (uint32_t j : rc.backup_history) g->reported.insert(j);
  stats_.pages_backed_up += rc.copies;
  return true;
}

void ResidencyAgent::Withdraw(Reclaim& rc, Granted* g) {
  const wire::ReclaimOrderT& m = rc.order;
  if (rc.step == ReclaimStep::kBackingUp || rc.step == ReclaimStep::kBackedUp) {
    // Every page of the order still held here is withdrawn, including pages whose populate copy was in flight when
    // the order came (memd reclaims whole requests), but only after that populate was answered (ReadyPublish): memd
    // waits for that answer before it retires the page. ReadersDone goes out once no page of the order is mapped
    // (contract §4, brief §4).
    if (g != nullptr && PopulateInFlight(m.request, m.pages)) return;
    std::vector<uint32_t> held;
    for (PageIndex dp : m.pages) {
      std::optional<GpuPageUse> use = g != nullptr ? kv_->GpuPageOf(m.request, dp) : std::nullopt;
      if (use && use->held) held.push_back(use->page);
    }
    if (!held.empty()) {
      absl::StatusOr<CopyEvent> e = kv_->WithdrawReady(m.request, held);
      if (!e.ok()) spdlog::error("worker: withdraw of order {} failed: {}", m.order, e.status().ToString());
      if (e.ok()) rc.withdraw = *e;
    }
    DHS_CHECK_OK(TransitionReclaim(rc.step, rc.step, ReclaimStep::kWithdrawing));
  }
  if (rc.step != ReclaimStep::kWithdrawing || !rc.withdraw.Done()) return;
  DHS_CHECK_OK(TransitionReclaim(rc.step, ReclaimStep::kWithdrawing, ReclaimStep::kReadersDone));
  if (g != nullptr) {
    for (PageIndex dp : m.pages) {
      std::erase_if(g->gpu_pages, [&](const auto& e) { return e.second == dp; });
      g->lost.erase(dp);
    }
  }
  wire::ReadersDoneT done;
  done.order = m.order;
  done.request = m.request;
  done.gpu = config_.gpu;
  done.pages = m.pages;
  Sent(memd_->SendReadersDone(done), "ReadersDone");
  // Obeyed: the pages are unmapped and unread. Counted here, not at Retire, which may come after the request finished
  // and its orders were forgotten; an order that crossed its request's Complete reclaimed nothing.
  if (g != nullptr) {
    ++stats_.reclaims_obeyed;
    stats_.pages_reclaimed += m.pages.size();
  }
}

void ResidencyAgent::AdvanceReclaims() {
  for (auto it = reclaims_.begin(); it != reclaims_.end();) {
    Reclaim& rc = it->second;
    Granted* g = Find(rc.order.request);
    if (rc.step == ReclaimStep::kBackingUp && g != nullptr) {
      bool erased = false;
      if (!ReportBackup(rc, g, erased)) {
        it = erased ? reclaims_.erase(it) : std::next(it);
        continue;
      }
    }
    Withdraw(rc, g);
    ++it;
  }
}

bool ResidencyAgent::PopulateInFlight(RequestId request, std::span<const PageIndex> device_pages) const {
  for (const auto& [order, po] : populates_) {
    if (po.order.request != request) continue;
    for (size_t i = 0; i < po.order.pages.size() && i < po.order.history_pages.size(); ++i) {
      if (po.pending.contains(po.order.history_pages[i]) && Contains(device_pages, po.order.pages[i])) return true;
    }
  }
  return false;
}

void ResidencyAgent::OnRetire(const wire::RetireT& m) {
  auto it = reclaims_.find(m.order);
  if (it == reclaims_.end()) {
    // Its request finished after ReadersDone went out (EndRequest forgets the request's orders): nothing is mapped.
    spdlog::debug("worker: Retire for order {} of a finished request", m.order);
  } else if (it->second.step != ReclaimStep::kReadersDone) {
    spdlog::warn("worker: Retire for order {} that has not reached ReadersDone", m.order);
  }
  if (absl::Status s = kv_->Retire(m.pages); !s.ok()) spdlog::error("worker: Retire: {}", s.ToString());
  if (it != reclaims_.end()) reclaims_.erase(it);
}

// ---- populate orders ----

void ResidencyAgent::OnPopulateOrder(const wire::PopulateOrderT& m) {
  Granted* g = Find(m.request);
  if (g != nullptr) {
    for (PageIndex dp : m.pages) g->lost.erase(dp);  // memd freed it (HostCopyWritten) and gives it out again
  }
  Populate& po = populates_[m.order];
  po.order = m;
  if (m.pages.size() != m.history_pages.size() || m.pages.size() != m.host_pages.size()) {
    po.status = absl::InvalidArgumentError("PopulateOrder: pages, history_pages and host_pages differ in length");
  } else if (g == nullptr) {
    po.status = absl::FailedPreconditionError(absl::StrCat("PopulateOrder: request ", m.request,
                                                           " has no hierarchical KV on this worker"));
  }
  for (size_t i = 0; i < m.pages.size() && po.status.ok(); ++i) {
    const uint32_t j = m.history_pages[i];
    if (m.host_pages[i].segment() != 0 || j >= g->host_pages.size() || g->host_pages[j] != m.host_pages[i].page()) {
      po.status = absl::InvalidArgumentError(absl::StrCat("PopulateOrder: host page of history page ", j,
                                                          " differs from the grant"));
      break;
    }
    absl::StatusOr<CopyEvent> e = kv_->Populate(m.request, j, m.pages[i]);
    if (!e.ok()) {
      po.status = e.status();
      break;
    }
    po.pending.insert(j);
  }
  if (!po.pending.empty()) ReachFaultPoint(FaultPoint::kPopulate);  // test-only (common/fault_point.h)
  if (po.pending.empty()) AnswerPopulate(po);  // nothing in flight: answered at once
}

void ResidencyAgent::AnswerPopulate(Populate& po) {
  if (memd_->session().serving_away()) {  // an order of the dead memd: undone, answered to no one
    UndoPopulate(po);
    populates_.erase(po.order.order);
    return;
  }
  const wire::PopulateOrderT& m = po.order;
  Granted* g = Find(m.request);
  if (!po.status.ok() && g != nullptr && !po.published.empty()) {
    // Not published as a whole: withdraw the pages that did complete before memd frees them.
    absl::StatusOr<CopyEvent> e = kv_->WithdrawReady(m.request, po.published);
    if (e.ok()) {
      WaitCopy(*e, m.request, "withdrawal of a partly failed populate");
    } else {
      spdlog::error("worker: withdraw of populate order {} failed: {}", m.order, e.status().ToString());
    }
  }
  if (po.status.ok() && g != nullptr) {
    for (size_t i = 0; i < m.pages.size(); ++i) g->gpu_pages[m.history_pages[i]] = m.pages[i];
    stats_.pages_populated += m.pages.size();
  }
  wire::ReadyPublishT pub;
  pub.order = m.order;
  pub.gpu = config_.gpu;
  pub.request = m.request;
  pub.pages = m.pages;
  pub.history_pages = m.history_pages;
  pub.ok = po.status.ok();
  if (!po.status.ok()) pub.error = ToWireError(po.status);
  const uint64_t order = m.order;
  Sent(memd_->SendReadyPublish(pub), "ReadyPublish");
  populates_.erase(order);
}

// ---- KV completions ----

void ResidencyAgent::LoseGpuPage(RequestId request, uint32_t page, PageIndex dp) {
  Granted* g = Find(request);
  if (g == nullptr) return;
  // Not planned onto it again (RebuildKv): memd frees it once the page's host copy is reported.
  if (auto it = g->gpu_pages.find(page); it != g->gpu_pages.end() && it->second == dp) g->gpu_pages.erase(it);
  g->lost[dp] = page;
}

ResidencyAgent::Reclaim* ResidencyAgent::AwaitingOrder(RequestId request, uint32_t page) {
  for (auto& [order, rc] : reclaims_) {
    if (rc.order.request == request && rc.step == ReclaimStep::kBackingUp && rc.awaiting.contains(page)) return &rc;
  }
  return nullptr;
}

void ResidencyAgent::ReportBackups(const std::vector<KvCompletions::Backup>& backups) {
  std::map<RequestId, wire::HostCopyWrittenT> written;
  for (const KvCompletions::Backup& b : backups) {
    if (Reclaim* rc = AwaitingOrder(b.request, b.page)) {
      // A copy a reclaim order waits for: reported with that order's BackupComplete (AdvanceReclaims).
      rc->awaiting.erase(b.page);
      if (b.status.ok()) {
        ++rc->copies;
      } else if (rc->backup_status.ok()) {
        rc->backup_status = absl::Status(b.status.code(), absl::StrCat("host copy of page ", b.page, " failed: ",
                                                                        b.status.message()));
      }
      continue;
    }
    Granted* g = Find(b.request);
    if (g == nullptr) continue;
    if (memd_->session().serving_away()) {  // memd died: reported (ok) by ReturnFromAway to the memd that adopts the request
      if (b.status.ok()) ++stats_.pages_backed_up;
      if (!b.status.ok()) spdlog::error("worker: backup of page {} of request {} failed: {}", b.page, b.request,
                                        b.status.ToString());
      continue;
    }
    if (!b.status.ok()) {
      spdlog::error("worker: backup of page {} of request {} failed: {}", b.page, b.request, b.status.ToString());
      wire::HostCopyWrittenT fail;
      fail.request = b.request;
      fail.gpu = config_.gpu;
      fail.history_pages = {b.page};
      fail.host_pages = {wire::HostPageRef(0, b.host_page)};
      fail.ok = false;
      fail.error = ToWireError(b.status);
      fail.message = std::string(b.status.message());
      Sent(memd_->SendHostCopyWritten(fail), "HostCopyWritten");
      continue;
    }
    ++stats_.pages_backed_up;
    if (!g->reported.insert(b.page).second) continue;  // a replayed page: reported before
    wire::HostCopyWrittenT& w = written[b.request];
    w.request = b.request;
    w.gpu = config_.gpu;
    w.ok = true;
    w.history_pages.push_back(b.page);
    w.host_pages.emplace_back(0, b.host_page);
    w.checksums.push_back(b.checksum);
  }
  for (auto& [id, w] : written) Sent(memd_->SendHostCopyWritten(w), "HostCopyWritten");
}

void ResidencyAgent::ReportPublished(const std::vector<KvCompletions::Published>& published) {
  for (const KvCompletions::Published& p : published) {
    if (p.kept) {
      if (p.status.ok()) {
        ++stats_.pages_kept;
      } else {
        // The KV backs the page up to its host page instead; its HostCopyWritten tells memd the GPU page holds
        // nothing (memd frees it). Until then memd may name the page in a ReclaimOrder: answered through `lost`.
        spdlog::warn("worker: keeping page {} of request {} on GPU failed ({}); backed up to host instead", p.page,
                     p.request, p.status.ToString());
        LoseGpuPage(p.request, p.page, p.device_page);
      }
      continue;
    }
    auto pit = std::find_if(populates_.begin(), populates_.end(), [&](const auto& e) {
      return e.second.order.request == p.request && e.second.pending.contains(p.page);
    });
    if (pit == populates_.end()) continue;
    Populate& po = pit->second;
    po.pending.erase(p.page);
    if (p.status.ok()) {
      po.published.push_back(p.page);
    } else if (po.status.ok()) {
      po.status = p.status;
    }
    if (po.pending.empty()) AnswerPopulate(po);
  }
}

void ResidencyAgent::Poll() {
  std::erase_if(cancelled_, [&](const Cancelled& c) {
    if (!std::all_of(c.copies.begin(), c.copies.end(), [](const CopyEvent& e) { return e.Done(); })) return false;
    Sent(memd_->SendReadyPublish(c.answer), "ReadyPublish");
    return true;
  });
  KvCompletions c = kv_->Poll();
  ReportBackups(c.backups);
  ReportPublished(c.published);
  AdvanceReclaims();
}

// ---- the loop's decisions ----

absl::Status ResidencyAgent::RebuildKv(RequestId request) {
  for (const auto& [order, rc] : reclaims_) {
    if (rc.order.request == request && rc.step != ReclaimStep::kReadersDone) {
      return absl::AbortedError("a reclaim order of this request is in flight");
    }
  }
  for (const auto& [order, po] : populates_) {
    if (po.order.request == request) return absl::AbortedError("a populate order of this request is in flight");
  }
  kv_->Release(request);
  const Granted* g = Find(request);
  if (g == nullptr) return absl::FailedPreconditionError(absl::StrCat("request ", request, " is not granted"));
  return PlanKv(request, *g);
}

void ResidencyAgent::EndRequest(RequestId request, wire::CompleteT complete) {
  // Issue 26 (sessions across nodes): a finished turn that names its history pages (session_page_digests) for memd to
  // publish first waits for its host backups and reports them (Poll), so that memd holds every complete page's copy
  // confirmed at the Complete; otherwise a copy that landed since the last Poll would still be unconfirmed there and
  // not published, and how many pages a turn publishes would depend on timing.
  if (!complete.session_page_digests.empty()) {
    for (const CopyEvent& e : kv_->CopiesInFlight(request).to_host) WaitCopy(e, request, "host backup");
    Poll();
  }
  RememberFinished(request);
  // Populate orders in flight die with the request, but memd frees their GPU pages only when they are answered
  // (contract §5): each is answered unpublished once its copies into those pages ended (Poll).
  std::vector<Cancelled> cancelled;
  for (const auto& [order, po] : populates_) {
    if (po.order.request != request) continue;
    Cancelled c;
    c.answer.order = order;
    c.answer.gpu = config_.gpu;
    c.answer.request = request;
    c.answer.pages = po.order.pages;
    c.answer.history_pages = po.order.history_pages;
    c.answer.ok = false;
    c.answer.error = wire::ErrorCode::CANCELLED;
    cancelled.push_back(std::move(c));
  }
  const RequestCopies copies = kv_->CopiesInFlight(request);
  for (const auto& [dp, copy] : copies.into_gpu) {
    bool populated = false;
    for (Cancelled& c : cancelled) {
      if (Contains(c.answer.pages, dp)) {
        c.copies.push_back(copy);
        populated = true;
      }
    }
    // A kept page's device->device copy: memd frees the page at Complete, so it must have landed by then.
    if (!populated) WaitCopy(copy, request, "keep copy");
  }
  // Likewise every host backup still being written: memd frees the request's host pages at Complete and may grant
  // them at once; a late write would land in another request's page.
  for (const CopyEvent& e : copies.to_host) WaitCopy(e, request, "host backup");
  kv_->Release(request);
  // Orders of this request die with it: Complete releases everything at memd (contract §6).
  std::erase_if(reclaims_, [&](const auto& e) { return e.second.order.request == request; });
  std::erase_if(populates_, [&](const auto& e) { return e.second.order.request == request; });
  granted_.erase(request);
  SendComplete(request, std::move(complete));
  for (Cancelled& x : cancelled) cancelled_.push_back(std::move(x));
}

// ---- memd away (issue 11) ----

void ResidencyAgent::UndoPopulate(Populate& po) {
  const wire::PopulateOrderT& m = po.order;
  // The copies into the GPU pages end first (the new memd may lend those pages at once).
  for (const auto& [dp, copy] : kv_->CopiesInFlight(m.request).into_gpu) {
    if (Contains(m.pages, dp)) WaitCopy(copy, m.request, "population copy of a dead memd's order");
  }
  std::vector<uint32_t> mapped;  // published or still pending in the KV: withdrawn
  for (size_t i = 0; i < m.pages.size() && i < m.history_pages.size(); ++i) {
    std::optional<GpuPageUse> use = kv_->GpuPageOf(m.request, m.pages[i]);
    if (use && use->held && use->page == m.history_pages[i]) mapped.push_back(use->page);
  }
  if (!mapped.empty()) {
    absl::StatusOr<CopyEvent> e = kv_->WithdrawReady(m.request, mapped);
    if (e.ok()) {
      WaitCopy(*e, m.request, "withdrawal of a dead memd's population");
    } else {
      spdlog::error("worker: withdraw of population order {} failed: {}", m.order, e.status().ToString());
    }
  }
  spdlog::info("worker: population order {} of request {} of the dead memd undone ({} pages)", m.order, m.request,
               m.pages.size());
}

void ResidencyAgent::ResolveReclaim(Reclaim& rc) {
  const wire::ReclaimOrderT& m = rc.order;
  Granted* g = Find(m.request);
  if (g == nullptr) return;  // its request ended: nothing of it is mapped
  if (rc.step == ReclaimStep::kReadersDone || rc.step == ReclaimStep::kWithdrawing) {
    // Its pages were backed up and are withdrawn (or being withdrawn): they are dropped, each has a host copy.
    if (rc.step == ReclaimStep::kWithdrawing) WaitCopy(rc.withdraw, m.request, "withdrawal of a dead memd's reclaim");
    for (PageIndex dp : m.pages) {
      std::erase_if(g->gpu_pages, [&](const auto& e) { return e.second == dp; });
      g->lost.erase(dp);
    }
    spdlog::info("worker: reclaim order {} of request {} of the dead memd: its {} pages dropped (on host)", m.order,
                 m.request, m.pages.size());
    return;
  }
  // Abandoned: the pages stay kept on GPU. A page only planned to be kept is kept again, unless its backup was issued
  // (then it is on host, not on that GPU page).
  for (const auto& [j, dp] : rc.planned) {
    if (HasHostCopy(kv_->Residency(m.request, j))) {
      LoseGpuPage(m.request, j, dp);
      continue;
    }
    if (absl::Status s = kv_->RestoreKeep(m.request, j, dp); !s.ok()) {
      spdlog::error("worker: keeping page {} of request {} again failed: {}", j, m.request, s.ToString());
      LoseGpuPage(m.request, j, dp);
    }
  }
  spdlog::info("worker: reclaim order {} of request {} of the dead memd abandoned: its pages stay on GPU", m.order,
               m.request);
}

void ResidencyAgent::EnterAway() {
  for (Cancelled& c : cancelled_) {  // answers owed to the dead memd: dropped once the copies into the pages ended
    for (const CopyEvent& e : c.copies) WaitCopy(e, c.answer.request, "population copy of an ended request");
  }
  cancelled_.clear();
  std::vector<uint64_t> orders;
  for (const auto& [order, po] : populates_) orders.push_back(order);
  for (uint64_t order : orders) {
    auto it = populates_.find(order);
    if (it == populates_.end()) continue;
    UndoPopulate(it->second);
    populates_.erase(it);
  }
  for (auto& [order, rc] : reclaims_) ResolveReclaim(rc);
  reclaims_.clear();
}

std::unique_ptr<wire::ReportedRequestT> ResidencyAgent::Report(RequestId request) const {
  auto it = granted_.find(request);
  if (it == granted_.end()) return nullptr;
  const Granted& g = it->second;
  auto rep = std::make_unique<wire::ReportedRequestT>();
  rep->request = request;
  rep->slot = g.slot;
  rep->required_pages = g.required;
  for (uint32_t j = 0; j < g.host_pages.size(); ++j) {
    auto page = std::make_unique<wire::ReportedPageT>();
    page->host_page = g.host_pages[j];
    page->host_copy = g.reported.contains(j);
    if (page->host_copy) page->checksum = kv_->HostChecksum(request, j);
    if (auto dp = g.gpu_pages.find(j); dp != g.gpu_pages.end()) {
      page->has_gpu_page = true;
      page->gpu_page = dp->second;
    }
    rep->history.push_back(std::move(page));
  }
  return rep;
}

void ResidencyAgent::ReturnFromAway(const std::set<RequestId>& adopted) {
  for (auto& [id, g] : granted_) {
    if (!adopted.contains(id)) continue;
    // memd's journal decides which host copies count: every written one that is not on a GPU page is reported again
    // (a repeated report of a confirmed copy changes nothing). A page on a GPU page keeps what memd says.
    std::erase_if(g.reported, [&pages = g.gpu_pages](uint32_t j) { return !pages.contains(j); });
    wire::HostCopyWrittenT w;
    for (uint32_t j = 0; j < g.host_pages.size(); ++j) {
      if (g.gpu_pages.contains(j) || kv_->Residency(id, j) != PageResidency::kHostWritten) continue;
      g.reported.insert(j);
      w.history_pages.push_back(j);
      w.host_pages.emplace_back(0, g.host_pages[j]);
      w.checksums.push_back(kv_->HostChecksum(id, j));
    }
    if (w.history_pages.empty()) continue;
    w.request = id;
    w.gpu = config_.gpu;
    w.ok = true;
    Sent(memd_->SendHostCopyWritten(w), "HostCopyWritten");
  }
}

void ResidencyAgent::Forget(RequestId request) {
  const RequestCopies copies = kv_->CopiesInFlight(request);
  for (const auto& [dp, copy] : copies.into_gpu) WaitCopy(copy, request, "keep copy");
  for (const CopyEvent& e : copies.to_host) WaitCopy(e, request, "host backup");
  kv_->Release(request);
  granted_.erase(request);
}

bool ResidencyAgent::busy() const {
  if (!populates_.empty() || !cancelled_.empty()) return true;
  return std::any_of(reclaims_.begin(), reclaims_.end(),
                     [](const auto& e) { return e.second.step != ReclaimStep::kReadersDone; });
}

uint32_t ResidencyAgent::pending_orders() const {
  return static_cast<uint32_t>(reclaims_.size() + populates_.size() + cancelled_.size());
}

}  // namespace dhs
