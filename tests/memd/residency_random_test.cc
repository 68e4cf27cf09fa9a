// Randomized state-machine test of ResidencyManager (brief §4) driven through the events memd's daemon really sends:
// admissions with host pages for the whole context (some with optional_history = false, some that can never fit),
// HostCopyWritten confirmations (some failing), ReclaimOrders answered by BackupComplete over random subsets of pages
// (some failing, some deferred), ReadersDone sent early (before the order's population copies reported),
// PopulateOrders answered by ReadyPublish over random subsets (some failing), Complete at any time (queued, admitted,
// reclaiming, with copies in flight), population attempts and retries, and malformed reports that must change nothing.
//
// A fake worker holds every outstanding order; the test keeps its own model of each request's pages (on GPU, being
// populated, host copy confirmed, covered by the worker's tail, backup in flight) and checks, after every event:
// CheckInvariants, the safety invariant from the model, every GPU page's owner and state, host coverage, slots, pinned
// host pages = copies in flight, open orders, and that a Retire comes exactly when the model says the reclaim is done
// (readers done, no backup or population copy in flight), with regranted_to and CompleteAck.released_pages computed by
// the model. At the end everything is answered and completed: every GPU page free, no host page pinned or allocated,
// no order entry left.
// Fences (issue 11): FenceGpu at random points (with backups, populations, reclaims and queued admissions in flight),
// then RegisterGpu of the fenced GPU at a random later point (a new epoch). The model: queued admissions of the GPU
// are rejected UNAVAILABLE; granted requests become interrupted and keep exactly the host pages whose host copy was
// confirmed (never a page whose backup was only in flight); the fake worker forgets every order of the GPU; after
// every event no copy, order, slot or GPU page of a fenced GPU remains and pinned host pages = copies in flight.
// Resumes (issue 11): a new request of a live GPU takes over an interrupted request of that GPU (Admit with
// resume_of) at random points, some with bad input that must change nothing (wrong GPU, context smaller than the kept
// pages, host_backed without resume_of, unknown or not interrupted). The model: the interrupted request ends in that
// event; EVERY kept host page goes to the new request under the same history page, gaps and all (held while it is
// queued), none is freed; the grant gives exactly those host pages to those history pages with a confirmed host copy
// (host_backed_pages = the kept history pages, imported_pages = their leading run), fresh host pages to the others,
// and no optional GPU page; a queued resume rejected by a fence or completed frees them. Drain checks none leaks.
// memd restarts (issue 11): the core writes its host journal (memd/host_journal.h) into a buffer; CheckInvariants
// checks it against the core after every event. At random points memd "dies": a new core gets a copy of the journal
// bytes, Verify()s them and adopts them (AdoptHostPages); every GPU's worker then says Hello. The model: exactly what
// FenceGpu of every GPU leaves (granted requests interrupted with their confirmed host copies, queued admissions
// gone), except requests that hold no host page (interrupted with no host copy left, or a context of 0 pages), which
// the journal cannot name (gone too; memd's daemon restores those from their request records, docs/operations.md).
// Seeds: 1..20 by default, or the one in env DHS_SEED; events per seed: env DHS_EVENTS (2000).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "memd/host_journal.h"
#include "memd/residency_manager.h"
#include "memd/request_state.h"
#include "tests/memd/residency_test_util.h"
#include "spdlog/spdlog.h"

namespace dhs::memd {
namespace {

constexpr uint32_t kGpus = 2, kM = 24, kRes = 2, kHost = 96, kSlots = 5;
// Speculation shares (issue 13): every GPU's Hello declares a draft ring of at most 2 pages and staging of at most one
// page per slot for its kSlots slots; admissions declare random shares up to those, inside their required pages.
constexpr uint64_t kGpuPageBytes = 4096, kRingSlotBytes = 2 * kGpuPageBytes, kStagingSlotBytes = kGpuPageBytes;
constexpr GpuDeclaration kDeclared{kGpuPageBytes, kSlots * kRingSlotBytes, kSlots * kStagingSlotBytes};

uint32_t PagesOf(uint64_t bytes) { return static_cast<uint32_t>((bytes + kGpuPageBytes - 1) / kGpuPageBytes); }

struct MPage {
  PageIndex host_page = 0;
  bool on_gpu = false;       // holds a GPU page (kept, populating, ready, reclaiming)
  PageIndex gpu_page = 0;
  bool populating = false;   // population copy in flight: not readable yet
  bool written = false;      // complete host copy confirmed (backup done, HostCopyWritten)
  bool tail = false;         // covered by the worker's tail (not kept at the grant, or a deferred backup)
  bool backup = false;       // a backup copy in flight
  bool lost = false;         // interrupted by a fence without a confirmed host copy: host page freed
};
struct MReq {
  GpuId gpu = 0;
  bool granted = false;
  SlotIndex slot = 0;
  uint32_t required = 0, complete = 0, context = 0;
  bool optional_history = true;
  std::vector<PageIndex> required_pages;
  std::vector<MPage> pages;
  OrderId reclaim = 0;  // the live reclaim (0: none)
  bool interrupted = false;  // its GPU was fenced while it was granted
  std::map<uint32_t, PageIndex> resumed_host;  // a resume: history page -> host page it took over (every kept one)
  RequestId resume_of = 0;              // admitted as a resume of it (a fence while queued interrupts it again)
  uint32_t epoch = 1;        // its GPU's epoch at its admission
  SpeculationShare share;    // its slot's draft ring and staging (inside `required`); none once interrupted
};
struct FakeReclaim {
  RequestId request = 0;
  GpuId gpu = 0;
  std::set<PageIndex> pages;                // GPU pages still in the reclaim
  std::map<PageIndex, uint32_t> backups;    // unreported backups: GPU page -> history page
  std::map<PageIndex, PageIndex> targets;   // GPU page -> host page of unreported backups
  bool failed = false, readers_sent = false, gone = false;  // gone: request completed
};
struct FakePopulate {
  RequestId request = 0;
  GpuId gpu = 0;
  std::map<PageIndex, std::pair<uint32_t, PageIndex>> pages;  // unreported: GPU page -> (history page, host page)
};

class Harness : Dice {
 public:
  Harness(uint64_t seed, const std::string& policy)
      : Dice(seed),
        view_rng_(seed ^ 0x9e3779b97f4a7c15ULL),
        share_rng_(seed ^ 0x5851f42d4c957f2dULL),
        journal_(kHost),
        policy_(policy) {
    ResidencyConfig c{.reserve_pages = kRes, .host_pages = kHost, .host_page_bytes = 4096,
                      .populate_pages_per_attempt = 3, .reclaim_policy = policy};
    mgr_ = std::move(*ResidencyManager::Create(c, [this] { return now_; }, journal_.get()));
    for (GpuId g = 0; g < kGpus; ++g) EXPECT_TRUE(mgr_->RegisterGpu(g, kM, kSlots, kDeclared).ok());
    epochs_.assign(kGpus, 1);
    up_.assign(kGpus, true);
  }

  void Step() {
    ++now_;
    const int dice = static_cast<int>(Pick(100));
    if (dice < 16 && model_.size() < 16) return Admit();
    if (dice == 16 && Pick(4) == 0) return Fence();
    // Restarts only in the first half of a default run: the counters summed at the end are the last core's.
    if (dice == 16 && Pick(3) == 0 && now_ < 1000) return RestartMemd();
    if (dice == 17) return Reregister();
    if (dice == 18 || dice == 19) return Resume();
    if (dice == 18 && Pick(2) == 0) return Run(mgr_->ReleaseHeldPages());  // the adoption's grace period ends
    if (dice < 24 && !model_.empty()) return Run(mgr_->Complete(PickKey(model_)), /*complete=*/true);
    if (dice < 34) return Written();
    if (dice < 50) return AnswerBackup(Pick(8) != 0);
    if (dice < 60) return SendReadersDone();
    if (dice < 76) return AnswerPopulate(Pick(8) != 0);
    if (dice < 78) return Malformed();
    if (dice < 94) return Run(mgr_->Populate());
    return Run(mgr_->RetryBackups());
  }

