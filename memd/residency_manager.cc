#include "memd/residency_manager.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/worker_shape.h"
#include "memd/core_dump.h"
#include "spdlog/spdlog.h"

namespace dhs::memd {

std::string_view OrderName(const Order& order) {
  static constexpr std::string_view kNames[] = {"grant", "wait", "reject", "reclaim", "populate", "retire",
                                                "complete-ack"};
  return kNames[order.index()];
}

absl::StatusOr<std::unique_ptr<ResidencyManager>> ResidencyManager::Create(const ResidencyConfig& config,
                                                                           Clock clock, HostJournal* journal) {
  auto policy = MakeReclaimPolicy(config.reclaim_policy);
  if (!policy.ok()) return policy.status();
  auto host = HostPageAllocator::Create(config.host_pages, config.host_page_bytes);
  if (!host.ok()) return host.status();
  if (journal != nullptr && journal->pages() != config.host_pages) {
    return absl::InvalidArgumentError(absl::StrFormat("journal of %d host pages for a host pool of %d",
                                                      journal->pages(), config.host_pages));
  }
  host->set_journal(journal);
  if (!clock) return absl::InvalidArgumentError("ResidencyManager needs a clock");
  std::optional<PrefixPages> tier;  // the host tier (issue 24): none while prefix sharing is off
  if (config.prefix_sharing) {
    auto made = PrefixPages::Create(config.prefix);
    if (!made.ok()) return made.status();
    tier.emplace(std::move(*made));
  }
  return std::unique_ptr<ResidencyManager>(
      new ResidencyManager(config, std::move(clock), std::move(*host), std::move(*policy), std::move(tier)));
}

ResidencyManager::ResidencyManager(const ResidencyConfig& config, Clock clock, HostPageAllocator host,
                                   std::unique_ptr<ReclaimPolicy> policy, std::optional<PrefixPages> tier)
    : config_(config),
      policy_(std::move(policy)),
      state_(std::move(clock), std::move(host)),
      prefix_(state_, std::move(tier)),
      recovery_(state_, prefix_) {}

const GpuPageTable* ResidencyManager::gpu_table(GpuId gpu) const {
  auto it = state_.gpus.find(gpu);
  return it == state_.gpus.end() ? nullptr : &it->second.table;
}

std::vector<Order> ResidencyManager::DrainOrders() {
  std::vector<Order> out;
  out.swap(state_.outbox);
  return out;
}

absl::Status ResidencyManager::Finish(absl::Status status) {
  ++state_.counters.events;  // Populate() and RetryBackups() are ticks: FinishTick()
  if (!status.ok()) {
    ++state_.counters.event_errors;
    return status;
  }
  Pump();
  return status;
}

// A timer call (Populate, RetryBackups): counted as a tick, not an event (20 ms ticks would swamp the event count).
absl::Status ResidencyManager::FinishTick() {
  ++state_.counters.ticks;
  Pump();
  return absl::OkStatus();
}

// ---------------------------------------------------------------- events

absl::Status ResidencyManager::AddGpu(GpuId gpu, uint32_t pages, uint32_t request_slots,
                                      const GpuDeclaration& declared) {
  if (state_.gpus.count(gpu)) return absl::AlreadyExistsError(absl::StrFormat("GPU %d already registered", gpu));
  if (pages > kMaxGpuPages) {
    return absl::InvalidArgumentError(absl::StrFormat("GPU %d: M = %d pages exceeds memd's bound of %d pages per GPU",
                                                      gpu, pages, kMaxGpuPages));
  }
  if (request_slots > kMaxRequestSlots) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GPU %d: %d request slots exceed memd's bound of %d per GPU", gpu, request_slots, kMaxRequestSlots));
  }
  if (declared.page_bytes > kMaxGpuPageBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("GPU %d: page_bytes %d exceeds memd's bound of %d bytes", gpu,
                                                      declared.page_bytes, kMaxGpuPageBytes));
  }
  auto table = GpuPageTable::Create(gpu, pages, config_.reserve_pages);
  if (!table.ok()) return table.status();
  state_.gpus.emplace(gpu, Gpu{std::move(*table), {}, PopulationScheduler(config_.populate_pages_per_attempt), 0,
                               request_slots, {}, ReclaimIndex(policy_.get()), {}, 0, {}, declared, {}});
  state_.journal_gpus.erase(gpu);
  return absl::OkStatus();
}

