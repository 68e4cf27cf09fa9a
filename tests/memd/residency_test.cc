// Deterministic cases of the residency state machine (brief §4) through the events memd's daemon really sends: deficit
// covered by exactly the first q requests per policy, uncoverable deficit, failing backup and retry, slots chosen at
// the grant, oversize request, host page reuse after a copy, reclaim of pages being populated with an early
// ReadersDone, completion during a reclaim, counts returning to their start, and the worker contract (host pages for
// the whole context, HostCopyWritten, deferred backups, hisparse).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "memd/residency_manager.h"
#include "tests/memd/residency_test_util.h"

namespace dhs::memd {
namespace {

// History page of `gpu_page` in a grant (its index in optional_pages).
uint32_t HistoryOf(const GrantOrder& g, PageIndex gpu_page) {
  auto it = std::find(g.optional_pages.begin(), g.optional_pages.end(), gpu_page);
  EXPECT_NE(it, g.optional_pages.end()) << "GPU page " << gpu_page << " not in the grant";
  return static_cast<uint32_t>(it - g.optional_pages.begin());
}

class ResidencyTest : public CoreTest {
 protected:
  ResidencyTest() { now_us_ = 1000; }
  void Make(uint32_t m, uint32_t reserve, uint32_t host_pages, std::string policy = "oldest-first",
            uint32_t populate = 8, uint32_t slots = 0) {
    ResidencyConfig c;
    c.reserve_pages = reserve;
    c.host_pages = host_pages;
    c.host_page_bytes = 4096;
    c.reclaim_policy = policy;
    c.populate_pages_per_attempt = populate;
    MakeCore(c, m, slots);
  }
  // context = history unless given.
  std::vector<Order> Admit(RequestId r, uint32_t required, uint32_t history, int64_t context = -1) {
    AdmitRequest a;
    a.request = r;
    a.required_pages = required;
    a.history_pages = history;
    a.context_pages = context < 0 ? history : static_cast<uint32_t>(context);
    return Do(mgr_->Admit(a));
  }
  std::vector<Order> Written(RequestId r, std::vector<uint32_t> pages, bool ok = true) {
    return Do(mgr_->OnHostCopyWritten(r, pages, {}, ok));
  }
  RequestDump Req(RequestId r) {
    const std::optional<RequestDump> d = DumpOf(*mgr_, r);
    if (!d) ADD_FAILURE() << "request " << r << " missing";
    return d.value_or(RequestDump{});
  }
  bool Known(RequestId r) { return DumpOf(*mgr_, r).has_value(); }
  // Answers every ReclaimOrder in `orders`: all backups ok, then ReadersDone; returns all orders produced.
  std::vector<Order> FinishReclaims(std::vector<Order> orders) {
    std::vector<Order> all = orders;
    for (const ReclaimOrder& rc : OfType<ReclaimOrder>(orders)) {
      if (!rc.backup_pages.empty()) {
        auto more = Do(mgr_->OnBackupComplete(rc.order, {}, true));
        all.insert(all.end(), more.begin(), more.end());
      }
      auto more = Do(mgr_->OnReadersDone(rc.order));
      all.insert(all.end(), more.begin(), more.end());
    }
    return all;
  }
};

// Reserved request ids (issue 12): 0 (RetireOrder.regranted_to's "none") and kNoOwner (2^64-1, a free page's owner)
// are refused with INVALID_ARGUMENT and change nothing; before, kNoOwner reached GpuPageTable::Take and a
// DHS_CHECK_OK aborted memd. The core's other answers to them (GpuOfRequest) say "unknown".
TEST_F(ResidencyTest, ReservedRequestIdsAreRefusedAndChangeNothing) {
  Make(4, 0, 8);
  for (RequestId reserved : {RequestId{0}, kNoOwner}) {
    AdmitRequest a;
    a.request = reserved;
    a.required_pages = 1;
    a.history_pages = 1;
    a.context_pages = 1;
    const absl::Status s = mgr_->Admit(a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("reserved"), std::string::npos) << s;
    EXPECT_TRUE(mgr_->DrainOrders().empty());
    EXPECT_FALSE(Known(reserved));
    EXPECT_FALSE(mgr_->GpuOfRequest(reserved).has_value());
  }
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
  EXPECT_EQ(OfType<GrantOrder>(Admit(kNoOwner - 1, 1, 1)).size(), 1u);  // the largest id that is not reserved
  EXPECT_EQ(mgr_->GpuOfRequest(kNoOwner - 1), std::optional<GpuId>(0));
}

TEST_F(ResidencyTest, ResidentFirstKeepsImportedHistoryOnGpuThenHost) {
  Make(10, 2, 16);
  auto o = Admit(1, 2, 9);  // lendable 8: 2 required, 6 history on GPU (optional-ready), 3 on host (tail-covered)
  auto grants = OfType<GrantOrder>(o);
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].required_pages.size(), 2u);
  EXPECT_EQ(grants[0].optional_pages.size(), 6u);
  EXPECT_EQ(grants[0].host_pages.size(), 9u);  // a host page for every page of the context
  EXPECT_EQ(grants[0].slot, 0u);
  EXPECT_TRUE(OfType<ReclaimOrder>(o).empty());  // host backup deferred
  const GpuPageTable* t = mgr_->gpu_table(0);
  EXPECT_EQ(t->required(), 2u);
  EXPECT_EQ(t->optional_ready(), 6u);
  EXPECT_EQ(t->free(), 2u);  // exactly M_res left
  EXPECT_EQ(Req(1).host_pages, 3u);
  EXPECT_EQ(Req(1).tail_pages, 3u);
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
  const uint32_t a[] = {0, 3, 4, 5};
  std::set<RequestId> reclaimed;
  for (const ReclaimOrder& rc : OfType<ReclaimOrder>(o)) {
    reclaimed.insert(rc.request);
    EXPECT_EQ(rc.gpu_pages.size(), a[rc.request]);
    EXPECT_EQ(rc.backup_pages, rc.gpu_pages);  // no host copy yet: every page is backed up
  }
  EXPECT_EQ(reclaimed, c.victims);
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
  EXPECT_TRUE(OfType<ReclaimOrder>(o).empty());
  EXPECT_TRUE(OfType<GrantOrder>(o).empty());
  ASSERT_EQ(OfType<WaitOrder>(o).size(), 1u);
  EXPECT_EQ(Req(2).state, RequestState::kQueued);
  EXPECT_EQ(Req(1).state, RequestState::kAdmitted);
  o = Do(mgr_->Complete(1));
  auto acks = OfType<CompleteAckOrder>(o);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].released_pages, 6u);  // 5 required + 1 optional
  auto g = OfType<GrantOrder>(o);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].request, 2u);
}

TEST_F(ResidencyTest, FailedBackupLeavesVictimUntouchedAndRetrySucceeds) {
  Make(8, 0, 16);
  auto a = OfType<GrantOrder>(Admit(1, 1, 3))[0];  // a_1 = 3, lendable 4
  auto o = Admit(2, 6, 0);                          // Δ = 2 -> reclaim request 1
  auto rc = OfType<ReclaimOrder>(o);
  ASSERT_EQ(rc.size(), 1u);
  ASSERT_EQ(rc[0].backup_pages.size(), 3u);
  const std::vector<PageIndex> bp = rc[0].backup_pages;
  Do(mgr_->OnBackupComplete(rc[0].order, {{bp[0]}}, true));
  o = Do(mgr_->OnBackupComplete(rc[0].order, {{bp[1]}}, false));  // copy error
  EXPECT_TRUE(o.empty());
  EXPECT_EQ(mgr_->OnReadersDone(rc[0].order).code(), absl::StatusCode::kFailedPrecondition);  // aborted
  o = Do(mgr_->OnBackupComplete(rc[0].order, {{bp[2]}}, true));
  EXPECT_TRUE(OfType<RetireOrder>(o).empty());
  EXPECT_TRUE(OfType<GrantOrder>(o).empty());
  EXPECT_EQ(mgr_->open_orders(), 0u);  // the aborted order owes nothing more
  // Victim untouched: admitted, same pages, all optional-ready; admission still waits.
  EXPECT_EQ(Req(1).state, RequestState::kAdmitted);
  EXPECT_EQ(Req(1).optional_pages, 3u);
  for (PageIndex p : a.optional_pages) {
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
  rc = OfType<ReclaimOrder>(o);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].gpu_pages.size(), 3u);
  ASSERT_EQ(rc[0].backup_pages, std::vector<PageIndex>{bp[1]});  // only the page without a host copy
  EXPECT_EQ(rc[0].backup_host_pages, std::vector<PageIndex>{a.host_pages[HistoryOf(a, bp[1])]});
  auto all = FinishReclaims(o);
  ASSERT_EQ(OfType<GrantOrder>(all).size(), 1u);
  EXPECT_EQ(Req(1).host_pages, 3u);
  EXPECT_EQ(Req(1).optional_pages, 0u);
}

