#include "memd/residency_manager.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace dhs::memd {

std::string_view OrderName(const Order& order) {
  static constexpr std::string_view kNames[] = {"grant", "wait", "reject", "backup", "populate", "withdraw", "retire",
                                                "reclaim"};
  return kNames[order.index()];
}

absl::StatusOr<std::unique_ptr<ResidencyManager>> ResidencyManager::Create(const ResidencyConfig& config,
                                                                           Clock clock) {
  auto policy = MakeReclaimPolicy(config.reclaim_policy);
  if (!policy.ok()) return policy.status();
  auto host = HostPageAllocator::Create(config.host_pages, config.host_page_bytes);
  if (!host.ok()) return host.status();
  if (!clock) return absl::InvalidArgumentError("ResidencyManager needs a clock");
  return std::unique_ptr<ResidencyManager>(
      new ResidencyManager(config, std::move(clock), std::move(*host), std::move(*policy)));
}

ResidencyManager::ResidencyManager(const ResidencyConfig& config, Clock clock, HostPageAllocator host,
                                   std::unique_ptr<ReclaimPolicy> policy)
    : config_(config), clock_(std::move(clock)), host_(std::move(host)), policy_(std::move(policy)) {}

const GpuPageTable* ResidencyManager::gpu_table(GpuId gpu) const {
  auto it = gpus_.find(gpu);
  return it == gpus_.end() ? nullptr : &it->second.table;
}

std::vector<Order> ResidencyManager::DrainOrders() {
  std::vector<Order> out;
  out.swap(outbox_);
  return out;
}

absl::Status ResidencyManager::Finish(absl::Status status) {
  ++counters_.events;
  if (!status.ok()) {
    ++counters_.event_errors;
    return status;
  }
  Pump();
  return status;
}

// ---------------------------------------------------------------- events