absl::Status ResidencyManager::RegisterGpu(GpuId gpu, uint32_t pages, uint32_t request_slots,
                                           const GpuDeclaration& declared) {
  if (auto e = state_.epochs.find(gpu); e != state_.epochs.end() && e->second >= kNodeRequestEpochs) {
    // Its next epoch's node ids would repeat epoch 1's (MakeNodeRequestId keeps the epoch mod 2^24).
    return Finish(absl::ResourceExhaustedError(absl::StrFormat(
        "GPU %d: epoch %d is the last one node request ids tell apart (2^24); a new registration would reuse epoch "
        "1's ids", gpu, e->second)));
  }
  if (absl::Status s = AddGpu(gpu, pages, request_slots, declared); !s.ok()) return Finish(s);
  if (++state_.epochs[gpu] > 1) ++state_.counters.reregistrations;
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::AdoptGpu(GpuId gpu, uint32_t pages, uint32_t request_slots, uint32_t epoch,
                                        std::span<const ReportedRequest> reports,
                                        std::vector<absl::Status>* outcomes, const GpuDeclaration& declared) {
  if (state_.gpus.contains(gpu)) {
    return Finish(absl::AlreadyExistsError(absl::StrFormat("GPU %d already registered", gpu)));
  }
  if (absl::Status s = recovery_.CheckAdoptGpu(gpu, epoch); !s.ok()) return Finish(s);
  if (absl::Status s = AddGpu(gpu, pages, request_slots, declared); !s.ok()) return Finish(s);
  recovery_.AdoptReports(gpu, epoch, reports, outcomes);
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::FenceGpu(GpuId gpu, std::string_view why) { return Finish(recovery_.Fence(gpu, why)); }

absl::Status ResidencyManager::AdoptHostPages(std::span<const AdoptedRequest> requests,
                                              std::span<const AdoptedSharedPage> shared) {
  return Finish(recovery_.AdoptHostPages(requests, shared));
}

absl::Status ResidencyManager::ReleaseHeldPages() {
  recovery_.ReleaseHeldPages();
  return Finish(absl::OkStatus());
}

std::vector<PrefixAddress> ResidencyManager::ClusterLookups(const AdmitRequest& a) const {
  if (!prefix_.on() || (a.prefix.empty() && a.session_digests.empty()) || a.page_rows == 0) return {};
  const uint64_t pages = a.context_rows / a.page_rows + (a.context_rows % a.page_rows != 0 ? 1 : 0);
  if (pages > UINT32_MAX) return {};
  auto addresses = prefix_.Addresses(a, static_cast<uint32_t>(pages));
  if (!addresses.ok()) return {};
  return prefix_.ClusterLookups(*addresses);
}

absl::Status ResidencyManager::ImportClusterPages(std::span<const ClusterImport> pages) {
  return Finish(prefix_.ImportCluster(pages));
}

absl::Status ResidencyManager::Admit(const AdmitRequest& in) {
  AdmitRequest a = in;
  if (a.request == 0 || a.request == kNoOwner) {  // 0: RetireOrder.regranted_to's "none"; kNoOwner: a free page
    return Finish(absl::InvalidArgumentError(
        absl::StrFormat("request id %d is reserved (0 and 2^64-1 are never request ids)", a.request)));
  }
  if (absl::Status s = prefix_.CheckRequestId(a.request); !s.ok()) return Finish(s);  // kSharedOwner (issue 24)
  if (a.page_rows > 0) {  // rows -> pages without overflow: ceil(rows / p) for every rows up to 2^64-1
    const uint64_t pages = a.context_rows / a.page_rows + (a.context_rows % a.page_rows != 0 ? 1 : 0);
    if (pages > UINT32_MAX) {
      return Finish(absl::InvalidArgumentError(absl::StrFormat(
          "request %d: history_rows %d is %d pages of %d rows, beyond any host pool (at most 2^32-1 pages)", a.request,
          a.context_rows, pages, a.page_rows)));
    }
    a.context_pages = static_cast<uint32_t>(pages);
  }
  if (state_.requests.count(a.request)) {
    return Finish(absl::AlreadyExistsError(absl::StrFormat("request %d already known", a.request)));
  }
  auto g = state_.gpus.find(a.gpu);
  if (g == state_.gpus.end()) {
    return Finish(absl::NotFoundError(absl::StrFormat("request %d: GPU %d %s", a.request, a.gpu,
                                                      recovery_.fenced(a.gpu) ? "is fenced" : "not registered")));
  }
  if (a.required_pages == 0) {
    return Finish(absl::InvalidArgumentError(absl::StrFormat("request %d: required_pages must be > 0", a.request)));
  }
  if (a.context_pages < a.history_pages) {
    return Finish(absl::InvalidArgumentError(absl::StrFormat(
        "request %d: %d complete history pages exceed the %d pages of its context", a.request, a.history_pages,
        a.context_pages)));
  }
  if (absl::Status s = core::CheckShare(a.request, a.required_pages, a.speculation, g->second.declared); !s.ok()) {
    return Finish(s);
  }
  if (absl::Status s = recovery_.CheckResume(a); !s.ok()) return Finish(s);
  auto prefix = prefix_.Addresses(a, a.context_pages);  // issue 24: empty while prefix sharing is off
  if (!prefix.ok()) return Finish(prefix.status());
  Request r;
  r.id = a.request;
  r.gpu = a.gpu;
  r.required_count = a.required_pages;
  r.imported_pages = a.history_pages;
  r.context_pages = a.context_pages;
  r.optional_history = a.optional_history;
  r.speculation = a.speculation;
  r.prefix = std::move(*prefix);
  r.time_us = state_.clock();
  ++state_.counters.admissions;
  if (a.resume_of != 0) {
    r.resume_of = a.resume_of;
    recovery_.TakeOver(r, a.resume_of);
  }
  if (absl::Status never = NeverFits(r, g->second); !never.ok()) {  // rejected at once, blocks nobody
    spdlog::info("memd: reject: {}", std::string(never.message()));
    prefix_.Release(r);                // a resume's taken-over shared pages (issue 24)
    state_.host.ReleaseRequest(r.id);  // a resume's taken-over pages
    state_.outbox.push_back(RejectOrder{r.id, r.gpu, never, r.resume_of});  // a resume's predecessor ended with it
    ++state_.counters.rejects;
    return Finish(absl::OkStatus());
  }
  state_.requests.emplace(r.id, std::move(r));
  g->second.queue.push_back(a.request);
  return Finish(absl::OkStatus());
}

// The pages a report names (empty = every unreported one), checked against the order: all-or-nothing.
absl::Status ResidencyManager::CheckReportedPages(const OrderEntry& entry, OrderId order,
                                                  std::span<const PageIndex> pages,
                                                  std::vector<PageIndex>& out) const {
  if (pages.empty()) {
    for (const auto& [page, copy] : entry.copies) out.push_back(page);
    return absl::OkStatus();
  }
  absl::flat_hash_set<PageIndex> seen;
  for (PageIndex p : pages) {
    if (!entry.copies.contains(p)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("page %d is not an unreported page of %s order %d", p, entry.reclaim ? "reclaim" : "populate",
                          order));
    }
    if (!seen.insert(p).second) {
      return absl::InvalidArgumentError(absl::StrFormat("page %d named twice for order %d", p, order));
    }
    out.push_back(p);
  }
  return absl::OkStatus();
}

absl::Status ResidencyManager::OnBackupComplete(OrderId order, std::span<const PageIndex> pages, bool ok,
                                                std::span<const PageIndex> deferred,
                                                std::span<const uint64_t> checksums) {
  auto it = state_.orders.find(order);
  if (it == state_.orders.end() || !it->second.reclaim) {
    return Finish(absl::NotFoundError(absl::StrFormat("reclaim order %d unknown (or all its backups reported)", order)));
  }
  if (!checksums.empty() && checksums.size() != pages.size()) {
    return Finish(absl::InvalidArgumentError(absl::StrFormat(
        "reclaim order %d: %d checksums for %d pages", order, checksums.size(), pages.size())));
  }
  std::vector<PageIndex> reported;
  if (absl::Status s = CheckReportedPages(it->second, order, pages, reported); !s.ok()) return Finish(s);
  absl::flat_hash_map<PageIndex, uint64_t> checksum_of;  // issue 22: GPU page -> its host copy's checksum
  for (size_t i = 0; i < checksums.size(); ++i) checksum_of[pages[i]] = checksums[i];
  const absl::flat_hash_set<PageIndex> deferred_set(deferred.begin(), deferred.end());
  for (PageIndex p : deferred_set) {
    if (std::find(reported.begin(), reported.end(), p) == reported.end()) {
      return Finish(absl::InvalidArgumentError(absl::StrFormat(
          "deferred page %d is not among the pages reported for reclaim order %d", p, order)));
    }
  }
  struct Done { CopyId copy; bool written; uint64_t checksum; };  // the entry may be erased by what they cause
  std::vector<Done> done;
  for (PageIndex p : reported) {
    const auto sum = checksum_of.find(p);
    done.push_back(Done{it->second.copies.at(p), !ok || !deferred_set.contains(p),
                        sum == checksum_of.end() ? 0 : sum->second});
    it->second.copies.erase(p);
  }
  for (const Done& d : done) BackupDone(d.copy, ok, d.written, d.checksum);
  EraseOrderIfDone(order);
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::OnReadyPublish(OrderId order, std::span<const PageIndex> pages, bool ok) {
  auto it = state_.orders.find(order);
  if (it == state_.orders.end() || it->second.reclaim) {
    return Finish(absl::NotFoundError(absl::StrFormat("populate order %d unknown", order)));
  }
  std::vector<PageIndex> reported;
  if (absl::Status s = CheckReportedPages(it->second, order, pages, reported); !s.ok()) return Finish(s);
  std::vector<CopyId> done;  // the entry may be erased by what they cause
  for (PageIndex p : reported) {
    done.push_back(it->second.copies.at(p));
    it->second.copies.erase(p);
  }
  for (CopyId copy : done) PopulateDone(copy, ok);
  EraseOrderIfDone(order);
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::OnReadersDone(OrderId order) {
  auto it = state_.reclaims.find(order);
  if (it == state_.reclaims.end()) {
    auto entry = state_.orders.find(order);
    if (entry != state_.orders.end() && entry->second.reclaim && entry->second.aborted) {
      return Finish(absl::FailedPreconditionError(
          absl::StrFormat("reclaim order %d was aborted by a failed backup", order)));
    }
    if (order != 0 && order < state_.next_order && (entry == state_.orders.end() || entry->second.reclaim)) {
      ++state_.counters.stale_reports;  // retired already, or cancelled by its request's completion
      return Finish(absl::OkStatus());
    }
    return Finish(absl::NotFoundError(absl::StrFormat("reclaim order %d never issued", order)));
  }
  it->second.readers_done = true;
  AdvanceReclaim(it->second);
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::OnHostCopyWritten(RequestId id, std::span<const uint32_t> pages,
                                                 std::span<const PageIndex> host_pages, bool ok,
                                                 std::span<const uint64_t> checksums) {
  auto it = state_.requests.find(id);
  if (it == state_.requests.end()) return Finish(absl::NotFoundError(absl::StrFormat("request %d unknown", id)));
  Request& r = it->second;
  if (absl::Status s = CheckHostCopyReport(r, pages, host_pages, checksums); !s.ok()) return Finish(s);
  if (!ok) {  // nothing changes: the rows stay in the worker's tail, the pages are not populated
    state_.counters.host_write_failures += pages.size();
    return Finish(absl::OkStatus());
  }
  Gpu& g = state_.gpus.at(r.gpu);
  for (size_t i = 0; i < pages.size(); ++i) ConfirmHostCopy(r, g, pages[i], checksums.empty() ? 0 : checksums[i]);
  Reindex(r, g);
  return Finish(absl::OkStatus());
}

absl::Status ResidencyManager::CheckHostCopyReport(const Request& r, std::span<const uint32_t> pages,
                                                   std::span<const PageIndex> host_pages,
                                                   std::span<const uint64_t> checksums) const {
  const RequestId id = r.id;
  if (r.state == RequestState::kQueued) {
    return absl::FailedPreconditionError(absl::StrFormat("request %d is not admitted yet", id));
  }
  if (r.state == RequestState::kInterrupted) {
    return absl::FailedPreconditionError(
        absl::StrFormat("request %d was interrupted by a fence of GPU %d: its host copies are fixed", id, r.gpu));
  }
  if (!host_pages.empty() && host_pages.size() != pages.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request %d: %d host pages for %d history pages", id, host_pages.size(), pages.size()));
  }
  if (!checksums.empty() && checksums.size() != pages.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request %d: %d checksums for %d history pages", id, checksums.size(), pages.size()));
  }
  absl::flat_hash_set<uint32_t> seen;
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] >= r.history.size()) {
      return absl::OutOfRangeError(
          absl::StrFormat("request %d has %d history pages, not page %d", id, r.history.size(), pages[i]));
    }
    if (!seen.insert(pages[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("request %d: history page %d named twice in one HostCopyWritten", id, pages[i]));
    }
    if (!host_pages.empty() && host_pages[i] != r.history[pages[i]].host_page) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request %d history page %d: host page %d written, but host page %d was assigned", id, pages[i],
          host_pages[i], r.history[pages[i]].host_page));
    }
  }
  return absl::OkStatus();
}

