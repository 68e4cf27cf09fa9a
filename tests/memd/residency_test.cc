// Deterministic cases of the residency state machine (brief §4): deficit covered by exactly the first q requests
// per policy, uncoverable deficit, failing backup, oversize request, host page reuse, pending-page reclaim,
// counts returning to their start.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "memd/residency_manager.h"

namespace dhs::memd {
namespace {

template <typename T>
std::vector<T> OfType(const std::vector<Order>& orders) {
  std::vector<T> out;
  for (const Order& o : orders) {
    if (const T* t = std::get_if<T>(&o)) out.push_back(*t);
  }
  return out;
}

class ResidencyTest : public ::testing::Test {
 protected:
  void Make(uint32_t m, uint32_t reserve, uint32_t host_pages, std::string policy = "oldest-first",
            uint32_t populate = 8) {
    ResidencyConfig c;
    c.reserve_pages = reserve;
    c.host_pages = host_pages;
    c.host_page_bytes = 4096;
    c.reclaim_policy = policy;
    c.populate_pages_per_attempt = populate;
    auto m_or = ResidencyManager::Create(c, [this] { return now_us_; });
    ASSERT_TRUE(m_or.ok()) << m_or.status();
    mgr_ = std::move(*m_or);
    ASSERT_TRUE(mgr_->RegisterGpu(0, m).ok());
  }
  // Runs an event, checks it succeeded and the invariants hold, returns the orders it produced.
  std::vector<Order> Do(absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    absl::Status inv = mgr_->CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
    now_us_ += 10;
    return mgr_->DrainOrders();
  }
  std::vector<Order> Admit(RequestId r, uint32_t required, uint32_t history) {
    return Do(mgr_->Admit({r, 0, static_cast<SlotIndex>(r), required, history}));
  }
  RequestDump Req(RequestId r) {
    for (const RequestDump& d : mgr_->Dump().requests) {
      if (d.request == r) return d;
    }
    ADD_FAILURE() << "request " << r << " missing";
    return {};
  }
  bool Known(RequestId r) {
    for (const RequestDump& d : mgr_->Dump().requests) {
      if (d.request == r) return true;
    }
    return false;
  }
  // Completes every backup (ok), then readers-done for every withdrawal; returns all orders produced.
  std::vector<Order> FinishReclaims(std::vector<Order> orders) {
    std::vector<Order> all = orders;
    for (const BackupOrder& b : OfType<BackupOrder>(orders)) {
      auto more = Do(mgr_->OnBackupDone(b.copy, true));
      all.insert(all.end(), more.begin(), more.end());
    }
    for (const WithdrawOrder& w : OfType<WithdrawOrder>(all)) {
      auto more = Do(mgr_->OnReadersDone(w.reclaim));
      all.insert(all.end(), more.begin(), more.end());
    }
    return all;
  }

  int64_t now_us_ = 1000;
  std::unique_ptr<ResidencyManager> mgr_;
};

TEST_F(ResidencyTest, ResidentFirstKeepsImportedHistoryOnGpuThenHost) {
  Make(10, 2, 16);
  auto o = Admit(1, 2, 9);  // lendable 8: 2 required, 6 history on GPU (optional-ready), 3 imported to host
  auto grants = OfType<GrantOrder>(o);
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].required_pages.size(), 2u);
  EXPECT_EQ(grants[0].history_gpu_pages.size(), 6u);
  EXPECT_EQ(grants[0].history_host_pages.size(), 3u);
  EXPECT_TRUE(OfType<BackupOrder>(o).empty());  // host backup deferred
  const GpuPageTable* t = mgr_->gpu_table(0);
  EXPECT_EQ(t->required(), 2u);
  EXPECT_EQ(t->optional_ready(), 6u);
  EXPECT_EQ(t->free(), 2u);  // exactly M_res left
  EXPECT_EQ(Req(1).host_pages, 3u);
  EXPECT_EQ(Req(1).optional_pages, 6u);
}