absl::Status ResidencyManager::RegisterGpu(GpuId gpu, uint32_t pages) {
  if (gpus_.count(gpu)) return Finish(absl::AlreadyExistsError(absl::StrFormat("GPU %d already registered", gpu)));
  auto table = GpuPageTable::Create(gpu, pages, config_.reserve_pages);
  if (!table.ok()) return Finish(table.status());
  gpus_.emplace(gpu, Gpu{std::move(*table), {}, PopulationScheduler(config_.populate_pages_per_attempt), 0});
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::Admit(const AdmitRequest& a) {
  if (requests_.count(a.request)) {
    return Finish(absl::AlreadyExistsError(absl::StrFormat("request %d already known", a.request)));
  }
  auto g = gpus_.find(a.gpu);
  if (g == gpus_.end()) {
    return Finish(absl::NotFoundError(absl::StrFormat("request %d: GPU %d not registered", a.request, a.gpu)));
  }
  if (a.required_pages == 0) {
    return Finish(absl::InvalidArgumentError(absl::StrFormat("request %d: required_pages must be > 0", a.request)));
  }
  if (a.assign_host_pages && a.context_pages < a.history_pages) {
    return Finish(absl::InvalidArgumentError(absl::StrFormat(
        "request %d: %d complete history pages exceed the %d pages of its context", a.request, a.history_pages,
        a.context_pages)));
  }
  Request r;
  r.id = a.request;
  r.gpu = a.gpu;
  r.slot = a.slot;
  r.required_count = a.required_pages;
  r.imported_pages = a.history_pages;
  r.assign_host_pages = a.assign_host_pages;
  r.context_pages = a.assign_host_pages ? a.context_pages : a.history_pages;
  r.optional_history = a.optional_history;
  r.state = RequestState::kQueued;
  r.time_us = clock_();
  ++counters_.admissions;
  if (absl::Status never = NeverFits(r, g->second); !never.ok()) {  // rejected at once, blocks nobody
    spdlog::info("memd: reject: {}", std::string(never.message()));
    outbox_.push_back(RejectOrder{r.id, r.gpu, never});
    ++counters_.rejects;
    return Finish(absl::OkStatus());
  }
  requests_.emplace(r.id, std::move(r));
  g->second.queue.push_back(a.request);
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::OnBackupDone(CopyId copy, bool ok, bool written) {
  auto it = copies_.find(copy);
  if (it == copies_.end() || !it->second.backup) {
    return Finish(absl::NotFoundError(absl::StrFormat("backup copy %d unknown", copy)));
  }
  const Copy c = it->second;
  copies_.erase(it);
  (void)host_.Unpin(c.host_page);
  if (!ok) ++counters_.backups_failed;
  if (c.orphan) return Finish(absl::OkStatus());  // request completed; its host page was freed (reusable now)
  Request& r = requests_.at(c.request);
  HistoryPage& hp = r.history[c.history_page];
  hp.backup = 0;
  if (ok) {
    const bool confirmed = hp.has_host && !hp.awaiting_write && hp.host_page == c.host_page;
    hp.has_host = true;
    hp.host_page = c.host_page;
    hp.host_reserved = false;
    hp.awaiting_write = !written && !confirmed;  // deferred: covered by the worker's tail until OnHostCopyWritten
    if (c.from_tail) hp.where = Where::kNone;  // leaves the tail: host only until population brings it back
    if (c.reclaim != 0) {
      Reclaim& rc = reclaims_.at(c.reclaim);
      --rc.backups;
      AdvanceReclaim(rc);
    }
  } else {
    // An assigned host page stays the request's; so does one that became a valid copy meanwhile (OnHostCopyWritten).
    if (!hp.host_reserved && !(hp.has_host && hp.host_page == c.host_page)) (void)host_.Free(c.host_page);
    if (c.from_tail) r.tail_retry.push_back(c.history_page);
    if (c.reclaim != 0) AbortReclaim(r, gpus_.at(r.gpu));
  }
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::OnPopulateDone(CopyId copy, bool ok) {
  auto it = copies_.find(copy);
  if (it == copies_.end() || it->second.backup) {
    return Finish(absl::NotFoundError(absl::StrFormat("population copy %d unknown", copy)));
  }
  const Copy c = it->second;
  copies_.erase(it);
  (void)host_.Unpin(c.host_page);
  if (!ok) ++counters_.populates_failed;
  Gpu& g = gpus_.at(c.gpu);
  if (c.orphan) {  // request completed while the copy was in flight: the page is free only now
    (void)g.table.Release(c.gpu_page);
    return Finish(absl::OkStatus());
  }
  Request& r = requests_.at(c.request);
  HistoryPage& hp = r.history[c.history_page];
  hp.populate = 0;
  const bool reclaiming = g.table.state(c.gpu_page) == PageState::kReclaiming;
  if (ok) {
    if (!reclaiming) {
      (void)g.table.Transition(c.gpu_page, PageState::kOptionalPending, PageState::kOptionalReady);
    } else {
      Reclaim& rc = reclaims_.at(r.reclaim);
      --rc.populates;
      AdvanceReclaim(rc);
    }
  } else {
    // Nothing was published: the page holds no readable data and is freed at once.
    (void)g.table.Release(c.gpu_page);
    hp.where = Where::kNone;
    --r.optional;
    if (reclaiming) {
      Reclaim& rc = reclaims_.at(r.reclaim);
      rc.pages.erase(std::find(rc.pages.begin(), rc.pages.end(), c.gpu_page));
      --g.reclaiming_pages;
      --rc.populates;
      AdvanceReclaim(rc);
    }
  }
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::OnReadersDone(ReclaimId id) {
  auto it = reclaims_.find(id);
  if (it == reclaims_.end()) {
    if (id != 0 && id < next_reclaim_) {  // cancelled by its request's completion
      ++counters_.stale_reports;
      return Finish(absl::OkStatus());
    }
    return Finish(absl::NotFoundError(absl::StrFormat("reclaim %d never issued", id)));
  }
  if (!it->second.withdrawn) {
    return Finish(absl::FailedPreconditionError(absl::StrFormat("reclaim %d: readers-done before withdrawal", id)));
  }
  RetireReclaim(id);
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::OnHostCopyWritten(RequestId id, uint32_t history_page) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return Finish(absl::NotFoundError(absl::StrFormat("request %d unknown", id)));
  Request& r = it->second;
  if (r.state == RequestState::kQueued) {
    return Finish(absl::FailedPreconditionError(absl::StrFormat("request %d is not admitted yet", id)));
  }
  if (history_page >= r.history.size()) {
    return Finish(absl::OutOfRangeError(
        absl::StrFormat("request %d has %d history pages, not page %d", id, r.history.size(), history_page)));
  }
  HistoryPage& hp = r.history[history_page];
  if (!hp.has_host && !hp.host_reserved) {
    return Finish(absl::FailedPreconditionError(
        absl::StrFormat("request %d history page %d has no host page assigned", id, history_page)));
  }
  hp.has_host = true;
  hp.host_reserved = false;
  hp.awaiting_write = false;
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::OnTailPageComplete(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return Finish(absl::NotFoundError(absl::StrFormat("request %d unknown", id)));
  Request& r = it->second;
  if (r.state == RequestState::kQueued) {
    return Finish(absl::FailedPreconditionError(absl::StrFormat("request %d is not admitted yet", id)));
  }
  r.history.push_back(HistoryPage{.where = Where::kTail});
  r.tail_retry.push_back(static_cast<uint32_t>(r.history.size() - 1));
  OrderTailBackups(r);
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::Complete(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return Finish(absl::NotFoundError(absl::StrFormat("request %d unknown", id)));
  Request& r = it->second;
  Gpu& g = gpus_.at(r.gpu);
  if (r.state == RequestState::kQueued) {
    g.queue.erase(std::find(g.queue.begin(), g.queue.end(), id));
  } else {
    for (PageIndex p : r.required) (void)g.table.Release(p);
    for (HistoryPage& hp : r.history) {
      if (hp.backup != 0) copies_.at(hp.backup).orphan = true;
      if (hp.where != Where::kPage) continue;
      if (hp.populate != 0) {
        copies_.at(hp.populate).orphan = true;  // the page is freed when the copy reports
      } else {
        (void)g.table.Release(hp.gpu_page);
      }
    }
    if (r.reclaim != 0) {
      g.reclaiming_pages -= static_cast<uint32_t>(reclaims_.at(r.reclaim).pages.size());
      reclaims_.erase(r.reclaim);
    }
    host_.ReleaseRequest(id);  // pinned pages become reusable after their copy reports
  }
  r.state = RequestState::kCompleted;
  requests_.erase(it);
  ++counters_.completions;
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::Populate() {
  for (auto& [gpu_id, g] : gpus_) {
    if (!g.queue.empty()) continue;  // never take what a queued admission needs
    std::vector<PopulationCandidate> candidates;
    for (const auto& [id, r] : requests_) {
      if (r.gpu != gpu_id || r.state != RequestState::kAdmitted) continue;
      uint32_t missing = 0;
      if (!r.optional_history) continue;  // hisparse: history stays on host
      for (const HistoryPage& hp : r.history) missing += hp.where == Where::kNone && hp.has_host && !hp.awaiting_write;
      if (missing > 0) candidates.push_back({id, missing});
    }
    for (const PopulationGrant& grant : g.scheduler.Plan(candidates, g.table.lendable())) {
      Request& r = requests_.at(grant.request);
      auto pages = g.table.Take(r.id, grant.pages, PageState::kOptionalPending);
      if (!pages.ok()) break;  // cannot happen: the plan stays within lendable()
      size_t next = 0;
      for (uint32_t h = 0; h < r.history.size() && next < pages->size(); ++h) {
        HistoryPage& hp = r.history[h];
        if (hp.where != Where::kNone || !hp.has_host || hp.awaiting_write) continue;
        const CopyId id = next_copy_++;
        const PageIndex gp = (*pages)[next++];
        copies_[id] = Copy{.backup = false, .request = r.id, .gpu = gpu_id, .history_page = h,
                           .host_page = hp.host_page, .gpu_page = gp};
        (void)host_.Pin(hp.host_page);
        hp.where = Where::kPage;
        hp.gpu_page = gp;
        hp.populate = id;
        ++r.optional;
        ++counters_.populates_ordered;
        outbox_.push_back(PopulateOrder{id, r.id, gpu_id, h, hp.host_page, gp});
      }
    }
  }
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::RetryBackups() {
  for (auto& [id, r] : requests_) {
    r.backoff = false;
    if (!r.tail_retry.empty()) OrderTailBackups(r);
  }
  return Finish(absl::OkStatus());
}

// ---------------------------------------------------------------- decisions

void ResidencyManager::Pump() {
  for (auto& [id, g] : gpus_) PumpGpu(id, g);
}

absl::Status ResidencyManager::NeverFits(const Request& r, const Gpu& g) const {
  const uint32_t m = g.table.pages(), res = g.table.reserve();
  if (r.required_count > m - res) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request %d needs %d required pages but GPU %d can lend at most %d (M=%d, M_res=%d): it can never fit", r.id,
        r.required_count, r.gpu, m - res, m, res));
  }
  if (r.assign_host_pages && r.context_pages > host_.pages()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request %d needs %d host pages for its context but the host pool has %d pages: it can never fit", r.id,
        r.context_pages, host_.pages()));
  }
  const uint64_t room = (r.optional_history ? uint64_t{m - res - r.required_count} : 0) + host_.pages();
  if (!r.assign_host_pages && r.imported_pages > room) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request %d imports %d history pages but GPU %d (%d spare) and the host pool (%d pages) can never hold them",
        r.id, r.imported_pages, r.gpu, m - res - r.required_count, host_.pages()));
  }
  return absl::OkStatus();
}

