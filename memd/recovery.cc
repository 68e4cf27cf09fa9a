#include "memd/recovery.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "spdlog/spdlog.h"

namespace dhs::memd {

using core::CheckShare;
using core::Copy;
using core::CountShare;
using core::Gpu;
using core::Reindex;
using core::Request;
using core::TakeSlot;

absl::Status Recovery::CheckAdoptGpu(GpuId gpu, uint32_t epoch) const {
  if (s_.epochs.contains(gpu) && !s_.journal_gpus.contains(gpu)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "GPU %d was registered with this memd (epoch %d) and fenced: its worker says Hello without a report (a new "
        "epoch)", gpu, s_.epochs.at(gpu)));
  }
  const uint32_t journal_epoch = s_.epochs.contains(gpu) ? s_.epochs.at(gpu) : 0;
  if (epoch == 0 || epoch < journal_epoch) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "GPU %d: a report of epoch %d, but the journal holds requests of epoch %d (a stale worker)", gpu, epoch,
        journal_epoch));
  }
  return absl::OkStatus();
}

void Recovery::AdoptReports(GpuId gpu, uint32_t epoch, std::span<const ReportedRequest> reports,
                            std::vector<absl::Status>* outcomes) {
  s_.epochs[gpu] = epoch;
  Gpu& g = s_.gpus.at(gpu);
  uint32_t taken = 0;
  for (const ReportedRequest& rep : reports) {
    absl::Status s = CheckReport(gpu, g, rep);
    if (s.ok()) {
      AdoptReport(gpu, g, rep);
      ++taken;
    } else {
      ++s_.counters.reports_refused;
      spdlog::warn("memd: GPU {}: report of request {} refused: {}", gpu, rep.request, s.ToString());
    }
    if (outcomes != nullptr) outcomes->push_back(std::move(s));
  }
  s_.counters.requests_reported += taken;
  spdlog::info("memd: worker of GPU {} survived a memd restart (epoch {}): {} of {} reported requests adopted", gpu,
               epoch, taken, reports.size());
}

absl::Status Recovery::CheckReport(GpuId gpu, const Gpu& g, const ReportedRequest& rep) const {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: %s", rep.request, why));
  };
  if (rep.request == 0 || rep.request == kNoOwner) return bad("a reserved id");
  const auto known = s_.requests.find(rep.request);
  const Request* old = known == s_.requests.end() ? nullptr : &known->second;
  if (old != nullptr && (old->state != RequestState::kInterrupted || old->gpu != gpu)) {
    return absl::AlreadyExistsError(absl::StrFormat("request %d is known (%s on GPU %d)", rep.request,
                                                    RequestStateName(old->state), old->gpu));
  }
  const auto context = static_cast<uint32_t>(rep.history.size());
  if (rep.required_pages.empty()) return bad("no required page");
  if (rep.required_pages.size() > UINT32_MAX) return bad("more required pages than any GPU has");
  if (absl::Status s = CheckShare(rep.request, static_cast<uint32_t>(rep.required_pages.size()), rep.speculation,
                                  g.declared);
      !s.ok()) {
    return s;
  }
  if (context > s_.host.pages() || rep.history_pages > context) return bad("context or complete pages out of range");
  if (old != nullptr && old->context_pages != context) {
    return bad(absl::StrFormat("%d context pages, the journal says %d", context, old->context_pages));
  }
  if (rep.slot >= (g.request_slots != 0 ? g.request_slots : kMaxRequestSlots) || g.used_slots.contains(rep.slot)) {
    return absl::AlreadyExistsError(
        absl::StrFormat("request %d: slot %d out of range or taken", rep.request, rep.slot));
  }
  std::set<PageIndex> gpu_pages(rep.required_pages.begin(), rep.required_pages.end());
  size_t named = rep.required_pages.size();
  std::set<PageIndex> host_pages;
  for (uint32_t h = 0; h < context; ++h) {
    const ReportedHistoryPage& hp = rep.history[h];
    if (hp.gpu_page) {
      if (!rep.optional_history) return bad("an optional GPU page without optional history");
      gpu_pages.insert(*hp.gpu_page);
      ++named;
    }
    if (!host_pages.insert(hp.host_page).second) return bad(absl::StrFormat("host page %d named twice", hp.host_page));
    const bool journal = old != nullptr && old->history[h].state == HistoryState::kHost;
    if (journal && old->history[h].host_page != hp.host_page) {
      return bad(absl::StrFormat("history page %d: host page %d, the journal says %d", h, hp.host_page,
                                 old->history[h].host_page));
    }
    // Issue 24: a shared prefix page it imported (or wrote and memd shared) came back cached; the same confirmed
    // content (checksum) makes it a reference, never a second owner.
    const bool shared = !journal && prefix_.ReportedHit(hp.host_page, hp.checksum);
    if (!journal && !shared && !s_.host.is_free(hp.host_page)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "request %d: host page %d of history page %d is not free (pool %d pages)", rep.request, hp.host_page, h,
          s_.host.pages()));
    }
  }
  if (gpu_pages.size() != named) return bad("a GPU page named twice");
  for (PageIndex p : gpu_pages) {
    if (p >= g.table.pages() || g.table.state(p) != PageState::kFree) {
      return absl::FailedPreconditionError(absl::StrFormat("request %d: GPU %d page %d out of range or taken",
                                                           rep.request, gpu, p));
    }
  }
  if (gpu_pages.size() > g.table.lendable()) return bad("more GPU pages than lendable (M - M_res)");
  return absl::OkStatus();
}