void ResidencyManager::ConfirmHostCopy(Request& r, Gpu& g, uint32_t h, uint64_t checksum) {
  HistoryPage& hp = r.history[h];
  ++state_.counters.host_writes;
  switch (hp.state) {
    case HistoryState::kHostPending:
      DHS_CHECK_OK(TransitionHistory(hp, hp.state, HistoryState::kHost));
      hp.checksum = checksum;
      DHS_CHECK_OK(state_.host.Confirm(hp.host_page, checksum));
      prefix_.Publish(r, h, checksum);
      ++r.host_only;
      break;
    case HistoryState::kGpu:
      if (r.state == RequestState::kAdmitted && hp.copy == 0) {
        // A page kept at the grant is written to host outside an order only when the worker did not keep it (its
        // keep copy failed, contract §3): the GPU page holds nothing and never will. It is freed now (lendable
        // again: a waiting admission may take it without a reclaim); the page is host-resident, a population
        // candidate. In a reclaim (or with a backup in flight) the reclaim retires the GPU page instead.
        DHS_CHECK_OK(g.table.Release(hp.gpu_page));
        DHS_CHECK_OK(TransitionHistory(hp, HistoryState::kGpu, HistoryState::kHost));
        hp.checksum = checksum;
        DHS_CHECK_OK(state_.host.Confirm(hp.host_page, checksum));
        prefix_.Publish(r, h, checksum);
        --r.optional;
        ++r.host_only;
        ++state_.counters.keeps_lost;
        break;
      }
      [[fallthrough]];
    case HistoryState::kGpuDeferred:
      DHS_CHECK_OK(TransitionHistory(hp, hp.state, HistoryState::kGpuAndHost));
      hp.checksum = checksum;
      DHS_CHECK_OK(state_.host.Confirm(hp.host_page, checksum));
      prefix_.Publish(r, h, checksum);
      break;
    default:  // already a complete host copy (a repeated report): a checksum only where none was known
      // (a shared page is immutable, its checksum with it: issue 24)
      if (hp.checksum == 0 && checksum != 0 && hp.state != HistoryState::kLost &&
          !prefix_.Holds(r.id, hp.host_page)) {
        hp.checksum = checksum;
        DHS_CHECK_OK(state_.host.Confirm(hp.host_page, checksum));
      }
      break;
  }
}

absl::Status ResidencyManager::Complete(RequestId id) {
  auto it = state_.requests.find(id);
  if (it == state_.requests.end()) return Finish(absl::NotFoundError(absl::StrFormat("request %d unknown", id)));
  Request& r = it->second;
  uint32_t released = 0;
  if (r.state == RequestState::kInterrupted) {
    prefix_.Release(r);              // its shared references (issue 24)
    state_.host.ReleaseRequest(id);  // its GPU pages went with the fence: nothing pinned, nothing on GPU
  } else if (Gpu& g = state_.gpus.at(r.gpu); r.state == RequestState::kQueued) {
    g.queue.erase(std::find(g.queue.begin(), g.queue.end(), id));
    prefix_.Release(r);              // a queued resume's taken-over shared references
    state_.host.ReleaseRequest(id);  // a queued resume's taken-over host pages
  } else {
    released = ReleaseAdmitted(r, g);
  }
  state_.outbox.push_back(CompleteAckOrder{id, r.gpu, released});
  state_.requests.erase(it);
  ++state_.counters.completions;
  return Finish(absl::OkStatus());
}

// Frees everything an admitted request holds; returns the GPU pages it held (required + optional).
uint32_t ResidencyManager::ReleaseAdmitted(Request& r, Gpu& g) {
  uint32_t released = static_cast<uint32_t>(r.required.size());
  for (PageIndex p : r.required) DHS_CHECK_OK(g.table.Release(p));
  for (HistoryPage& hp : r.history) {
    if (hp.copy != 0) state_.copies.at(hp.copy).orphan = true;  // its report only unpins (and frees a population page)
    if (!HoldsGpuPage(hp.state)) continue;
    ++released;
    if (hp.state != HistoryState::kPopulating) DHS_CHECK_OK(g.table.Release(hp.gpu_page));
  }
  if (r.reclaim != 0) {
    g.reclaiming_pages -= static_cast<uint32_t>(state_.reclaims.at(r.reclaim).pages.size());
    state_.reclaims.erase(r.reclaim);
    EraseOrderIfDone(r.reclaim);
  }
  ReleaseSlot(g, r.slot);
  CountShare(g, r.speculation, -1);
  prefix_.Release(r);                // shared references (cached at the last) and unconfirmed writes (issue 24)
  state_.host.ReleaseRequest(r.id);  // pinned pages become reusable after their copy reports
  DHS_CHECK_OK(TransitionRequest(r.state, r.state, RequestState::kCompleted));  // admitted or reclaiming
  if (r.backoff) state_.backoff.erase(r.id);
  Reindex(r, g);
  return released;
}

absl::Status ResidencyManager::Populate() {
  for (auto& [gpu_id, g] : state_.gpus) {
    if (!g.queue.empty()) continue;  // never take what a queued admission needs
    // Nothing to hand out: the plan would be empty (and leave the scheduler as it is); skip the O(context pages) scan.
    if (g.table.lendable() == 0) continue;
    std::vector<PopulationCandidate> candidates;
    for (RequestId id : g.populatable) candidates.push_back({id, state_.requests.at(id).host_only});
    for (const PopulationGrant& grant : g.scheduler.Plan(candidates, g.table.lendable())) {
      PopulateRequest(gpu_id, g, state_.requests.at(grant.request), grant.pages);
    }
  }
  return FinishTick();
}