bool ResidencyManager::TryGrant(Request& r, Gpu& g) {
  const uint32_t lend = g.table.lendable();
  if (r.required_count > lend) return false;
  // Resident-first: spare pages keep imported history on GPU, but leave what the admissions queued behind require.
  uint32_t behind = 0;
  for (size_t i = 1; i < g.queue.size(); ++i) behind += requests_.at(g.queue[i]).required_count;
  const uint32_t spare = lend - r.required_count;
  uint32_t on_gpu = r.optional_history ? std::min(r.imported_pages, spare > behind ? spare - behind : 0) : 0;
  if (r.assign_host_pages) {
    if (r.context_pages > host_.reusable()) return false;  // waits for host pages (a completion frees them)
    return GrantWithHostPages(r, g, on_gpu);
  }
  if (r.optional_history && r.imported_pages - on_gpu > host_.reusable()) on_gpu = std::min(r.imported_pages, spare);
  const uint32_t to_host = r.imported_pages - on_gpu;
  if (to_host > host_.reusable()) return false;

  auto required = g.table.Take(r.id, r.required_count, PageState::kRequired);
  auto optional = g.table.Take(r.id, on_gpu, PageState::kOptionalReady);
  auto host = host_.Allocate(r.id, kAllSources, to_host);
  r.required = *required;
  r.history.resize(r.imported_pages);
  for (uint32_t h = 0; h < on_gpu; ++h) r.history[h] = HistoryPage{.where = Where::kPage, .gpu_page = (*optional)[h]};
  for (uint32_t h = 0; h < to_host; ++h) {
    r.history[on_gpu + h] = HistoryPage{.has_host = true, .host_page = (*host)[h]};
  }
  r.optional = on_gpu;
  r.state = RequestState::kAdmitted;
  r.time_us = clock_();
  r.seq = next_seq_++;
  ++counters_.grants;
  outbox_.push_back(GrantOrder{r.id, r.gpu, r.slot, *required, *optional, *host, {}});
  return true;
}