// A backup that keeps failing: the victim is re-ordered after 1, 2, 4, ... RetryBackups calls (bounded back-off,
// at most kMaxRetryTicks), not on every call; once a reclaim of it retires, the back-off starts over. It used to be
// re-ordered on every RetryBackups (every second in memd) forever.
TEST_F(ResidencyTest, RepeatedBackupFailuresBackOffExponentially) {
  Make(8, 0, 16);
  Admit(1, 1, 3);                                      // a_1 = 3, lendable 4
  auto rc = OfType<ReclaimOrder>(Admit(2, 6, 0));      // Δ = 2 -> reclaim request 1
  std::vector<uint32_t> waited;                        // RetryBackups calls before each new ReclaimOrder
  for (int failure = 0; failure < 9; ++failure) {
    ASSERT_EQ(rc.size(), 1u) << "failure " << failure;
    Do(mgr_->OnBackupComplete(rc[0].order, {}, false));  // every backup fails
    uint32_t calls = 0;
    for (rc.clear(); rc.empty() && calls < 1000; ++calls) {
      auto o = Do(mgr_->Populate());                   // ticks in between never re-order it
      ASSERT_TRUE(OfType<ReclaimOrder>(o).empty());
      rc = OfType<ReclaimOrder>(Do(mgr_->RetryBackups()));
    }
    waited.push_back(calls);
  }
  EXPECT_EQ(waited, (std::vector<uint32_t>{1, 2, 4, 8, 16, 32, 64, 64, 64}));
  ASSERT_EQ(rc.size(), 1u);
  auto all = FinishReclaims({rc[0]});  // this time the backups succeed: retired, request 2 granted
  ASSERT_EQ(OfType<GrantOrder>(all).size(), 1u);
  EXPECT_EQ(mgr_->counters().reclaims_failed, 9u);
}