// a_A = 3, a_B = 4, a_C = 5 (admitted in that order); a new admission with deficit Δ.
struct QCase {
  const char* policy;
  uint32_t delta;
  std::set<RequestId> victims;  // the first q of the policy's order (not q-1; q+1 untouched)
};

class DeficitTest : public ResidencyTest, public ::testing::WithParamInterface<QCase> {};

TEST_P(DeficitTest, ReclaimsExactlyTheFirstQRequests) {
  const QCase& c = GetParam();
  Make(20, 2, 64, c.policy);
  Admit(1, 1, 3);  // A
  Admit(2, 1, 4);  // B
  Admit(3, 1, 5);  // C
  const uint32_t lendable = mgr_->gpu_table(0)->lendable();
  ASSERT_EQ(lendable, 18u - 15u);
  auto o = Admit(4, lendable + c.delta, 0);
  EXPECT_TRUE(OfType<GrantOrder>(o).empty());
  ASSERT_EQ(OfType<WaitOrder>(o).size(), 1u);
  EXPECT_EQ(OfType<WaitOrder>(o)[0].deficit_pages, c.delta);
  std::set<RequestId> backed_up;
  for (const BackupOrder& b : OfType<BackupOrder>(o)) backed_up.insert(b.request);
  EXPECT_EQ(backed_up, c.victims);
  const uint32_t a[] = {0, 3, 4, 5};
  for (RequestId r = 1; r <= 3; ++r) {
    const bool victim = c.victims.count(r) > 0;
    EXPECT_EQ(Req(r).state, victim ? RequestState::kReclaiming : RequestState::kAdmitted) << r;
    EXPECT_EQ(Req(r).optional_pages, a[r]) << r;  // pages stay until retired
  }
  auto all = FinishReclaims(o);
  auto grants = OfType<GrantOrder>(all);
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].request, 4u);
  uint32_t retired = 0;
  for (const RetireOrder& r : OfType<RetireOrder>(all)) retired += r.gpu_pages.size();
  uint32_t expected = 0;
  for (RequestId r : c.victims) expected += a[r];
  EXPECT_EQ(retired, expected);
  for (RequestId r = 1; r <= 3; ++r) {
    const bool victim = c.victims.count(r) > 0;
    EXPECT_EQ(Req(r).optional_pages, victim ? 0u : a[r]) << r;
    EXPECT_EQ(Req(r).host_pages, victim ? a[r] : 0u) << r;  // victims are on host only now
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, DeficitTest,
                         ::testing::Values(QCase{"oldest-first", 3, {1}}, QCase{"oldest-first", 4, {1, 2}},
                                           QCase{"oldest-first", 7, {1, 2}}, QCase{"newest-first", 5, {3}},
                                           QCase{"newest-first", 6, {3, 2}}, QCase{"largest-first", 9, {3, 2}},
                                           QCase{"largest-first", 10, {3, 2, 1}}));

TEST_F(ResidencyTest, UncoverableDeficitWaitsAndProceedsAfterCompletion) {
  Make(10, 2, 8);
  Admit(1, 5, 1);  // a_1 = 1, lendable 2
  auto o = Admit(2, 5, 0);  // Δ = 3 > 1: no reclaim, waits
  EXPECT_TRUE(OfType<BackupOrder>(o).empty());
  EXPECT_TRUE(OfType<GrantOrder>(o).empty());
  ASSERT_EQ(OfType<WaitOrder>(o).size(), 1u);
  EXPECT_EQ(Req(2).state, RequestState::kQueued);
  EXPECT_EQ(Req(1).state, RequestState::kAdmitted);
  o = Do(mgr_->Complete(1));
  auto g = OfType<GrantOrder>(o);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].request, 2u);
}