bool ResidencyManager::GrantWithHostPages(Request& r, Gpu& g, uint32_t on_gpu) {
  auto required = g.table.Take(r.id, r.required_count, PageState::kRequired);
  auto optional = g.table.Take(r.id, on_gpu, PageState::kOptionalReady);
  auto host = host_.Allocate(r.id, kAllSources, r.context_pages);
  r.required = *required;
  r.history.resize(r.context_pages);
  for (uint32_t h = 0; h < r.context_pages; ++h) {
    HistoryPage& hp = r.history[h];
    hp.host_page = (*host)[h];
    if (h < on_gpu) {  // optional-ready, backup deferred into its assigned host page
      hp.where = Where::kPage;
      hp.gpu_page = (*optional)[h];
      hp.host_reserved = true;
    } else {  // covered by the worker's tail until its backup completed (contract §3)
      hp.has_host = true;
      hp.awaiting_write = true;
    }
  }
  r.optional = on_gpu;
  r.state = RequestState::kAdmitted;
  r.time_us = clock_();
  r.seq = next_seq_++;
  ++counters_.grants;
  GrantOrder grant{r.id, r.gpu, r.slot, *required, *optional, {}, {}};
  grant.context_host_pages = *host;
  outbox_.push_back(std::move(grant));
  return true;
}