void Recovery::AdoptReport(GpuId gpu, Gpu& g, const ReportedRequest& rep) {
  Request r;
  r.id = rep.request;
  r.gpu = gpu;
  r.required_count = static_cast<uint32_t>(rep.required_pages.size());
  r.imported_pages = rep.history_pages;
  r.context_pages = static_cast<uint32_t>(rep.history.size());
  r.optional_history = rep.optional_history;
  r.speculation = rep.speculation;
  r.required = rep.required_pages;
  r.history.resize(r.context_pages);
  const auto old = s_.requests.find(rep.request);
  std::vector<PageIndex> optional;
  for (uint32_t h = 0; h < r.context_pages; ++h) {
    const ReportedHistoryPage& in = rep.history[h];
    HistoryPage& hp = r.history[h];
    hp.host_page = in.host_page;
    const bool journal = old != s_.requests.end() && old->second.history[h].state == HistoryState::kHost;
    const bool shared = !journal && prefix_.ReportedHit(in.host_page, in.checksum);  // issue 24: CheckReport
    const bool copy = journal || shared;
    if (shared) {
      prefix_.HoldReported(in.host_page, r.id);
      hp.checksum = in.checksum;
    } else if (!journal) {
      DHS_CHECK_OK(s_.host.AllocateAt(r.id, kAllSources, in.host_page, h, r.context_pages));  // checked
    }
    if (journal) {  // issue 22: the journal's checksum wins; the report's fills one the journal lacks
      hp.checksum = old->second.history[h].checksum != 0 ? old->second.history[h].checksum : in.checksum;
      if (hp.checksum != old->second.history[h].checksum) DHS_CHECK_OK(s_.host.Confirm(in.host_page, hp.checksum));
    }
    if (in.gpu_page) {
      hp.state = copy ? HistoryState::kGpuAndHost : HistoryState::kGpu;
      hp.gpu_page = *in.gpu_page;
      optional.push_back(*in.gpu_page);
    } else {
      hp.state = copy ? HistoryState::kHost : HistoryState::kHostPending;
    }
    r.host_only += hp.state == HistoryState::kHost;
  }
  DHS_CHECK_OK(g.table.TakeAt(r.id, r.required, PageState::kRequired));  // checked: free, distinct, lendable
  DHS_CHECK_OK(g.table.TakeAt(r.id, optional, PageState::kOptionalReady));
  r.optional = static_cast<uint32_t>(optional.size());
  r.slot = rep.slot;
  TakeSlot(g, rep.slot);
  DHS_CHECK_OK(TransitionRequest(r.state, RequestState::kQueued, RequestState::kAdmitted));
  r.time_us = s_.clock();
  r.seq = s_.next_seq++;
  CountShare(g, r.speculation, +1);
  if (old != s_.requests.end()) s_.requests.erase(old);
  Request& placed = s_.requests.emplace(r.id, std::move(r)).first->second;
  Reindex(placed, g);
}