// One PopulateOrder: `count` lendable pages (the scheduler's plan stays within lendable()) for r's kHost pages.
void ResidencyManager::PopulateRequest(GpuId gpu_id, Gpu& g, Request& r, uint32_t count) {
  auto pages = g.table.Take(r.id, count, PageState::kOptionalPending);
  DHS_CHECK_OK(pages.status());
  PopulateOrder order;
  order.order = state_.next_order++;
  order.request = r.id;
  order.gpu = gpu_id;
  OrderEntry& entry = state_.orders[order.order];
  entry.reclaim = false;
  entry.request = r.id;
  entry.gpu = gpu_id;
  size_t next = 0;
  for (uint32_t h = 0; h < r.history.size() && next < pages->size(); ++h) {
    HistoryPage& hp = r.history[h];
    if (hp.state != HistoryState::kHost) continue;
    const CopyId id = state_.next_copy++;
    const PageIndex gp = (*pages)[next++];
    state_.copies[id] = Copy{.backup = false, .request = r.id, .gpu = gpu_id, .history_page = h,
                       .host_page = hp.host_page, .gpu_page = gp, .order = order.order};
    DHS_CHECK_OK(state_.host.Pin(hp.host_page));
    DHS_CHECK_OK(TransitionHistory(hp, HistoryState::kHost, HistoryState::kPopulating));
    --r.host_only;
    hp.gpu_page = gp;
    hp.copy = id;
    ++r.optional;
    ++state_.counters.populates_ordered;
    entry.copies[gp] = id;
    order.gpu_pages.push_back(gp);
    order.history_pages.push_back(h);
    order.host_pages.push_back(hp.host_page);
  }
  DHS_CHECK_OK(next == pages->size() ? absl::OkStatus() : absl::InternalError("population plan beyond candidates"));
  Reindex(r, g);
  state_.outbox.push_back(std::move(order));
}

absl::Status ResidencyManager::RetryBackups() {
  for (auto it = state_.backoff.begin(); it != state_.backoff.end();) {
    Request& r = state_.requests.at(*it);
    if (--r.retry_ticks > 0) {
      ++it;
      continue;
    }
    r.backoff = false;
    Reindex(r, state_.gpus.at(r.gpu));
    it = state_.backoff.erase(it);
  }
  return FinishTick();
}

// ---------------------------------------------------------------- copies reported

void ResidencyManager::BackupDone(CopyId copy, bool ok, bool written, uint64_t checksum) {
  auto node = state_.copies.extract(copy);
  const Copy& c = node.mapped();
  DHS_CHECK_OK(state_.host.Unpin(c.host_page));
  if (!ok) ++state_.counters.backups_failed;
  if (c.orphan) return;  // request completed; its host page was freed (reusable now)
  Request& r = state_.requests.at(c.request);
  HistoryPage& hp = r.history[c.history_page];
  hp.copy = 0;
  if (!ok) {
    if (c.reclaim != 0) AbortReclaim(r, state_.gpus.at(r.gpu));
    return;
  }
  if (!written) ++state_.counters.deferred_backups;
  // A page confirmed by HostCopyWritten while its backup was in flight (kGpuAndHost) stays confirmed.
  if (hp.state == HistoryState::kGpu) {
    DHS_CHECK_OK(TransitionHistory(hp, HistoryState::kGpu, written ? HistoryState::kGpuAndHost
                                                                    : HistoryState::kGpuDeferred));
    if (written) {
      hp.checksum = checksum;
      DHS_CHECK_OK(state_.host.Confirm(hp.host_page, checksum));
      prefix_.Publish(r, c.history_page, checksum);
    }
  }
  if (c.reclaim != 0) {
    Reclaim& rc = state_.reclaims.at(c.reclaim);
    --rc.backups;
    AdvanceReclaim(rc);
  }
}

void ResidencyManager::PopulateDone(CopyId copy, bool ok) {
  auto node = state_.copies.extract(copy);
  const Copy& c = node.mapped();
  DHS_CHECK_OK(state_.host.Unpin(c.host_page));
  if (!ok) ++state_.counters.populates_failed;
  Gpu& g = state_.gpus.at(c.gpu);
  if (c.orphan) {  // request completed while the copy was in flight: the page is free only now
    DHS_CHECK_OK(g.table.Release(c.gpu_page));
    return;
  }
  Request& r = state_.requests.at(c.request);
  HistoryPage& hp = r.history[c.history_page];
  hp.copy = 0;
  const bool reclaiming = g.table.state(c.gpu_page) == PageState::kReclaiming;
  if (ok) {
    DHS_CHECK_OK(TransitionHistory(hp, HistoryState::kPopulating, HistoryState::kGpuAndHost));
    if (!reclaiming) DHS_CHECK_OK(g.table.Transition(c.gpu_page, PageState::kOptionalPending, PageState::kOptionalReady));
  } else {  // nothing was published: the page holds no readable data and is freed at once
    DHS_CHECK_OK(TransitionHistory(hp, HistoryState::kPopulating, HistoryState::kHost));
    DHS_CHECK_OK(g.table.Release(c.gpu_page));
    --r.optional;
    ++r.host_only;
    Reindex(r, g);
  }
  if (!reclaiming) return;
  Reclaim& rc = state_.reclaims.at(r.reclaim);
  if (!ok) {
    rc.pages.erase(std::find(rc.pages.begin(), rc.pages.end(), c.gpu_page));
    --g.reclaiming_pages;
  }
  --rc.populates;
  AdvanceReclaim(rc);
}

// ---------------------------------------------------------------- decisions

void ResidencyManager::Pump() {
  for (auto& [id, g] : state_.gpus) PumpGpu(id, g);
}

absl::Status ResidencyManager::NeverFits(const Request& r, const Gpu& g) const {
  const uint32_t m = g.table.pages(), res = g.table.reserve();
  if (r.required_count > m - res) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request %d needs %d required pages but GPU %d can lend at most %d (M=%d, M_res=%d): it can never fit", r.id,
        r.required_count, r.gpu, m - res, m, res));
  }
  if (r.context_pages > state_.host.pages()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request %d needs %d host pages for its context but the host pool has %d pages: it can never fit", r.id,
        r.context_pages, state_.host.pages()));
  }
  return absl::OkStatus();
}

bool ResidencyManager::TryGrant(Request& r, Gpu& g) {
  const uint32_t lend = g.table.lendable();
  const auto kept = static_cast<uint32_t>(r.resumed_host.size());  // a resume's host pages, owned already
  if (r.required_count > lend) return false;  // waits for pages
  // Prefix sharing (issue 24): stored pages of its chain with the same content are imported, not allocated; cached
  // pages are room (evicted at the grant, in the policy's order) rather than a reason to wait.
  const PrefixHits hits = prefix_.Hits(r);
  const uint32_t need = r.context_pages - kept - static_cast<uint32_t>(hits.size());
  const std::optional<std::vector<PageIndex>> evict = prefix_.RoomFor(need, hits);
  if (!evict) return false;  // waits for host pages
  const SlotIndex slot = FreeSlot(g);
  if (slot == kNoSlot) return false;  // waits for a completion
  const uint32_t on_gpu = KeptOnGpu(r, g, kept + static_cast<uint32_t>(hits.size()));
  auto required = g.table.Take(r.id, r.required_count, PageState::kRequired);
  auto optional = g.table.Take(r.id, on_gpu, PageState::kOptionalReady);
  prefix_.Hold(r, hits, *evict);  // the grant goes ahead: its lookups counted, its hits held, the room made
  std::vector<uint32_t> fresh;  // history pages without a taken-over or shared host copy: a fresh host page each
  fresh.reserve(need);
  for (uint32_t h = 0; h < r.context_pages; ++h) {
    if (!r.resumed_host.contains(h) && !hits.contains(h)) fresh.push_back(h);
  }
  auto host = state_.host.AllocateHistory(r.id, kAllSources, fresh, r.context_pages);
  if (!required.ok() || !optional.ok() || !host.ok()) {
    RejectRefusedGrant(r, g, required, optional, host.status(), hits);
    return true;
  }
  r.required = *required;
  GrantOrder grant;
  grant.request = r.id;
  grant.gpu = r.gpu;
  grant.slot = slot;
  grant.required_pages = *required;
  grant.optional_pages = *optional;
  AssignHistory(r, fresh, *host, *optional, hits, grant);
  prefix_.BeginWrites(r);
  r.optional = on_gpu;
  r.host_only = kept + static_cast<uint32_t>(hits.size());
  r.slot = slot;
  TakeSlot(g, slot);
  CountShare(g, r.speculation, +1);
  DHS_CHECK_OK(TransitionRequest(r.state, RequestState::kQueued, RequestState::kAdmitted));
  r.time_us = state_.clock();
  r.seq = state_.next_seq++;
  Reindex(r, g);
  ++state_.counters.grants;
  MarkRegranted(grant);
  state_.outbox.push_back(std::move(grant));
  return true;
}