std::vector<ReclaimCandidate> ResidencyManager::Candidates(GpuId gpu, bool skip_backoff) const {
  std::vector<ReclaimCandidate> out;
  for (const auto& [id, r] : requests_) {
    if (r.gpu != gpu || r.state != RequestState::kAdmitted || r.optional == 0) continue;
    if (skip_backoff && r.backoff) continue;
    out.push_back({id, r.time_us, r.seq, r.optional});
  }
  return out;
}

void ResidencyManager::PumpGpu(GpuId gpu_id, Gpu& g) {
  while (!g.queue.empty()) {
    Request& head = requests_.at(g.queue.front());
    if (absl::Status never = NeverFits(head, g); !never.ok()) {
      spdlog::info("memd: reject: {}", std::string(never.message()));
      outbox_.push_back(RejectOrder{head.id, gpu_id, never});
      ++counters_.rejects;
      g.queue.pop_front();
      requests_.erase(head.id);
      continue;
    }
    if (TryGrant(head, g)) {
      g.queue.pop_front();
      continue;
    }
    // Deficit Δ: reclaim whole requests in the reclaim order; a victim whose backup cannot start is skipped.
    for (;;) {
      const int64_t delta = int64_t{head.required_count} - g.table.lendable() - g.reclaiming_pages;
      if (delta <= 0) break;
      VictimChoice choice = policy_->Choose(Candidates(gpu_id, true), static_cast<uint32_t>(delta));
      if (!choice.covers) break;  // all optional pages cannot cover Δ: wait until capacity frees
      bool all_started = true;
      for (RequestId v : choice.victims) all_started &= StartReclaim(requests_.at(v), g);
      if (all_started) break;
    }
    break;  // FIFO: those behind the head wait
  }
  for (size_t i = 0; i < g.queue.size(); ++i) {
    Request& r = requests_.at(g.queue[i]);
    if (r.wait_sent) continue;
    r.wait_sent = true;
    ++counters_.waits;
    const int64_t deficit = int64_t{r.required_count} - g.table.lendable();
    outbox_.push_back(WaitOrder{r.id, gpu_id, static_cast<uint32_t>(i), static_cast<uint32_t>(std::max<int64_t>(0, deficit))});
  }
}

bool ResidencyManager::StartReclaim(Request& v, Gpu& g) {
  std::vector<uint32_t> need_backup;
  for (uint32_t h = 0; h < v.history.size(); ++h) {
    const HistoryPage& hp = v.history[h];
    if (hp.where == Where::kPage && !hp.has_host && hp.backup == 0 && hp.populate == 0) need_backup.push_back(h);
  }
  uint32_t unassigned = 0;  // pages needing a backup that have no host page yet
  for (uint32_t h : need_backup) unassigned += !v.history[h].host_reserved;
  auto host = host_.Allocate(v.id, kAllSources, unassigned);
  if (!host.ok()) {  // host pool full: the victim stays untouched
    spdlog::debug("memd: reclaim of request {} not started: {}", v.id, std::string(host.status().message()));
    v.backoff = true;
    ++counters_.reclaims_failed;
    ++counters_.backups_failed;
    return false;
  }
  const ReclaimId id = next_reclaim_++;
  Reclaim rc;
  rc.id = id;
  rc.victim = v.id;
  rc.gpu = v.gpu;
  for (HistoryPage& hp : v.history) {
    if (hp.where != Where::kPage) continue;
    (void)g.table.Transition(hp.gpu_page, hp.populate ? PageState::kOptionalPending : PageState::kOptionalReady,
                             PageState::kReclaiming);
    rc.pages.push_back(hp.gpu_page);
    if (hp.populate != 0) ++rc.populates;
    if (hp.backup != 0) {  // a backup of an earlier, aborted attempt is still in flight: adopt it
      copies_.at(hp.backup).reclaim = id;
      ++rc.backups;
    }
  }
  ReclaimStartOrder start{id, v.id, v.gpu, rc.pages};
  outbox_.push_back(std::move(start));
  size_t next_host = 0;
  for (size_t i = 0; i < need_backup.size(); ++i) {
    HistoryPage& hp = v.history[need_backup[i]];
    const CopyId cid = next_copy_++;
    const PageIndex host_page = hp.host_reserved ? hp.host_page : (*host)[next_host++];
    copies_[cid] = Copy{.backup = true, .request = v.id, .gpu = v.gpu, .history_page = need_backup[i],
                        .host_page = host_page, .gpu_page = hp.gpu_page, .reclaim = id};
    (void)host_.Pin(host_page);
    hp.backup = cid;
    ++rc.backups;
    ++counters_.backups_ordered;
    outbox_.push_back(BackupOrder{cid, v.id, v.gpu, need_backup[i], false, hp.gpu_page, host_page, id});
  }
  v.state = RequestState::kReclaiming;
  v.reclaim = id;
  g.reclaiming_pages += static_cast<uint32_t>(rc.pages.size());
  ++counters_.reclaims_started;
  AdvanceReclaim(reclaims_.emplace(id, std::move(rc)).first->second);
  return true;
}