absl::Status Recovery::Fence(GpuId gpu, std::string_view why) {
  auto g = s_.gpus.find(gpu);
  if (g == s_.gpus.end()) {
    return absl::NotFoundError(absl::StrFormat("GPU %d is not registered (or already fenced)", gpu));
  }
  FenceCopies(gpu);
  std::erase_if(s_.orders, [gpu](const auto& e) { return e.second.gpu == gpu; });
  std::erase_if(s_.reclaims, [gpu](const auto& e) { return e.second.gpu == gpu; });
  uint32_t interrupted = 0;
  for (RequestId q : g->second.queue) {
    Request& r = s_.requests.at(q);
    if (r.resume_of != 0) {  // its predecessor is gone: rejecting it would lose the host pages and record it took over
      InterruptQueuedResume(r);
      ++interrupted;
      continue;
    }
    s_.outbox.push_back(RejectOrder{q, gpu, absl::UnavailableError(absl::StrFormat(
        "GPU %d was fenced (its worker died or hung) before request %d was granted", gpu, q))});
    s_.requests.erase(q);
    ++s_.counters.admissions_fenced;
  }
  for (auto& [id, r] : s_.requests) {
    if (r.gpu != gpu || (r.state != RequestState::kAdmitted && r.state != RequestState::kReclaiming)) continue;
    Interrupt(r);
    ++interrupted;
  }
  s_.gpus.erase(g);
  fence_reasons_[gpu] = std::string(why);
  ++s_.counters.fences;
  spdlog::warn("memd: GPU {} fenced (epoch {}): {} requests interrupted, they keep their confirmed host copies", gpu,
               s_.epochs.at(gpu), interrupted);
  return absl::OkStatus();
}

// Every copy in flight on `gpu` ends now: its host page is unpinned (an orphan's freed page becomes reusable), its
// history page no longer references it. What the page holds is decided by Interrupt.
void Recovery::FenceCopies(GpuId gpu) {
  for (auto it = s_.copies.begin(); it != s_.copies.end();) {
    const Copy& c = it->second;
    if (c.gpu != gpu) {
      ++it;
      continue;
    }
    DHS_CHECK_OK(s_.host.Unpin(c.host_page));
    if (!c.orphan) s_.requests.at(c.request).history[c.history_page].copy = 0;
    it = s_.copies.erase(it);
  }
}

void Recovery::InterruptQueuedResume(Request& r) {
  r.history.assign(r.context_pages, HistoryPage{});
  for (uint32_t h = 0; h < r.context_pages; ++h) {
    HistoryPage& hp = r.history[h];
    hp.state = HistoryState::kLost;
    if (auto kept = r.resumed_host.find(h); kept != r.resumed_host.end()) {
      hp.state = HistoryState::kHost;
      hp.host_page = kept->second;
      if (auto sum = r.resumed_checksums.find(h); sum != r.resumed_checksums.end()) hp.checksum = sum->second;
    }
  }
  r.host_only = static_cast<uint32_t>(r.resumed_host.size());
  r.resumed_host.clear();
  r.resumed_checksums.clear();
  r.wait_sent = false;
  r.resume_of = 0;     // interrupted again: no longer a resume (the next worker's resume takes it over)
  r.speculation = {};  // no required allocation any more (its GPU's sums went with the GPU)
  DHS_CHECK_OK(TransitionRequest(r.state, RequestState::kQueued, RequestState::kInterrupted));
  ++s_.counters.requests_interrupted;
}

// An admitted request of a fenced GPU keeps exactly its confirmed host copies (kHost, kPopulating, kGpuAndHost ->
// kHost); rows that were only on the GPU or in the worker's tail are lost (kLost, host page freed).
void Recovery::Interrupt(Request& r) {
  uint32_t kept = 0;
  for (HistoryPage& hp : r.history) {
    switch (hp.state) {
      case HistoryState::kHost: break;
      case HistoryState::kPopulating:
      case HistoryState::kGpuAndHost: DHS_CHECK_OK(TransitionHistory(hp, hp.state, HistoryState::kHost)); break;
      default:
        DHS_CHECK_OK(TransitionHistory(hp, hp.state, HistoryState::kLost));
        prefix_.AbandonWrite(r, hp.host_page);  // a page it was writing is never importable (issue 24)
        DHS_CHECK_OK(s_.host.Free(hp.host_page));
        ++s_.counters.host_pages_lost;
    }
    hp.gpu_page = 0;
    kept += hp.state == HistoryState::kHost;
  }
  r.required.clear();
  r.speculation = {};  // its share of the required allocation went with it (and its GPU's sums with the GPU)
  r.optional = 0;
  r.host_only = kept;
  r.slot = kNoSlot;
  r.reclaim = 0;
  if (r.backoff) s_.backoff.erase(r.id);
  r.backoff = false;
  r.victim_key.reset();  // the GPU's victim index and population candidates go with the GPU
  DHS_CHECK_OK(TransitionRequest(r.state, r.state, RequestState::kInterrupted));  // admitted or reclaiming
  ++s_.counters.requests_interrupted;
}