  // Answers everything (ok), completes every request; then everything must be released.
  void Drain() {
    Run(mgr_->ReleaseHeldPages());
    for (GpuId g = 0; g < kGpus; ++g) {
      if (!up_[g]) Reregister(g);
    }
    for (int guard = 0; guard < 100000; ++guard) {
      if (HasBackups()) {
        AnswerBackup(true);
      } else if (!populates_.empty()) {
        AnswerPopulate(true);
      } else if (ReadersDoneDue()) {
        SendReadersDone();
      } else if (!model_.empty()) {
        Run(mgr_->Complete(model_.begin()->first), true);
      } else {
        break;
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (GpuId g = 0; g < kGpus; ++g) EXPECT_EQ(mgr_->gpu_table(g)->free(), kM) << "GPU " << g;
    EXPECT_EQ(mgr_->host().reusable(), kHost);
    EXPECT_EQ(mgr_->host().pinned(), 0u);
    EXPECT_EQ(mgr_->host().allocated(), 0u);
    EXPECT_EQ(mgr_->open_orders(), 0u);
    EXPECT_EQ(mgr_->copies_in_flight(), 0u);
    EXPECT_TRUE(reclaims_.empty());
  }

  const Counters& counters() const { return mgr_->counters(); }
  uint64_t early_readers_done() const { return early_readers_done_; }
  uint64_t regranted() const { return regranted_; }
  uint64_t slot_waits() const { return slot_waits_; }
  uint64_t fenced_with_copies() const { return fenced_with_copies_; }
  uint64_t kept_pages() const { return kept_pages_; }
  uint64_t lost_backups() const { return lost_backups_; }
  uint64_t resumed_pages() const { return resumed_pages_; }
  uint64_t resumed_pages_since_restart() const { return resumed_pages_since_restart_; }
  uint64_t resume_refusals() const { return resume_refusals_; }
  uint64_t resumes_with_gaps() const { return resumes_with_gaps_; }  // took over kept pages after a lost one
  uint64_t resumes_rejected() const { return resumes_rejected_; }    // never fit after the take-over (took_over)
  uint64_t bad_shares() const { return bad_shares_; }                // admissions refused for their share
  uint64_t bad_share_reports() const { return bad_share_reports_; }  // reports refused for their share
  uint64_t max_share_pages() const { return max_share_pages_; }      // the most share pages one GPU held at once
  uint64_t restarts() const { return restarts_; }
  // Request-state changes seen between two checks, per (from, to) (CheckRequestStates).
  const std::map<std::pair<RequestState, RequestState>, uint64_t>& state_moves() const { return state_moves_; }
  uint64_t survived() const { return survived_; }
  uint64_t reported() const { return reported_; }
  uint64_t refused_reports() const { return refused_reports_; }

 private:
  bool HasBackups() const {
    return std::any_of(reclaims_.begin(), reclaims_.end(), [](const auto& r) { return !r.second.backups.empty(); });
  }
  bool Due(const FakeReclaim& f) const { return !f.readers_sent && !f.failed && f.backups.empty(); }
  bool ReadersDoneDue() const {
    return std::any_of(reclaims_.begin(), reclaims_.end(), [&](const auto& r) { return Due(r.second); });
  }

  void Admit() {
    const RequestId r = next_id_++;
    AdmitRequest a;
    a.request = r;
    a.gpu = Pick(kGpus);
    if (!up_[a.gpu]) {  // a fenced GPU has no page accounting: refused, nothing changes
      a.required_pages = 1;
      const absl::Status s = mgr_->Admit(a);
      EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
      EXPECT_TRUE(mgr_->DrainOrders().empty());
      return Check();
    }
    a.required_pages = Pick(40) == 0 ? kM : 1 + Pick(5);  // some can never fit
    a.history_pages = Pick(9);
    a.context_pages = a.history_pages + Pick(4) + (Pick(60) == 0 ? kHost : 0);
    a.optional_history = Pick(4) != 0;
    a.speculation = RandomShare();
    a.required_pages += static_cast<uint32_t>(a.speculation.pages());
    MReq& m = model_[r];
    m.share = a.speculation;
    m.gpu = a.gpu;
    m.epoch = epochs_[a.gpu];
    m.required = a.required_pages;
    m.complete = a.history_pages;
    m.context = a.context_pages;
    m.optional_history = a.optional_history;
    Run(mgr_->Admit(a));
  }

  // The restarted worker of a live GPU resumes one of its interrupted requests (Admit with resume_of); sometimes the
  // admission is bad and must be refused whole.
  void Resume() {
    const std::vector<RequestId> interrupted = InterruptedOnLiveGpus(model_, up_);
    if (interrupted.empty()) return Run(mgr_->Populate());
    const RequestId old = interrupted[Pick(static_cast<uint32_t>(interrupted.size()))];
    const MReq& om = model_.at(old);
    std::map<uint32_t, PageIndex> kept;  // every confirmed host copy, gaps and all
    for (uint32_t h = 0; h < om.pages.size(); ++h) {
      if (!om.pages[h].lost) kept.emplace(h, om.pages[h].host_page);
    }
    const uint32_t span = kept.empty() ? 0 : kept.rbegin()->first + 1;  // the context must hold the last kept page
    AdmitRequest a;
    a.request = next_id_++;
    a.gpu = om.gpu;
    a.required_pages = 1 + Pick(5);
    a.history_pages = Pick(9);
    a.context_pages = std::max<uint32_t>(a.history_pages, span) + Pick(3);
    // Sometimes more context than the host pool: it never fits, and is rejected after it took `old` over (the reject
    // names it: took_over).
    if (Pick(10) == 0) a.context_pages = kHost + 1 + Pick(3);
    a.optional_history = Pick(4) != 0;
    a.host_backed = true;
    a.resume_of = old;
    a.speculation = RandomShare();
    a.required_pages += static_cast<uint32_t>(a.speculation.pages());
    if (Pick(5) == 0) return ResumeRefused(a, span);
    MReq m;
    m.share = a.speculation;
    m.gpu = a.gpu;
    m.epoch = epochs_[a.gpu];
    m.required = a.required_pages;
    m.complete = a.history_pages;
    m.context = a.context_pages;
    m.optional_history = a.optional_history;
    resumed_pages_ += kept.size();
    resumed_pages_since_restart_ += kept.size();
    if (!kept.empty() && kept.size() < span) ++resumes_with_gaps_;
    m.resumed_host = std::move(kept);
    m.resume_of = old;
    model_.erase(old);
    model_[a.request] = std::move(m);
    Run(mgr_->Admit(a));
    ASSERT_TRUE(mgr_->InterruptedHostPages(old).empty());
  }

  // A bad resume (one of five kinds) is refused with its code and changes nothing (Check sees any change).
  void ResumeRefused(AdmitRequest a, uint32_t span) {
    absl::StatusCode want = absl::StatusCode::kInvalidArgument;
    switch (Pick(5)) {
      case 0:  // another GPU: NotFound while that one is fenced, else InvalidArgument
        a.gpu = 1 - a.gpu;
        if (!up_[a.gpu]) want = absl::StatusCode::kNotFound;
        break;
      case 1:  // a context that does not hold the last kept page
        if (span == 0) return;
        a.context_pages = span - 1;
        a.history_pages = 0;
        break;
      case 2: a.resume_of = 0; break;  // host_backed without resume_of
      case 3: a.resume_of = 1'000'000'000; want = absl::StatusCode::kNotFound; break;  // unknown
      default: {  // a request that is not interrupted
        RequestId live = 0;
        for (const auto& [id, m] : model_) {
          if (!m.interrupted) live = id;
        }
        if (live == 0) return;
        a.resume_of = live;
      }
    }
    const uint64_t errors = mgr_->counters().event_errors;
    const absl::Status s = mgr_->Admit(a);
    ASSERT_EQ(s.code(), want) << s;
    ++resume_refusals_;
    EXPECT_EQ(mgr_->counters().event_errors, errors + 1);
    EXPECT_TRUE(mgr_->DrainOrders().empty());
    Check();
  }

  // The worker confirms host copies: mostly pages its tail covers, sometimes any page (a kept page, a repeat).
  void Written() {
    std::vector<RequestId> granted;
    for (const auto& [id, m] : model_) {
      if (m.granted && !m.interrupted && !m.pages.empty()) granted.push_back(id);
    }
    if (granted.empty()) return Run(mgr_->Populate());
    const RequestId r = granted[Pick(static_cast<uint32_t>(granted.size()))];
    MReq& m = model_.at(r);
    std::vector<uint32_t> pages;
    for (uint32_t h = 0; h < m.pages.size(); ++h) {
      if ((m.pages[h].tail && !m.pages[h].written) ? Pick(2) == 0 : Pick(12) == 0) pages.push_back(h);
    }
    if (pages.empty()) pages.push_back(Pick(static_cast<uint32_t>(m.pages.size())));
    const bool ok = Pick(6) != 0;
    if (ok) {
      for (uint32_t h : pages) {
        MPage& mp = m.pages[h];
        // A kept page (on GPU, no host copy, no copy in flight) written outside a reclaim: the worker did not keep it,
        // memd frees its GPU page (contract §3). In a reclaim, or with a backup in flight, it stays on GPU.
        if (mp.on_gpu && !mp.written && !mp.tail && !mp.backup && !mp.populating && m.reclaim == 0) mp.on_gpu = false;
        mp.written = true;
      }
    }
    std::vector<PageIndex> host;
    if (Pick(2) == 0) {
      for (uint32_t h : pages) host.push_back(m.pages[h].host_page);
    }
    std::vector<uint64_t> sums;  // issue 22: random checksums (or none); the invariants check the journal keeps them
    if (Pick(3) != 0) {
      for (size_t i = 0; i < pages.size(); ++i) sums.push_back(Pick(1000));
    }
    Run(mgr_->OnHostCopyWritten(r, pages, host, ok, sums));
  }

  // A queued resume whose GPU is fenced (or whose memd restarted): interrupted, the history pages it took over on
  // their host pages (confirmed copies), the rest of its context lost.
  static void InterruptQueuedResume(MReq& m) {
    m.granted = true;
    m.interrupted = true;
    m.pages.assign(m.context, MPage{});
    for (uint32_t h = 0; h < m.context; ++h) {
      m.pages[h].lost = !m.resumed_host.contains(h);
      m.pages[h].written = !m.pages[h].lost;
      if (m.pages[h].written) m.pages[h].host_page = m.resumed_host.at(h);
    }
    m.resumed_host.clear();
    m.resume_of = 0;  // interrupted again: no longer a resume (as memd's Recovery::InterruptQueuedResume)
  }

  // The worker of a random live GPU is gone. The model applies the fence first (so Run's expected Retires see no
  // reclaim of the GPU), then the event runs.
  void Fence() {
    std::vector<GpuId> live;
    for (GpuId g = 0; g < kGpus; ++g) {
      if (up_[g]) live.push_back(g);
    }
    if (live.empty()) return Run(mgr_->Populate());
    const GpuId g = live[Pick(static_cast<uint32_t>(live.size()))];
    fenced_with_copies_ += mgr_->copies_in_flight() > 0;
    for (auto it = model_.begin(); it != model_.end();) {
      MReq& m = it->second;
      if (m.gpu != g || m.interrupted) {
        ++it;
        continue;
      }
      if (!m.granted && m.resume_of != 0) {  // a queued resume is interrupted again, with the host pages it took over
        InterruptQueuedResume(m);
        ++it;
        continue;
      }
      if (!m.granted) {  // answered with UNAVAILABLE by this event
        fence_rejects_.insert(it->first);
        it = model_.erase(it);
        continue;
      }
      m.interrupted = true;
      m.reclaim = 0;
      m.required_pages.clear();
      for (MPage& mp : m.pages) {
        lost_backups_ += mp.backup && !mp.written;
        mp.lost = !mp.written;  // a backup in flight, a deferred one or the worker's tail: not a host copy
        kept_pages_ += mp.written;
        mp.on_gpu = mp.populating = mp.backup = mp.tail = false;
      }
      ++it;
    }
    std::erase_if(reclaims_, [g](const auto& r) { return r.second.gpu == g; });
    std::erase_if(populates_, [g](const auto& p) { return p.second.gpu == g; });
    up_[g] = false;
    Run(mgr_->FenceGpu(g));
    ASSERT_TRUE(fence_rejects_.empty()) << "a queued admission of the fenced GPU was not rejected";
    ASSERT_TRUE(mgr_->fenced(g));
    ASSERT_EQ(mgr_->gpu_table(g), nullptr);
    // A fenced worker starts a new epoch: a re-Hello with a report is for a memd restart only.
    ASSERT_EQ(mgr_->AdoptGpu(g, kM, kSlots, epochs_[g], {}).code(), absl::StatusCode::kFailedPrecondition);
    const absl::Status again = mgr_->FenceGpu(g);
    ASSERT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
    const absl::Status reg_live = live.size() > 1
                                      ? mgr_->RegisterGpu(live[0] == g ? live[1] : live[0], kM, kSlots, kDeclared)
                                      : absl::AlreadyExistsError("");
    ASSERT_EQ(reg_live.code(), absl::StatusCode::kAlreadyExists) << "a live GPU registered twice";
    ASSERT_TRUE(mgr_->DrainOrders().empty());
  }

  // memd is SIGKILLed: a new core adopts a copy of the journal as the segment holds it, then every GPU's new worker
  // says Hello. The model first becomes what FenceGpu of every GPU leaves.
  void RestartMemd() {
    std::vector<uint64_t> copy = journal_.Snapshot();  // the dead memd's bytes, as the segment keeps them
    std::vector<bool> survives(kGpus);  // its worker lives on and says Hello again with a report (AdoptGpu)
    for (GpuId g = 0; g < kGpus; ++g) survives[g] = up_[g] && Pick(2) == 0;
    for (auto it = model_.begin(); it != model_.end();) {
      MReq& m = it->second;
      if (survives[m.gpu] && m.granted && !m.interrupted) {  // continues untouched, the dead memd's orders resolved
        Survive(m);
        ++it;
        continue;
      }
      // A queued resume owns the host pages it took over (journaled as their history pages, confirmed):
      // the new memd adopts it as an interrupted request holding them (one with none is gone, below).
      if (!m.granted && m.resume_of != 0) InterruptQueuedResume(m);
      const bool any_written = std::any_of(m.pages.begin(), m.pages.end(), [](const MPage& p) { return p.written; });
      // Queued: gone with memd. Holding no host page (interrupted without a host copy, or a context of 0 pages): no
      // journal entry names it, gone too.
      if (!m.granted || (m.interrupted ? !any_written : m.context == 0)) {
        it = model_.erase(it);
        continue;
      }
      m.interrupted = true;
      m.reclaim = 0;
      m.required_pages.clear();
      for (MPage& mp : m.pages) {
        mp.lost = mp.lost || !mp.written;
        mp.on_gpu = mp.populating = mp.backup = mp.tail = false;
      }
      ++it;
    }
    reclaims_.clear();
    populates_.clear();
    journal_.Restore(std::move(copy));
    auto verified = journal_->Verify();
    ASSERT_TRUE(verified.ok()) << verified.status();
    std::vector<AdoptedRequest> adopted;
    for (const auto& [id, jr] : *verified) {
      ASSERT_TRUE(model_.contains(id)) << "the journal names request " << id << " the model does not hold";
      const MReq& m = model_.at(id);
      ASSERT_EQ(jr.context_pages, m.context) << "request " << id;
      adopted.push_back(AdoptedRequest{id, m.gpu, m.epoch, jr.context_pages, jr.confirmed, jr.checksums});
    }
    // A surviving worker's request with a context of 0 pages holds no host page: only its report names it.
    const auto unjournaled = std::count_if(model_.begin(), model_.end(), [&](const auto& e) {
      return survives[e.second.gpu] && !e.second.interrupted && e.second.context == 0;
    });
    ASSERT_EQ(adopted.size() + unjournaled, model_.size()) << "a request the model holds is missing from the journal";
    ResidencyConfig c{.reserve_pages = kRes, .host_pages = kHost, .host_page_bytes = 4096,
                      .populate_pages_per_attempt = 3, .reclaim_policy = policy_};
    mgr_ = std::move(*ResidencyManager::Create(c, [this] { return now_; }, journal_.get()));
    ++restarts_;
    states_.clear();  // a new core: it rebuilds its requests (adopted interrupted, then reported ones admitted)
    resumed_pages_since_restart_ = 0;
    std::vector<AdoptedRequest> bad = adopted;
    if (!bad.empty()) {  // a bad list changes nothing
      bad.push_back(bad.front());
      ASSERT_EQ(mgr_->AdoptHostPages(bad).code(), absl::StatusCode::kInvalidArgument);
    }
    const absl::Status adopt = mgr_->AdoptHostPages(adopted);
    ASSERT_TRUE(adopt.ok()) << adopt;
    ASSERT_TRUE(mgr_->CheckInvariants().ok()) << mgr_->CheckInvariants();
    ASSERT_TRUE(mgr_->DrainOrders().empty());
    for (const AdoptedRequest& a : adopted) ASSERT_EQ(mgr_->InterruptedHostPages(a.request), a.host_pages);
    ASSERT_EQ(mgr_->host().held() + mgr_->host().allocated(), kHost);  // nothing reusable until ReleaseHeldPages
    if (!adopted.empty()) ASSERT_EQ(mgr_->AdoptHostPages(adopted).code(), absl::StatusCode::kFailedPrecondition);
    for (GpuId g = 0; g < kGpus; ++g) {
      if (survives[g]) SurvivorHello(g, adopted);
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (GpuId g = 0; g < kGpus; ++g) {
      if (survives[g]) continue;
      epochs_[g] = 0;
      for (const AdoptedRequest& a : adopted) {
        if (a.gpu == g) epochs_[g] = std::max(epochs_[g], a.epoch);
      }
      ASSERT_EQ(mgr_->fenced(g), epochs_[g] > 0);
      up_[g] = epochs_[g] == 0;
      if (up_[g]) {  // a GPU memd knows nothing of: its first registration
        epochs_[g] = 1;
        ASSERT_TRUE(mgr_->RegisterGpu(g, kM, kSlots, kDeclared).ok());
      }
    }
    ASSERT_TRUE(mgr_->DrainOrders().empty());
    for (GpuId g = 0; g < kGpus; ++g) {
      if (!up_[g]) Reregister(g);  // the new epoch follows the adopted requests' one
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  // A worker whose memd died resolves the dead memd's orders before it reports (docs/protocol.md): a population in
  // flight is undone (its page was not readable yet); a reclaim whose ReadersDone was sent drops its pages (each has a
  // host copy or the tail), any other reclaim is abandoned (its pages stay kept on GPU); a backup in flight was never
  // confirmed (no host copy). Pages neither on GPU nor confirmed are in the worker's tail.
  void Survive(MReq& m) {
    const bool dropped = m.reclaim != 0 && reclaims_.at(m.reclaim).readers_sent;
    for (MPage& mp : m.pages) {
      if (mp.populating || (dropped && mp.on_gpu)) mp.on_gpu = false;
      mp.populating = mp.backup = false;
      mp.tail = !mp.on_gpu && !mp.written;
    }
    m.reclaim = 0;
    ++survived_;
  }

  // The surviving worker of GPU g says Hello again with a report of its granted requests (AdoptGpu), keeping its
  // epoch. Some reports claim a host copy the journal lacks (ignored: the journal wins); bad ones (a slot or a GPU
  // page taken twice, a page beyond M) are refused alone and change nothing; a report of an epoch below the
  // journal's is refused whole.
  void SurvivorHello(GpuId g, const std::vector<AdoptedRequest>& adopted) {
    std::vector<ReportedRequest> reports;
    for (const auto& [id, m] : model_) {
      if (m.gpu != g || !m.granted || m.interrupted) continue;
      ReportedRequest rep{id, m.slot, m.required_pages, m.complete, m.optional_history, {}, m.share};
      for (const MPage& mp : m.pages) {
        rep.history.push_back({mp.host_page, mp.written || Pick(8) == 0,
                               mp.on_gpu ? std::optional<PageIndex>(mp.gpu_page) : std::nullopt, 0});
      }
      reports.push_back(std::move(rep));
    }
    const size_t good = reports.size();
    if (good > 0 && Pick(2) == 0) {  // another id with the first one's slot and pages
      ReportedRequest twin = reports.front();
      twin.request = next_id_++;
      reports.push_back(std::move(twin));
    }
    if (Pick(3) == 0) reports.push_back(ReportedRequest{next_id_++, kSlots - 1, {kM}, 0, true, {}});
    if (share_rng_() % 3 == 0) {  // a share of more pages than its required ones: refused alone
      reports.push_back(ReportedRequest{next_id_++, kSlots - 1, {0}, 0, true, {},
                                        SpeculationShare{1, 1, kGpuPageBytes, kGpuPageBytes}});
      ++bad_share_reports_;
    }
    uint32_t journal_epoch = 0;
    for (const AdoptedRequest& a : adopted) journal_epoch = a.gpu == g ? std::max(journal_epoch, a.epoch) : journal_epoch;
    if (journal_epoch > 1) {
      ASSERT_EQ(mgr_->AdoptGpu(g, kM, kSlots, journal_epoch - 1, reports).code(),
                absl::StatusCode::kFailedPrecondition);
      ASSERT_TRUE(mgr_->fenced(g));
    }
    std::vector<absl::Status> outcomes;
    const absl::Status s = mgr_->AdoptGpu(g, kM, kSlots, epochs_[g], reports, &outcomes, kDeclared);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(outcomes.size(), reports.size());
    for (size_t i = 0; i < outcomes.size(); ++i) {
      ASSERT_EQ(outcomes[i].ok(), i < good) << "report of request " << reports[i].request << ": " << outcomes[i];
    }
    reported_ += good;
    refused_reports_ += reports.size() - good;
    ASSERT_EQ(mgr_->epoch(g), epochs_[g]);
    ASSERT_EQ(mgr_->AdoptGpu(g, kM, kSlots, epochs_[g], {}).code(), absl::StatusCode::kAlreadyExists);
    ASSERT_TRUE(mgr_->DrainOrders().empty());
    up_[g] = true;
  }

  // A new worker for a fenced GPU says Hello: a new epoch with a fresh page table; interrupted requests stay.
  void Reregister(std::optional<GpuId> which = std::nullopt) {
    std::vector<GpuId> down;
    for (GpuId g = 0; g < kGpus; ++g) {
      if (!up_[g]) down.push_back(g);
    }
    if (down.empty()) return Run(mgr_->Populate());
    const GpuId g = which.value_or(down[Pick(static_cast<uint32_t>(down.size()))]);
    up_[g] = true;
    ++epochs_[g];
    Run(mgr_->RegisterGpu(g, kM, kSlots, kDeclared));
    ASSERT_EQ(mgr_->epoch(g), epochs_[g]);
    ASSERT_FALSE(mgr_->fenced(g));
    std::vector<RequestId> want;
    for (const auto& [id, m] : model_) {
      if (m.gpu == g && m.interrupted) want.push_back(id);
    }
    ASSERT_EQ(mgr_->InterruptedRequests(g), want);
  }

  void AnswerBackup(bool ok) {
    std::vector<OrderId> with;
    for (const auto& [o, f] : reclaims_) {
      if (!f.backups.empty()) with.push_back(o);
    }
    if (with.empty()) return Run(mgr_->Populate());
    const OrderId o = with[Pick(static_cast<uint32_t>(with.size()))];
    FakeReclaim& f = reclaims_.at(o);
    std::vector<PageIndex> pages, deferred;
    for (const auto& [p, h] : f.backups) {
      if (Pick(2) == 0) pages.push_back(p);
    }
    const bool all = pages.empty();  // an empty list reports every unreported backup
    std::vector<PageIndex> reported = pages;
    if (all) {
      for (const auto& [p, h] : f.backups) reported.push_back(p);
    }
    for (PageIndex p : reported) {
      if (ok && Pick(4) == 0) deferred.push_back(p);
    }
    auto it = model_.find(f.request);
    for (PageIndex p : reported) {
      const uint32_t h = f.backups.at(p);
      f.backups.erase(p);
      f.targets.erase(p);
      if (it == model_.end() || f.gone) continue;
      MPage& mp = it->second.pages[h];
      mp.backup = false;
      if (!ok) continue;
      (std::find(deferred.begin(), deferred.end(), p) != deferred.end() ? mp.tail : mp.written) = true;
    }
    if (!ok && it != model_.end() && !f.gone && it->second.reclaim != 0) {  // aborts the request's live reclaim
      reclaims_.at(it->second.reclaim).failed = true;
      it->second.reclaim = 0;
    }
    std::vector<uint64_t> sums;  // issue 22: as above
    if (Pick(3) != 0) {
      for (size_t i = 0; i < pages.size(); ++i) sums.push_back(Pick(1000));
    }
    Run(mgr_->OnBackupComplete(o, pages, ok, deferred, sums));
  }

  // ReadersDone once the worker's own backups of the order reported (none failed); population copies into its pages
  // may still be in flight (early: memd holds it). Also for orders of requests that completed (stale: OK).
  void SendReadersDone() {
    std::vector<OrderId> due;
    for (const auto& [o, f] : reclaims_) {
      if (Due(f)) due.push_back(o);
    }
    if (due.empty()) return Run(mgr_->Populate());
    const OrderId o = due[Pick(static_cast<uint32_t>(due.size()))];
    FakeReclaim& f = reclaims_.at(o);
    f.readers_sent = true;
    for (const auto& [po, fp] : populates_) {
      for (const auto& [p, hp] : fp.pages) early_readers_done_ += f.pages.count(p) && fp.gpu == f.gpu && !f.gone;
    }
    Run(mgr_->OnReadersDone(o));
  }

  void AnswerPopulate(bool ok) {
    if (populates_.empty()) return Run(mgr_->Populate());
    const OrderId o = PickKey(populates_);
    FakePopulate& fp = populates_.at(o);
    std::vector<PageIndex> pages;
    for (const auto& [p, x] : fp.pages) {
      if (Pick(2) == 0) pages.push_back(p);
    }
    std::vector<PageIndex> reported = pages;
    if (pages.empty()) {
      for (const auto& [p, x] : fp.pages) reported.push_back(p);
    }
    auto it = model_.find(fp.request);
    for (PageIndex p : reported) {
      const uint32_t h = fp.pages.at(p).first;
      fp.pages.erase(p);
      if (it == model_.end()) continue;  // orphan: the page is freed now
      MPage& mp = it->second.pages[h];
      mp.populating = false;
      if (ok) continue;
      mp.on_gpu = false;  // nothing published: freed at once, leaves its reclaim
      if (it->second.reclaim != 0) {
        FakeReclaim& f = reclaims_.at(it->second.reclaim);
        f.pages.erase(p);
        if (f.pages.empty()) {  // the reclaim ends without a Retire (nothing was published)
          f.gone = true;
          it->second.reclaim = 0;
        }
      }
    }
    if (fp.pages.empty()) populates_.erase(o);
    Run(mgr_->OnReadyPublish(o, pages, ok));
  }

  // A slot's share: none (speculation off), staging only (no drafter) or both, bytes up to the declared per-slot ones.
  SpeculationShare RandomShare() {
    SpeculationShare share;
    const uint64_t kind = share_rng_() % 3;
    if (kind == 0) return share;
    share.staging_bytes = 1 + share_rng_() % kStagingSlotBytes;
    share.staging_pages = PagesOf(share.staging_bytes);
    if (kind == 2) {
      share.draft_ring_bytes = 1 + share_rng_() % kRingSlotBytes;
      share.draft_ring_pages = PagesOf(share.draft_ring_bytes);
    }
    return share;
  }

  // An admission whose speculation share is bad (one of three kinds) is refused INVALID_ARGUMENT, changes nothing.
  void BadShare() {
    std::vector<GpuId> live;
    for (GpuId g = 0; g < kGpus; ++g) {
      if (up_[g]) live.push_back(g);
    }
    if (live.empty()) return Run(mgr_->Populate());
    AdmitRequest a;
    a.request = next_id_++;
    a.gpu = live[share_rng_() % live.size()];
    a.context_pages = 2;
    a.speculation = SpeculationShare{2, 1, kRingSlotBytes, kStagingSlotBytes};
    a.required_pages = 4;
    switch (share_rng_() % 3) {
      case 0: a.required_pages = 2; break;                // 3 pages of share in 2 required
      case 1: a.speculation.draft_ring_pages = 1; break;  // 8192 bytes are 2 pages of 4096, not 1
      default:                                            // above the GPU's declared total
        a.speculation.staging_bytes = kDeclared.staging_bytes + 1;
        a.speculation.staging_pages = PagesOf(a.speculation.staging_bytes);
        a.required_pages = 2 + a.speculation.staging_pages;
    }
    const uint64_t errors = mgr_->counters().event_errors;
    const absl::Status s = mgr_->Admit(a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(mgr_->counters().event_errors, errors + 1);
    EXPECT_FALSE(mgr_->GpuOfRequest(a.request).has_value());
    EXPECT_TRUE(mgr_->DrainOrders().empty());
    ++bad_shares_;
    Check();
  }

  // Malformed reports are refused whole and change nothing (the checks after the event see any change).
  void Malformed() {
    if (share_rng_() % 4 == 0) return BadShare();
    const uint64_t errors = mgr_->counters().event_errors;
    absl::Status s;
    if (HasBackups()) {
      OrderId o = 0;
      for (const auto& [id, f] : reclaims_) {
        if (!f.backups.empty()) o = id;
      }
      const PageIndex p = reclaims_.at(o).backups.begin()->first;
      s = mgr_->OnBackupComplete(o, {{p, p}}, Pick(2) == 0);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    } else if (!populates_.empty()) {
      s = mgr_->OnBackupComplete(populates_.begin()->first, {}, true);  // a populate order is not a reclaim order
      EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    } else {
      s = mgr_->OnReadyPublish(1'000'000'000, {}, true);
      EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    }
    EXPECT_EQ(mgr_->counters().event_errors, errors + 1);
    EXPECT_TRUE(mgr_->DrainOrders().empty());
    Check();
  }

  // Runs an event that must be accepted, applies its orders to the fake worker and the model, checks everything.
  void Run(absl::Status s, bool complete = false) {
    ASSERT_TRUE(s.ok()) << s;
    std::set<OrderId> due;  // reclaims the model says end with a Retire in this event
    for (const auto& [o, f] : reclaims_) {
      if (f.gone || f.failed || !f.readers_sent || !f.backups.empty()) continue;
      const MReq& m = model_.at(f.request);
      bool busy = false;
      for (const MPage& mp : m.pages) busy |= mp.on_gpu && (mp.backup || mp.populating);
      if (!busy) due.insert(o);
    }
    std::vector<Order> orders = mgr_->DrainOrders();
    if (complete) ApplyComplete(orders);
    std::set<OrderId> retired;
    for (const Order& o : orders) Absorb(o, orders, retired);
    ASSERT_EQ(retired, due) << "Retires of this event differ from the reclaims the model says are done";
    Check();
  }

  void ApplyComplete(const std::vector<Order>& orders) {
    const CompleteAckOrder* ack = nullptr;
    for (const Order& o : orders) {
      if (const auto* a = std::get_if<CompleteAckOrder>(&o)) ack = a;
    }
    ASSERT_NE(ack, nullptr);
    auto it = model_.find(ack->request);
    ASSERT_NE(it, model_.end());
    uint32_t held = 0;
    if (it->second.granted) {
      held = static_cast<uint32_t>(it->second.required_pages.size());
      for (const MPage& mp : it->second.pages) held += mp.on_gpu;
    }
    EXPECT_EQ(ack->released_pages, held) << "request " << ack->request;
    if (it->second.reclaim != 0) reclaims_.at(it->second.reclaim).gone = true;
    for (auto& [o, f] : reclaims_) f.gone |= f.request == ack->request;
    model_.erase(it);
  }

  void Absorb(const Order& o, const std::vector<Order>& all, std::set<OrderId>& retired) {
    if (const auto* g = std::get_if<GrantOrder>(&o)) return OnGrant(*g);
    if (const auto* w = std::get_if<WaitOrder>(&o)) {
      ASSERT_TRUE(model_.count(w->request) && !model_.at(w->request).granted);
      slot_waits_ += SlotsInUse(w->gpu) == kSlots;
      return;
    }
    if (const auto* r = std::get_if<RejectOrder>(&o)) {
      if (fence_rejects_.erase(r->request)) {
        ASSERT_EQ(r->error.code(), absl::StatusCode::kUnavailable) << r->error;
        EXPECT_EQ(r->took_over, 0u) << "a fence rejects only plain requests";
        return;
      }
      ASSERT_TRUE(model_.count(r->request) && !model_.at(r->request).granted);
      const MReq& m = model_.at(r->request);
      EXPECT_TRUE(m.required > kM - kRes || m.context > kHost) << "rejected although it could fit";
      EXPECT_EQ(r->error.code(), absl::StatusCode::kResourceExhausted);
      EXPECT_EQ(r->took_over, m.resume_of) << "a rejected resume names the request it took over (AdmitReject)";
      if (m.resume_of != 0) ++resumes_rejected_;
      model_.erase(r->request);
      return;
    }
    if (const auto* rc = std::get_if<ReclaimOrder>(&o)) return OnReclaim(*rc);
    if (const auto* p = std::get_if<PopulateOrder>(&o)) return OnPopulate(*p);
    if (const auto* rt = std::get_if<RetireOrder>(&o)) return OnRetire(*rt, all, retired);
  }

  uint32_t SlotsInUse(GpuId gpu) const {
    uint32_t n = 0;
    for (const auto& [id, m] : model_) n += m.granted && !m.interrupted && m.gpu == gpu;
    return n;
  }

  void OnGrant(const GrantOrder& g) {
    ASSERT_TRUE(model_.count(g.request));
    MReq& m = model_.at(g.request);
    ASSERT_FALSE(m.granted);
    ASSERT_EQ(g.gpu, m.gpu);
    ASSERT_LT(g.slot, kSlots);
    for (const auto& [id, other] : model_) {
      ASSERT_FALSE(other.granted && !other.interrupted && other.gpu == m.gpu && other.slot == g.slot)
          << "slot " << g.slot << " twice";
    }
    ASSERT_EQ(g.required_pages.size(), m.required);
    ASSERT_LE(g.optional_pages.size(), m.complete);
    if (!m.optional_history) {
      ASSERT_TRUE(g.optional_pages.empty());
    }
    ASSERT_EQ(g.host_pages.size(), m.context);
    const std::map<std::pair<GpuId, PageIndex>, RequestId> owners = ExpectedOwners();
    for (const auto* list : {&g.required_pages, &g.optional_pages}) {
      for (PageIndex p : *list) ASSERT_FALSE(owners.count({g.gpu, p})) << "GPU page " << p << " granted twice";
    }
    const std::set<PageIndex> busy = BusyHostPages();
    for (uint32_t h = 0; h < g.host_pages.size(); ++h) {
      if (m.resumed_host.contains(h)) continue;
      ASSERT_FALSE(busy.count(g.host_pages[h])) << "host page " << g.host_pages[h] << " in use or pinned";
    }
    ASSERT_EQ(std::set<PageIndex>(g.host_pages.begin(), g.host_pages.end()).size(), g.host_pages.size());
    const auto kept = static_cast<uint32_t>(m.resumed_host.size());
    std::vector<uint32_t> backed;  // the model's: every taken-over history page, ascending
    uint32_t leading = 0;
    for (const auto& [h, hp] : m.resumed_host) {
      ASSERT_EQ(g.host_pages[h], hp) << "a resume's history page " << h << " got another host page";
      backed.push_back(h);
      if (h == leading) ++leading;
    }
    ASSERT_EQ(g.host_backed_pages, backed);
    ASSERT_EQ(g.imported_pages, leading);
    if (kept > 0) ASSERT_TRUE(g.optional_pages.empty()) << "a resume kept history on GPU at its grant";
    m.granted = true;
    m.slot = g.slot;
    m.required_pages = g.required_pages;
    m.pages.resize(m.context);
    for (uint32_t h = 0; h < m.context; ++h) {
      MPage& mp = m.pages[h];
      mp.host_page = g.host_pages[h];
      mp.on_gpu = h < g.optional_pages.size();
      mp.gpu_page = mp.on_gpu ? g.optional_pages[h] : 0;
      mp.written = m.resumed_host.contains(h);  // the interrupted request's confirmed host copy
      mp.tail = !mp.on_gpu && !mp.written;
    }
    m.resumed_host.clear();
  }

  void OnReclaim(const ReclaimOrder& rc) {
    ASSERT_TRUE(model_.count(rc.request));
    MReq& m = model_.at(rc.request);
    ASSERT_TRUE(m.granted && m.optional_history);
    ASSERT_EQ(m.reclaim, 0u) << "two live reclaims of request " << rc.request;
    ASSERT_FALSE(reclaims_.count(rc.order) || populates_.count(rc.order)) << "order id reused";
    FakeReclaim f;
    f.request = rc.request;
    f.gpu = rc.gpu;
    std::set<PageIndex> expect_pages, expect_backups;
    for (uint32_t h = 0; h < m.pages.size(); ++h) {
      const MPage& mp = m.pages[h];
      if (!mp.on_gpu) continue;
      expect_pages.insert(mp.gpu_page);
      if (!mp.populating && !mp.written && !mp.tail && !mp.backup) expect_backups.insert(mp.gpu_page);
    }
    ASSERT_EQ(std::set<PageIndex>(rc.gpu_pages.begin(), rc.gpu_pages.end()), expect_pages);
    ASSERT_EQ(std::set<PageIndex>(rc.backup_pages.begin(), rc.backup_pages.end()), expect_backups);
    ASSERT_EQ(rc.backup_host_pages.size(), rc.backup_pages.size());
    for (size_t i = 0; i < rc.backup_pages.size(); ++i) {
      for (uint32_t h = 0; h < m.pages.size(); ++h) {
        MPage& mp = m.pages[h];
        if (!mp.on_gpu || mp.gpu_page != rc.backup_pages[i]) continue;
        ASSERT_EQ(rc.backup_host_pages[i], mp.host_page) << "backup not into the host page assigned at the grant";
        mp.backup = true;
        f.backups[mp.gpu_page] = h;
        f.targets[mp.gpu_page] = mp.host_page;
      }
    }
    f.pages = expect_pages;
    m.reclaim = rc.order;
    reclaims_[rc.order] = std::move(f);
  }

  void OnPopulate(const PopulateOrder& p) {
    ASSERT_TRUE(model_.count(p.request));
    MReq& m = model_.at(p.request);
    ASSERT_TRUE(m.granted && m.optional_history && m.reclaim == 0);
    ASSERT_FALSE(reclaims_.count(p.order) || populates_.count(p.order)) << "order id reused";
    ASSERT_FALSE(p.gpu_pages.empty());
    ASSERT_EQ(p.history_pages.size(), p.gpu_pages.size());
    ASSERT_EQ(p.host_pages.size(), p.gpu_pages.size());
    const std::map<std::pair<GpuId, PageIndex>, RequestId> owners = ExpectedOwners();
    FakePopulate fp;
    fp.request = p.request;
    fp.gpu = p.gpu;
    for (size_t i = 0; i < p.gpu_pages.size(); ++i) {
      ASSERT_LT(p.history_pages[i], m.pages.size());
      MPage& mp = m.pages[p.history_pages[i]];
      ASSERT_TRUE(mp.written && !mp.on_gpu) << "population of a page without a confirmed host copy, or on GPU";
      ASSERT_EQ(p.host_pages[i], mp.host_page);
      ASSERT_FALSE(owners.count({p.gpu, p.gpu_pages[i]})) << "population into a page in use";
      mp.on_gpu = true;
      mp.populating = true;
      mp.gpu_page = p.gpu_pages[i];
      fp.pages[p.gpu_pages[i]] = {p.history_pages[i], mp.host_page};
    }
    populates_[p.order] = std::move(fp);
  }

  void OnRetire(const RetireOrder& rt, const std::vector<Order>& all, std::set<OrderId>& retired) {
    ASSERT_TRUE(reclaims_.count(rt.order));
    FakeReclaim& f = reclaims_.at(rt.order);
    ASSERT_EQ(f.request, rt.request);
    ASSERT_EQ(std::set<PageIndex>(rt.gpu_pages.begin(), rt.gpu_pages.end()), f.pages);
    MReq& m = model_.at(rt.request);
    for (MPage& mp : m.pages) {
      if (!mp.on_gpu) continue;
      ASSERT_TRUE(mp.written || mp.tail) << "retired a page without a host copy";
      mp.on_gpu = false;
    }
    m.reclaim = 0;
    retired.insert(rt.order);
    RequestId expect = 0;  // the grant of this event whose required pages took retired ones
    for (const Order& o : all) {
      const auto* g = std::get_if<GrantOrder>(&o);
      if (!g || g->gpu != rt.gpu || expect != 0) continue;
      for (PageIndex p : g->required_pages) expect = f.pages.count(p) ? g->request : expect;
    }
    EXPECT_EQ(rt.regranted_to, expect);
    regranted_ += expect != 0;
    reclaims_.erase(rt.order);
  }

  // Expected owner of every used GPU page: required and optional pages of granted requests, and pages of population
  // copies still in flight for completed requests (freed when the copy reports).
  std::map<std::pair<GpuId, PageIndex>, RequestId> ExpectedOwners() const {
    std::map<std::pair<GpuId, PageIndex>, RequestId> owners;
    for (const auto& [id, m] : model_) {
      for (PageIndex p : m.required_pages) owners[{m.gpu, p}] = id;
      for (const MPage& mp : m.pages) {
        if (mp.on_gpu) owners[{m.gpu, mp.gpu_page}] = id;
      }
    }
    for (const auto& [o, fp] : populates_) {
      if (model_.count(fp.request)) continue;
      for (const auto& [p, x] : fp.pages) owners[{fp.gpu, p}] = fp.request;
    }
    return owners;
  }
  // Host pages of live requests, and host pages of copies in flight (pinned: not reusable until they report).
  std::set<PageIndex> BusyHostPages() const {
    std::set<PageIndex> busy;
    for (const auto& [id, m] : model_) {
      for (const MPage& mp : m.pages) {
        if (!mp.lost) busy.insert(mp.host_page);
      }
      for (const auto& [h, hp] : m.resumed_host) busy.insert(hp);  // a queued resume's
    }
    for (const auto& [o, f] : reclaims_) {
      for (const auto& [p, hp] : f.targets) busy.insert(hp);
    }
    for (const auto& [o, fp] : populates_) {
      for (const auto& [p, x] : fp.pages) busy.insert(x.second);
    }
    return busy;
  }

  // Issue 12: what a view dumps (DumpScope) agrees with the full dump: a random page range of a random GPU is its
  // slice, runs from a random page (as many as asked) are maximal and cover exactly those pages, and the counts-only
  // dump holds the same page counts.
  void CheckScopedDumps(const StateDump& full) {
    std::vector<size_t> up;  // a fenced GPU has no page table (M = 0 in the dump) until its worker says Hello again
    for (size_t i = 0; i < full.gpus.size(); ++i) {
      if (full.gpus[i].up) up.push_back(i);
    }
    if (!up.empty()) CheckPageRange(full, full.gpus[up[std::uniform_int_distribution<size_t>(0, up.size() - 1)(view_rng_)]]);
    if (::testing::Test::HasFatalFailure()) return;
    const StateDump counts = mgr_->Dump(DumpDetail::kCounts);
    ASSERT_EQ(counts.gpus.size(), full.gpus.size());
    for (size_t i = 0; i < counts.gpus.size(); ++i) {
      ASSERT_EQ(counts.gpus[i].up, full.gpus[i].up);
      ASSERT_EQ(counts.gpus[i].free_pages, full.gpus[i].free_pages);
      ASSERT_EQ(counts.gpus[i].required_pages, full.gpus[i].required_pages);
      ASSERT_EQ(counts.gpus[i].optional_pages, full.gpus[i].optional_pages);
      ASSERT_TRUE(counts.gpus[i].page_states.empty());
    }
  }

  void CheckPageRange(const StateDump& full, const GpuDump& g) {
    DumpScope scope;
    scope.page_gpu = g.gpu;
    scope.page_from = std::uniform_int_distribution<PageIndex>(0, g.pages - 1)(view_rng_);
    scope.page_count = std::uniform_int_distribution<uint32_t>(1, g.pages)(view_rng_);
    const GpuDump part = mgr_->Dump(scope).gpus.at(&g - full.gpus.data());
    const size_t end = std::min<size_t>(g.pages, size_t{scope.page_from} + scope.page_count);
    ASSERT_EQ(part.page_states, std::vector<PageState>(g.page_states.begin() + scope.page_from,
                                                       g.page_states.begin() + end));
    ASSERT_EQ(part.page_owners, std::vector<RequestId>(g.page_owners.begin() + scope.page_from,
                                                       g.page_owners.begin() + end));
    scope.page_runs = true;
    const GpuDump runs = mgr_->Dump(scope).gpus.at(&g - full.gpus.data());
    ASSERT_FALSE(runs.page_runs.empty());
    ASSERT_LE(runs.page_runs.size(), scope.page_count);
    PageIndex p = scope.page_from;
    for (size_t i = 0; i < runs.page_runs.size(); ++i) {
      const PageRun& r = runs.page_runs[i];
      ASSERT_EQ(r.first, p);
      for (; p < r.first + r.count; ++p) ASSERT_TRUE(g.page_states[p] == r.state && g.page_owners[p] == r.owner) << p;
      if (p < g.pages) ASSERT_TRUE(g.page_states[p] != r.state || g.page_owners[p] != r.owner) << "run not maximal";
    }
    ASSERT_TRUE(p == g.pages || runs.page_runs.size() == scope.page_count);
  }

  // Request states (memd/request_state.h): between two checks a request moves only along the brief's moves, spelled
  // out here independently of kRequestTransitions, one or more steps (one event may grant a request and start its
  // reclaim); a new one starts queued (an adopted one is built queued too); a completed one is gone in the event that
  // completes it. So a move the core made around its table, or a table grown beyond these moves, fails here.
  void CheckRequestStates(const StateDump& d) {
    using S = RequestState;
    static constexpr std::pair<S, S> kMoves[] = {
        {S::kQueued, S::kAdmitted},       {S::kAdmitted, S::kReclaiming},    {S::kReclaiming, S::kAdmitted},
        {S::kAdmitted, S::kCompleted},    {S::kReclaiming, S::kCompleted},   {S::kAdmitted, S::kInterrupted},
        {S::kReclaiming, S::kInterrupted}, {S::kQueued, S::kInterrupted}};
    std::map<RequestId, RequestState> now;
    for (const RequestDump& rd : d.requests) {
      ASSERT_NE(rd.state, RequestState::kCompleted) << "request " << rd.request << " completed but still known";
      const auto prev = states_.find(rd.request);
      const RequestState from = prev == states_.end() ? RequestState::kQueued : prev->second;
      std::set<RequestState> reached = {from};
      for (size_t step = 0; step < std::size(kMoves); ++step) {
        for (const auto& [a, b] : kMoves) {
          if (reached.contains(a)) reached.insert(b);
        }
      }
      ASSERT_TRUE(reached.contains(rd.state)) << "request " << rd.request << ": " << RequestStateName(from) << " -> "
                                              << RequestStateName(rd.state) << " is no path of the allowed moves";
      if (prev != states_.end() && from != rd.state) ++state_moves_[{from, rd.state}];
      now[rd.request] = rd.state;
    }
    states_ = std::move(now);
  }

  void Check() {
    ASSERT_TRUE(mgr_->CheckInvariants().ok()) << mgr_->CheckInvariants();
    const StateDump d = mgr_->Dump();
    CheckScopedDumps(d);
    if (::testing::Test::HasFatalFailure()) return;
    CheckRequestStates(d);
    if (::testing::Test::HasFatalFailure()) return;
    const auto owners = ExpectedOwners();
    uint32_t host_held = 0;  // host pages the model says are allocated: no leak, none freed early
    for (const auto& [id, m] : model_) {
      host_held += static_cast<uint32_t>(m.resumed_host.size());
      for (const MPage& mp : m.pages) host_held += !mp.lost;
    }
    ASSERT_EQ(mgr_->host().allocated(), host_held);
    ASSERT_EQ(d.gpus.size(), kGpus);
    for (const GpuDump& g : d.gpus) {
      ASSERT_EQ(g.up, bool{up_[g.gpu]}) << "GPU " << g.gpu;
      // Speculation in use = the shares of the requests granted on it (issue 13); the Hello's totals.
      SpeculationShare want;
      for (const auto& [id, m] : model_) {
        if (m.gpu != g.gpu || !m.granted || m.interrupted) continue;
        want.draft_ring_pages += m.share.draft_ring_pages;
        want.staging_pages += m.share.staging_pages;
        want.draft_ring_bytes += m.share.draft_ring_bytes;
        want.staging_bytes += m.share.staging_bytes;
      }
      if (g.up) max_share_pages_ = std::max<uint64_t>(max_share_pages_, want.pages());
      ASSERT_EQ(g.draft_ring_pages, g.up ? want.draft_ring_pages : 0) << "GPU " << g.gpu;
      ASSERT_EQ(g.staging_pages, g.up ? want.staging_pages : 0) << "GPU " << g.gpu;
      ASSERT_EQ(g.draft_ring_bytes, g.up ? want.draft_ring_bytes : 0) << "GPU " << g.gpu;
      ASSERT_EQ(g.staging_bytes, g.up ? want.staging_bytes : 0) << "GPU " << g.gpu;
      ASSERT_EQ(g.declared_draft_ring_bytes, g.up ? kDeclared.draft_ring_bytes : 0) << "GPU " << g.gpu;
      ASSERT_EQ(g.declared_staging_bytes, g.up ? kDeclared.staging_bytes : 0) << "GPU " << g.gpu;
      ASSERT_EQ(g.epoch, epochs_[g.gpu]) << "GPU " << g.gpu;
      if (!g.up) {  // fenced: no pages, slots or queue of it remain
        ASSERT_TRUE(g.page_states.empty() && g.queue.empty() && g.used_slots == 0 && g.reclaims_in_flight == 0);
        ASSERT_EQ(mgr_->gpu_table(g.gpu), nullptr);
      }
      for (PageIndex p = 0; p < g.page_states.size(); ++p) {
        auto it = owners.find({g.gpu, p});
        const RequestId want = it == owners.end() ? kNoOwner : it->second;
        ASSERT_EQ(g.page_owners[p], want) << "GPU " << g.gpu << " page " << p;
        if (want == kNoOwner) continue;
        const PageState st = g.page_states[p];
        auto m = model_.find(want);
        if (m == model_.end()) {  // orphan population page
          ASSERT_TRUE(st == PageState::kOptionalPending || st == PageState::kReclaiming);
          continue;
        }
        const bool required =
            std::count(m->second.required_pages.begin(), m->second.required_pages.end(), p) > 0;
        bool populating = false;
        for (const MPage& mp : m->second.pages) populating |= mp.on_gpu && mp.gpu_page == p && mp.populating;
        const PageState expect = required                   ? PageState::kRequired
                                 : m->second.reclaim != 0   ? PageState::kReclaiming
                                 : populating               ? PageState::kOptionalPending
                                                            : PageState::kOptionalReady;
        ASSERT_EQ(st, expect) << "GPU " << g.gpu << " page " << p << " of request " << want;
      }
    }
    ASSERT_EQ(d.requests.size(), model_.size());
    for (const RequestDump& rd : d.requests) {
      const MReq& m = model_.at(rd.request);
      ASSERT_EQ(rd.state == RequestState::kQueued, !m.granted);
      const SpeculationShare share = m.interrupted ? SpeculationShare{} : m.share;  // an interrupted one holds none
      ASSERT_EQ(rd.draft_ring_pages, share.draft_ring_pages) << "request " << rd.request;
      ASSERT_EQ(rd.staging_pages, share.staging_pages) << "request " << rd.request;
      ASSERT_EQ(rd.draft_ring_bytes, share.draft_ring_bytes) << "request " << rd.request;
      ASSERT_EQ(rd.staging_bytes, share.staging_bytes) << "request " << rd.request;
      if (!m.granted) {  // a queued resume shows the host copies it took over
        ASSERT_EQ(rd.host_pages, m.resumed_host.size()) << "request " << rd.request;
        continue;
      }
      ASSERT_EQ(rd.state == RequestState::kInterrupted, m.interrupted) << "request " << rd.request;
      if (m.interrupted) {  // keeps exactly its confirmed host copies, nothing else
        std::map<uint32_t, PageIndex> kept;
        for (uint32_t h = 0; h < m.pages.size(); ++h) {
          if (!m.pages[h].lost) kept[h] = m.pages[h].host_page;
        }
        ASSERT_EQ(mgr_->InterruptedHostPages(rd.request), kept) << "request " << rd.request;
        ASSERT_EQ(rd.host_pages, kept.size());
        ASSERT_EQ(rd.slot, kNoSlot);
        ASSERT_EQ(rd.required_pages + rd.optional_pages, 0u);
        continue;
      }
      ASSERT_EQ(rd.state == RequestState::kReclaiming, m.reclaim != 0) << "request " << rd.request;
      ASSERT_EQ(rd.slot, m.slot);
      uint32_t host = 0, tail = 0, optional = 0;
      for (const MPage& mp : m.pages) {
        // Safety (brief §4): every history page is readable on GPU or has a host copy (or the worker's tail).
        ASSERT_TRUE((mp.on_gpu && !mp.populating) || mp.written || mp.tail) << "request " << rd.request << " lost";
        host += mp.written || mp.tail;
        tail += mp.tail && !mp.written;
        optional += mp.on_gpu;
      }
      ASSERT_EQ(rd.history_pages, m.context);
      ASSERT_EQ(rd.host_pages, host) << "host coverage of request " << rd.request;
      ASSERT_EQ(rd.tail_pages, tail) << "tail-covered pages of request " << rd.request;
      ASSERT_EQ(rd.optional_pages, optional) << "a_r of request " << rd.request;
    }
    uint32_t copies = 0;
    size_t open = 0;
    for (const auto& [o, f] : reclaims_) {
      copies += static_cast<uint32_t>(f.backups.size());
      open += !f.backups.empty() || (!f.gone && !f.failed);
    }
    for (const auto& [o, fp] : populates_) copies += static_cast<uint32_t>(fp.pages.size());
    open += populates_.size();
    ASSERT_EQ(mgr_->host().pinned(), copies) << "pinned host pages vs copies in flight";
    ASSERT_EQ(mgr_->open_orders(), open) << "order entries vs orders still owing reports";
    // The fake worker forgets reclaims that owe nothing more (a cancelled one after its stale ReadersDone).
    std::erase_if(reclaims_, [](const auto& r) {
      return r.second.backups.empty() && (r.second.failed || (r.second.gone && r.second.readers_sent));
    });
  }

  std::mt19937_64 view_rng_;  // the scoped views checked (own stream: the events of a seed stay as they were)
  std::mt19937_64 share_rng_;  // speculation shares and bad-share events (own stream, likewise)
  uint64_t bad_shares_ = 0, bad_share_reports_ = 0, max_share_pages_ = 0;
  int64_t now_ = 0;
  RequestId next_id_ = 1;
  std::unique_ptr<ResidencyManager> mgr_;
  std::map<RequestId, MReq> model_;  // queued and granted requests
  std::map<OrderId, FakeReclaim> reclaims_;
  std::map<OrderId, FakePopulate> populates_;
  uint64_t early_readers_done_ = 0, regranted_ = 0, slot_waits_ = 0;
  uint64_t fenced_with_copies_ = 0, kept_pages_ = 0, lost_backups_ = 0, resumed_pages_ = 0, resume_refusals_ = 0;
  uint64_t resumed_pages_since_restart_ = 0;  // since the last RestartMemd: the core's host_pages_resumed
  uint64_t resumes_with_gaps_ = 0;
  uint64_t resumes_rejected_ = 0;
  std::vector<uint32_t> epochs_;
  std::vector<bool> up_;
  JournalMemory journal_;  // the journal region (the segment's, in memd)
  std::string policy_;
  uint64_t restarts_ = 0;
  std::map<RequestId, RequestState> states_;  // each request's state at the last check (CheckRequestStates)
  std::map<std::pair<RequestState, RequestState>, uint64_t> state_moves_;
  uint64_t survived_ = 0, reported_ = 0, refused_reports_ = 0;  // requests of surviving workers; reports adopted, refused
  std::set<RequestId> fence_rejects_;  // queued admissions a fence must reject (UNAVAILABLE) in this event
};

TEST(ResidencyRandom, InvariantsHoldUnderRandomEvents) {
  spdlog::set_level(spdlog::level::err);  // the core logs every reject and failed copy; thousands here
  const char* policies[] = {"oldest-first", "newest-first", "largest-first"};
  Counters total;
  uint64_t early = 0, regranted = 0, slot_waits = 0, fenced_with_copies = 0, kept = 0, lost_backups = 0;
  uint64_t resumed_pages = 0, resume_refusals = 0, resumes_with_gaps = 0, resumes_rejected = 0;
  uint64_t restarts = 0, adopted = 0, adopted_pages = 0, survived = 0, reported = 0, refused_reports = 0;
  uint64_t bad_shares = 0, bad_share_reports = 0, max_share_pages = 0;
  std::map<std::pair<RequestState, RequestState>, uint64_t> state_moves;
  for (uint64_t seed : Seeds()) {
    const std::string policy = policies[seed % 3];
    std::printf("DHS_SEED=%lu (policy %s)\n", static_cast<unsigned long>(seed), policy.c_str());
    SCOPED_TRACE("DHS_SEED=" + std::to_string(seed) + " policy " + policy);
    Harness h(seed, policy);
    for (int i = 0; i < Events(); ++i) {
      SCOPED_TRACE("event " + std::to_string(i));
      h.Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    h.Drain();
    if (::testing::Test::HasFatalFailure()) return;
    const Counters& c = h.counters();
    total.grants += c.grants;
    total.reclaims_retired += c.reclaims_retired;
    total.reclaims_failed += c.reclaims_failed;
    total.populates_ordered += c.populates_ordered;
    total.populates_failed += c.populates_failed;
    total.rejects += c.rejects;
    total.deferred_backups += c.deferred_backups;
    total.host_writes += c.host_writes;
    total.host_write_failures += c.host_write_failures;
    total.stale_reports += c.stale_reports;
    total.keeps_lost += c.keeps_lost;
    total.fences += c.fences;
    total.reregistrations += c.reregistrations;
    total.requests_interrupted += c.requests_interrupted;
    total.admissions_fenced += c.admissions_fenced;
    total.host_pages_lost += c.host_pages_lost;
    early += h.early_readers_done();
    regranted += h.regranted();
    slot_waits += h.slot_waits();
    fenced_with_copies += h.fenced_with_copies();
    kept += h.kept_pages();
    lost_backups += h.lost_backups();
    resumed_pages += h.resumed_pages();
    resume_refusals += h.resume_refusals();
    resumes_with_gaps += h.resumes_with_gaps();
    resumes_rejected += h.resumes_rejected();
    bad_shares += h.bad_shares();
    bad_share_reports += h.bad_share_reports();
    max_share_pages = std::max(max_share_pages, h.max_share_pages());
    total.resumes += c.resumes;
    EXPECT_EQ(c.host_pages_resumed, h.resumed_pages_since_restart());  // the counters are the last core's
    restarts += h.restarts();
    for (const auto& [move, n] : h.state_moves()) state_moves[move] += n;
    survived += h.survived();
    reported += h.reported();
    refused_reports += h.refused_reports();
    adopted += h.counters().requests_adopted;  // the last core's: adopted by the latest restart
    adopted_pages += h.counters().host_pages_adopted;
  }
  std::printf("resumes %lu (host pages taken over %lu; %lu resumes took kept pages after a lost one), bad resumes "
              "refused %lu, resumes rejected after the take-over %lu\n",
              static_cast<unsigned long>(total.resumes), static_cast<unsigned long>(resumed_pages),
              static_cast<unsigned long>(resumes_with_gaps), static_cast<unsigned long>(resume_refusals),
              static_cast<unsigned long>(resumes_rejected));
  std::printf("speculation shares: bad admissions refused %lu, bad reports refused %lu, at most %lu share pages on "
              "one GPU\n", static_cast<unsigned long>(bad_shares), static_cast<unsigned long>(bad_share_reports),
              static_cast<unsigned long>(max_share_pages));
  std::printf("requests of workers that survived a memd restart %lu (reports adopted %lu, bad reports refused %lu)\n",
              static_cast<unsigned long>(survived), static_cast<unsigned long>(reported),
              static_cast<unsigned long>(refused_reports));
  std::printf("memd restarts %lu: the last one of each seed adopted %lu requests, %lu host pages\n",
              static_cast<unsigned long>(restarts), static_cast<unsigned long>(adopted),
              static_cast<unsigned long>(adopted_pages));
  std::printf(
      "grants %lu, reclaims retired %lu, aborted %lu, populates %lu (failed %lu), rejects %lu, deferred backups %lu, "
      "host writes %lu (failed %lu), stale reports %lu, early readers-done %lu, regranted %lu, slot waits %lu, "
      "keeps lost %lu\n",
      static_cast<unsigned long>(total.grants), static_cast<unsigned long>(total.reclaims_retired),
      static_cast<unsigned long>(total.reclaims_failed), static_cast<unsigned long>(total.populates_ordered),
      static_cast<unsigned long>(total.populates_failed), static_cast<unsigned long>(total.rejects),
      static_cast<unsigned long>(total.deferred_backups), static_cast<unsigned long>(total.host_writes),
      static_cast<unsigned long>(total.host_write_failures), static_cast<unsigned long>(total.stale_reports),
      static_cast<unsigned long>(early), static_cast<unsigned long>(regranted),
      static_cast<unsigned long>(slot_waits), static_cast<unsigned long>(total.keeps_lost));
  std::printf("fences %lu (%lu with copies in flight), re-registrations %lu, interrupted %lu, admissions rejected by a "
              "fence %lu, host pages kept %lu, lost %lu (backups in flight %lu)\n",
              static_cast<unsigned long>(total.fences), static_cast<unsigned long>(fenced_with_copies),
              static_cast<unsigned long>(total.reregistrations), static_cast<unsigned long>(total.requests_interrupted),
              static_cast<unsigned long>(total.admissions_fenced), static_cast<unsigned long>(kept),
              static_cast<unsigned long>(total.host_pages_lost), static_cast<unsigned long>(lost_backups));
  std::printf("request-state moves seen between checks:");
  for (const auto& [move, n] : state_moves) {
    std::printf(" %s->%s %lu", std::string(RequestStateName(move.first)).c_str(),
                std::string(RequestStateName(move.second)).c_str(), static_cast<unsigned long>(n));
  }
  std::printf("\n");
  // The run must have exercised every path it claims to (each is reached many times over the 20 default seeds; one
  // seed alone, rerun with DHS_SEED, may miss a rare one).
  if (std::getenv("DHS_SEED") != nullptr) return;
  EXPECT_GT(total.grants, 0u);
  EXPECT_GT(resumes_rejected, 0u) << "no resume was rejected after its take-over (AdmitReject.took_over unchecked)";
  using RS = RequestState;
  for (const auto& move : {std::pair{RS::kQueued, RS::kAdmitted}, std::pair{RS::kAdmitted, RS::kReclaiming},
                           std::pair{RS::kReclaiming, RS::kAdmitted}, std::pair{RS::kAdmitted, RS::kInterrupted},
                           std::pair{RS::kQueued, RS::kInterrupted}}) {
    EXPECT_GT(state_moves[move], 0u) << RequestStateName(move.first) << " -> " << RequestStateName(move.second);
  }
  EXPECT_GT(total.reclaims_retired, 0u);
  EXPECT_GT(total.reclaims_failed, 0u);
  EXPECT_GT(total.populates_ordered, 0u);
  EXPECT_GT(total.populates_failed, 0u);
  EXPECT_GT(total.rejects, 0u);
  EXPECT_GT(total.deferred_backups, 0u);
  EXPECT_GT(total.host_writes, 0u);
  EXPECT_GT(total.host_write_failures, 0u);
  EXPECT_GT(total.stale_reports, 0u);
  EXPECT_GT(total.keeps_lost, 0u);
  EXPECT_GT(early, 0u);
  EXPECT_GT(regranted, 0u);
  EXPECT_GT(slot_waits, 0u);
  EXPECT_GT(fenced_with_copies, 0u);
  EXPECT_GT(total.reregistrations, 0u);
  EXPECT_GT(total.admissions_fenced, 0u);
  EXPECT_GT(kept, 0u);
  EXPECT_GT(total.host_pages_lost, 0u);
  EXPECT_GT(total.resumes, 0u);
  EXPECT_GT(resumed_pages, 0u);
  EXPECT_GT(resume_refusals, 0u);
  EXPECT_GT(resumes_with_gaps, 0u);
  EXPECT_GT(bad_shares, 0u);
  EXPECT_GT(bad_share_reports, 0u);
  EXPECT_GT(max_share_pages, 0u);
  EXPECT_GT(restarts, 0u);
  EXPECT_GT(survived, 0u);
  EXPECT_EQ(reported, survived);
  EXPECT_GT(refused_reports, 0u);
  EXPECT_GT(adopted_pages, 0u);
  EXPECT_GT(lost_backups, 0u);  // a Wait sent while every request slot of the GPU was in use (slots, not pages, bind)
}

}  // namespace
}  // namespace dhs::memd