void ResidencyManager::AdvanceReclaim(Reclaim& rc) {
  if (rc.withdrawn || rc.backups != 0 || rc.populates != 0) return;
  if (rc.pages.empty()) {  // every page's population failed: nothing was published, nothing to withdraw
    RetireReclaim(rc.id);
    return;
  }
  rc.withdrawn = true;
  outbox_.push_back(WithdrawOrder{rc.id, rc.victim, rc.gpu, rc.pages});
}

void ResidencyManager::RetireReclaim(ReclaimId id) {
  Reclaim rc = std::move(reclaims_.at(id));
  reclaims_.erase(id);
  Request& v = requests_.at(rc.victim);
  Gpu& g = gpus_.at(rc.gpu);
  for (HistoryPage& hp : v.history) {
    if (hp.where != Where::kPage) continue;
    (void)g.table.Release(hp.gpu_page);
    hp.where = Where::kNone;
    --v.optional;
  }
  g.reclaiming_pages -= static_cast<uint32_t>(rc.pages.size());
  v.state = RequestState::kAdmitted;
  v.reclaim = 0;
  ++counters_.reclaims_retired;
  counters_.pages_retired += rc.pages.size();
  if (!rc.pages.empty()) outbox_.push_back(RetireOrder{rc.id, rc.victim, rc.gpu, std::move(rc.pages)});
}

void ResidencyManager::AbortReclaim(Request& v, Gpu& g) {
  auto it = reclaims_.find(v.reclaim);
  for (HistoryPage& hp : v.history) {
    if (hp.where != Where::kPage) continue;
    (void)g.table.Transition(hp.gpu_page, PageState::kReclaiming,
                             hp.populate ? PageState::kOptionalPending : PageState::kOptionalReady);
    if (hp.backup != 0) copies_.at(hp.backup).reclaim = 0;  // detach: its result still counts as a host copy
  }
  g.reclaiming_pages -= static_cast<uint32_t>(it->second.pages.size());
  reclaims_.erase(it);
  v.state = RequestState::kAdmitted;
  v.reclaim = 0;
  v.backoff = true;
  ++counters_.reclaims_failed;
  spdlog::debug("memd: reclaim of request {} aborted by a failed backup; it may be retried", v.id);
}

void ResidencyManager::OrderTailBackups(Request& r) {
  size_t done = 0;
  for (; done < r.tail_retry.size(); ++done) {
    auto host = host_.Allocate(r.id, kAllSources, 1);
    if (!host.ok()) break;  // host pool full: stays in the tail until RetryBackups
    const uint32_t h = r.tail_retry[done];
    const CopyId cid = next_copy_++;
    copies_[cid] = Copy{.backup = true, .request = r.id, .gpu = r.gpu, .history_page = h, .host_page = (*host)[0],
                        .from_tail = true};
    (void)host_.Pin((*host)[0]);
    r.history[h].backup = cid;
    ++counters_.backups_ordered;
    outbox_.push_back(BackupOrder{cid, r.id, r.gpu, h, true, 0, (*host)[0]});
  }
  r.tail_retry.erase(r.tail_retry.begin(), r.tail_retry.begin() + static_cast<std::ptrdiff_t>(done));
}

// ---------------------------------------------------------------- checks and dump