TEST_F(ResidencyTest, SlotIsChosenAtTheGrantAndFreedAtCompletion) {
  Make(16, 0, 16, "oldest-first", 8, /*slots=*/2);
  EXPECT_EQ(OfType<GrantOrder>(Admit(1, 1, 0))[0].slot, 0u);
  EXPECT_EQ(OfType<GrantOrder>(Admit(2, 1, 0))[0].slot, 1u);
  auto o = Admit(3, 1, 0);  // pages enough, but both slots in use: waits (no reclaim)
  EXPECT_TRUE(OfType<GrantOrder>(o).empty());
  ASSERT_EQ(OfType<WaitOrder>(o).size(), 1u);
  EXPECT_TRUE(OfType<ReclaimOrder>(o).empty());
  o = Do(mgr_->Complete(1));
  auto g = OfType<GrantOrder>(o);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].request, 3u);
  EXPECT_EQ(g[0].slot, 0u);  // the lowest free slot
  EXPECT_EQ(Req(3).slot, 0u);
  EXPECT_EQ(Req(2).slot, 1u);
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
  AdmitRequest a;
  a.request = 1;
  a.gpu = 7;
  a.required_pages = 1;
  EXPECT_EQ(mgr_->Admit(a).code(), absl::StatusCode::kNotFound);  // unknown GPU
  a.gpu = 0;
  a.required_pages = 0;
  EXPECT_EQ(mgr_->Admit(a).code(), absl::StatusCode::kInvalidArgument);  // no required pages
  a.required_pages = 1;
  a.history_pages = 3;
  a.context_pages = 2;
  EXPECT_EQ(mgr_->Admit(a).code(), absl::StatusCode::kInvalidArgument);  // complete pages beyond the context
  a.history_pages = 0;
  a.host_backed = true;  // a resume names the request it resumes
  EXPECT_EQ(mgr_->Admit(a).code(), absl::StatusCode::kInvalidArgument);
  Admit(1, 1, 0, 2);
  a.host_backed = false;
  EXPECT_EQ(mgr_->Admit(a).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(mgr_->OnBackupComplete(99, {}, true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->OnReadyPublish(99, {}, true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->OnReadersDone(99).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->OnHostCopyWritten(42, {{0u}}, {}, true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->OnHostCopyWritten(1, {{2u}}, {}, true).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(mgr_->OnHostCopyWritten(1, {{0u}}, {{7u, 7u}}, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->Complete(42).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->RegisterGpu(0, 4).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(mgr_->RegisterGpu(1, 1).code(), absl::StatusCode::kInvalidArgument);  // M_res 2 > M 1
  EXPECT_EQ(ResidencyManager::Create({.reclaim_policy = "lru"}, [] { return 0; }).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
  EXPECT_EQ(mgr_->counters().event_errors, 14u);  // every refused event above
  EXPECT_TRUE(mgr_->DrainOrders().empty());  // a refused event orders nothing
}

// A Hello whose M or request slots are beyond memd's bounds is refused (InvalidArgument), before any allocation: an
// M of 2^32-1 pages used to make the page table allocate ~50 GB and kill memd with std::bad_alloc.
TEST_F(ResidencyTest, RegisterGpuBeyondTheBoundsIsRefused) {
  Make(10, 2, 8);
  EXPECT_EQ(mgr_->RegisterGpu(1, kMaxGpuPages + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->RegisterGpu(1, 4, kMaxRequestSlots + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->RegisterGpu(1, 4, UINT32_MAX).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->RegisterGpu(1, UINT32_MAX).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->gpu_table(1), nullptr);
  EXPECT_EQ(mgr_->counters().event_errors, 4u);
  EXPECT_TRUE(mgr_->RegisterGpu(1, 4, kMaxRequestSlots).ok());  // at the bound: accepted
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
}

// Speculation shares are required pages (issue 13; brief §2 "required allocation", §8 "with a drafter"): a GPU whose
// pages go to draft rings and staging admits fewer sessions, exactly floor((M - M_res) / (base + ring + staging)).
// Numbers of brief §8's glm5-like preset, by hand: page = p * d_KV * L_pay = 64 * 576 * 78 = 2,875,392 bytes; base
// required = ceil((B + T) / p) = ceil((4096 + 64) / 64) = 65 pages; draft ring per slot R_d * 12,288 with R_d =
// 64 * ceil((2048 + 8 + 63) / 64) = 2176 rows = 26,738,688 bytes = 10 pages (9.3); staging per slot M_stage / N =
// χ * K_max * k * d_KV = 4 * 8 * 2048 * 576 = 37,748,736 bytes = 14 pages (13.1). With speculation a session requires
// 65 + 10 + 14 = 89 pages: of M = 1000, 11 sessions (979 pages) instead of floor(1000 / 65) = 15.
TEST_F(ResidencyTest, SpeculationSharesAreRequiredPagesAndAdmitFewerSessions) {
  Make(1000, 0, 8, "oldest-first", 8, /*slots=*/16);  // GPU 0: no speculation (its Hello declares none)
  constexpr uint64_t kPage = 2875392, kRing = 26738688, kStage = 37748736;
  ASSERT_EQ(kRing, 2176u * 12288);
  ASSERT_EQ(kStage, 4u * 8 * 2048 * 576);
  ASSERT_TRUE(mgr_->RegisterGpu(1, 1000, 16, GpuDeclaration{kPage, 16 * kRing, 16 * kStage}).ok());
  const SpeculationShare share{10, 14, kRing, kStage};
  std::map<GpuId, std::vector<RequestId>> granted, waiting;
  for (GpuId gpu : {0u, 1u}) {
    for (RequestId i = 1; i <= 16; ++i) {
      AdmitRequest a;
      a.request = gpu * 100 + i;
      a.gpu = gpu;
      a.required_pages = 65;
      if (gpu == 1) {
        a.speculation = share;
        a.required_pages += 24;
      }
      const auto orders = Do(mgr_->Admit(a));
      (OfType<GrantOrder>(orders).empty() ? waiting : granted)[gpu].push_back(a.request);
    }
  }
  EXPECT_EQ(granted[0].size(), 15u);  // 15 * 65 = 975; the 16th waits for 65 of the 25 left
  EXPECT_EQ(granted[1].size(), 11u);  // 11 * 89 = 979; the 12th waits for 89 of the 21 left
  EXPECT_EQ(waiting[1].size(), 5u);
  StateDump d = mgr_->Dump();
  const GpuDump& g1 = d.gpus[1];
  EXPECT_EQ(g1.required_pages, 979u);
  EXPECT_EQ(g1.draft_ring_pages, 110u);
  EXPECT_EQ(g1.staging_pages, 154u);
  EXPECT_EQ(g1.draft_ring_bytes, 294125568u);  // 11 * 26,738,688
  EXPECT_EQ(g1.staging_bytes, 415236096u);     // 11 * 37,748,736
  EXPECT_EQ(g1.declared_draft_ring_bytes, 427819008u);  // 16 * 26,738,688
  EXPECT_EQ(g1.declared_staging_bytes, 603979776u);     // 16 * 37,748,736 = χ * N * K_max * k * d_KV
  EXPECT_EQ(d.gpus[0].draft_ring_pages + d.gpus[0].staging_pages, 0u);
  const RequestDump queued = Req(waiting[1][0]);  // a queued admission shows its share; the GPU's sums do not count it
  EXPECT_EQ(queued.state, RequestState::kQueued);
  EXPECT_EQ(queued.draft_ring_pages, 10u);
  EXPECT_EQ(queued.staging_bytes, kStage);
  // A completion frees the 89 pages, share included: the head of the queue is granted, the sums stay at 11 sessions.
  auto o = Do(mgr_->Complete(granted[1][0]));
  ASSERT_EQ(OfType<CompleteAckOrder>(o).size(), 1u);
  EXPECT_EQ(OfType<CompleteAckOrder>(o)[0].released_pages, 89u);
  ASSERT_EQ(OfType<GrantOrder>(o).size(), 1u);
  EXPECT_EQ(OfType<GrantOrder>(o)[0].request, waiting[1][0]);
  EXPECT_EQ(OfType<GrantOrder>(o)[0].required_pages.size(), 89u);
  EXPECT_EQ(mgr_->Dump().gpus[1].draft_ring_pages, 110u);
  for (RequestId r = 102; r <= 116; ++r) Do(mgr_->Complete(r));  // 101 completed above
  d = mgr_->Dump();
  EXPECT_EQ(d.gpus[1].draft_ring_pages + d.gpus[1].staging_pages, 0u);
  EXPECT_EQ(d.gpus[1].draft_ring_bytes + d.gpus[1].staging_bytes, 0u);
  EXPECT_EQ(d.gpus[1].free_pages, 1000u);
}

// A bad speculation share is refused INVALID_ARGUMENT naming the numbers, and changes nothing.
TEST_F(ResidencyTest, BadSpeculationSharesAreRefused) {
  Make(100, 0, 8);
  ASSERT_TRUE(mgr_->RegisterGpu(1, 100, 4, GpuDeclaration{4096, 4 * 10000, 4 * 5000}).ok());
  AdmitRequest a;
  a.request = 1;
  a.gpu = 1;
  a.required_pages = 7;
  a.speculation = SpeculationShare{3, 2, 10000, 5000};  // ceil(10000 / 4096) = 3, ceil(5000 / 4096) = 2
  const auto refused = [&](AdmitRequest bad, const std::string& says) {
    const absl::Status s = mgr_->Admit(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(says), std::string::npos) << s;
    EXPECT_FALSE(mgr_->GpuOfRequest(bad.request).has_value());
    EXPECT_TRUE(mgr_->DrainOrders().empty());
    EXPECT_TRUE(mgr_->CheckInvariants().ok());
  };
  AdmitRequest b = a;
  b.required_pages = 4;
  refused(b, "draft ring 3 + staging 2 pages exceed its 4 required pages");
  b = a;
  b.speculation.draft_ring_pages = 2;
  b.required_pages = 6;
  refused(b, "pages of 4096 bytes need 3 and 2");
  b = a;
  b.speculation.staging_bytes = 20001;  // above the Hello's 4 * 5000
  b.speculation.staging_pages = 5;
  b.required_pages = 10;
  refused(b, "exceed its GPU's declared totals");
  b = a;
  b.gpu = 0;  // GPU 0's Hello declared no page bytes
  refused(b, "declared no page_bytes");
  EXPECT_EQ(mgr_->RegisterGpu(2, 4, 1, GpuDeclaration{kMaxGpuPageBytes + 1, 0, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->counters().event_errors, 5u);
  const auto o = Do(mgr_->Admit(a));  // the good one is granted with its 7 pages
  ASSERT_EQ(OfType<GrantOrder>(o).size(), 1u);
  EXPECT_EQ(Req(1).draft_ring_pages, 3u);
  EXPECT_EQ(Req(1).staging_bytes, 5000u);
  EXPECT_EQ(mgr_->Dump().gpus[1].staging_pages, 2u);
}

// The wire's history_rows is converted to context pages by the core, without overflow: ceil(rows / p) beyond 2^32-1
// pages (history_rows = 2^64-1 used to wrap to 0 pages in the daemon and be granted) is InvalidArgument, nothing
// changes; 2^32-1 pages is a valid number that can never fit (Reject).
TEST_F(ResidencyTest, ContextRowsBeyondAnyPoolAreRefusedWithoutOverflow) {
  Make(10, 2, 8);
  AdmitRequest a;
  a.request = 1;
  a.required_pages = 1;
  a.page_rows = 16;
  for (uint64_t rows : {UINT64_MAX, UINT64_MAX - 15, uint64_t{16} * UINT32_MAX + 1}) {
    a.context_rows = rows;
    EXPECT_EQ(mgr_->Admit(a).code(), absl::StatusCode::kInvalidArgument) << rows;
  }
  EXPECT_FALSE(Known(1));
  EXPECT_TRUE(mgr_->DrainOrders().empty());
  a.context_rows = uint64_t{16} * UINT32_MAX;  // exactly 2^32-1 pages: more than the host pool, rejected at once
  auto rejects = OfType<RejectOrder>(Do(mgr_->Admit(a)));
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_EQ(rejects[0].error.code(), absl::StatusCode::kResourceExhausted);
  a.request = 2;
  a.context_rows = 33;  // 3 pages of 16 rows (the last one partial)
  auto grants = OfType<GrantOrder>(Do(mgr_->Admit(a)));
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].host_pages.size(), 3u);
}

// HostCopyWritten naming a history page twice is refused whole (as BackupComplete and ReadyPublish refuse it): it
// used to be accepted and counted once per mention.
TEST_F(ResidencyTest, HostCopyWrittenNamingAPageTwiceIsRefused) {
  Make(10, 2, 8);
  Admit(1, 1, 0, 3);
  const Counters before = mgr_->counters();
  EXPECT_EQ(mgr_->OnHostCopyWritten(1, {{2u, 2u, 2u}}, {}, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->OnHostCopyWritten(1, {{0u, 1u, 0u}}, {}, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->counters().host_writes, before.host_writes);
  EXPECT_EQ(mgr_->counters().host_write_failures, before.host_write_failures);
  EXPECT_EQ(Req(1).tail_pages, 3u);
  EXPECT_TRUE(mgr_->DrainOrders().empty());
  Written(1, {0, 1, 2});
  EXPECT_EQ(mgr_->counters().host_writes, before.host_writes + 3);
  EXPECT_EQ(Req(1).tail_pages, 0u);
}

// Populate() and RetryBackups() (the daemon's 20 ms / 1 s timer) are ticks, not events: an idle memd used to count
// ~50 events a second in dhs_memd_events_total.
TEST_F(ResidencyTest, TicksAreNotCountedAsEvents) {
  Make(10, 2, 8);
  const uint64_t events = mgr_->counters().events;  // RegisterGpu
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(mgr_->Populate().ok());
  ASSERT_TRUE(mgr_->RetryBackups().ok());
  EXPECT_EQ(mgr_->counters().events, events);
  EXPECT_EQ(mgr_->counters().ticks, 6u);
  Admit(1, 1, 0, 1);
  EXPECT_EQ(mgr_->counters().events, events + 1);
}

// A report of a reclaim order that names a page it does not owe, names one twice, or says deferred for a page it
// does not report, is refused whole: nothing changes.
TEST_F(ResidencyTest, MalformedBackupReportChangesNothing) {
  Make(8, 0, 16);
  Admit(1, 1, 3);
  auto rc = OfType<ReclaimOrder>(Admit(2, 6, 0));
  ASSERT_EQ(rc.size(), 1u);
  const std::vector<PageIndex>& bp = rc[0].backup_pages;
  ASSERT_EQ(bp.size(), 3u);
  const PageIndex required_page = 7;  // not a page of the reclaim
  ASSERT_EQ(std::count(bp.begin(), bp.end(), required_page), 0);
  const Counters before = mgr_->counters();
  EXPECT_EQ(mgr_->OnBackupComplete(rc[0].order, {{bp[0], required_page}}, true).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->OnBackupComplete(rc[0].order, {{bp[0], bp[0]}}, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->OnBackupComplete(rc[0].order, {{bp[0]}}, true, {{bp[1]}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->OnReadyPublish(rc[0].order, {}, true).code(), absl::StatusCode::kNotFound);  // not a populate order
  EXPECT_EQ(mgr_->counters().backups_failed, before.backups_failed);
  EXPECT_EQ(Req(1).host_pages, 0u);
  EXPECT_TRUE(mgr_->DrainOrders().empty());
  auto all = FinishReclaims({rc[0]});
  EXPECT_EQ(OfType<GrantOrder>(all).size(), 1u);
  EXPECT_EQ(mgr_->OnBackupComplete(rc[0].order, {}, true).code(), absl::StatusCode::kNotFound);  // all reported
}

// A completed request's host page stays pinned (not reusable) until its population copy reports.
TEST_F(ResidencyTest, HostPageReusedOnlyAfterItsCopyCompletes) {
  Make(4, 0, 1);
  Admit(1, 1, 1);                       // history page 0 kept on GPU, lendable 2
  auto o = FinishReclaims(Admit(2, 3, 0));  // Δ = 1: request 1 reclaimed, page backed up, retired, 2 granted
  ASSERT_EQ(OfType<GrantOrder>(o).size(), 1u);
  Do(mgr_->Complete(2));
  auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 1u);
  ASSERT_EQ(pops[0].history_pages, std::vector<uint32_t>{0});
  auto ack = OfType<CompleteAckOrder>(Do(mgr_->Complete(1)));  // the population copy is still in flight
  ASSERT_EQ(ack.size(), 1u);
  EXPECT_EQ(ack[0].released_pages, 2u);  // required + the pending page (freed when its copy reports)
  EXPECT_EQ(mgr_->host().reusable(), 0u);
  EXPECT_EQ(mgr_->gpu_table(0)->free(), 3u);
  o = Admit(3, 1, 0, 1);  // needs the only host page: waits
  EXPECT_EQ(OfType<WaitOrder>(o).size(), 1u);
  o = Do(mgr_->OnReadyPublish(pops[0].order, {}, true));
  EXPECT_EQ(mgr_->gpu_table(0)->free(), 4u - 1u);  // the orphan page is free, request 3 took one
  auto g = OfType<GrantOrder>(o);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].host_pages, pops[0].host_pages);
  EXPECT_EQ(mgr_->open_orders(), 0u);
}

// Pages being populated are reclaimed with their copies in flight; the worker's ReadersDone may arrive first and is
// held until the copies reported; a failed population frees its page at once; the retire names the admission that
// took the pages (regranted_to).
TEST_F(ResidencyTest, ReclaimOfPendingPagesWaitsForTheirCopiesAndHoldsAnEarlyReadersDone) {
  Make(6, 0, 8);
  Admit(1, 1, 0, 3);
  Written(1, {0, 1, 2});
  auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 1u);
  ASSERT_EQ(pops[0].gpu_pages.size(), 3u);
  const std::vector<PageIndex> pp = pops[0].gpu_pages;
  Do(mgr_->OnReadyPublish(pops[0].order, {{pp[0]}}, true));  // one ready, two pending
  EXPECT_EQ(mgr_->gpu_table(0)->optional_pending(), 2u);
  auto o = Admit(2, 4, 0);  // lendable 2, Δ = 2 -> reclaim request 1 (a = 3)
  auto rc = OfType<ReclaimOrder>(o);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_TRUE(rc[0].backup_pages.empty());  // all pages have host copies
  EXPECT_EQ(mgr_->gpu_table(0)->reclaiming(), 3u);
  o = Do(mgr_->OnReadersDone(rc[0].order));  // early: two population copies still in flight
  EXPECT_TRUE(o.empty());
  o = Do(mgr_->OnReadyPublish(pops[0].order, {{pp[1]}}, false));  // failed: nothing published, page freed at once
  EXPECT_TRUE(o.empty());
  EXPECT_EQ(mgr_->gpu_table(0)->reclaiming(), 2u);
  o = Do(mgr_->OnReadyPublish(pops[0].order, {{pp[2]}}, true));  // the last copy: the held ReadersDone applies
  auto retire = OfType<RetireOrder>(o);
  ASSERT_EQ(retire.size(), 1u);
  EXPECT_EQ(retire[0].order, rc[0].order);
  EXPECT_EQ(std::set<PageIndex>(retire[0].gpu_pages.begin(), retire[0].gpu_pages.end()),
            (std::set<PageIndex>{pp[0], pp[2]}));
  EXPECT_EQ(retire[0].regranted_to, 2u);
  ASSERT_EQ(OfType<GrantOrder>(o).size(), 1u);
  EXPECT_EQ(Req(1).optional_pages, 0u);
  EXPECT_EQ(Req(1).host_pages, 3u);
  EXPECT_EQ(mgr_->open_orders(), 0u);
}

TEST_F(ResidencyTest, CompletionCancelsReclaimAndLateReportsAreIgnored) {
  Make(8, 0, 16);
  Admit(1, 1, 3);
  auto rc = OfType<ReclaimOrder>(Admit(2, 6, 0));
  ASSERT_EQ(rc.size(), 1u);
  Do(mgr_->OnBackupComplete(rc[0].order, {}, true));
  auto o = Do(mgr_->Complete(1));
  ASSERT_EQ(OfType<CompleteAckOrder>(o).size(), 1u);
  EXPECT_EQ(OfType<CompleteAckOrder>(o)[0].released_pages, 4u);
  auto g = OfType<GrantOrder>(o);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(OfType<RetireOrder>(o).empty());
  EXPECT_TRUE(mgr_->OnReadersDone(rc[0].order).ok());  // stale: its reclaim was cancelled
  EXPECT_EQ(mgr_->counters().stale_reports, 1u);
  EXPECT_EQ(mgr_->open_orders(), 0u);
}

TEST_F(ResidencyTest, FreeCountsReturnToStartAfterManyCompletions) {
  Make(32, 2, 64, "largest-first", 4);
  std::vector<Order> pending;
  for (RequestId r = 1; r <= 40; ++r) {
    auto o = Admit(r, 1 + r % 5, r % 7, r % 7 + 1);
    pending.insert(pending.end(), o.begin(), o.end());
    o = Do(mgr_->Populate());
    pending.insert(pending.end(), o.begin(), o.end());
    // Answer everything outstanding (this loop's orders may produce more); confirm every granted page written except
    // the kept ones (a kept page's HostCopyWritten would say its keep failed: memd would free its GPU page).
    while (!pending.empty()) {
      Order x = pending.back();
      pending.pop_back();
      std::vector<Order> more;
      if (auto* g = std::get_if<GrantOrder>(&x)) {
        std::vector<uint32_t> all;
        for (uint32_t h = static_cast<uint32_t>(g->optional_pages.size()); h < g->host_pages.size(); ++h) {
          all.push_back(h);
        }
        more = Written(g->request, all);
      }
      if (auto* rc = std::get_if<ReclaimOrder>(&x)) {
        if (!rc->backup_pages.empty()) more = Do(mgr_->OnBackupComplete(rc->order, {}, true));
        auto done = Do(mgr_->OnReadersDone(rc->order));
        more.insert(more.end(), done.begin(), done.end());
      }
      if (auto* p = std::get_if<PopulateOrder>(&x)) more = Do(mgr_->OnReadyPublish(p->order, {}, true));
      pending.insert(pending.end(), more.begin(), more.end());
    }
    if (r > 5) Do(mgr_->Complete(r - 5));
  }
  for (RequestId r = 36; r <= 40; ++r) Do(mgr_->Complete(r));
  EXPECT_TRUE(mgr_->Dump().requests.empty());
  EXPECT_EQ(mgr_->gpu_table(0)->free(), 32u);
  EXPECT_EQ(mgr_->host().reusable(), 64u);
  EXPECT_EQ(mgr_->open_orders(), 0u);
  EXPECT_GT(mgr_->counters().reclaims_retired, 0u);
  EXPECT_GT(mgr_->counters().populates_ordered, 0u);
}

// The worker contract (docs/protocol.md): a host page for every page of the full context at the grant; pages not
// kept optional are host-covered from the grant but populated only after the worker confirmed their bytes
// (HostCopyWritten); a reclaim backs up into the page's assigned host page, and a failed backup keeps that assignment.
using ContractTest = ResidencyTest;

TEST_F(ContractTest, HostPagesForTheWholeContextAndPopulationAfterConfirmedWrites) {
  Make(8, 0, 16);
  auto g = OfType<GrantOrder>(Admit(1, 2, 4, 6));
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].optional_pages.size(), 4u);  // 6 spare GPU pages keep all 4 complete pages
  ASSERT_EQ(g[0].host_pages.size(), 6u);
  EXPECT_EQ(std::set<PageIndex>(g[0].host_pages.begin(), g[0].host_pages.end()).size(), 6u);
  EXPECT_EQ(mgr_->host().allocated(), 6u);
  EXPECT_EQ(Req(1).host_pages, 2u);  // pages 4, 5: covered by the worker's tail until written

  // Request 2 (6 required) reclaims request 1: the backups go to the host pages assigned at the grant.
  auto rc = OfType<ReclaimOrder>(Admit(2, 6, 0, 1));
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].gpu_pages.size(), 4u);
  ASSERT_EQ(rc[0].backup_pages.size(), 4u);
  for (size_t i = 0; i < rc[0].backup_pages.size(); ++i) {
    EXPECT_EQ(rc[0].backup_host_pages[i], g[0].host_pages[HistoryOf(g[0], rc[0].backup_pages[i])]);
  }
  EXPECT_EQ(mgr_->host().allocated(), 6u);  // request 2 is queued: it holds nothing yet
  // A failed backup aborts the reclaim and keeps the assigned host pages.
  Do(mgr_->OnBackupComplete(rc[0].order, {{rc[0].backup_pages[0]}}, false));
  EXPECT_EQ(mgr_->host().pages_of(1), 6u);
  Do(mgr_->OnBackupComplete(rc[0].order, {}, true));  // the other three
  EXPECT_EQ(mgr_->host().pages_of(1), 6u);
  EXPECT_EQ(Req(1).host_pages, 5u);  // 3 backed up + 2 covered by the tail
  Do(mgr_->Complete(2));

  // Population: nothing to populate yet (the 4 pages are on GPU; pages 4, 5 are not confirmed written).
  EXPECT_TRUE(OfType<PopulateOrder>(Do(mgr_->Populate())).empty());
  Written(1, {5}, /*ok=*/false);  // a failed write changes nothing
  EXPECT_EQ(mgr_->counters().host_write_failures, 1u);
  EXPECT_TRUE(OfType<PopulateOrder>(Do(mgr_->Populate())).empty());
  Do(mgr_->OnHostCopyWritten(1, {{5u}}, {{g[0].host_pages[5]}}, true));
  auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 1u);
  EXPECT_EQ(pops[0].history_pages, std::vector<uint32_t>{5});
  EXPECT_EQ(pops[0].host_pages, std::vector<PageIndex>{g[0].host_pages[5]});

  // Bad reports are refused and change nothing.
  EXPECT_EQ(mgr_->OnHostCopyWritten(1, {{6u}}, {}, true).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(mgr_->OnHostCopyWritten(9, {{0u}}, {}, true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->OnHostCopyWritten(1, {{4u}}, {{g[0].host_pages[5]}}, true).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Req(1).tail_pages, 1u);  // page 4 still unconfirmed
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
}

// A reclaim backup answered "deferred" (the worker had only planned to keep the page, whose rows it is still writing,
// contract §4) lets the reclaim go on at once and covers the page by the worker's tail, but the page is populated only
// after the worker confirms its bytes (HostCopyWritten). A confirmation that arrives before the deferred answer is
// kept.
TEST_F(ContractTest, DeferredReclaimBackupRetiresAtOnceAndPopulatesOnlyAfterTheWrite) {
  Make(8, 0, 16);
  auto g = OfType<GrantOrder>(Admit(1, 2, 4, 6));
  ASSERT_EQ(g.size(), 1u);
  ASSERT_EQ(g[0].optional_pages.size(), 4u);
  auto rc = OfType<ReclaimOrder>(Admit(2, 6, 0, 1));  // needs request 1's 4 optional pages
  ASSERT_EQ(rc.size(), 1u);
  ASSERT_EQ(rc[0].backup_pages.size(), 4u);
  const std::vector<PageIndex>& opt = g[0].optional_pages;  // GPU page of history page h
  // Page 3 is confirmed written before its reclaim answer says deferred; pages 2 and 3 are deferred.
  Written(1, {3});
  Do(mgr_->OnBackupComplete(rc[0].order, {{opt[0], opt[1]}}, true));
  auto o = Do(mgr_->OnBackupComplete(rc[0].order, {{opt[2], opt[3]}}, true, {{opt[2], opt[3]}}));
  EXPECT_TRUE(o.empty()) << "the retire waits for the worker's ReadersDone";
  EXPECT_EQ(mgr_->counters().deferred_backups, 2u);
  auto granted = OfType<GrantOrder>(Do(mgr_->OnReadersDone(rc[0].order)));
  ASSERT_EQ(granted.size(), 1u);
  EXPECT_EQ(granted[0].request, 2u);
  EXPECT_EQ(Req(1).host_pages, 6u);  // all host-covered: 2 written, 1 confirmed, 1 deferred, 2 by the tail
  EXPECT_EQ(Req(1).tail_pages, 3u);  // page 2 (deferred) and pages 4, 5
  Do(mgr_->Complete(2));
  // Pages 0, 1 (backed up) and 3 (confirmed) are populated; page 2 is not until its write is confirmed.
  std::set<uint32_t> populated;
  for (const PopulateOrder& p : OfType<PopulateOrder>(Do(mgr_->Populate()))) {
    populated.insert(p.history_pages.begin(), p.history_pages.end());
  }
  EXPECT_EQ(populated, (std::set<uint32_t>{0, 1, 3}));
  Written(1, {2});
  auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 1u);
  EXPECT_EQ(pops[0].history_pages, std::vector<uint32_t>{2});
  EXPECT_EQ(pops[0].host_pages, std::vector<PageIndex>{g[0].host_pages[2]});
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
}

// A page kept at the grant whose keep copy failed is written to its host page instead and reported with
// HostCopyWritten (contract §3): outside a reclaim memd frees its GPU page at once (gpu -> host, a_r - 1), so an
// admission that needs the page is granted without a reclaim, and the page is populated only from its host copy. The
// same report crossing a reclaim of the request (the GPU page is the reclaim's) makes the page gpu-and-host and the
// reclaim retires it.
TEST_F(ContractTest, KeptPageWrittenOutsideAReclaimFreesItsGpuPage) {
  Make(8, 0, 16);
  auto g = OfType<GrantOrder>(Admit(1, 2, 4, 6));
  ASSERT_EQ(g.size(), 1u);
  ASSERT_EQ(g[0].optional_pages.size(), 4u);  // history pages 0..3 kept; 2 GPU pages free
  const std::vector<PageIndex>& opt = g[0].optional_pages;
  auto o = Written(1, {0});  // page 0's keep copy failed: written to host instead
  EXPECT_TRUE(OfType<ReclaimOrder>(o).empty());
  EXPECT_EQ(Req(1).optional_pages, 3u);
  EXPECT_EQ(Req(1).tail_pages, 2u) << "pages 4, 5 only";
  EXPECT_EQ(mgr_->gpu_table(0)->free(), 3u);
  EXPECT_EQ(mgr_->gpu_table(0)->state(opt[0]), PageState::kFree);
  EXPECT_EQ(mgr_->counters().keeps_lost, 1u);
  // Request 2 needs 3 pages: granted at once, with page 0's GPU page, no reclaim.
  o = Admit(2, 3, 0, 1);
  auto g2 = OfType<GrantOrder>(o);
  ASSERT_EQ(g2.size(), 1u);
  EXPECT_TRUE(OfType<ReclaimOrder>(o).empty());
  EXPECT_NE(std::find(g2[0].required_pages.begin(), g2[0].required_pages.end(), opt[0]),
            g2[0].required_pages.end());
  Do(mgr_->Complete(2));
  // Page 0 is host now: populated from its host page (into any free GPU page).
  auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 1u);
  EXPECT_EQ(pops[0].history_pages, std::vector<uint32_t>{0});
  EXPECT_EQ(pops[0].host_pages, std::vector<PageIndex>{g[0].host_pages[0]});
  Do(mgr_->OnReadyPublish(pops[0].order, {}, true));
  // A reclaim of request 1 orders backups of pages 1..3; page 1's HostCopyWritten crosses it: the page stays the
  // reclaim's (gpu-and-host), its GPU page is retired with the others.
  auto rc = OfType<ReclaimOrder>(Admit(3, 6, 0, 1));
  ASSERT_EQ(rc.size(), 1u);
  ASSERT_EQ(rc[0].backup_pages.size(), 3u);
  EXPECT_EQ(rc[0].gpu_pages.size(), 4u);
  Written(1, {1});
  EXPECT_EQ(Req(1).optional_pages, 4u) << "a reclaim's page is freed only by its Retire";
  EXPECT_EQ(mgr_->gpu_table(0)->state(opt[1]), PageState::kReclaiming);
  EXPECT_EQ(mgr_->counters().keeps_lost, 1u);
  auto all = FinishReclaims({Order(rc[0])});
  auto retired = OfType<RetireOrder>(all);
  ASSERT_EQ(retired.size(), 1u);
  EXPECT_EQ(retired[0].gpu_pages.size(), 4u);
  EXPECT_NE(std::find(retired[0].gpu_pages.begin(), retired[0].gpu_pages.end(), opt[1]), retired[0].gpu_pages.end());
  EXPECT_EQ(OfType<GrantOrder>(all).size(), 1u);
  EXPECT_EQ(Req(1).optional_pages, 0u);
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
}

// A request admitted with optional_history = false (hisparse mode) keeps none of its history on GPU at the grant, is
// never populated even with free GPU pages and confirmed host copies, and so is never a reclaim victim; an adaptive
// request beside it is populated.
TEST_F(ContractTest, RequestWithoutOptionalHistoryIsNeverKeptPopulatedOrReclaimed) {
  Make(16, 0, 32);
  AdmitRequest a;
  a.request = 1;
  a.required_pages = 2;
  a.history_pages = 4;
  a.context_pages = 6;
  a.optional_history = false;
  auto g = OfType<GrantOrder>(Do(mgr_->Admit(a)));
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(g[0].optional_pages.empty()) << "spare GPU pages, but hisparse keeps no optional history";
  ASSERT_EQ(g[0].host_pages.size(), 6u);
  ASSERT_EQ(OfType<GrantOrder>(Admit(2, 2, 0, 6)).size(), 1u);
  Written(1, {0, 1, 2, 3, 4, 5});
  Written(2, {0, 1, 2, 3, 4, 5});
  std::set<RequestId> populated;
  for (const PopulateOrder& p : OfType<PopulateOrder>(Do(mgr_->Populate()))) populated.insert(p.request);
  EXPECT_EQ(populated, std::set<RequestId>{2});
  EXPECT_EQ(Req(1).optional_pages, 0u);
  // A deficit reclaims request 2 (the only one with optional pages), never request 1.
  auto rc = OfType<ReclaimOrder>(Admit(3, 12, 0, 1));
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].request, 2u);
}

TEST_F(ContractTest, ContextLargerThanTheHostPoolIsRejectedAndWaitsForHostPages) {
  Make(8, 0, 4);
  auto rej = OfType<RejectOrder>(Admit(1, 1, 0, 5));
  ASSERT_EQ(rej.size(), 1u);
  EXPECT_EQ(rej[0].error.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(OfType<GrantOrder>(Admit(2, 1, 0, 3)).size(), 1u);
  auto o = Admit(3, 1, 0, 2);  // GPU room, but only 1 host page left: waits
  EXPECT_TRUE(OfType<GrantOrder>(o).empty());
  EXPECT_EQ(OfType<WaitOrder>(o).size(), 1u);
  EXPECT_EQ(OfType<GrantOrder>(Do(mgr_->Complete(2))).size(), 1u);
  EXPECT_EQ(mgr_->OnHostCopyWritten(3, {{0u}}, {}, true).code(), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace dhs::memd

namespace dhs::memd {
namespace {

// Issue 11: a fence while a reclaim's backups and a population copy are held in flight (the core's view of a worker
// killed while the device's copy hook holds them). Request 1 keeps 4 history pages on GPU (no host copy) + 2 tail
// pages; request 2 has 3 confirmed host pages being populated; request 3 queues and its deficit reclaims request 1.
// One backup of request 1 reports ok, history page 1 is confirmed by HostCopyWritten while its backup is in flight,
// pages 2 and 3 have only their backups in flight. After FenceGpu: nothing pinned, no order, request 3 rejected
// UNAVAILABLE, request 1 keeps exactly history pages 0 and 1, request 2 keeps 0..2, and the GPU re-registers (epoch 2).
TEST_F(ResidencyTest, FenceWithBackupAndPopulationHeldResolvesEveryOrder) {
  Make(10, 0, 32);
  const auto g1 = OfType<GrantOrder>(Admit(1, 1, 4, 6));
  ASSERT_EQ(g1.size(), 1u);
  ASSERT_EQ(g1[0].optional_pages.size(), 4u);
  const auto g2 = OfType<GrantOrder>(Admit(2, 1, 0, 3));
  ASSERT_EQ(g2.size(), 1u);
  Written(2, {0, 1, 2});
  const auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 1u);
  ASSERT_EQ(pops[0].gpu_pages.size(), 3u);
  const auto rc = OfType<ReclaimOrder>(Admit(3, 4, 0));  // free 1, Δ = 3: reclaims request 1 (a_r = 4)
  ASSERT_EQ(rc.size(), 1u);
  ASSERT_EQ(rc[0].request, 1u);
  ASSERT_EQ(rc[0].backup_pages.size(), 4u);
  Do(mgr_->OnBackupComplete(rc[0].order, {{g1[0].optional_pages[0]}}, true));
  Written(1, {1});  // confirmed while its backup is still in flight
  EXPECT_EQ(mgr_->host().pinned(), 6u);  // 3 backups + 3 population copies held
  EXPECT_EQ(mgr_->open_orders(), 2u);

  EXPECT_EQ(mgr_->FenceReason(0), "");  // up: no reason
  auto o = Do(mgr_->FenceGpu(0, "its connection closed"));
  const auto rejects = OfType<RejectOrder>(o);
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_EQ(rejects[0].request, 3u);
  EXPECT_EQ(rejects[0].error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(o.size(), 1u);
  EXPECT_EQ(mgr_->host().pinned(), 0u);
  EXPECT_EQ(mgr_->open_orders(), 0u);
  EXPECT_EQ(mgr_->copies_in_flight(), 0u);
  EXPECT_EQ(mgr_->gpu_table(0), nullptr);
  EXPECT_TRUE(mgr_->fenced(0));
  EXPECT_EQ(mgr_->FenceReason(0), "its connection closed");  // the core alone holds it (the daemon asks)
  EXPECT_EQ(mgr_->InterruptedHostPages(1),
            (std::map<uint32_t, PageIndex>{{0, g1[0].host_pages[0]}, {1, g1[0].host_pages[1]}}));
  EXPECT_EQ(mgr_->InterruptedHostPages(2), (std::map<uint32_t, PageIndex>{{0, g2[0].host_pages[0]},
                                                                         {1, g2[0].host_pages[1]},
                                                                         {2, g2[0].host_pages[2]}}));
  EXPECT_EQ(mgr_->host().allocated(), 5u);
  EXPECT_EQ(mgr_->host().reusable(), 27u);
  EXPECT_EQ(mgr_->counters().host_pages_lost, 4u);  // history pages 2, 3 (backups unconfirmed), 4, 5 (tail)
  EXPECT_EQ(Req(1).state, RequestState::kInterrupted);
  EXPECT_EQ(Req(1).host_pages, 2u);
  EXPECT_EQ(Req(1).slot, kNoSlot);
  EXPECT_FALSE(Known(3));
  const StateDump d = mgr_->Dump();
  ASSERT_EQ(d.gpus.size(), 1u);
  EXPECT_FALSE(d.gpus[0].up);
  EXPECT_EQ(d.gpus[0].epoch, 1u);

  // The dead worker's late reports name orders that no longer exist; its requests' host copies are fixed.
  EXPECT_EQ(mgr_->OnBackupComplete(rc[0].order, {}, true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->OnReadyPublish(pops[0].order, {}, true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->OnHostCopyWritten(1, {{2}}, {}, true).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(mgr_->FenceGpu(0, "again").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr_->FenceReason(0), "its connection closed");  // a refused fence changes nothing
  AdmitRequest a;
  a.request = 4;
  a.required_pages = 1;
  EXPECT_EQ(mgr_->Admit(a).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(mgr_->DrainOrders().empty());
  EXPECT_TRUE(mgr_->CheckInvariants().ok()) << mgr_->CheckInvariants();

  // A new worker: epoch 2, a fresh table, the interrupted requests listed; Complete releases their host pages.
  Do(mgr_->RegisterGpu(0, 10));
  EXPECT_EQ(mgr_->epoch(0), 2u);
  EXPECT_FALSE(mgr_->fenced(0));
  EXPECT_EQ(mgr_->FenceReason(0), "");
  EXPECT_EQ(mgr_->counters().reregistrations, 1u);
  EXPECT_EQ(mgr_->InterruptedRequests(0), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(mgr_->gpu_table(0)->free(), 10u);
  EXPECT_EQ(OfType<GrantOrder>(Admit(5, 2, 0, 2)).size(), 1u);
  for (RequestId r : {1, 2}) {
    const auto acks = OfType<CompleteAckOrder>(Do(mgr_->Complete(r)));
    ASSERT_EQ(acks.size(), 1u);
    EXPECT_EQ(acks[0].released_pages, 0u);
  }
  EXPECT_EQ(mgr_->host().allocated(), 2u);  // request 5's context only
  EXPECT_TRUE(mgr_->InterruptedRequests(0).empty());
}


// Issue 11, resume from host KV: after a fence, a new request of the GPU's next epoch takes over EVERY kept host page
// of an interrupted request in one Admit, gaps and all (request 1 of 5 pages: copy, gap, copy, gap, tail = history
// pages 0 and 2 confirmed), the interrupted request ends, the grant names them (host_backed_pages = {0, 2}, the
// leading run imported_pages = 1) on the same host pages with fresh host pages for the rest and no optional GPU page;
// population brings them back; bad resumes change nothing; at the end no host page is held.
TEST_F(ResidencyTest, ResumeTakesOverEveryKeptHostPageGapsAndAllInOneEvent) {
  Make(10, 0, 32);
  const auto g1 = OfType<GrantOrder>(Admit(1, 1, 0, 5));
  const auto g2 = OfType<GrantOrder>(Admit(2, 1, 0, 3));
  ASSERT_EQ(g1.size(), 1u);
  ASSERT_EQ(g2.size(), 1u);
  EXPECT_EQ(g1[0].imported_pages, 0u);
  EXPECT_TRUE(g1[0].host_backed_pages.empty());
  Written(1, {0, 2});
  Written(2, {0});
  Do(mgr_->FenceGpu(0));
  ASSERT_EQ(mgr_->host().allocated(), 3u);
  Do(mgr_->RegisterGpu(0, 10));
  ASSERT_TRUE(mgr_->RegisterGpu(1, 10).ok());
  const StateDump before = mgr_->Dump();

  AdmitRequest a;
  a.request = 10;
  a.required_pages = 1;
  a.context_pages = 5;
  a.host_backed = true;
  uint32_t held = 3;  // host pages allocated: the interrupted requests' kept copies (+ request 3's below)
  auto refused = [&](AdmitRequest bad, absl::StatusCode code) {
    const absl::Status s = mgr_->Admit(bad);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_TRUE(mgr_->DrainOrders().empty());
    EXPECT_TRUE(mgr_->CheckInvariants().ok());
    EXPECT_EQ(mgr_->InterruptedRequests(0), (std::vector<RequestId>{1, 2}));
    EXPECT_EQ(mgr_->host().allocated(), held);
  };
  refused(a, absl::StatusCode::kInvalidArgument);  // host_backed without resume_of
  a.resume_of = 99;
  refused(a, absl::StatusCode::kNotFound);  // unknown
  Admit(3, 1, 0, 1);
  held = 4;
  a.resume_of = 3;
  refused(a, absl::StatusCode::kInvalidArgument);  // admitted, not interrupted
  a.resume_of = 1;
  a.host_backed = false;
  refused(a, absl::StatusCode::kInvalidArgument);  // resume_of without host_backed
  a.host_backed = true;
  a.context_pages = 2;
  refused(a, absl::StatusCode::kInvalidArgument);  // kept history page 2 is outside a context of 2 pages
  a.context_pages = 5;
  a.gpu = 1;
  refused(a, absl::StatusCode::kInvalidArgument);  // another GPU's worker
  a.gpu = 0;
  EXPECT_EQ(mgr_->InterruptedHostPages(1), (std::map<uint32_t, PageIndex>{{0, g1[0].host_pages[0]},
                                                                          {2, g1[0].host_pages[2]}}));
  EXPECT_EQ(before.requests.size() + 1, mgr_->Dump().requests.size());  // request 3 only

  const auto g = OfType<GrantOrder>(Do(mgr_->Admit(a)));
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].request, 10u);
  EXPECT_EQ(g[0].imported_pages, 1u);  // the leading run (what a worker that reads no host_backed_pages imports)
  EXPECT_EQ(g[0].host_backed_pages, (std::vector<uint32_t>{0, 2}));
  ASSERT_EQ(g[0].host_pages.size(), 5u);
  EXPECT_EQ(g[0].host_pages[0], g1[0].host_pages[0]);
  EXPECT_EQ(g[0].host_pages[2], g1[0].host_pages[2]);
  const std::set<PageIndex> distinct(g[0].host_pages.begin(), g[0].host_pages.end());
  EXPECT_EQ(distinct.size(), 5u);  // pages 1, 3, 4: fresh host pages of their own
  EXPECT_TRUE(g[0].optional_pages.empty());
  EXPECT_FALSE(Known(1));
  EXPECT_EQ(mgr_->InterruptedRequests(0), (std::vector<RequestId>{2}));
  EXPECT_EQ(mgr_->counters().resumes, 1u);
  EXPECT_EQ(mgr_->counters().host_pages_resumed, 2u);
  EXPECT_EQ(mgr_->host().allocated(), 1u + 1u + 5u);  // request 2's kept page, request 3, request 10
  EXPECT_EQ(Req(10).host_pages, 5u);  // host-covered: 2 confirmed copies, 3 in the tail
  EXPECT_EQ(Req(10).tail_pages, 3u);
  // The pages without a copy are recomputed by the worker and written as any other page: confirmed by
  // HostCopyWritten into the fresh host pages the grant assigned.
  Written(10, {1});
  EXPECT_EQ(Req(10).tail_pages, 2u);
  const auto pops = OfType<PopulateOrder>(Do(mgr_->Populate()));
  ASSERT_EQ(pops.size(), 1u);
  EXPECT_EQ(pops[0].request, 10u);
  EXPECT_EQ(pops[0].history_pages, (std::vector<uint32_t>{0, 1, 2}));
  Do(mgr_->OnReadyPublish(pops[0].order, {}, true));
  for (RequestId r : {10, 2, 3}) Do(mgr_->Complete(r));
  EXPECT_EQ(mgr_->host().allocated(), 0u);
  EXPECT_EQ(mgr_->host().reusable(), 32u);
  EXPECT_EQ(mgr_->gpu_table(0)->free(), 10u);
}

// A resume that must wait (the only slot is taken) holds the host pages it took over while queued; a fence rejects
// it and frees them; a queued resume completed by its worker frees them too.
TEST_F(ResidencyTest, QueuedResumeHoldsItsHostPagesUntilFencedOrCompleted) {
  Make(10, 0, 32, "oldest-first", 8, /*slots=*/1);
  Admit(1, 1, 0, 3);
  Admit(2, 1, 0, 2);  // waits for the slot
  Do(mgr_->Complete(2));
  Written(1, {0, 1});
  Do(mgr_->FenceGpu(0));
  Do(mgr_->RegisterGpu(0, 10, 1));
  Admit(3, 1, 0, 1);  // holds the slot
  AdmitRequest a;
  a.request = 4;
  a.required_pages = 1;
  a.context_pages = 3;
  a.host_backed = true;
  a.resume_of = 1;
  EXPECT_EQ(OfType<WaitOrder>(Do(mgr_->Admit(a))).size(), 1u);
  EXPECT_EQ(mgr_->host().allocated(), 1u + 2u);  // request 3, request 4's two taken-over pages
  EXPECT_EQ(Req(4).host_pages, 2u);
  EXPECT_EQ(mgr_->Dump().gpus[0].queued_host_pages, 1u);  // its context of 3 pages, 2 of them owned already
  EXPECT_TRUE(mgr_->InterruptedRequests(0).empty());
  // A fence while it is queued: no reject (its predecessor is gone; rejecting would lose what it took over): it is
  // interrupted again, holding history pages 0 and 1 on the same host pages, page 2 lost; request 3 had no
  // confirmed copy, so its host page is freed.
  const std::map<uint32_t, PageIndex> taken = mgr_->InterruptedHostPages(1);
  EXPECT_TRUE(taken.empty());  // request 1 ended at the take-over
  EXPECT_TRUE(OfType<RejectOrder>(Do(mgr_->FenceGpu(0))).empty());
  EXPECT_EQ(mgr_->InterruptedRequests(0), (std::vector<RequestId>{3, 4}));
  const std::map<uint32_t, PageIndex> kept = mgr_->InterruptedHostPages(4);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_TRUE(kept.contains(0) && kept.contains(1));
  EXPECT_EQ(mgr_->host().allocated(), 2u);
  EXPECT_EQ(Req(4).host_pages, 2u);
  // The next worker resumes it again: it takes over the same two pages, then completes; request 3 is given up.
  Do(mgr_->RegisterGpu(0, 10, 1));
  Do(mgr_->Complete(3));
  a.request = 8;
  a.resume_of = 4;
  Do(mgr_->Admit(a));
  EXPECT_EQ(Req(8).host_pages, 3u);  // granted: the 2 taken over + 1 fresh
  EXPECT_EQ(mgr_->host().allocated(), 3u);
  Do(mgr_->Complete(8));
  EXPECT_EQ(mgr_->host().allocated(), 0u);
  // Completed while queued.
  Admit(5, 1, 0, 2);
  Written(5, {0});
  Do(mgr_->FenceGpu(0));
  Do(mgr_->RegisterGpu(0, 10, 1));
  Admit(6, 1, 0, 1);
  a.request = 7;
  a.resume_of = 5;
  EXPECT_EQ(OfType<WaitOrder>(Do(mgr_->Admit(a))).size(), 1u);
  EXPECT_EQ(mgr_->host().allocated(), 2u);
  Do(mgr_->Complete(7));
  Do(mgr_->Complete(6));
  EXPECT_EQ(mgr_->host().allocated(), 0u);
}

// A resume that can never fit is rejected after it took its interrupted request over: the reject names that request
// (RejectOrder.took_over -> AdmitReject.took_over), which is gone with every host page it kept; a bad resume is
// refused before any change (a status, no order) and its request stays interrupted. A plain request's reject names
// none. (libdhs lists a resume's request by this: tests/libdhs EmbeddedResumeList, libdhs_api
// ARejectedResumeListsItsRequestWhileMemdHoldsIt.)
TEST_F(ResidencyTest, ARejectedResumeNamesTheInterruptedRequestItTookOver) {
  Make(10, 0, 32);
  Admit(1, 1, 0, 3);
  Written(1, {0, 1});
  Do(mgr_->FenceGpu(0));
  Do(mgr_->RegisterGpu(0, 10));
  ASSERT_EQ(mgr_->InterruptedRequests(0), std::vector<RequestId>{1});
  ASSERT_EQ(mgr_->host().allocated(), 2u);
  AdmitRequest a;
  a.request = 4;
  a.required_pages = 1;
  a.context_pages = 1;  // kept history page 1 is outside a context of 1 page: refused, nothing changes
  a.host_backed = true;
  a.resume_of = 1;
  EXPECT_EQ(mgr_->Admit(a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(mgr_->DrainOrders().empty());
  EXPECT_EQ(mgr_->InterruptedRequests(0), std::vector<RequestId>{1});
  EXPECT_EQ(mgr_->host().allocated(), 2u);
  a.context_pages = 33;  // more host pages than the pool's 32: it never fits
  const std::vector<RejectOrder> rejects = OfType<RejectOrder>(Do(mgr_->Admit(a)));
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_EQ(rejects[0].request, 4u);
  EXPECT_EQ(rejects[0].error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(rejects[0].took_over, 1u);
  EXPECT_TRUE(mgr_->InterruptedRequests(0).empty());
  EXPECT_EQ(mgr_->host().allocated(), 0u) << "the taken-over host pages are freed with the reject";
  a.request = 5;
  a.host_backed = false;
  a.resume_of = 0;
  const std::vector<RejectOrder> plain = OfType<RejectOrder>(Do(mgr_->Admit(a)));
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].took_over, 0u);
  EXPECT_TRUE(mgr_->CheckInvariants().ok());
}

// Issue 22, host-page integrity: the checksum a HostCopyWritten reports with each page is kept with the confirmed
// copy (a repeated report never replaces a known one; a list of another length is refused and changes nothing),
// survives the fence with the page, and the resume's grant names it with its page (host_backed_checksums, same
// order as host_backed_pages). A page confirmed without a checksum is handed on with 0 (none known).
TEST_F(ResidencyTest, ChecksumsOfConfirmedCopiesReachTheResumeGrant) {
  Make(10, 0, 32);
  ASSERT_EQ(OfType<GrantOrder>(Admit(1, 1, 0, 5)).size(), 1u);
  EXPECT_EQ(mgr_->OnHostCopyWritten(1, std::vector<uint32_t>{0, 2}, {}, true, std::vector<uint64_t>{111})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Req(1).tail_pages, 5u);  // refused whole: nothing confirmed
  Do(mgr_->OnHostCopyWritten(1, std::vector<uint32_t>{0, 2}, {}, true, std::vector<uint64_t>{111, 333}));
  Do(mgr_->OnHostCopyWritten(1, std::vector<uint32_t>{2}, {}, true, std::vector<uint64_t>{999}));  // repeated
  Written(1, {3});  // no checksum
  Do(mgr_->FenceGpu(0));
  Do(mgr_->RegisterGpu(0, 10));
  AdmitRequest a;
  a.request = 10;
  a.required_pages = 1;
  a.context_pages = 5;
  a.host_backed = true;
  a.resume_of = 1;
  const auto g = OfType<GrantOrder>(Do(mgr_->Admit(a)));
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].host_backed_pages, (std::vector<uint32_t>{0, 2, 3}));
  EXPECT_EQ(g[0].host_backed_checksums, (std::vector<uint64_t>{111, 333, 0}));
  // A fence of the resumed request keeps them again for the next resume.
  Do(mgr_->FenceGpu(0));
  Do(mgr_->RegisterGpu(0, 10));
  a.request = 11;
  a.resume_of = 10;
  const auto g2 = OfType<GrantOrder>(Do(mgr_->Admit(a)));
  ASSERT_EQ(g2.size(), 1u);
  EXPECT_EQ(g2[0].host_backed_checksums, (std::vector<uint64_t>{111, 333, 0}));
  Do(mgr_->Complete(11));
}

}  // namespace
}  // namespace dhs::memd