TEST_F(ResidencyTest, FailedBackupLeavesVictimUntouchedAndRetrySucceeds) {
  Make(8, 0, 16);
  auto a = OfType<GrantOrder>(Admit(1, 1, 3))[0];  // a_1 = 3, lendable 4
  auto o = Admit(2, 6, 0);                          // Δ = 2 -> reclaim request 1
  auto backups = OfType<BackupOrder>(o);
  ASSERT_EQ(backups.size(), 3u);
  Do(mgr_->OnBackupDone(backups[0].copy, true));
  o = Do(mgr_->OnBackupDone(backups[1].copy, false));  // copy error
  EXPECT_TRUE(OfType<WithdrawOrder>(o).empty());
  o = Do(mgr_->OnBackupDone(backups[2].copy, true));
  EXPECT_TRUE(OfType<WithdrawOrder>(o).empty());
  EXPECT_TRUE(OfType<GrantOrder>(o).empty());
  // Victim untouched: admitted, same pages, all optional-ready; admission still waits.
  EXPECT_EQ(Req(1).state, RequestState::kAdmitted);
  EXPECT_EQ(Req(1).optional_pages, 3u);
  for (PageIndex p : a.history_gpu_pages) {
    EXPECT_EQ(mgr_->gpu_table(0)->state(p), PageState::kOptionalReady);
    EXPECT_EQ(mgr_->gpu_table(0)->owner(p), 1u);
  }
  EXPECT_EQ(Req(1).host_pages, 2u);  // completed backups stay valid copies; the failed one is not a copy
  EXPECT_EQ(Req(2).state, RequestState::kQueued);
  EXPECT_EQ(mgr_->counters().reclaims_failed, 1u);
  // Not retried until RetryBackups (the victim is backed off).
  o = Do(mgr_->Populate());
  EXPECT_TRUE(o.empty());
  o = Do(mgr_->RetryBackups());
  backups = OfType<BackupOrder>(o);
  ASSERT_EQ(backups.size(), 1u);  // only the page without a host copy
  EXPECT_EQ(backups[0].history_page, 1u);
  auto all = FinishReclaims(o);
  ASSERT_EQ(OfType<GrantOrder>(all).size(), 1u);
  EXPECT_EQ(Req(1).host_pages, 3u);
  EXPECT_EQ(Req(1).optional_pages, 0u);
}

TEST_F(ResidencyTest, HostPoolFullDoesNotStartTheReclaim) {
  Make(8, 0, 2);
  Admit(1, 1, 3);            // a_1 = 3 (no host copies)
  auto o = Admit(2, 6, 0);   // Δ = 2, but 3 backups need 3 host pages > 2
  EXPECT_TRUE(OfType<BackupOrder>(o).empty());
  EXPECT_EQ(Req(1).state, RequestState::kAdmitted);
  EXPECT_EQ(Req(2).state, RequestState::kQueued);
  EXPECT_EQ(mgr_->host().reusable(), 2u);  // nothing kept
}

TEST_F(ResidencyTest, OversizeHeadRejectedAtOnceAndTheOneBehindAdmitted) {
  Make(10, 2, 8);
  Admit(1, 6, 0);
  auto o = Admit(2, 4, 0);  // waits (lendable 2)
  ASSERT_EQ(OfType<WaitOrder>(o).size(), 1u);
  o = Admit(3, 9, 0);  // 9 > M - M_res = 8: can never fit
  auto rej = OfType<RejectOrder>(o);
  ASSERT_EQ(rej.size(), 1u);
  EXPECT_EQ(rej[0].request, 3u);
  EXPECT_EQ(rej[0].error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(rej[0].error.message().find("never fit"), std::string::npos);
  EXPECT_FALSE(Known(3));
  o = Admit(4, 1, 0);  // queued behind 2 (FIFO)
  EXPECT_EQ(OfType<WaitOrder>(o).size(), 1u);
  o = Do(mgr_->Complete(1));
  auto g = OfType<GrantOrder>(o);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].request, 2u);
  EXPECT_EQ(g[1].request, 4u);
}