absl::Status ResidencyManager::CheckInvariants() const {
  if (absl::Status s = host_.CheckInvariants(); !s.ok()) return s;
  std::map<GpuId, std::vector<RequestId>> owner;  // expected owner of every GPU page
  std::map<GpuId, uint32_t> reclaiming_expected;
  size_t queued = 0;
  for (const auto& [gid, g] : gpus_) {
    if (absl::Status s = g.table.CheckInvariants(); !s.ok()) return s;
    owner[gid].assign(g.table.pages(), kNoOwner);
    for (RequestId q : g.queue) {
      auto it = requests_.find(q);
      if (it == requests_.end() || it->second.state != RequestState::kQueued || it->second.gpu != gid) {
        return absl::InternalError(absl::StrFormat("GPU %d queue holds request %d that is not queued there", gid, q));
      }
    }
    queued += g.queue.size();
  }
  auto claim = [&](GpuId gid, PageIndex p, RequestId r, PageState want) -> absl::Status {
    const GpuPageTable& t = gpus_.at(gid).table;
    if (p >= t.pages() || owner[gid][p] != kNoOwner) {
      return absl::InternalError(absl::StrFormat("GPU %d page %d owned twice (request %d)", gid, p, r));
    }
    owner[gid][p] = r;
    if (t.owner(p) != r || t.state(p) != want) {
      return absl::InternalError(absl::StrFormat("GPU %d page %d: table says %s of %d, expected %s of %d", gid, p,
                                                 PageStateName(t.state(p)), t.owner(p), PageStateName(want), r));
    }
    return absl::OkStatus();
  };
  std::set<PageIndex> host_pages;
  size_t queued_requests = 0;
  for (const auto& [id, r] : requests_) {
    if (r.state == RequestState::kQueued) {
      ++queued_requests;
      if (!r.required.empty() || !r.history.empty()) return absl::InternalError("queued request holds pages");
      continue;
    }
    const bool reclaiming = r.state == RequestState::kReclaiming;
    if (reclaiming != (r.reclaim != 0) || (reclaiming && !reclaims_.count(r.reclaim))) {
      return absl::InternalError(absl::StrFormat("request %d: reclaim state inconsistent", id));
    }
    for (PageIndex p : r.required) {
      if (absl::Status s = claim(r.gpu, p, id, PageState::kRequired); !s.ok()) return s;
    }
    uint32_t optional = 0, host_expected = 0;
    for (uint32_t h = 0; h < r.history.size(); ++h) {
      const HistoryPage& hp = r.history[h];
      if (hp.where == Where::kPage) {
        ++optional;
        const PageState want = reclaiming        ? PageState::kReclaiming
                               : hp.populate != 0 ? PageState::kOptionalPending
                                                  : PageState::kOptionalReady;
        if (absl::Status s = claim(r.gpu, hp.gpu_page, id, want); !s.ok()) return s;
      }
      const bool ready_on_gpu = hp.where == Where::kTail || (hp.where == Where::kPage && hp.populate == 0);
      if (!ready_on_gpu && !hp.has_host) {
        return absl::InternalError(absl::StrFormat(
            "safety: request %d history page %d is neither ready on GPU nor has a host copy", id, h));
      }
      if (hp.populate != 0 && !hp.has_host) {
        return absl::InternalError(absl::StrFormat("request %d page %d populated without host copy", id, h));
      }
      if (hp.has_host && hp.host_reserved) {
        return absl::InternalError(absl::StrFormat("request %d page %d: host copy and reservation at once", id, h));
      }
      if (hp.has_host || hp.host_reserved) {
        ++host_expected;
        if (!host_.is_allocated(hp.host_page) || host_.owner(hp.host_page) != id ||
            !host_pages.insert(hp.host_page).second) {
          return absl::InternalError(absl::StrFormat("request %d page %d: host page %d not its own", id, h, hp.host_page));
        }
      }
      if (hp.backup != 0) {
        auto c = copies_.find(hp.backup);
        if (c == copies_.end() || c->second.request != id || c->second.history_page != h || c->second.orphan) {
          return absl::InternalError(absl::StrFormat("request %d page %d: backup copy record missing", id, h));
        }
        // A backup into the page's own (assigned or confirmed) host page pins no further page.
        const bool own_page = (hp.has_host || hp.host_reserved) && c->second.host_page == hp.host_page;
        if (!own_page) ++host_expected;
      }
    }
    if (optional != r.optional) {
      return absl::InternalError(absl::StrFormat("request %d: a_r %d but %d optional pages", id, r.optional, optional));
    }
    if (host_.pages_of(id) != host_expected) {
      return absl::InternalError(
          absl::StrFormat("request %d holds %d host pages, expected %d", id, host_.pages_of(id), host_expected));
    }
  }
  if (queued != queued_requests) return absl::InternalError("queued requests and queues disagree");
  for (const auto& [cid, c] : copies_) {
    if (!c.backup && c.orphan) {  // page kept until the population copy reports
      const PageState st = gpus_.at(c.gpu).table.state(c.gpu_page);
      if (owner[c.gpu][c.gpu_page] != kNoOwner ||
          (st != PageState::kOptionalPending && st != PageState::kReclaiming)) {
        return absl::InternalError(absl::StrFormat("orphan population page %d of GPU %d inconsistent", c.gpu_page, c.gpu));
      }
      owner[c.gpu][c.gpu_page] = c.request;
    }
  }
  for (const auto& [gid, g] : gpus_) {
    for (PageIndex p = 0; p < g.table.pages(); ++p) {
      if (owner[gid][p] != g.table.owner(p)) {
        return absl::InternalError(absl::StrFormat("GPU %d page %d: owned by %d in the table, by %d in the requests",
                                                   gid, p, g.table.owner(p), owner[gid][p]));
      }
    }
  }
  for (const auto& [rid, rc] : reclaims_) {
    reclaiming_expected[rc.gpu] += static_cast<uint32_t>(rc.pages.size());
    auto v = requests_.find(rc.victim);
    if (v == requests_.end() || v->second.reclaim != rid) return absl::InternalError("reclaim without its victim");
  }
  for (const auto& [gid, g] : gpus_) {
    if (g.reclaiming_pages != reclaiming_expected[gid]) {
      return absl::InternalError(absl::StrFormat("GPU %d: reclaiming page count off", gid));
    }
  }
  return absl::OkStatus();
}