absl::Status Recovery::CheckAdopted(std::span<const AdoptedRequest> requests) const {
  if (!s_.gpus.empty() || !s_.requests.empty()) {
    return absl::FailedPreconditionError("AdoptHostPages must be the first event (a GPU or a request is known)");
  }
  std::set<RequestId> ids;
  std::set<PageIndex> pages;
  for (const AdoptedRequest& a : requests) {
    if (a.request == 0 || a.request == kNoOwner || !ids.insert(a.request).second) {
      return absl::InvalidArgumentError(absl::StrFormat("adopted request id %d reserved or repeated", a.request));
    }
    if (a.epoch == 0 || a.context_pages > s_.host.pages()) {
      return absl::InvalidArgumentError(absl::StrFormat("adopted request %d: epoch %d, %d context pages (pool %d)",
                                                        a.request, a.epoch, a.context_pages, s_.host.pages()));
    }
    for (const auto& [h, page] : a.host_pages) {
      if (h >= a.context_pages || page >= s_.host.pages() || !pages.insert(page).second) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "adopted request %d: history page %d of %d on host page %d (pool %d; out of range or named twice)",
            a.request, h, a.context_pages, page, s_.host.pages()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Recovery::AdoptHostPages(std::span<const AdoptedRequest> requests,
                                      std::span<const AdoptedSharedPage> shared) {
  if (absl::Status s = CheckAdopted(requests); !s.ok()) return s;
  std::set<PageIndex> request_pages;
  for (const AdoptedRequest& a : requests) {
    for (const auto& [h, page] : a.host_pages) request_pages.insert(page);
  }
  if (absl::Status s = prefix_.CheckAdopted(shared, request_pages); !s.ok()) return s;
  uint32_t kept = 0;
  for (const AdoptedRequest& a : requests) {
    Request r;
    r.id = a.request;
    r.gpu = a.gpu;
    r.context_pages = a.context_pages;
    r.time_us = s_.clock();
    r.history.resize(a.context_pages);
    for (HistoryPage& hp : r.history) hp.state = HistoryState::kLost;
    for (const auto& [h, page] : a.host_pages) {
      DHS_CHECK_OK(s_.host.AllocateAt(a.request, kAllSources, page, h, a.context_pages));  // pool empty: checked above
      const auto sum = a.checksums.find(h);
      r.history[h].checksum = sum == a.checksums.end() ? 0 : sum->second;
      DHS_CHECK_OK(s_.host.Confirm(page, r.history[h].checksum));
      r.history[h].state = HistoryState::kHost;
      r.history[h].host_page = page;
    }
    r.host_only = static_cast<uint32_t>(a.host_pages.size());
    DHS_CHECK_OK(TransitionRequest(r.state, RequestState::kQueued, RequestState::kInterrupted));
    kept += r.host_only;
    uint32_t& epoch = s_.epochs[a.gpu];
    epoch = std::max(epoch, a.epoch);
    s_.journal_gpus.insert(a.gpu);
    s_.requests.emplace(a.request, std::move(r));
  }
  // Confirmed shared pages come back cached (issue 24); with sharing off they are freed below.
  const uint32_t adopted_shared = prefix_.Adopt(shared);
  uint32_t reheld = 0;  // issue 24: the adopted requests hold their shared prefix pages again (their records' chains)
  for (const AdoptedRequest& a : requests) reheld += prefix_.HoldAdopted(s_.requests.at(a.request), a.prefix, a.page_rows);
  if (HostJournal* journal = const_cast<HostJournal*>(s_.host.journal())) {
    for (PageIndex p = 0; p < s_.host.pages(); ++p) {
      if (!s_.host.is_allocated(p)) journal->Free(p);  // assigned, never confirmed: lost as FenceGpu loses it
    }
  }
  if (adopted_shared > 0) {
    spdlog::info("memd: adopted {} shared prefix pages from the journal; {} references of adopted requests restored",
                 adopted_shared, reheld);
  }
  s_.counters.requests_adopted += requests.size();
  s_.counters.host_pages_adopted += kept;
  s_.counters.host_pages_held += s_.host.HoldReusable();
  spdlog::info("memd: adopted {} interrupted requests holding {} confirmed host pages from the journal",
               requests.size(), kept);
  return absl::OkStatus();
}

void Recovery::ReleaseHeldPages() {
  if (const uint32_t n = s_.host.ReleaseHeld(); n > 0) spdlog::info("memd: {} held host pages are reusable now", n);
}

absl::Status Recovery::CheckResume(const AdmitRequest& a) const {
  if (a.host_backed != (a.resume_of != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d: host_backed is %s and resume_of is %d: a resume sets both (host_backed and the interrupted "
        "request it continues)", a.request, a.host_backed ? "true" : "false", a.resume_of));
  }
  if (a.resume_of == 0) return absl::OkStatus();
  auto it = s_.requests.find(a.resume_of);
  if (it == s_.requests.end()) {
    return absl::NotFoundError(absl::StrFormat("request %d resumes request %d, which is unknown", a.request,
                                               a.resume_of));
  }
  const Request& old = it->second;
  if (old.state != RequestState::kInterrupted) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d resumes request %d, which is %s, not interrupted",
                                                      a.request, a.resume_of, RequestStateName(old.state)));
  }
  if (old.gpu != a.gpu) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d (GPU %d) resumes request %d of GPU %d: only its own GPU's worker resumes it", a.request, a.gpu,
        a.resume_of, old.gpu));
  }
  for (uint32_t h = a.context_pages; h < old.history.size(); ++h) {
    if (old.history[h].state == HistoryState::kHost) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request %d has %d context pages, but request %d it resumes kept a host copy of history page %d",
          a.request, a.context_pages, a.resume_of, h));
    }
  }
  return absl::OkStatus();
}