// Resident-first: spare pages keep imported history on GPU, but leave what the admissions queued behind require. A
// resume (or a prefix hit: `host_backed` > 0) keeps nothing on GPU at the grant: its history is on host (imported) or
// recomputed into the tail.
uint32_t ResidencyManager::KeptOnGpu(const Request& r, const Gpu& g, uint32_t host_backed) const {
  if (!r.optional_history || host_backed > 0) return 0;
  uint32_t behind = 0;
  for (size_t i = 1; i < g.queue.size(); ++i) behind += state_.requests.at(g.queue[i]).required_count;
  const uint32_t spare = g.table.lendable() - r.required_count;
  return std::min(r.imported_pages, spare > behind ? spare - behind : 0);
}

// The tables refused what lendable() / reusable() promised: a bug, never a peer's input (Admit checks the id and the
// counts). memd does not abort on it: the admission is refused, nothing of it stays taken, memd keeps serving.
void ResidencyManager::RejectRefusedGrant(Request& r, Gpu& g, const absl::StatusOr<std::vector<PageIndex>>& required,
                                          const absl::StatusOr<std::vector<PageIndex>>& optional,
                                          const absl::Status& host, const PrefixHits& hits) {
  for (const auto* taken : {&required, &optional}) {
    if (taken->ok()) {
      for (PageIndex p : **taken) DHS_CHECK_OK(g.table.Release(p));  // just taken
    }
  }
  prefix_.Unhold(r, hits);  // the hits just held, and a resume's taken-over shared pages
  state_.host.ReleaseRequest(r.id);
  const absl::Status why = !required.ok() ? required.status() : !optional.ok() ? optional.status() : host;
  spdlog::error("memd: request {}: the page tables refused its grant: {}", r.id, why.ToString());
  state_.outbox.push_back(
      RejectOrder{r.id, r.gpu, absl::InternalError(absl::StrCat("grant failed: ", why.message())), r.resume_of});
  ++state_.counters.rejects;
  state_.requests.erase(r.id);  // the caller pops it from the queue and does not touch it again
}

void ResidencyManager::AssignHistory(Request& r, std::span<const uint32_t> fresh,
                                     std::span<const PageIndex> fresh_host, std::span<const PageIndex> optional,
                                     const PrefixHits& hits, GrantOrder& grant) {
  r.history.assign(r.context_pages, HistoryPage{});
  grant.host_pages.assign(r.context_pages, 0);
  for (size_t i = 0; i < fresh.size(); ++i) grant.host_pages[fresh[i]] = fresh_host[i];
  for (uint32_t h = 0; h < r.context_pages; ++h) {
    HistoryPage& hp = r.history[h];
    auto taken = r.resumed_host.find(h);
    auto hit = hits.find(h);
    if (taken != r.resumed_host.end() || hit != hits.end()) {
      // A resume's confirmed host copy, or a shared prefix page (issue 24): imported by the worker, a population
      // candidate.
      grant.host_pages[h] = taken != r.resumed_host.end() ? taken->second : hit->second.host_page;
      hp.state = HistoryState::kHost;
      if (taken != r.resumed_host.end()) {
        const auto sum = r.resumed_checksums.find(h);
        hp.checksum = sum == r.resumed_checksums.end() ? 0 : sum->second;
      } else {
        hp.checksum = hit->second.checksum;
        grant.shared_pages.push_back(h);
      }
      grant.host_backed_pages.push_back(h);
      grant.host_backed_checksums.push_back(hp.checksum);
      if (h == grant.imported_pages) ++grant.imported_pages;  // the leading run
    } else if (h < optional.size()) {  // optional-ready, backup deferred into its assigned host page
      hp.state = HistoryState::kGpu;
      hp.gpu_page = optional[h];
    }  // else kHostPending: covered by the worker's tail until its write is confirmed (contract §3)
    hp.host_page = grant.host_pages[h];
  }
  r.resumed_host.clear();
  r.resumed_checksums.clear();
}

// Retire orders of this event on the grant's GPU whose pages the grant's required allocation took: regranted_to.
void ResidencyManager::MarkRegranted(GrantOrder& grant) {
  for (Order& o : state_.outbox) {
    auto* retire = std::get_if<RetireOrder>(&o);
    if (!retire || retire->gpu != grant.gpu || retire->regranted_to != 0) continue;
    const bool took = std::any_of(retire->gpu_pages.begin(), retire->gpu_pages.end(), [&](PageIndex p) {
      return std::find(grant.required_pages.begin(), grant.required_pages.end(), p) != grant.required_pages.end();
    });
    if (took) retire->regranted_to = grant.request;
  }
}

void ResidencyManager::PumpGpu(GpuId gpu_id, Gpu& g) {
  while (!g.queue.empty()) {
    Request& head = state_.requests.at(g.queue.front());
    if (TryGrant(head, g)) {
      g.queue.pop_front();
      continue;
    }
    // Deficit Δ: reclaim whole requests in the reclaim order.
    const int64_t delta = int64_t{head.required_count} - g.table.lendable() - g.reclaiming_pages;
    if (delta > 0) {
      const VictimChoice choice = g.victims.Choose(static_cast<uint32_t>(delta));
      if (choice.covers) {  // else all optional pages cannot cover Δ: wait until capacity frees
        for (RequestId v : choice.victims) StartReclaim(state_.requests.at(v), g);
      }
    }
    break;  // FIFO: those behind the head wait
  }
  SendWaits(gpu_id, g);
}

void ResidencyManager::SendWaits(GpuId gpu_id, Gpu& g) {
  for (size_t i = 0; i < g.queue.size(); ++i) {
    Request& r = state_.requests.at(g.queue[i]);
    if (r.wait_sent) continue;
    r.wait_sent = true;
    ++state_.counters.waits;
    const int64_t deficit = int64_t{r.required_count} - g.table.lendable();
    state_.outbox.push_back(WaitOrder{r.id, gpu_id, static_cast<uint32_t>(i),
                                static_cast<uint32_t>(std::max<int64_t>(0, deficit))});
  }
}

void ResidencyManager::StartReclaim(Request& v, Gpu& g) {
  const ReclaimId id = state_.next_order++;
  Reclaim rc;
  rc.id = id;
  rc.victim = v.id;
  rc.gpu = v.gpu;
  ReclaimOrder order;
  order.order = id;
  order.request = v.id;
  order.gpu = v.gpu;
  OrderEntry& entry = state_.orders[id];
  entry.request = v.id;
  entry.gpu = v.gpu;
  for (uint32_t h = 0; h < v.history.size(); ++h) {
    HistoryPage& hp = v.history[h];
    if (!HoldsGpuPage(hp.state)) continue;
    const bool populating = hp.state == HistoryState::kPopulating;
    DHS_CHECK_OK(g.table.Transition(hp.gpu_page, populating ? PageState::kOptionalPending : PageState::kOptionalReady,
                                    PageState::kReclaiming));
    rc.pages.push_back(hp.gpu_page);
    order.gpu_pages.push_back(hp.gpu_page);
    if (populating) {
      ++rc.populates;  // it has a host copy; the reclaim waits for its copy's report
    } else if (hp.copy != 0) {
      state_.copies.at(hp.copy).reclaim = id;  // a backup of an aborted attempt is still in flight: adopt it
      ++rc.backups;
    } else if (hp.state == HistoryState::kGpu) {  // no host copy yet: back it up into its assigned host page
      const CopyId cid = state_.next_copy++;
      state_.copies[cid] = Copy{.backup = true, .request = v.id, .gpu = v.gpu, .history_page = h,
                          .host_page = hp.host_page, .gpu_page = hp.gpu_page, .order = id, .reclaim = id};
      DHS_CHECK_OK(state_.host.Pin(hp.host_page));
      hp.copy = cid;
      ++rc.backups;
      ++state_.counters.backups_ordered;
      entry.copies[hp.gpu_page] = cid;
      order.backup_pages.push_back(hp.gpu_page);
      order.backup_host_pages.push_back(hp.host_page);
    }
  }
  DHS_CHECK_OK(TransitionRequest(v.state, RequestState::kAdmitted, RequestState::kReclaiming));
  v.reclaim = id;
  Reindex(v, g);
  g.reclaiming_pages += static_cast<uint32_t>(rc.pages.size());
  ++state_.counters.reclaims_started;
  state_.outbox.push_back(std::move(order));
  AdvanceReclaim(state_.reclaims.emplace(id, std::move(rc)).first->second);
}