StateDump ResidencyManager::Dump() const {
  StateDump d;
  d.policy = std::string(policy_->name());
  d.now_us = clock_();
  std::map<RequestId, int32_t> rank;
  for (const auto& [gid, g] : gpus_) {
    GpuDump gd;
    const GpuPageTable& t = g.table;
    gd.gpu = gid;
    gd.pages = t.pages();
    gd.required_pages = t.required();
    gd.optional_pages = t.optional();
    gd.reserve_pages = t.reserve();
    gd.free_pages = t.free();
    gd.pending_pages = t.optional_pending();
    gd.ready_pages = t.optional_ready();
    gd.reclaiming_pages = t.reclaiming();
    gd.queue.assign(g.queue.begin(), g.queue.end());
    for (const auto& [rid, rc] : reclaims_) gd.reclaims_in_flight += rc.gpu == gid;
    for (PageIndex p = 0; p < t.pages(); ++p) {
      gd.page_states.push_back(t.state(p));
      gd.page_owners.push_back(t.owner(p));
    }
    d.gpus.push_back(std::move(gd));
    std::vector<ReclaimCandidate> c = Candidates(gid, false);
    policy_->Order(c);
    for (size_t i = 0; i < c.size(); ++i) rank[c[i].request] = static_cast<int32_t>(i);
  }
  for (const auto& [id, r] : requests_) {
    RequestDump rd;
    rd.request = id;
    rd.gpu = r.gpu;
    rd.slot = r.slot;
    rd.state = r.state;
    rd.required_pages = r.state == RequestState::kQueued ? r.required_count : static_cast<uint32_t>(r.required.size());
    rd.optional_pages = r.optional;
    rd.history_pages = static_cast<uint32_t>(r.state == RequestState::kQueued ? r.imported_pages : r.history.size());
    for (const HistoryPage& hp : r.history) {
      rd.host_pages += hp.has_host;
      rd.tail_pages += hp.where == Where::kTail;
    }
    rd.admitted_at_us = r.time_us;
    auto it = rank.find(id);
    rd.reclaim_rank = it == rank.end() ? -1 : it->second;
    d.requests.push_back(rd);
  }
  d.host = HostDump{host_.pages(), host_.page_bytes(), host_.reusable(), host_.allocated(), host_.pinned(),
                    host_.freed_pinned()};
  return d;
}

}  // namespace dhs::memd