TEST_F(ResidencyTest, BadEventsAreClearErrors) {
  Make(10, 2, 8);
  EXPECT_EQ(mgr_->Admit({1, 7, 0, 1, 0}).code(), absl::StatusCode::kNotFound);      // unknown GPU
  EXPECT_EQ(mgr_->Admit({1, 0, 0, 0, 0}).code(), absl::StatusCode::kInvalidArgument);  // no required pages
  Admit(1, 1, 0);
  EXPECT_EQ(mgr_->Admit({1, 0, 0, 1, 0}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(mgr_->OnBackupDone(99, true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->OnPopulateDone(99, true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->OnReadersDone(99).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->Complete(42).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->RegisterGpu(0, 4).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(mgr_->RegisterGpu(1, 1).code(), absl::StatusCode::kInvalidArgument);  // M_res 2 > M 1
  EXPECT_EQ(ResidencyManager::Create({.reclaim_policy = "lru"}, [] { return 0; }).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
  EXPECT_EQ(mgr_->counters().event_errors, 9u);  // every refused event above
}

TEST_F(ResidencyTest, HostPageReusedOnlyAfterItsCopyCompletes) {
  Make(10, 0, 1);
  Admit(1, 1, 0);
  auto o = Do(mgr_->OnTailPageComplete(1));
  auto b = OfType<BackupOrder>(o);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_TRUE(b[0].from_tail);
  EXPECT_EQ(Req(1).tail_pages, 1u);  // in the tail until its backup completes
  Do(mgr_->Complete(1));             // the copy is still in flight
  EXPECT_EQ(mgr_->host().reusable(), 0u);
  Admit(2, 1, 0);
  o = Do(mgr_->OnTailPageComplete(2));
  EXPECT_TRUE(OfType<BackupOrder>(o).empty());  // the only host page is still pinned by request 1's copy
  EXPECT_EQ(Req(2).tail_pages, 1u);
  Do(mgr_->OnBackupDone(b[0].copy, true));
  EXPECT_EQ(mgr_->host().reusable(), 1u);
  o = Do(mgr_->RetryBackups());
  auto b2 = OfType<BackupOrder>(o);
  ASSERT_EQ(b2.size(), 1u);
  EXPECT_EQ(b2[0].host_page, b[0].host_page);
  Do(mgr_->OnBackupDone(b2[0].copy, true));
  EXPECT_EQ(Req(2).tail_pages, 0u);  // left the tail
  EXPECT_EQ(Req(2).host_pages, 1u);
}

TEST_F(ResidencyTest, ReclaimOfPendingPagesWaitsForTheirCopies) {
  Make(6, 0, 8);
  Admit(1, 1, 0);
  for (int i = 0; i < 3; ++i) {
    auto b = OfType<BackupOrder>(Do(mgr_->OnTailPageComplete(1)));
    ASSERT_EQ(b.size(), 1u);
    Do(mgr_->OnBackupDone(b[0].copy, true));
  }
  auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 3u);
  Do(mgr_->OnPopulateDone(pops[0].copy, true));  // one ready, two pending
  EXPECT_EQ(mgr_->gpu_table(0)->optional_pending(), 2u);
  auto o = Admit(2, 4, 0);  // lendable 2, Δ = 2 -> reclaim request 1 (a = 3)
  EXPECT_TRUE(OfType<BackupOrder>(o).empty());    // all pages have host copies
  EXPECT_TRUE(OfType<WithdrawOrder>(o).empty());  // two population copies still in flight
  EXPECT_EQ(mgr_->gpu_table(0)->reclaiming(), 3u);
  o = Do(mgr_->OnPopulateDone(pops[1].copy, false));  // failed: nothing published, page freed at once
  EXPECT_TRUE(OfType<WithdrawOrder>(o).empty());
  EXPECT_EQ(mgr_->gpu_table(0)->reclaiming(), 2u);
  o = Do(mgr_->OnPopulateDone(pops[2].copy, true));  // published, so it must be withdrawn
  auto w = OfType<WithdrawOrder>(o);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].gpu_pages.size(), 2u);
  EXPECT_TRUE(OfType<GrantOrder>(o).empty());
  o = Do(mgr_->OnReadersDone(w[0].reclaim));
  ASSERT_EQ(OfType<RetireOrder>(o).size(), 1u);
  ASSERT_EQ(OfType<GrantOrder>(o).size(), 1u);
  EXPECT_EQ(Req(1).optional_pages, 0u);
  EXPECT_EQ(Req(1).host_pages, 3u);
}

TEST_F(ResidencyTest, CompletionCancelsReclaimAndLateReportsAreIgnored) {
  Make(8, 0, 16);
  Admit(1, 1, 3);
  auto o = Admit(2, 6, 0);
  auto backups = OfType<BackupOrder>(o);
  ASSERT_EQ(backups.size(), 3u);
  for (const auto& b : backups) Do(mgr_->OnBackupDone(b.copy, true));
  auto w = OfType<WithdrawOrder>(mgr_->outbox());
  EXPECT_TRUE(w.empty());  // drained by Do
  o = Do(mgr_->Complete(1));
  ASSERT_EQ(OfType<GrantOrder>(o).size(), 1u);
  EXPECT_TRUE(mgr_->OnReadersDone(1).ok());  // stale: its reclaim was cancelled
  EXPECT_EQ(mgr_->counters().stale_reports, 1u);
}

TEST_F(ResidencyTest, FreeCountsReturnToStartAfterManyCompletions) {
  Make(32, 2, 64, "largest-first", 4);
  std::vector<Order> pending;
  for (RequestId r = 1; r <= 40; ++r) {
    auto o = Admit(r, 1 + r % 5, r % 7);
    pending.insert(pending.end(), o.begin(), o.end());
    if (r % 3 == 0 && Req(r).state != RequestState::kQueued) {
      o = Do(mgr_->OnTailPageComplete(r));
      pending.insert(pending.end(), o.begin(), o.end());
    }
    o = Do(mgr_->Populate());
    pending.insert(pending.end(), o.begin(), o.end());
    // Answer everything outstanding (this loop's orders may produce more).
    while (!pending.empty()) {
      Order x = pending.back();
      pending.pop_back();
      std::vector<Order> more;
      if (auto* b = std::get_if<BackupOrder>(&x)) more = Do(mgr_->OnBackupDone(b->copy, true));
      if (auto* p = std::get_if<PopulateOrder>(&x)) more = Do(mgr_->OnPopulateDone(p->copy, true));
      if (auto* w = std::get_if<WithdrawOrder>(&x)) more = Do(mgr_->OnReadersDone(w->reclaim));
      pending.insert(pending.end(), more.begin(), more.end());
    }
    if (r > 5) Do(mgr_->Complete(r - 5));
  }
  for (RequestId r = 36; r <= 40; ++r) Do(mgr_->Complete(r));
  EXPECT_TRUE(mgr_->Dump().requests.empty());
  EXPECT_EQ(mgr_->gpu_table(0)->free(), 32u);
  EXPECT_EQ(mgr_->host().reusable(), 64u);
  EXPECT_GT(mgr_->counters().reclaims_retired, 0u);
  EXPECT_GT(mgr_->counters().populates_ordered, 0u);
}

// The worker contract (docs/protocol.md): a host page for every page of the full context at the grant; pages not
// kept optional are host-covered from the grant but populated only after the worker confirmed their bytes; a reclaim
// backs up into the page's assigned host page, and a failed backup keeps that assignment.
class ContractTest : public ResidencyTest {
 protected:
  std::vector<Order> AdmitContract(RequestId r, uint32_t required, uint32_t complete, uint32_t context) {
    AdmitRequest a{r, 0, static_cast<SlotIndex>(r), required, complete};
    a.assign_host_pages = true;
    a.context_pages = context;
    return Do(mgr_->Admit(a));
  }
};

TEST_F(ContractTest, HostPagesForTheWholeContextAndPopulationAfterConfirmedWrites) {
  Make(8, 0, 16);
  auto g = OfType<GrantOrder>(AdmitContract(1, 2, 4, 6));
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].history_gpu_pages.size(), 4u);  // 6 spare GPU pages keep all 4 complete pages
  EXPECT_TRUE(g[0].history_host_pages.empty());
  ASSERT_EQ(g[0].context_host_pages.size(), 6u);
  EXPECT_EQ(std::set<PageIndex>(g[0].context_host_pages.begin(), g[0].context_host_pages.end()).size(), 6u);
  EXPECT_EQ(mgr_->host().allocated(), 6u);
  EXPECT_EQ(Req(1).host_pages, 2u);  // pages 4, 5: covered by the worker's tail until written

  // Request 2 (6 required) reclaims request 1: the backups go to the host pages assigned at the grant.
  auto o = AdmitContract(2, 6, 0, 1);
  auto starts = OfType<ReclaimStartOrder>(o);
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].gpu_pages.size(), 4u);
  auto backups = OfType<BackupOrder>(o);
  ASSERT_EQ(backups.size(), 4u);
  for (const BackupOrder& b : backups) {
    EXPECT_EQ(b.reclaim, starts[0].reclaim);
    EXPECT_EQ(b.host_page, g[0].context_host_pages[b.history_page]);
  }
  EXPECT_EQ(mgr_->host().allocated(), 6u);  // request 2 is queued: it holds nothing yet
  // A failed backup aborts the reclaim and keeps the assigned host pages.
  Do(mgr_->OnBackupDone(backups[0].copy, false));
  EXPECT_EQ(mgr_->host().pages_of(1), 6u);
  for (size_t i = 1; i < backups.size(); ++i) Do(mgr_->OnBackupDone(backups[i].copy, true));
  EXPECT_EQ(mgr_->host().pages_of(1), 6u);
  EXPECT_EQ(Req(1).host_pages, 5u);  // 3 backed up + 2 covered by the tail
  Do(mgr_->Complete(2));

  // Population: nothing to populate yet (the 4 pages are on GPU; pages 4, 5 are not confirmed written).
  EXPECT_TRUE(OfType<PopulateOrder>(Do(mgr_->Populate())).empty());
  Do(mgr_->OnHostCopyWritten(1, 5));
  auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 1u);
  EXPECT_EQ(pops[0].history_page, 5u);
  EXPECT_EQ(pops[0].host_page, g[0].context_host_pages[5]);

  // Bad reports are refused and change nothing.
  EXPECT_EQ(mgr_->OnHostCopyWritten(1, 6).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(mgr_->OnHostCopyWritten(9, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
}

// A reclaim backup answered "deferred" (written = false: the worker had only planned to keep the page, whose rows
// it is still writing, contract §4) lets the reclaim go on at once and covers the page by the worker's tail, but the
// page is populated only after the worker confirms its bytes (OnHostCopyWritten). A confirmation that arrives before
// the deferred answer is kept.
TEST_F(ContractTest, DeferredReclaimBackupRetiresAtOnceAndPopulatesOnlyAfterTheWrite) {
  Make(8, 0, 16);
  auto g = OfType<GrantOrder>(AdmitContract(1, 2, 4, 6));
  ASSERT_EQ(g.size(), 1u);
  ASSERT_EQ(g[0].history_gpu_pages.size(), 4u);
  auto o = AdmitContract(2, 6, 0, 1);  // needs request 1's 4 optional pages
  auto backups = OfType<BackupOrder>(o);
  ASSERT_EQ(backups.size(), 4u);
  std::map<uint32_t, CopyId> copy_of;
  for (const BackupOrder& b : backups) copy_of[b.history_page] = b.copy;
  // Page 3 is confirmed written (order 0) before its reclaim answer says deferred; pages 2 and 3 are deferred.
  Do(mgr_->OnHostCopyWritten(1, 3));
  Do(mgr_->OnBackupDone(copy_of[0], true));
  Do(mgr_->OnBackupDone(copy_of[1], true));
  Do(mgr_->OnBackupDone(copy_of[2], true, /*written=*/false));
  auto w = OfType<WithdrawOrder>(Do(mgr_->OnBackupDone(copy_of[3], true, /*written=*/false)));
  ASSERT_EQ(w.size(), 1u) << "the reclaim waits for nothing once every page is answered";
  auto granted = OfType<GrantOrder>(Do(mgr_->OnReadersDone(w[0].reclaim)));
  ASSERT_EQ(granted.size(), 1u);
  EXPECT_EQ(granted[0].request, 2u);
  EXPECT_EQ(Req(1).host_pages, 6u);  // all host-covered: 2 written, 1 confirmed, 1 deferred, 2 by the tail
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
  Do(mgr_->Complete(2));
  // Pages 0, 1 (backed up) and 3 (confirmed) are populated; page 2 is not until its write is confirmed.
  std::set<uint32_t> populated;
  for (const PopulateOrder& p : OfType<PopulateOrder>(Do(mgr_->Populate()))) populated.insert(p.history_page);
  EXPECT_EQ(populated, (std::set<uint32_t>{0, 1, 3}));
  Do(mgr_->OnHostCopyWritten(1, 2));
  auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 1u);
  EXPECT_EQ(pops[0].history_page, 2u);
  EXPECT_EQ(pops[0].host_page, g[0].context_host_pages[2]);
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
}

// A request admitted with optional_history = false (hisparse mode) keeps none of its history on GPU at the grant, is
// never populated even with free GPU pages and confirmed host copies, and so is never a reclaim victim; an adaptive
// request beside it is populated.
TEST_F(ContractTest, RequestWithoutOptionalHistoryIsNeverKeptPopulatedOrReclaimed) {
  Make(16, 0, 32);
  AdmitRequest a{1, 0, 1, 2, 4};
  a.assign_host_pages = true;
  a.context_pages = 6;
  a.optional_history = false;
  auto g = OfType<GrantOrder>(Do(mgr_->Admit(a)));
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(g[0].history_gpu_pages.empty()) << "spare GPU pages, but hisparse keeps no optional history";
  ASSERT_EQ(g[0].context_host_pages.size(), 6u);
  auto g2 = OfType<GrantOrder>(AdmitContract(2, 2, 0, 6));
  ASSERT_EQ(g2.size(), 1u);
  for (uint32_t h = 0; h < 6; ++h) {
    Do(mgr_->OnHostCopyWritten(1, h));
    Do(mgr_->OnHostCopyWritten(2, h));
  }
  std::set<RequestId> populated;
  for (const PopulateOrder& p : OfType<PopulateOrder>(Do(mgr_->Populate()))) populated.insert(p.request);
  EXPECT_EQ(populated, std::set<RequestId>{2});
  EXPECT_EQ(Req(1).optional_pages, 0u);
  // A deficit reclaims request 2 (the only one with optional pages), never request 1.
  auto starts = OfType<ReclaimStartOrder>(AdmitContract(3, 12, 0, 1));
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].request, 2u);
  // Imported history of a request without optional history that fits nowhere but on GPU is refused at once.
  Make(16, 0, 2);
  AdmitRequest b{5, 0, 0, 2, 4};
  b.optional_history = false;
  auto rej = OfType<RejectOrder>(Do(mgr_->Admit(b)));
  ASSERT_EQ(rej.size(), 1u);
  EXPECT_EQ(rej[0].error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
}

TEST_F(ContractTest, ContextLargerThanTheHostPoolIsRejectedAndWaitsForHostPages) {
  Make(8, 0, 4);
  auto rej = OfType<RejectOrder>(AdmitContract(1, 1, 0, 5));
  ASSERT_EQ(rej.size(), 1u);
  EXPECT_EQ(rej[0].error.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(OfType<GrantOrder>(AdmitContract(2, 1, 0, 3)).size(), 1u);
  auto o = AdmitContract(3, 1, 0, 2);  // GPU room, but only 1 host page left: waits
  EXPECT_TRUE(OfType<GrantOrder>(o).empty());
  EXPECT_EQ(OfType<WaitOrder>(o).size(), 1u);
  EXPECT_EQ(OfType<GrantOrder>(Do(mgr_->Complete(2))).size(), 1u);
  EXPECT_EQ(mgr_->OnHostCopyWritten(3, 0).code(), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace dhs::memd