void Recovery::TakeOver(Request& r, RequestId interrupted) {
  Request& old = s_.requests.at(interrupted);
  uint32_t leading = 0;  // for the log: the run a worker that reads no host_backed_pages imports
  for (uint32_t h = 0; h < old.history.size(); ++h) {
    const HistoryPage& hp = old.history[h];
    if (hp.state != HistoryState::kHost) continue;  // kLost: no host page, the worker recomputes those rows
    if (!prefix_.Rehold(hp.host_page, old.id, r.id)) {  // a shared page's reference moves (issue 24)
      DHS_CHECK_OK(s_.host.Transfer(hp.host_page, r.id, h, r.context_pages));
    }
    r.resumed_host.emplace(h, hp.host_page);
    r.resumed_checksums.emplace(h, hp.checksum);
    if (h == leading) ++leading;
  }
  s_.requests.erase(interrupted);
  const auto taken = static_cast<uint32_t>(r.resumed_host.size());
  ++s_.counters.resumes;
  s_.counters.host_pages_resumed += taken;
  spdlog::info("memd: request {} resumes interrupted request {}: {} host pages taken over ({} leading, {} after a "
               "gap)", r.id, interrupted, taken, leading, taken - leading);
}

// An interrupted request: no GPU page, slot, reclaim or copy; each history page kHost (its own host page, claimed in
// `host_pages`) or kLost; it owns exactly its kHost pages in the host pool.
absl::Status Recovery::CheckInterrupted(const Request& r, std::set<PageIndex>& host_pages) const {
  if (r.slot != kNoSlot || !r.required.empty() || r.optional != 0 || r.reclaim != 0 || r.backoff || r.victim_key) {
    return absl::InternalError(absl::StrFormat("interrupted request %d holds a slot, GPU pages or a reclaim", r.id));
  }
  uint32_t kept = 0;
  for (uint32_t h = 0; h < r.history.size(); ++h) {
    const HistoryPage& hp = r.history[h];
    if (hp.copy != 0 || (hp.state != HistoryState::kHost && hp.state != HistoryState::kLost)) {
      return absl::InternalError(absl::StrFormat("interrupted request %d page %d: %s, copy %d", r.id, h,
                                                 HistoryStateName(hp.state), hp.copy));
    }
    if (hp.state == HistoryState::kLost) continue;
    ++kept;
    if (prefix_.Holds(r.id, hp.host_page)) continue;  // a shared reference (PrefixSharing::CheckInvariants)
    if (absl::Status s = CheckJournal(r, h); !s.ok()) return s;
    if (!s_.host.is_allocated(hp.host_page) || s_.host.owner(hp.host_page) != r.id ||
        !host_pages.insert(hp.host_page).second) {
      return absl::InternalError(absl::StrFormat("interrupted request %d page %d: host page %d not its own", r.id, h,
                                                 hp.host_page));
    }
  }
  if (s_.host.pages_of(r.id) != kept - prefix_.Held(r) || r.host_only != kept) {
    return absl::InternalError(absl::StrFormat("interrupted request %d: %d host pages owned, %d kept, host_only %d",
                                               r.id, s_.host.pages_of(r.id), kept, r.host_only));
  }
  return absl::OkStatus();
}