// Retires the reclaim once every backup and population copy reported and the worker's readers are done.
void ResidencyManager::AdvanceReclaim(Reclaim& rc) {
  if (rc.backups != 0 || rc.populates != 0) return;
  // Every page's population failed: nothing was published, nothing to wait for (a later ReadersDone is stale).
  if (rc.readers_done || rc.pages.empty()) RetireReclaim(rc.id);
}

void ResidencyManager::RetireReclaim(ReclaimId id) {
  Reclaim rc = std::move(state_.reclaims.at(id));
  state_.reclaims.erase(id);
  Request& v = state_.requests.at(rc.victim);
  Gpu& g = state_.gpus.at(rc.gpu);
  for (HistoryPage& hp : v.history) {
    if (!HoldsGpuPage(hp.state)) continue;
    // Only pages with a host copy (or covered by the worker's tail) may be retired: kGpu or kPopulating here is a bug.
    const HistoryState to = hp.state == HistoryState::kGpuDeferred ? HistoryState::kHostPending : HistoryState::kHost;
    DHS_CHECK_OK(TransitionHistory(hp, hp.state, to));
    v.host_only += to == HistoryState::kHost;
    DHS_CHECK_OK(g.table.Release(hp.gpu_page));
    --v.optional;
  }
  g.reclaiming_pages -= static_cast<uint32_t>(rc.pages.size());
  v.backup_failures = 0;  // its backups went through: a later failure starts the back-off over
  DHS_CHECK_OK(TransitionRequest(v.state, RequestState::kReclaiming, RequestState::kAdmitted));
  v.reclaim = 0;
  Reindex(v, g);
  ++state_.counters.reclaims_retired;
  state_.counters.pages_retired += rc.pages.size();
  if (!rc.pages.empty()) state_.outbox.push_back(RetireOrder{rc.id, rc.victim, rc.gpu, std::move(rc.pages)});
  EraseOrderIfDone(id);
}

void ResidencyManager::AbortReclaim(Request& v, Gpu& g) {
  auto it = state_.reclaims.find(v.reclaim);
  for (HistoryPage& hp : v.history) {
    if (!HoldsGpuPage(hp.state)) continue;
    const bool populating = hp.state == HistoryState::kPopulating;
    DHS_CHECK_OK(g.table.Transition(hp.gpu_page, PageState::kReclaiming,
                                    populating ? PageState::kOptionalPending : PageState::kOptionalReady));
    if (hp.copy != 0 && !populating) state_.copies.at(hp.copy).reclaim = 0;  // detach: its result still counts
  }
  g.reclaiming_pages -= static_cast<uint32_t>(it->second.pages.size());
  state_.orders.at(it->first).aborted = true;
  const ReclaimId id = it->first;
  state_.reclaims.erase(it);
  EraseOrderIfDone(id);
  DHS_CHECK_OK(TransitionRequest(v.state, RequestState::kReclaiming, RequestState::kAdmitted));
  v.reclaim = 0;
  v.backoff = true;
  state_.backoff.insert(v.id);
  ++v.backup_failures;
  v.retry_ticks = std::min(uint32_t{1} << std::min(v.backup_failures - 1, 6u), kMaxRetryTicks);
  Reindex(v, g);
  ++state_.counters.reclaims_failed;
  spdlog::debug("memd: reclaim of request {} aborted by a failed backup; it may be retried", v.id);
}

// An order entry lives while its reclaim is live or it still owes copy reports.
void ResidencyManager::EraseOrderIfDone(OrderId order) {
  auto it = state_.orders.find(order);
  if (it == state_.orders.end() || !it->second.copies.empty()) return;
  if (it->second.reclaim && state_.reclaims.count(order)) return;
  state_.orders.erase(it);
}

// ---------------------------------------------------------------- checks and dump

absl::Status ResidencyManager::CheckInvariants() const {
  if (absl::Status s = state_.host.CheckInvariants(); !s.ok()) return s;
  if (absl::Status s = CheckQueues(); !s.ok()) return s;
  std::map<GpuId, std::vector<RequestId>> owner;  // expected owner of every GPU page
  for (const auto& [gid, g] : state_.gpus) {
    if (absl::Status s = g.table.CheckInvariants(); !s.ok()) return s;
    owner[gid].assign(g.table.pages(), kNoOwner);
  }
  std::set<PageIndex> host_pages;
  for (const auto& [id, r] : state_.requests) {
    if (absl::Status s = CheckRequest(r, owner, host_pages); !s.ok()) return s;
  }
  // Every allocated host page belongs to a live request, or is a shared or cached prefix page (issue 24).
  const uint32_t shared_pages = prefix_.PoolPages();
  if (host_pages.size() + shared_pages != state_.host.allocated()) {
    return absl::InternalError(absl::StrFormat("host pool: %d pages allocated, %d held by requests, %d shared",
                                               state_.host.allocated(), host_pages.size(), shared_pages));
  }
  if (absl::Status s = prefix_.CheckInvariants(); !s.ok()) return s;
  if (absl::Status s = CheckCopiesAndOrders(owner); !s.ok()) return s;
  for (const auto& [gid, g] : state_.gpus) {
    for (PageIndex p = 0; p < g.table.pages(); ++p) {
      if (owner[gid][p] != g.table.owner(p)) {
        return absl::InternalError(absl::StrFormat("GPU %d page %d: owned by %d in the table, by %d in the requests",
                                                   gid, p, g.table.owner(p), owner[gid][p]));
      }
    }
  }
  if (absl::Status s = CheckReclaims(); !s.ok()) return s;
  return CheckVictimIndex();
}

