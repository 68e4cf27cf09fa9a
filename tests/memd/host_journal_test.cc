// The host pool's page-ownership journal (memd/host_journal.h) and the core's AdoptHostPages (issue 11, memd
// restart): entries written and read back, raw bytes that do not verify (each kind of damage named), a write torn at
// every store boundary still verifying to the state before or after it, and a core that adopts a dead core's journal
// holding exactly what FenceGpu leaves (computed by fencing the original core).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "memd/host_journal.h"
#include "memd/residency_manager.h"

namespace dhs::memd {
namespace {

constexpr uint32_t kPages = 8;

struct Buffer {
  explicit Buffer(uint32_t pages) : words(HostJournal::BytesFor(pages) / 8, 0xA5A5A5A5A5A5A5A5ull) {}
  std::span<uint8_t> bytes() { return {reinterpret_cast<uint8_t*>(words.data()), words.size() * 8}; }
  uint64_t& word(PageIndex page, int w) { return words[(kJournalHeaderBytes + kJournalEntryBytes * page) / 8 + w]; }
  std::vector<uint64_t> words;
};

HostJournal Formatted(Buffer& b, uint32_t pages = kPages) {
  HostJournal j = *HostJournal::Attach(b.bytes(), pages);
  j.Format();
  return j;
}

TEST(HostJournal, EntriesReadBackAndVerifyToTheirRequests) {
  Buffer b(kPages);
  HostJournal j = Formatted(b);
  j.Assign(3, 77, 0, 2);
  j.Assign(5, 77, 1, 2);
  j.Confirm(5);
  j.Assign(6, 99, 0, 1);
  j.Free(6);
  const JournalEntry e = j.Read(5);
  EXPECT_EQ(e.state, JournalState::kConfirmed);
  EXPECT_EQ(e.owner, 77u);
  EXPECT_EQ(e.history_page, 1u);
  EXPECT_EQ(e.context_pages, 2u);
  EXPECT_EQ(j.Read(6).state, JournalState::kFree);
  auto v = j.Verify();
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->size(), 1u);
  const JournaledRequest& r = v->at(77);
  EXPECT_EQ(r.context_pages, 2u);
  EXPECT_EQ(r.confirmed, (std::map<uint32_t, PageIndex>{{1, 5}}));
  EXPECT_EQ(r.assigned, (std::map<uint32_t, PageIndex>{{0, 3}}));
  // A second view of the same bytes (the next memd) reads the same.
  HostJournal again = *HostJournal::Attach(b.bytes(), kPages);
  EXPECT_EQ(again.Verify()->at(77).confirmed, r.confirmed);
}

TEST(HostJournal, AttachRefusesTooSmallOrMisalignedMemory) {
  Buffer b(kPages);
  EXPECT_EQ(HostJournal::Attach(b.bytes().subspan(0, HostJournal::BytesFor(kPages) - 1), kPages).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostJournal::Attach(b.bytes().subspan(4), 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// Raw bytes: each kind of damage is refused DATA_LOSS naming the entry; an unformatted region (the 0xA5 fill) too.
TEST(HostJournal, DamagedBytesDoNotVerify) {
  {
    Buffer b(kPages);
    HostJournal j = *HostJournal::Attach(b.bytes(), kPages);
    EXPECT_EQ(j.Verify().status().code(), absl::StatusCode::kDataLoss);  // never formatted
  }
  {
    Buffer b(kPages);
    Formatted(b);
    EXPECT_EQ(HostJournal::Attach(b.bytes(), kPages - 1)->Verify().status().code(),
              absl::StatusCode::kDataLoss);  // other geometry: header says kPages
  }
  struct Damage {
    const char* what;
    int word;
    uint64_t value;
  };
  for (const Damage& d : {Damage{"owner flipped", 0, 78}, Damage{"meta flipped", 1, (uint64_t{0} << 32) | 3},
                          Damage{"tag garbage", 2, 0x1234567890abcdefull}, Damage{"unknown state", 2, 0x07}}) {
    SCOPED_TRACE(d.what);
    Buffer b(kPages);
    HostJournal j = Formatted(b);
    j.Assign(2, 77, 0, 2);
    j.Confirm(2);
    b.word(2, d.word) = d.value;
    const auto v = j.Verify();
    ASSERT_EQ(v.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(v.status().message().find("host page 2"), std::string_view::npos) << v.status();
  }
}

// Well-formed entries that contradict each other: one history page on two host pages, two context sizes for one
// owner, a history page outside its context.
TEST(HostJournal, ContradictoryEntriesDoNotVerify) {
  {
    Buffer b(kPages);
    HostJournal j = Formatted(b);
    j.Assign(1, 5, 0, 2);
    j.Assign(2, 5, 0, 2);
    EXPECT_EQ(j.Verify().status().code(), absl::StatusCode::kDataLoss);
  }
  {
    Buffer b(kPages);
    HostJournal j = Formatted(b);
    j.Assign(1, 5, 0, 2);
    j.Assign(2, 5, 1, 3);
    EXPECT_EQ(j.Verify().status().code(), absl::StatusCode::kDataLoss);
  }
  {
    Buffer b(kPages);
    HostJournal j = Formatted(b);
    j.Assign(1, 5, 4, 2);
    EXPECT_EQ(j.Verify().status().code(), absl::StatusCode::kDataLoss);
  }
  {
    Buffer b(kPages);
    HostJournal j = Formatted(b);
    j.Assign(1, 5, 0, kPages + 1);  // a context larger than the pool
    EXPECT_EQ(j.Verify().status().code(), absl::StatusCode::kDataLoss);
  }
}

// SIGKILL between any two stores: replay each write's stores one by one onto a copy and verify after each. Assign:
// free until its tag store, then assigned; Free: free from its first store; Confirm: one store.
TEST(HostJournal, EveryStoreBoundaryVerifies) {
  Buffer before(kPages);
  HostJournal j = Formatted(before);
  j.Assign(4, 42, 1, 3);  // an entry already assigned, to be confirmed and freed below
  Buffer after = before;
  HostJournal ja = *HostJournal::Attach(after.bytes(), kPages);
  ja.Assign(6, 43, 0, 1);  // the write under test
  // Stores of Assign in order: owner, meta, tag. Apply a prefix of them to `before`.
  for (int stores = 0; stores <= 3; ++stores) {
    Buffer torn = before;
    for (int w = 0; w < stores; ++w) torn.word(6, w) = after.word(6, w);
    auto v = HostJournal::Attach(torn.bytes(), kPages)->Verify();
    ASSERT_TRUE(v.ok()) << "after " << stores << " stores: " << v.status();
    EXPECT_EQ(v->contains(43), stores == 3) << stores;
  }
  // Free of page 4: tag first, then owner and meta.
  Buffer freed = before;
  HostJournal jf = *HostJournal::Attach(freed.bytes(), kPages);
  jf.Free(4);
  const int order[] = {2, 0, 1};
  for (int stores = 0; stores <= 3; ++stores) {
    Buffer torn = before;
    for (int i = 0; i < stores; ++i) torn.word(4, order[i]) = freed.word(4, order[i]);
    auto v = HostJournal::Attach(torn.bytes(), kPages)->Verify();
    ASSERT_TRUE(v.ok()) << "after " << stores << " stores: " << v.status();
    EXPECT_EQ(v->contains(42), stores == 0) << stores;
  }
}

// ---------------------------------------------------------------- AdoptHostPages

class AdoptTest : public ::testing::Test {
 protected:
  static ResidencyConfig Config() {
    ResidencyConfig c;
    c.reserve_pages = 0;
    c.host_pages = 16;
    c.host_page_bytes = 4096;
    return c;
  }
  void SetUp() override {
    journal_.emplace(Formatted(buffer_, 16));
    auto m = ResidencyManager::Create(Config(), [] { return 5; }, &*journal_);
    ASSERT_TRUE(m.ok()) << m.status();
    old_ = std::move(*m);
    ASSERT_TRUE(old_->RegisterGpu(0, 16, 4).ok());
  }
  void Ok(absl::Status s) {
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(old_->CheckInvariants().ok()) << old_->CheckInvariants();
  }
  // The dead memd's journal, adopted by a new core over a copy of its bytes.
  std::unique_ptr<ResidencyManager> Adopt(Buffer& copy, std::optional<HostJournal>& journal, uint32_t epoch = 1) {
    journal.emplace(*HostJournal::Attach(copy.bytes(), 16));
    auto v = journal->Verify();
    EXPECT_TRUE(v.ok()) << v.status();
    std::vector<AdoptedRequest> adopted;
    for (const auto& [id, jr] : *v) adopted.push_back({id, 0, epoch, jr.context_pages, jr.confirmed, jr.checksums});
    auto m = ResidencyManager::Create(Config(), [] { return 9; }, &*journal);
    EXPECT_TRUE(m.ok());
    EXPECT_TRUE((*m)->AdoptHostPages(adopted).ok());
    EXPECT_TRUE((*m)->CheckInvariants().ok()) << (*m)->CheckInvariants();
    return std::move(*m);
  }

  Buffer buffer_{16};
  std::optional<HostJournal> journal_;
  std::unique_ptr<ResidencyManager> old_;
};

// Request 1: 6 context pages, 2 kept on GPU at the grant; pages 2, 3 confirmed by HostCopyWritten, kept page 0 backed
// up by a reclaim's backup (confirmed) while kept page 1's backup is still in flight. Request 2: queued. What the new
// core adopts equals what FenceGpu leaves in the old one: request 1 interrupted with host copies of pages 0, 2, 3.
TEST_F(AdoptTest, AdoptedStateIsExactlyWhatFenceGpuLeaves) {
  AdmitRequest a{.request = 1, .gpu = 0, .required_pages = 2, .history_pages = 2, .context_pages = 6};
  Ok(old_->Admit(a));
  (void)old_->DrainOrders();
  Ok(old_->OnHostCopyWritten(1, std::vector<uint32_t>{2, 3}, {}, true));
  // A reclaim of request 1: admission 2 needs every lendable page.
  AdmitRequest b{.request = 2, .gpu = 0, .required_pages = 14, .history_pages = 0, .context_pages = 1};
  Ok(old_->Admit(b));
  std::vector<Order> orders = old_->DrainOrders();
  const ReclaimOrder* rc = nullptr;
  for (const Order& o : orders) {
    if (const auto* r = std::get_if<ReclaimOrder>(&o)) rc = r;
  }
  ASSERT_NE(rc, nullptr);
  ASSERT_EQ(rc->backup_pages.size(), 2u);
  Ok(old_->OnBackupComplete(rc->order, std::vector<PageIndex>{rc->backup_pages[0]}, true));
  // memd dies here: the segment keeps the journal's bytes.
  Buffer copy = buffer_;
  std::optional<HostJournal> journal;
  std::unique_ptr<ResidencyManager> adopted = Adopt(copy, journal, 3);
  Ok(old_->FenceGpu(0));
  EXPECT_EQ(adopted->InterruptedRequests(0), old_->InterruptedRequests(0));
  EXPECT_EQ(adopted->InterruptedRequests(0), std::vector<RequestId>{1});
  EXPECT_EQ(adopted->InterruptedHostPages(1), old_->InterruptedHostPages(1));
  EXPECT_EQ(adopted->InterruptedHostPages(1).size(), 3u);
  const StateDump d_new = adopted->Dump(), d_old = old_->Dump();
  ASSERT_EQ(d_new.requests.size(), 1u);
  EXPECT_EQ(d_new.requests[0].history_pages, d_old.requests[0].history_pages);
  EXPECT_EQ(d_new.requests[0].host_pages, d_old.requests[0].host_pages);
  EXPECT_EQ(adopted->host().allocated(), old_->host().allocated());
  EXPECT_EQ(adopted->host().pinned(), 0u);
  EXPECT_EQ(adopted->counters().requests_adopted, 1u);
  EXPECT_EQ(adopted->counters().host_pages_adopted, 3u);
  EXPECT_EQ(adopted->counters().host_pages_held, 13u);
  // The unconfirmed entries of the dead memd are free now; the GPU is fenced at epoch 3, its next worker gets 4.
  EXPECT_EQ(journal->Verify()->at(1).assigned.size(), 0u);
  EXPECT_TRUE(adopted->fenced(0));
  ASSERT_TRUE(adopted->RegisterGpu(0, 16, 4).ok());
  EXPECT_EQ(adopted->epoch(0), 4u);
  EXPECT_EQ(adopted->InterruptedRequests(0), std::vector<RequestId>{1});
  // The 13 pages not adopted are held (the dead memd's workers may still write them): an admission waits until
  // ReleaseHeldPages, then it is granted.
  EXPECT_EQ(adopted->host().held(), 13u);
  EXPECT_EQ(adopted->host().reusable(), 0u);
  AdmitRequest later{.request = 7, .gpu = 0, .required_pages = 1, .history_pages = 0, .context_pages = 2};
  ASSERT_TRUE(adopted->Admit(later).ok());
  std::vector<Order> orders_later = adopted->DrainOrders();
  ASSERT_EQ(orders_later.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<WaitOrder>(orders_later[0]));
  ASSERT_TRUE(adopted->ReleaseHeldPages().ok());
  EXPECT_TRUE(adopted->CheckInvariants().ok()) << adopted->CheckInvariants();
  orders_later = adopted->DrainOrders();
  ASSERT_EQ(orders_later.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<GrantOrder>(orders_later[0]));
  EXPECT_EQ(adopted->host().held(), 0u);
  ASSERT_TRUE(adopted->Complete(7).ok());
  // Completing the interrupted request frees its host pages in the core and in the journal.
  ASSERT_TRUE(adopted->Complete(1).ok());
  EXPECT_TRUE(adopted->CheckInvariants().ok()) << adopted->CheckInvariants();
  EXPECT_EQ(adopted->host().allocated(), 0u);
  EXPECT_TRUE(journal->Verify()->empty());
}

TEST_F(AdoptTest, BadAdoptionsAreRefusedAndChangeNothing) {
  Buffer copy(16);
  std::optional<HostJournal> journal;
  journal.emplace(Formatted(copy, 16));
  auto m = *ResidencyManager::Create(Config(), [] { return 9; }, &*journal);
  auto refused = [&](std::vector<AdoptedRequest> list, absl::StatusCode code) {
    EXPECT_EQ(m->AdoptHostPages(list).code(), code);
    EXPECT_EQ(m->host().allocated(), 0u);
    EXPECT_TRUE(m->InterruptedRequests(0).empty());
    EXPECT_FALSE(m->fenced(0));
    EXPECT_TRUE(m->CheckInvariants().ok());
  };
  refused({{0, 0, 1, 2, {}, {}}}, absl::StatusCode::kInvalidArgument);                           // reserved id
  refused({{1, 0, 1, 2, {}, {}}, {1, 0, 1, 2, {}, {}}}, absl::StatusCode::kInvalidArgument);         // id twice
  refused({{1, 0, 0, 2, {}, {}}}, absl::StatusCode::kInvalidArgument);                           // epoch 0
  refused({{1, 0, 1, 0, {{0, 1}}, {}}}, absl::StatusCode::kInvalidArgument);                     // no context
  refused({{1, 0, 1, 17, {}, {}}}, absl::StatusCode::kInvalidArgument);                          // beyond the pool
  refused({{1, 0, 1, 2, {{2, 0}}, {}}}, absl::StatusCode::kInvalidArgument);                     // page outside context
  refused({{1, 0, 1, 2, {{0, 16}}, {}}}, absl::StatusCode::kInvalidArgument);                    // host page beyond
  refused({{1, 0, 1, 2, {{0, 3}}, {}}, {2, 0, 1, 2, {{1, 3}}, {}}}, absl::StatusCode::kInvalidArgument);  // host page twice
  ASSERT_TRUE(m->RegisterGpu(1, 4).ok());
  refused({{1, 0, 1, 2, {{0, 3}}, {}}}, absl::StatusCode::kFailedPrecondition);  // not the first event
}

// ---------------------------------------------------------------- AdoptGpu (a worker survives a memd restart)

// Epochs past the old 8-bit wrap (issue 11): node request ids kept (epoch - 1) mod 256, so a memd adopting a dead
// memd's journal took a request of epoch 257 for epoch 1 and accepted the re-Hello of a worker 256 restarts stale.
// Now an id tells 2^24 epochs apart: the adopted epoch is 257, re-Hellos of epochs 1 and 256 are refused as stale, the
// surviving worker of epoch 257 is taken, a restarted worker gets epoch 258, whose ids differ from epoch 2's; and a GPU
// at the last epoch ids tell apart (2^24) is refused a new registration instead of reusing epoch 1's ids.
TEST_F(AdoptTest, EpochsPastTheOldEightBitWrapStillFenceStaleWorkers) {
  for (uint64_t e : {uint64_t{1}, uint64_t{256}, uint64_t{257}, uint64_t{513}, kNodeRequestEpochs}) {
    EXPECT_EQ(EpochOfNodeRequestId(MakeNodeRequestId(3, e, 5)), e);
    EXPECT_EQ(GpuOfNodeRequestId(MakeNodeRequestId(3, e, 5)), 3u);
    EXPECT_EQ(MakeNodeRequestId(3, e, 5) % kNodeRequestCounterEnd, 5u);
  }
  EXPECT_NE(MakeNodeRequestId(0, 257, 5), MakeNodeRequestId(0, 1, 5));
  EXPECT_NE(MakeNodeRequestId(0, 258, 5), MakeNodeRequestId(0, 2, 5));
  EXPECT_EQ(MakeNodeRequestId(0, kNodeRequestEpochs + 1, 5), MakeNodeRequestId(0, 1, 5));  // where it wraps now

  const RequestId id = MakeNodeRequestId(0, 257, 1);
  AdmitRequest a{.request = id, .gpu = 0, .required_pages = 2, .history_pages = 0, .context_pages = 2};
  Ok(old_->Admit(a));
  std::vector<Order> orders = old_->DrainOrders();
  ASSERT_EQ(orders.size(), 1u);
  Ok(old_->OnHostCopyWritten(id, std::vector<uint32_t>{0}, {}, true));
  Buffer copy = buffer_;  // memd dies here
  std::optional<HostJournal> journal;
  std::unique_ptr<ResidencyManager> m = Adopt(copy, journal, EpochOfNodeRequestId(id));
  EXPECT_EQ(m->epoch(0), 257u);
  EXPECT_TRUE(m->fenced(0));
  for (uint32_t stale : {1u, 256u}) {
    EXPECT_EQ(m->AdoptGpu(0, 16, 4, stale, {}).code(), absl::StatusCode::kFailedPrecondition) << "epoch " << stale;
  }
  ASSERT_TRUE(m->AdoptGpu(0, 16, 4, 257, {}).ok());
  EXPECT_EQ(m->epoch(0), 257u);
  EXPECT_FALSE(m->fenced(0));
  ASSERT_TRUE(m->FenceGpu(0).ok());  // that worker dies too; the next one is a new epoch
  ASSERT_TRUE(m->RegisterGpu(0, 16, 4).ok());
  EXPECT_EQ(m->epoch(0), 258u);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();

  // A journal whose request is of the last epoch an id tells apart: adopted as such; no later registration.
  std::optional<HostJournal> last_journal;
  Buffer last_copy = buffer_;
  std::unique_ptr<ResidencyManager> last = Adopt(last_copy, last_journal, static_cast<uint32_t>(kNodeRequestEpochs));
  EXPECT_EQ(last->epoch(0), kNodeRequestEpochs);
  const absl::Status refused = last->RegisterGpu(0, 16, 4);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("2^24"), std::string::npos) << refused;
}

// Request 1 (context 4 pages, 2 kept on GPU at the grant): history page 2 confirmed by HostCopyWritten, then memd
// dies. Its worker survives and reports: pages 0, 1 on their kept GPU pages (page 1 claims a host copy the journal
// lacks), page 2 host only (confirmed), page 3 in the tail. The new core rebuilds exactly that: the grant's GPU pages
// and slot, history page 2 the only host copy, the epoch kept; a second report with the same slot is refused alone.
TEST_F(AdoptTest, SurvivingWorkerReportRebuildsItsRequest) {
  AdmitRequest a{.request = 1, .gpu = 0, .required_pages = 2, .history_pages = 2, .context_pages = 4};
  Ok(old_->Admit(a));
  std::vector<Order> orders = old_->DrainOrders();
  ASSERT_EQ(orders.size(), 1u);
  const GrantOrder grant = std::get<GrantOrder>(orders[0]);
  ASSERT_EQ(grant.optional_pages.size(), 2u);
  ASSERT_EQ(grant.host_pages.size(), 4u);
  Ok(old_->OnHostCopyWritten(1, std::vector<uint32_t>{2}, {}, true));
  Buffer copy = buffer_;  // memd dies here
  std::optional<HostJournal> journal;
  std::unique_ptr<ResidencyManager> m = Adopt(copy, journal, 1);
  ASSERT_EQ(m->InterruptedHostPages(1), (std::map<uint32_t, PageIndex>{{2, grant.host_pages[2]}}));
  ReportedRequest rep{1, grant.slot, grant.required_pages, 2, true, {}};
  rep.history = {{grant.host_pages[0], false, grant.optional_pages[0]},
                 {grant.host_pages[1], true, grant.optional_pages[1]},
                 {grant.host_pages[2], true, std::nullopt},
                 {grant.host_pages[3], false, std::nullopt}};
  ReportedRequest twin{7, grant.slot, {15}, 0, true, {}};
  std::vector<absl::Status> outcomes;
  ASSERT_EQ(m->AdoptGpu(0, 16, 4, 0, std::vector<ReportedRequest>{rep}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m->AdoptGpu(0, 16, 4, 1, std::vector<ReportedRequest>{rep, twin}, &outcomes).ok());
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_TRUE(outcomes[0].ok()) << outcomes[0];
  EXPECT_EQ(outcomes[1].code(), absl::StatusCode::kAlreadyExists) << outcomes[1];
  EXPECT_EQ(m->epoch(0), 1u);
  EXPECT_FALSE(m->fenced(0));
  EXPECT_TRUE(m->InterruptedRequests(0).empty());
  const GpuPageTable* t = m->gpu_table(0);
  ASSERT_NE(t, nullptr);
  for (PageIndex p : grant.required_pages) EXPECT_EQ(t->state(p), PageState::kRequired);
  for (PageIndex p : grant.optional_pages) EXPECT_EQ(t->state(p), PageState::kOptionalReady);
  EXPECT_EQ(t->free(), 12u);
  EXPECT_EQ(m->host().allocated(), 4u);
  auto v = journal->Verify();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->at(1).confirmed, (std::map<uint32_t, PageIndex>{{2, grant.host_pages[2]}}));  // page 1's claim: none
  EXPECT_EQ(v->at(1).assigned.size(), 3u);
  EXPECT_EQ(m->counters().requests_reported, 1u);
  EXPECT_EQ(m->counters().reports_refused, 1u);
  // Population brings the host-only page back; completion releases every page.
  ASSERT_TRUE(m->Populate().ok());
  orders = m->DrainOrders();
  ASSERT_EQ(orders.size(), 1u);
  const PopulateOrder pop = std::get<PopulateOrder>(orders[0]);
  EXPECT_EQ(pop.history_pages, std::vector<uint32_t>{2});
  EXPECT_EQ(pop.host_pages, std::vector<PageIndex>{grant.host_pages[2]});
  ASSERT_TRUE(m->OnReadyPublish(pop.order, {}, true).ok());
  ASSERT_TRUE(m->Complete(1).ok());
  orders = m->DrainOrders();
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(std::get<CompleteAckOrder>(orders[0]).released_pages, 5u);  // 2 required + 2 kept + 1 populated
  EXPECT_EQ(t->free(), 16u);
  EXPECT_EQ(m->host().allocated(), 0u);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
}

// Issue 22: a confirmed entry keeps its host copy's checksum (the reserved word of issue 11's layout): read back,
// verified (the check covers it: a changed checksum word does not verify), carried by Transfer; an entry without one
// (0, what an older memd wrote) verifies as before. Confirming again with another checksum goes through assigned, and
// every store boundary of it verifies to the old confirmed copy's owner with no confirmed copy, or the new checksum.
TEST(HostJournal, ConfirmedEntriesKeepTheirChecksum) {
  Buffer b(kPages);
  HostJournal j = Formatted(b);
  j.Assign(2, 77, 0, 3);
  j.Confirm(2, 0xABCDEF0123456789ull);
  j.Assign(4, 77, 1, 3);
  j.Confirm(4);  // none known
  EXPECT_EQ(j.Read(2).checksum, 0xABCDEF0123456789ull);
  EXPECT_EQ(j.Read(4).checksum, 0u);
  auto v = j.Verify();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->at(77).checksums, (std::map<uint32_t, uint64_t>{{0, 0xABCDEF0123456789ull}, {1, 0}}));
  Buffer damaged = b;
  damaged.word(2, 3) ^= 1;
  EXPECT_EQ(HostJournal::Attach(damaged.bytes(), kPages)->Verify().status().code(), absl::StatusCode::kDataLoss);

  Buffer before = b;
  Buffer after = b;
  HostJournal ja = *HostJournal::Attach(after.bytes(), kPages);
  ja.Confirm(2, 42);
  EXPECT_EQ(ja.Read(2).checksum, 42u);
  // Stores of a re-confirm: tag (assigned), checksum, tag (confirmed). Apply a prefix of them to `before`.
  for (int stores = 0; stores <= 3; ++stores) {
    Buffer torn = before;
    if (stores >= 1) {  // tag = assigned: what Assign leaves for the same owner and meta
      Buffer assigned = before;
      HostJournal jx = *HostJournal::Attach(assigned.bytes(), kPages);
      jx.Free(2);
      jx.Assign(2, 77, 0, 3);
      torn.word(2, 2) = assigned.word(2, 2);
    }
    if (stores >= 2) torn.word(2, 3) = after.word(2, 3);
    if (stores >= 3) torn.word(2, 2) = after.word(2, 2);
    auto tv = HostJournal::Attach(torn.bytes(), kPages)->Verify();
    ASSERT_TRUE(tv.ok()) << "after " << stores << " stores: " << tv.status();
    const JournaledRequest& r = tv->at(77);
    if (stores == 0) {
      EXPECT_EQ(r.checksums.at(0), 0xABCDEF0123456789ull);
    } else if (stores < 3) {
      EXPECT_FALSE(r.confirmed.contains(0)) << stores;
      EXPECT_TRUE(r.assigned.contains(0)) << stores;
    } else {
      EXPECT_EQ(r.checksums.at(0), 42u);
    }
  }
}

// Issue 22 through the core: checksums reported with HostCopyWritten and with a reclaim's BackupComplete land in the
// journal; a new memd adopting it hands them to the resume's grant.
TEST_F(AdoptTest, ChecksumsSurviveAMemdRestartIntoTheResumeGrant) {
  AdmitRequest a{.request = 1, .gpu = 0, .required_pages = 2, .history_pages = 2, .context_pages = 6};
  Ok(old_->Admit(a));
  (void)old_->DrainOrders();
  Ok(old_->OnHostCopyWritten(1, std::vector<uint32_t>{2, 3}, {}, true, std::vector<uint64_t>{22, 33}));
  AdmitRequest b{.request = 2, .gpu = 0, .required_pages = 14, .history_pages = 0, .context_pages = 1};
  Ok(old_->Admit(b));
  const ReclaimOrder* rc = nullptr;
  std::vector<Order> orders = old_->DrainOrders();
  for (const Order& o : orders) {
    if (const auto* r = std::get_if<ReclaimOrder>(&o)) rc = r;
  }
  ASSERT_NE(rc, nullptr);
  ASSERT_EQ(rc->backup_pages.size(), 2u);
  EXPECT_EQ(old_->OnBackupComplete(rc->order, std::vector<PageIndex>{rc->backup_pages[0]}, true, {},
                                   std::vector<uint64_t>{1, 2})
                .code(),
            absl::StatusCode::kInvalidArgument);  // one checksum per page reported
  Ok(old_->OnBackupComplete(rc->order, std::vector<PageIndex>{rc->backup_pages[0]}, true, {},
                            std::vector<uint64_t>{1000}));
  Buffer copy = buffer_;
  std::optional<HostJournal> journal;
  std::unique_ptr<ResidencyManager> adopted = Adopt(copy, journal, 3);
  EXPECT_EQ(journal->Verify()->at(1).checksums, (std::map<uint32_t, uint64_t>{{0, 1000}, {2, 22}, {3, 33}}));
  ASSERT_TRUE(adopted->RegisterGpu(0, 16, 4).ok());
  AdmitRequest resume{.request = 5, .gpu = 0, .required_pages = 1, .history_pages = 0, .context_pages = 6,
                      .host_backed = true, .resume_of = 1};
  ASSERT_TRUE(adopted->ReleaseHeldPages().ok());
  ASSERT_TRUE(adopted->Admit(resume).ok());
  const GrantOrder* grant = nullptr;
  std::vector<Order> granted = adopted->DrainOrders();
  for (const Order& o : granted) {
    if (const auto* g = std::get_if<GrantOrder>(&o)) grant = g;
  }
  ASSERT_NE(grant, nullptr);
  EXPECT_EQ(grant->host_backed_pages, (std::vector<uint32_t>{0, 2, 3}));
  EXPECT_EQ(grant->host_backed_checksums, (std::vector<uint64_t>{1000, 22, 33}));
  // The takeover moved the pages to request 5 in the journal with their checksums.
  EXPECT_EQ(journal->Verify()->at(5).checksums, (std::map<uint32_t, uint64_t>{{0, 1000}, {2, 22}, {3, 33}}));
  EXPECT_TRUE(adopted->CheckInvariants().ok()) << adopted->CheckInvariants();
}

}  // namespace
}  // namespace dhs::memd