absl::Status Recovery::CheckQueuedResume(const Request& r, std::set<PageIndex>& host_pages) const {
  const HostJournal* journal = s_.host.journal();
  for (const auto& [h, p] : r.resumed_host) {
    if (h < r.context_pages && prefix_.Holds(r.id, p)) continue;  // a shared reference (issue 24)
    if (h >= r.context_pages || !s_.host.is_allocated(p) || s_.host.owner(p) != r.id || !host_pages.insert(p).second) {
      return absl::InternalError(absl::StrFormat("queued request %d: resumed host page %d (history page %d of %d) "
                                                 "not its own", r.id, p, h, r.context_pages));
    }
    if (journal == nullptr) continue;
    const JournalEntry e = journal->Read(p);
    if (e.owner != r.id || e.history_page != h || e.context_pages != r.context_pages ||
        e.state != JournalState::kConfirmed) {
      return absl::InternalError(absl::StrFormat(
          "queued request %d: journal entry of its taken-over host page %d says state %d, owner %d, page %d of %d "
          "(history page %d expected, confirmed)", r.id, p, static_cast<int>(e.state), e.owner, e.history_page,
          e.context_pages, h));
    }
  }
  return absl::OkStatus();
}

absl::Status Recovery::CheckJournal(const Request& r, uint32_t h) const {
  const HostJournal* journal = s_.host.journal();
  if (journal == nullptr) return absl::OkStatus();
  const HistoryPage& hp = r.history[h];
  if (prefix_.Holds(r.id, hp.host_page)) return prefix_.CheckJournal(hp.host_page);  // kShared (issue 24)
  const JournalEntry e = journal->Read(hp.host_page);
  const bool confirmed = hp.state == HistoryState::kHost || hp.state == HistoryState::kPopulating ||
                         hp.state == HistoryState::kGpuAndHost;
  if (e.owner != r.id || e.history_page != h || e.context_pages != r.context_pages ||
      (e.state == JournalState::kConfirmed) != confirmed || e.state == JournalState::kFree) {
    return absl::InternalError(absl::StrFormat(
        "request %d history page %d (%s): journal entry of host page %d says state %d, owner %d, page %d of %d", r.id,
        h, HistoryStateName(hp.state), hp.host_page, static_cast<int>(e.state), e.owner, e.history_page,
        e.context_pages));
  }
  if (confirmed && e.checksum != hp.checksum) {  // issue 22: the journal keeps the confirmed copy's checksum
    return absl::InternalError(absl::StrFormat("request %d history page %d: journal checksum %#x, core %#x", r.id, h,
                                               e.checksum, hp.checksum));
  }
  return absl::OkStatus();
}

uint32_t Recovery::epoch(GpuId gpu) const {
  auto it = s_.epochs.find(gpu);
  return it == s_.epochs.end() ? 0 : it->second;
}

bool Recovery::fenced(GpuId gpu) const { return s_.epochs.contains(gpu) && !s_.gpus.contains(gpu); }

std::vector<RequestId> Recovery::InterruptedRequests(GpuId gpu) const {
  std::vector<RequestId> out;
  for (const auto& [id, r] : s_.requests) {
    if (r.gpu == gpu && r.state == RequestState::kInterrupted) out.push_back(id);
  }
  return out;
}

std::map<uint32_t, PageIndex> Recovery::InterruptedHostPages(RequestId request) const {
  std::map<uint32_t, PageIndex> out;
  auto it = s_.requests.find(request);
  if (it == s_.requests.end() || it->second.state != RequestState::kInterrupted) return out;
  for (uint32_t h = 0; h < it->second.history.size(); ++h) {
    if (it->second.history[h].state == HistoryState::kHost) out[h] = it->second.history[h].host_page;
  }
  return out;
}

std::string Recovery::FenceReason(GpuId gpu) const {
  auto it = fence_reasons_.find(gpu);
  return fenced(gpu) && it != fence_reasons_.end() ? it->second : std::string();
}

}  // namespace dhs::memd