absl::Status ResidencyManager::CheckQueues() const {
  size_t queued = 0, queued_requests = 0;
  for (const auto& [gid, g] : state_.gpus) {
    for (RequestId q : g.queue) {
      auto it = state_.requests.find(q);
      if (it == state_.requests.end() || it->second.state != RequestState::kQueued || it->second.gpu != gid) {
        return absl::InternalError(absl::StrFormat("GPU %d queue holds request %d that is not queued there", gid, q));
      }
    }
    queued += g.queue.size();
    std::set<SlotIndex> slots;
    SpeculationShare speculation;  // the recount of g.speculation
    for (const auto& [id, r] : state_.requests) {
      if (r.gpu != gid || r.state == RequestState::kQueued || r.state == RequestState::kInterrupted) continue;
      if (r.slot == kNoSlot || (g.request_slots != 0 && r.slot >= g.request_slots) || !slots.insert(r.slot).second) {
        return absl::InternalError(absl::StrFormat("GPU %d: request %d has slot %d (taken or out of range)", gid, id,
                                                   r.slot));
      }
      if (r.speculation.pages() > r.required.size()) {
        return absl::InternalError(absl::StrFormat("GPU %d: request %d: a speculation share of %d pages in %d required",
                                                   gid, id, r.speculation.pages(), r.required.size()));
      }
      speculation += r.speculation;
    }
    if (slots != g.used_slots) return absl::InternalError(absl::StrFormat("GPU %d: used slots disagree", gid));
    const SpeculationShare& sum = g.speculation;
    if (sum != speculation || sum.pages() > g.table.required()) {
      return absl::InternalError(absl::StrFormat(
          "GPU %d: speculation in use %d + %d pages, %d + %d bytes; its requests hold %d + %d pages, %d + %d bytes "
          "(M_req %d)", gid, sum.draft_ring_pages, sum.staging_pages, sum.draft_ring_bytes, sum.staging_bytes,
          speculation.draft_ring_pages, speculation.staging_pages, speculation.draft_ring_bytes,
          speculation.staging_bytes, g.table.required()));
    }
  }
  for (const auto& [id, r] : state_.requests) {
    if (r.state != RequestState::kInterrupted && !state_.gpus.contains(r.gpu)) {
      return absl::InternalError(absl::StrFormat("request %d (%s) on fenced GPU %d", id, RequestStateName(r.state),
                                                 r.gpu));
    }
    if (r.state != RequestState::kQueued) continue;
    ++queued_requests;
    if (!r.required.empty() || !r.history.empty() || r.slot != kNoSlot ||
        state_.host.pages_of(id) != r.resumed_host.size() - prefix_.Held(r)) {
      return absl::InternalError(absl::StrFormat("queued request %d holds pages or a slot", id));
    }
  }
  if (queued != queued_requests) return absl::InternalError("queued requests and queues disagree");
  return absl::OkStatus();
}

// One admitted request: its GPU pages (claimed in `owner`), its host pages (one per context page, its own, claimed in
// `host_pages`), a_r, and every history page against its state.
absl::Status ResidencyManager::CheckRequest(const Request& r, std::map<GpuId, std::vector<RequestId>>& owner,
                                            std::set<PageIndex>& host_pages) const {
  if (r.state == RequestState::kQueued) return recovery_.CheckQueuedResume(r, host_pages);
  if (!r.resumed_host.empty()) {
    return absl::InternalError(absl::StrFormat("request %d: resumed host pages left after its grant", r.id));
  }
  if (r.state == RequestState::kInterrupted) return recovery_.CheckInterrupted(r, host_pages);
  const bool reclaiming = r.state == RequestState::kReclaiming;
  if (reclaiming != (r.reclaim != 0) || (reclaiming && !state_.reclaims.count(r.reclaim))) {
    return absl::InternalError(absl::StrFormat("request %d: reclaim state inconsistent", r.id));
  }
  const GpuPageTable& t = state_.gpus.at(r.gpu).table;
  auto claim = [&](PageIndex p, PageState want) -> absl::Status {
    if (p >= t.pages() || owner[r.gpu][p] != kNoOwner || t.owner(p) != r.id || t.state(p) != want) {
      return absl::InternalError(absl::StrFormat("GPU %d page %d of request %d: table says %s of %d, expected %s",
                                                 r.gpu, p, r.id, PageStateName(t.state(p)), t.owner(p),
                                                 PageStateName(want)));
    }
    owner[r.gpu][p] = r.id;
    return absl::OkStatus();
  };
  for (PageIndex p : r.required) {
    if (absl::Status s = claim(p, PageState::kRequired); !s.ok()) return s;
  }
  if (r.history.size() != r.context_pages ||
      state_.host.pages_of(r.id) != r.context_pages - prefix_.Held(r)) {
    return absl::InternalError(absl::StrFormat("request %d: %d history pages, %d host pages, context %d", r.id,
                                               r.history.size(), state_.host.pages_of(r.id), r.context_pages));
  }
  uint32_t optional = 0;
  for (uint32_t h = 0; h < r.history.size(); ++h) {
    const HistoryPage& hp = r.history[h];
    const bool shared = prefix_.Holds(r.id, hp.host_page);  // PrefixSharing::CheckInvariants counts its holders
    if (absl::Status s = prefix_.CheckHeldPage(r, h); !s.ok()) return s;
    if (!shared && (!state_.host.is_allocated(hp.host_page) || state_.host.owner(hp.host_page) != r.id ||
                    !host_pages.insert(hp.host_page).second)) {
      return absl::InternalError(absl::StrFormat("request %d page %d: host page %d not its own", r.id, h, hp.host_page));
    }
    if (absl::Status s = CheckHistoryPage(r, h); !s.ok()) return s;
    if (absl::Status s = recovery_.CheckJournal(r, h); !s.ok()) return s;
    if (!HoldsGpuPage(hp.state)) continue;
    ++optional;
    const PageState want = reclaiming                               ? PageState::kReclaiming
                           : hp.state == HistoryState::kPopulating ? PageState::kOptionalPending
                                                                   : PageState::kOptionalReady;
    if (absl::Status s = claim(hp.gpu_page, want); !s.ok()) return s;
  }
  if (optional != r.optional) {
    return absl::InternalError(absl::StrFormat("request %d: a_r %d but %d optional pages", r.id, r.optional, optional));
  }
  return absl::OkStatus();
}

// A history page's state against its copy in flight and its request.
absl::Status ResidencyManager::CheckHistoryPage(const Request& r, uint32_t h) const {
  const HistoryPage& hp = r.history[h];
  auto bad = [&](std::string_view what) {
    return absl::InternalError(absl::StrFormat("request %d history page %d (%s): %s", r.id, h,
                                               HistoryStateName(hp.state), what));
  };
  if (HoldsGpuPage(hp.state) && !r.optional_history) return bad("on GPU without optional history");
  const bool backup_allowed = hp.state == HistoryState::kGpu || hp.state == HistoryState::kGpuAndHost;
  const bool populate_needed = hp.state == HistoryState::kPopulating;
  if (hp.copy == 0) return populate_needed ? bad("populating without a copy") : absl::OkStatus();
  auto c = state_.copies.find(hp.copy);
  if (c == state_.copies.end() || c->second.request != r.id || c->second.history_page != h || c->second.orphan ||
      c->second.host_page != hp.host_page) {
    return bad("copy record missing or not this page's");
  }
  if (c->second.backup ? !backup_allowed : !populate_needed) return bad("copy of the wrong kind");
  if (c->second.gpu_page != hp.gpu_page) return bad("copy into another GPU page");
  if (c->second.backup && r.state == RequestState::kReclaiming && c->second.reclaim != r.reclaim) {
    return bad("backup in flight not counted by the live reclaim");
  }
  return absl::OkStatus();
}

// Copies: each pins its host page, is listed by its order's entry; orphan population pages are owned by their
// completed request until the copy reports. Order entries: every listed copy exists and names the entry.
absl::Status ResidencyManager::CheckCopiesAndOrders(std::map<GpuId, std::vector<RequestId>>& owner) const {
  for (const auto& [id, entry] : state_.orders) {
    if (!state_.gpus.contains(entry.gpu)) return absl::InternalError(absl::StrFormat("order %d of fenced GPU", id));
  }
  for (const auto& [id, rc] : state_.reclaims) {
    if (!state_.gpus.contains(rc.gpu)) return absl::InternalError(absl::StrFormat("reclaim %d of fenced GPU", id));
  }
  for (const auto& [cid, c] : state_.copies) {
    if (!state_.gpus.contains(c.gpu)) {
      return absl::InternalError(absl::StrFormat("copy %d on fenced GPU %d", cid, c.gpu));
    }
    auto entry = state_.orders.find(c.order);
    if (entry == state_.orders.end() || entry->second.copies.count(c.gpu_page) == 0 ||
        entry->second.copies.at(c.gpu_page) != cid || entry->second.reclaim != c.backup) {
      return absl::InternalError(absl::StrFormat("copy %d is not listed by its order %d", cid, c.order));
    }
    if (!state_.host.is_pinned(c.host_page)) {
      return absl::InternalError(absl::StrFormat("copy %d: host page not pinned", cid));
    }
    if (c.backup || !c.orphan) continue;
    const PageState st = state_.gpus.at(c.gpu).table.state(c.gpu_page);
    if (owner[c.gpu][c.gpu_page] != kNoOwner || (st != PageState::kOptionalPending && st != PageState::kReclaiming)) {
      return absl::InternalError(absl::StrFormat("orphan population page %d of GPU %d inconsistent", c.gpu_page, c.gpu));
    }
    owner[c.gpu][c.gpu_page] = c.request;
  }
  // Pinned pages = the host pages of the copies in flight (a shared page read by two populations at once is one
  // page: issue 24).
  std::set<PageIndex> copied;
  for (const auto& [cid, c] : state_.copies) copied.insert(c.host_page);
  if (state_.host.pinned() != copied.size()) {
    return absl::InternalError(absl::StrFormat("%d host pages pinned, %d copies in flight", state_.host.pinned(),
                                               state_.copies.size()));
  }
  for (const auto& [id, entry] : state_.orders) {
    for (const auto& [page, cid] : entry.copies) {
      auto c = state_.copies.find(cid);
      if (c == state_.copies.end() || c->second.order != id) {
        return absl::InternalError(absl::StrFormat("order %d lists copy %d that is not its own", id, cid));
      }
    }
    if (entry.copies.empty() && !(entry.reclaim && state_.reclaims.count(id))) {
      return absl::InternalError(absl::StrFormat("order %d owes nothing but was kept", id));
    }
  }
  return absl::OkStatus();
}

// Reclaims: victim, pages, outstanding copies and the per-GPU reclaiming page counts.
absl::Status ResidencyManager::CheckReclaims() const {
  std::map<GpuId, uint32_t> reclaiming_expected;
  for (const auto& [rid, rc] : state_.reclaims) {
    reclaiming_expected[rc.gpu] += static_cast<uint32_t>(rc.pages.size());
    auto v = state_.requests.find(rc.victim);
    if (v == state_.requests.end() || v->second.reclaim != rid || !state_.orders.count(rid)) {
      return absl::InternalError(absl::StrFormat("reclaim %d without its victim or order", rid));
    }
    std::vector<PageIndex> pages;
    uint32_t populates = 0;
    for (const HistoryPage& hp : v->second.history) {
      if (HoldsGpuPage(hp.state)) pages.push_back(hp.gpu_page);
      populates += hp.state == HistoryState::kPopulating;
    }
    const uint32_t backups = static_cast<uint32_t>(std::count_if(
        state_.copies.begin(), state_.copies.end(),
        [&, rid = rid](const auto& c) { return c.second.backup && c.second.reclaim == rid; }));
    std::vector<PageIndex> listed = rc.pages;
    std::sort(pages.begin(), pages.end());
    std::sort(listed.begin(), listed.end());
    if (pages != listed || populates != rc.populates || backups != rc.backups) {
      return absl::InternalError(absl::StrFormat("reclaim %d: pages or outstanding copies disagree", rid));
    }
  }
  for (const auto& [gid, g] : state_.gpus) {
    if (g.reclaiming_pages != reclaiming_expected[gid]) {
      return absl::InternalError(absl::StrFormat("GPU %d: reclaiming page count off", gid));
    }
  }
  return absl::OkStatus();
}

// Every GPU's ReclaimIndex holds exactly its victim candidates, in the order the policy's sort gives them (the
// reference), each under the key its request remembers; the back-off set names exactly the backed-off requests; the
// released slots are the free slots below slot_high.
absl::Status ResidencyManager::CheckVictimIndex() const {
  for (const auto& [gid, g] : state_.gpus) {
    std::vector<ReclaimCandidate> want = core::VictimCandidates(state_, gid, true);
    policy_->Order(want);
    const std::vector<ReclaimCandidate> have = g.victims.Ordered();
    uint64_t total = 0;
    for (const ReclaimCandidate& c : want) total += c.optional_pages;
    auto same = [](const ReclaimCandidate& a, const ReclaimCandidate& b) {
      return a.request == b.request && a.admitted_at_us == b.admitted_at_us && a.admission_seq == b.admission_seq &&
             a.optional_pages == b.optional_pages;
    };
    if (have.size() != want.size() || !std::equal(have.begin(), have.end(), want.begin(), same) ||
        g.victims.total_pages() != total) {
      return absl::InternalError(absl::StrFormat("GPU %d: reclaim index disagrees with the sorted candidates", gid));
    }
    for (SlotIndex s = 0; s < g.slot_high; ++s) {
      if (g.used_slots.contains(s) == g.released_slots.contains(s)) {
        return absl::InternalError(absl::StrFormat("GPU %d: slot %d both used and released, or neither", gid, s));
      }
    }
    if (g.used_slots.size() + g.released_slots.size() != g.slot_high) {
      return absl::InternalError(absl::StrFormat("GPU %d: slots beyond slot_high %d in use", gid, g.slot_high));
    }
  }
  for (const auto& [gid, g] : state_.gpus) {
    for (RequestId id : g.populatable) {
      if (!state_.requests.contains(id) || state_.requests.at(id).gpu != gid) {
        return absl::InternalError(absl::StrFormat("GPU %d: population candidate %d not its request", gid, id));
      }
    }
  }
  size_t backed_off = 0;
  for (const auto& [id, r] : state_.requests) {
    backed_off += r.backoff;
    if (r.backoff != state_.backoff.contains(id)) {
      return absl::InternalError(absl::StrFormat("request %d: back-off flag and set disagree", id));
    }
    const bool candidate = r.state == RequestState::kAdmitted && r.optional > 0 && !r.backoff;
    if (candidate != r.victim_key.has_value() ||
        (candidate && (r.victim_key->optional_pages != r.optional || r.victim_key->admission_seq != r.seq))) {
      return absl::InternalError(absl::StrFormat("request %d: reclaim index key stale", id));
    }
    const auto host_only = static_cast<uint32_t>(std::count_if(
        r.history.begin(), r.history.end(), [](const HistoryPage& hp) { return hp.state == HistoryState::kHost; }));
    const bool populatable = r.state == RequestState::kAdmitted && r.optional_history && host_only > 0;
    auto g = state_.gpus.find(r.gpu);  // an interrupted request's GPU may be fenced
    if (host_only != r.host_only || populatable != (g != state_.gpus.end() && g->second.populatable.contains(id))) {
      return absl::InternalError(absl::StrFormat("request %d: %d kHost pages, host_only %d, population candidate %d",
                                                 id, host_only, r.host_only, populatable));
    }
  }
  if (backed_off != state_.backoff.size()) return absl::InternalError("back-off set names unknown requests");
  return absl::OkStatus();
}

StateDump ResidencyManager::Dump(DumpDetail detail) const { return core::DumpOf(state_, *policy_, prefix_, detail); }

StateDump ResidencyManager::Dump(const DumpScope& scope) const {
  return core::DumpOf(state_, *policy_, prefix_, scope);
}

std::vector<SessionPublishPage> ResidencyManager::SessionPages(RequestId request,
                                                              std::span<const uint64_t> digests) const {
  auto it = state_.requests.find(request);
  if (it == state_.requests.end()) return {};
  const core::Request& r = it->second;
  return SessionPagesToPublish(r, digests, [&](uint32_t h) { return prefix_.Holds(r.id, r.history[h].host_page); });
}

std::optional<GpuId> ResidencyManager::GpuOfRequest(RequestId request) const {
  auto it = state_.requests.find(request);
  return it == state_.requests.end() ? std::nullopt : std::optional<GpuId>(it->second.gpu);
}

std::optional<GpuId> ResidencyManager::GpuOfOrder(OrderId order) const {
  auto it = state_.orders.find(order);
  return it == state_.orders.end() ? std::nullopt : std::optional<GpuId>(it->second.gpu);
}

}  // namespace dhs::memd
