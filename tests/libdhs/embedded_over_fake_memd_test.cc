// tests/libdhs/embedded_over_fake_memd_test.cc: libdhs's C++ core (EmbeddedWorker) opened over the in-process fake
// memd of workerd's tests (EmbeddedWorker::OpenOver, a MemdTransport: tests/workerd/worker_test_util.h), so that the
// test decides which of memd's messages comes when: reclaim and populate orders at random points of an engine's
// decode loop (seeded), a reclaim order that arrives while the engine's readers are outstanding, memd away and back.
// The property checked everywhere is exactness (brief §1): every location a resolve returns holds the bytes the engine
// appended for that position and source, wherever the row lives (tail, hot cache, ready map, fetched from host). The
// worker's invariants (EmbeddedWorker::CheckInvariants) are checked after every call.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "libdhs/embedded_worker.h"
#include "nlohmann/json.hpp"
#include "tests/workerd/worker_test_util.h"

namespace dhs::lib {
namespace {

constexpr uint32_t kSources = 2, kRowBytes = 64, kPageRows = 16, kTopK = 8, kSlots = 2, kBudgetPages = 8;

EmbeddedConfig Shape() {
  EmbeddedConfig c;
  c.run_dir = "/nonexistent/unused-by-OpenOver";
  c.mode = WorkerMode::kAdaptive;
  c.sources = kSources;
  c.row_bytes = kRowBytes;
  c.page_rows = kPageRows;
  c.top_k = kTopK;
  c.hot_rows = 32;
  c.tail_rows = 32;
  c.slots = kSlots;
  c.hbm_budget_bytes = uint64_t{kBudgetPages} * kPageRows * kSources * kRowBytes;
  c.source_groups = {0, 0};  // one group: one resolve names both sources (brief §5)
  return c;
}

// The row the engine appends for (request tag, position, source): every byte depends on all three.
uint8_t RowByte(uint32_t tag, Position pos, SourceId s, uint32_t b) {
  return static_cast<uint8_t>((tag * 131 + static_cast<uint32_t>(pos) * 31 + s * 17 + b * 7) ^ (b >> 3));
}
std::vector<uint8_t> Rows(uint32_t tag, Position pos) {  // one position, every source ([position][source])
  std::vector<uint8_t> out(uint64_t{kSources} * kRowBytes);
  for (SourceId s = 0; s < kSources; ++s) {
    for (uint32_t b = 0; b < kRowBytes; ++b) out[s * kRowBytes + b] = RowByte(tag, pos, s, b);
  }
  return out;
}

struct Harness {
  // `before_open`: what memd holds when the worker says its Hello (its epoch, the interrupted requests it lists).
  explicit Harness(uint64_t seed, bool chaos, const std::function<void(test::FakeMemd&)>& before_open = {})
      : memd(/*capacity_pages=*/kBudgetPages, /*host_page_bytes=*/uint64_t{kPageRows} * kSources * kRowBytes,
             kPageRows, /*host_pages=*/96, seed, chaos, kSlots) {
    if (before_open) before_open(memd);
    absl::StatusOr<std::unique_ptr<EmbeddedWorker>> w = EmbeddedWorker::OpenOver(Shape(), memd);
    EXPECT_TRUE(w.ok()) << w.status();
    if (w.ok()) worker = *std::move(w);
  }
  void Check() const {
    const absl::Status s = worker->CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }
  // One resolve of `selection` of `request` (tag) over every source, each location read back from the region and
  // compared with the row appended there. Readers stay outstanding until ReadersDone.
  void ResolveAndCompare(RequestId request, uint32_t tag, const std::vector<Position>& selection) {
    std::vector<SourceId> sources;
    for (SourceId s = 0; s < kSources; ++s) sources.push_back(s);
    std::vector<int64_t> locations(sources.size() * selection.size(), -7);
    EmbeddedWorker::Query q{request, selection, locations};
    const absl::Status resolved = worker->Resolve(sources, std::span<EmbeddedWorker::Query>(&q, 1));
    ASSERT_TRUE(resolved.ok()) << resolved;
    Check();
    Compare(request, tag, selection, locations);
    last_locations = locations;
    ++resolves;
  }
  // The rows at `locations` (a resolve's output for `selection`, [source][j]) are the ones appended there.
  void Compare(RequestId request, uint32_t tag, const std::vector<Position>& selection,
               const std::vector<int64_t>& locations) const {
    absl::StatusOr<std::span<uint8_t>> pool = worker->Pool();
    ASSERT_TRUE(pool.ok());
    for (SourceId s = 0; s < kSources; ++s) {
      for (size_t j = 0; j < selection.size(); ++j) {
        const int64_t loc = locations[s * selection.size() + j];
        ASSERT_GE(loc, 0) << "request " << request << " position " << selection[j] << " source " << s;
        ASSERT_LE(static_cast<uint64_t>(loc) + kRowBytes, pool->size());
        for (uint32_t b = 0; b < kRowBytes; ++b) {
          ASSERT_EQ((*pool)[static_cast<size_t>(loc) + b], RowByte(tag, selection[j], s, b))
              << "request " << request << " position " << selection[j] << " source " << s << " byte " << b;
        }
      }
    }
  }
  void ReadersDone() {
    std::vector<SourceId> sources;
    for (SourceId s = 0; s < kSources; ++s) sources.push_back(s);
    ASSERT_TRUE(worker->ReadersDone(sources).ok());
    Check();
  }

  test::FakeMemd memd;
  std::unique_ptr<EmbeddedWorker> worker;
  int resolves = 0;
  std::vector<int64_t> last_locations;  // the latest resolve's output
};

struct EngineRequest {
  uint32_t tag = 0;
  RequestId id = 0;
  bool granted = false, done = false;
  Position appended = 0;
  uint64_t max_rows = 0;
};

// Drives `reqs` to their end: Poll, events, one appended position per granted request per step (refused while its
// tail waits for a host copy: tried again after the next Poll), a resolve of a random selection of its appended rows
// read back and compared, readers done, Complete at max_rows. Returns the steps taken.
int RunToEnd(Harness& h, std::vector<EngineRequest>& reqs, std::mt19937_64& rng, int max_steps) {
  int steps = 0;
  auto all_done = [&] { return std::all_of(reqs.begin(), reqs.end(), [](const auto& r) { return r.done; }); };
  while (!all_done() && steps < max_steps) {
    ++steps;
    EXPECT_TRUE(h.worker->Poll().ok());
    h.Check();
    while (!h.worker->events().empty()) {
      const EmbeddedEvent e = h.worker->events().front();
      h.worker->events().pop_front();
      for (EngineRequest& r : reqs) {
        if (r.id != e.request) continue;
        EXPECT_NE(e.kind, EmbeddedEvent::kRejected) << e.status;
        EXPECT_NE(e.kind, EmbeddedEvent::kFailed) << e.status;
        if (e.kind == EmbeddedEvent::kGranted) r.granted = true;
      }
    }
    for (EngineRequest& r : reqs) {
      if (!r.granted || r.done) continue;
      if (static_cast<uint64_t>(r.appended) < r.max_rows) {
        const std::vector<uint8_t> rows = Rows(r.tag, r.appended);
        const absl::Status s = h.worker->Append(r.id, r.appended, 1, rows, {});
        h.Check();
        if (s.ok()) {
          ++r.appended;
        } else {
          EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;  // the tail waits for a host copy
        }
      }
      if (r.appended > 0) {
        std::set<Position> pick;
        const size_t want = std::min<size_t>(kTopK, static_cast<size_t>(r.appended));
        while (pick.size() < want) pick.insert(static_cast<Position>(rng() % static_cast<uint64_t>(r.appended)));
        std::vector<Position> selection(pick.begin(), pick.end());
        std::shuffle(selection.begin(), selection.end(), rng);  // a selection is in the model's order
        h.ResolveAndCompare(r.id, r.tag, selection);
        h.ReadersDone();
      }
      if (static_cast<uint64_t>(r.appended) == r.max_rows) {
        EXPECT_TRUE(h.worker->Complete(r.id).ok());
        h.Check();
        r.done = true;
      }
    }
  }
  return steps;
}

std::vector<EngineRequest> Submit(Harness& h, int n, uint64_t max_rows) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<RequestId> id = h.worker->Submit(/*input_rows=*/1, max_rows);
    EXPECT_TRUE(id.ok()) << id.status();
    h.Check();
    reqs.push_back(EngineRequest{static_cast<uint32_t>(i + 1), id.ok() ? *id : 0, false, false, 0, max_rows});
  }
  return reqs;
}

TEST(EmbeddedOverFakeMemd, EveryResolvedRowIsTheAppendedOneUnderRandomReclaimsAndPopulations) {
  int reclaims = 0, populated = 0, host_rows = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    Harness h(seed, /*chaos=*/true);
    ASSERT_NE(h.worker, nullptr);
    std::mt19937_64 rng(seed * 7919);
    // Three requests on two slots: the third waits for a slot (memd's admission order), then runs.
    std::vector<EngineRequest> reqs = Submit(h, 3, /*max_rows=*/120);
    RunToEnd(h, reqs, rng, 2000);
    for (const EngineRequest& r : reqs) EXPECT_TRUE(r.done) << "request " << r.id << " appended " << r.appended;
    EXPECT_EQ(h.memd.completes, 3);
    EXPECT_EQ(h.memd.slots_free(), kSlots);
    EXPECT_EQ(h.memd.host_pages_held(), 0u) << "every host page freed by the Completes";
    reclaims += h.memd.reclaims_done;
    populated += h.memd.pages_populated;
    const nlohmann::json stats = nlohmann::json::parse(h.worker->StatsJson());
    host_rows += stats["census"]["host"].get<int>();
  }
  // The orders did happen, and rows came back from host copies (a test that served everything from the tail proves
  // nothing about the hierarchy).
  std::cout << "reclaims " << reclaims << " populated " << populated << " host rows " << host_rows << "\n";
  EXPECT_GT(reclaims, 0);
  EXPECT_GT(populated, 0);
  EXPECT_GT(host_rows, 0);
}

// Appends past the tail, has memd populate 4 pages, resolves a selection over them (readers outstanding) and has memd
// order their reclaim, polling 5 times: the order is held (no kReclaimed, memd not answered, one order held). Returns
// the selection (its locations in h.last_locations).
std::vector<Position> HoldAReclaim(Harness& h, EngineRequest& r) {
  std::vector<Position> selection;
  // Past the tail: complete pages leave it, kept on GPU under optional pages (adaptive mode, resident first).
  while (r.appended < 96) {
    EXPECT_TRUE(h.worker->Poll().ok());
    h.worker->events().clear();
    r.granted = true;
    const std::vector<uint8_t> rows = Rows(r.tag, r.appended);
    if (h.worker->Append(r.id, r.appended, 1, rows, {}).ok()) ++r.appended;
  }
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(h.worker->Poll().ok());  // the host copies written so far confirmed
  // memd populates pages 0 .. 3 (host-copied, out of the tail) into optional GPU pages: ready, the ones reclaimed.
  EXPECT_EQ(h.memd.OrderPopulate(r.id, 4), 4u);
  for (int i = 0; i < 20 && h.memd.pages_populated < 4; ++i) EXPECT_TRUE(h.worker->Poll().ok());
  EXPECT_EQ(h.memd.pages_populated, 4);
  h.worker->events().clear();
  selection = {0, 17, 40, 63, 5, 33, 50, 62};  // pages 0..3
  h.ResolveAndCompare(r.id, r.tag, selection);  // readers outstanding from here
  EXPECT_TRUE(h.memd.OrderReclaim(r.id)) << "no optional page to reclaim: the test needs kept pages";
  const int done_before = h.memd.reclaims_done;
  for (int i = 0; i < 5; ++i) {  // memd's order arrives; the engine's readers still read the resolved locations
    EXPECT_TRUE(h.worker->Poll().ok());
    h.Check();
    for (const EmbeddedEvent& e : h.worker->events()) {
      EXPECT_NE(e.kind, EmbeddedEvent::kReclaimed) << "reclaim carried out under outstanding readers";
    }
  }
  EXPECT_EQ(h.memd.reclaims_done, done_before) << "memd heard the reclaim done while readers were outstanding";
  EXPECT_EQ(nlohmann::json::parse(h.worker->StatsJson())["pages"]["orders_held"], 1);
  return selection;
}

// One request whose reclaim order is held under its readers (HoldAReclaim).
struct HeldReclaim {
  HeldReclaim() {
    reqs = Submit(h, 1, /*max_rows=*/200);
    done_before = h.memd.reclaims_done;
    selection = HoldAReclaim(h, reqs[0]);
  }
  int Stat(const char* key) const {
    return nlohmann::json::parse(h.worker->StatsJson())["pages"][key].get<int>();
  }
  // Polls until the held reclaim was carried out (its ReadersDone sent: memd's Retire is then in its inbox).
  void RunReclaim() {
    bool reclaimed = false;
    for (int i = 0; i < 20 && !reclaimed; ++i) {
      ASSERT_TRUE(h.worker->Poll().ok());
      h.Check();
      for (const EmbeddedEvent& e : h.worker->events()) reclaimed |= e.kind == EmbeddedEvent::kReclaimed;
      h.worker->events().clear();
    }
    EXPECT_TRUE(reclaimed) << "the deferred reclaim was never carried out";
    for (int i = 0; i < 20 && h.memd.reclaims_done == done_before; ++i) ASSERT_TRUE(h.worker->Poll().ok());
    EXPECT_EQ(h.memd.reclaims_done, done_before + 1);
  }
  Harness h{/*seed=*/3, /*chaos=*/false};
  std::vector<EngineRequest> reqs;
  int done_before = 0;
  std::vector<Position> selection;
};

TEST(EmbeddedOverFakeMemd, AReclaimOrderArrivingWhileReadersAreOutstandingWaitsForReadersDone) {
  HeldReclaim f;
  ASSERT_FALSE(HasFailure());
  Harness& h = f.h;
  EngineRequest& r = f.reqs[0];
  h.Compare(r.id, r.tag, f.selection, h.last_locations);  // the locations the readers read still hold the rows
  h.ReadersDone();
  ASSERT_NO_FATAL_FAILURE(f.RunReclaim());
  h.ResolveAndCompare(r.id, r.tag, f.selection);  // now from host copies: the same bytes
  h.ReadersDone();
  ASSERT_TRUE(h.worker->Complete(r.id).ok());
  h.Check();
}

// memd's Retire follows the worker's ReadersDone of its reclaim: it is carried out at once, also while readers are
// outstanding again (held, a grant handled meanwhile could reuse its pages before it; review finding). Delivered
// through InboxFor's handler (the path workerd's messages take) so that it arrives while readers are outstanding and
// a reclaim is held in front of it: a Retire of no page (nothing freed), which the rule must not hold either.
TEST(EmbeddedOverFakeMemd, ARetireIsNeverHeld) {
  HeldReclaim f;
  ASSERT_FALSE(HasFailure());
  Harness& h = f.h;
  EngineRequest& r = f.reqs[0];
  ASSERT_EQ(f.Stat("orders_held"), 1);  // the reclaim, under the readers
  struct NoAnswers final : AdmissionAnswers {
    void OnAdmitGrant(const wire::AdmitGrantT&) override { ADD_FAILURE() << "an answer was routed"; }
    void OnAdmitWait(const wire::AdmitWaitT&) override { ADD_FAILURE() << "an answer was routed"; }
    void OnAdmitReject(const wire::AdmitRejectT&) override { ADD_FAILURE() << "an answer was routed"; }
    void OnCompleteAck(const wire::CompleteAckT&) override { ADD_FAILURE() << "an answer was routed"; }
  } no_answers;
  wire::RetireT retire;
  retire.order = 999;  // no reclaim of this worker's: nothing mapped
  retire.request = r.id;
  h.worker->InboxFor(no_answers).OnRetire(retire);
  EXPECT_EQ(f.Stat("orders_held"), 1) << "the Retire was held behind the readers and the held reclaim";
  // A populate is held behind them (arrival order kept).
  wire::PopulateOrderT populate;
  populate.order = 1000;
  populate.request = r.id;
  h.worker->InboxFor(no_answers).OnPopulateOrder(populate);
  EXPECT_EQ(f.Stat("orders_held"), 2);
  h.ReadersDone();
  ASSERT_NO_FATAL_FAILURE(f.RunReclaim());
  EXPECT_EQ(f.Stat("orders_held"), 0);
  ASSERT_TRUE(h.worker->Complete(r.id).ok());
  h.Check();
}

// memd dies while its reclaim order is held (readers outstanding): the dead memd's order is dropped (KvStack::EnterAway),
// never carried out: whether the readers end before the poll that sees memd gone (review finding: it was carried out
// then, its backups written to the dead memd's host targets) or after the return (the new memd adopted the pages as
// reported).
TEST(EmbeddedOverFakeMemd, AnOrderHeldWhenMemdDiesIsNeverCarriedOut) {
  for (const bool readers_end_first : {false, true}) {
    SCOPED_TRACE(readers_end_first ? "the readers end before the poll" : "the readers end after the return");
    HeldReclaim f;
    ASSERT_FALSE(HasFailure());
    Harness& h = f.h;
    EngineRequest& r = f.reqs[0];
    ASSERT_TRUE(h.memd.session().ConnectionLost(std::chrono::steady_clock::now()));
    if (readers_end_first) {
      h.Compare(r.id, r.tag, f.selection, h.last_locations);
      h.ReadersDone();
    }
    ASSERT_TRUE(h.worker->Poll().ok());
    ASSERT_TRUE(h.worker->memd_away());
    for (const EmbeddedEvent& e : h.worker->events()) {
      EXPECT_NE(e.kind, EmbeddedEvent::kReclaimed) << "the dead memd's held order was carried out";
    }
    EXPECT_EQ(f.Stat("orders_held"), 0);
    EXPECT_EQ(f.Stat("reclaimed"), 0);
    if (!readers_end_first) h.Compare(r.id, r.tag, f.selection, h.last_locations);  // still the readers' rows
    h.memd.take_rehello = true;
    ASSERT_TRUE(h.worker->Poll().ok());
    ASSERT_FALSE(h.worker->memd_away());
    if (!readers_end_first) h.ReadersDone();
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE(h.worker->Poll().ok());
      h.Check();
      for (const EmbeddedEvent& e : h.worker->events()) {
        EXPECT_NE(e.kind, EmbeddedEvent::kReclaimed) << "the dead memd's held order was carried out";
      }
      h.worker->events().clear();
    }
    EXPECT_EQ(h.memd.reclaims_done, f.done_before);
    EXPECT_EQ(f.Stat("orders_held"), 0);
    EXPECT_EQ(f.Stat("reclaimed"), 0);
    h.ResolveAndCompare(r.id, r.tag, f.selection);  // its pages still serve the same bytes
    h.ReadersDone();
    ASSERT_TRUE(h.worker->Complete(r.id).ok());
    h.Check();
  }
}

TEST(EmbeddedOverFakeMemd, MemdAwayAndBackKeepsTheRowsAndDefersTheEnd) {
  Harness h(/*seed=*/5, /*chaos=*/false);
  ASSERT_NE(h.worker, nullptr);
  std::mt19937_64 rng(23);
  std::vector<EngineRequest> reqs = Submit(h, 2, /*max_rows=*/80);
  for (int step = 0; step < 200 && (reqs[0].appended < 40 || reqs[1].appended < 40); ++step) {
    ASSERT_TRUE(h.worker->Poll().ok());
    for (const EmbeddedEvent& e : h.worker->events()) {
      for (EngineRequest& r : reqs) r.granted |= e.kind == EmbeddedEvent::kGranted && e.request == r.id;
    }
    h.worker->events().clear();
    for (EngineRequest& r : reqs) {
      if (!r.granted || r.appended >= 40) continue;
      if (h.worker->Append(r.id, r.appended, 1, Rows(r.tag, r.appended), {}).ok()) ++r.appended;
    }
  }
  ASSERT_EQ(reqs[0].appended, 40);
  ASSERT_EQ(reqs[1].appended, 40);
  // memd dies (the transport saw its connection close).
  ASSERT_TRUE(h.memd.session().ConnectionLost(std::chrono::steady_clock::now()));
  ASSERT_TRUE(h.worker->Poll().ok());
  h.Check();
  EXPECT_TRUE(h.worker->memd_away());
  const int completes_before = h.memd.completes;
  // Away: request 0 is completed by the engine (its end waits for the re-Hello), request 1 reads its rows.
  ASSERT_TRUE(h.worker->Complete(reqs[0].id).ok());
  h.Check();
  EXPECT_EQ(h.memd.completes, completes_before) << "a Complete sent while memd is away";
  h.ResolveAndCompare(reqs[1].id, reqs[1].tag, {0, 3, 16, 31, 39, 20, 8, 12});
  h.ReadersDone();
  ASSERT_TRUE(h.worker->Poll().ok());  // the re-Hello is not taken yet
  EXPECT_TRUE(h.worker->memd_away());
  // A memd takes the re-Hello.
  h.memd.take_rehello = true;
  ASSERT_TRUE(h.worker->Poll().ok());
  h.Check();
  EXPECT_FALSE(h.worker->memd_away());
  EXPECT_EQ(h.memd.rehellos, 1);
  // Both were granted: both reported (the ended one too: memd learns its end from the Complete that follows).
  EXPECT_EQ(std::set<RequestId>(h.memd.rehello_reports.begin(), h.memd.rehello_reports.end()),
            (std::set<RequestId>{reqs[0].id, reqs[1].id}));
  EXPECT_EQ(h.memd.completes, completes_before + 1) << "the deferred end's Complete after the re-Hello";
  EXPECT_EQ(h.memd.complete_messages.back().request, reqs[0].id);
  // Request 1 goes on to its end, every row read back exact.
  reqs[0].done = true;
  RunToEnd(h, reqs, rng, 500);
  EXPECT_TRUE(reqs[1].done);
  EXPECT_EQ(h.memd.completes, completes_before + 2);
  const nlohmann::json stats = nlohmann::json::parse(h.worker->StatsJson());
  EXPECT_EQ(stats["memd"]["aways"].get<int>(), 1);
  EXPECT_EQ(stats["memd"]["returns"].get<int>(), 1);
  EXPECT_EQ(stats["memd"]["ends_deferred"].get<int>(), 1);
}

// ---- Resumes and the resumable list (review finding 2026-12-04: memd took an interrupted request over for a resume
// it then rejected, or that the engine completed while it queued; the request stayed listed, and a second resume of it
// got memd's "unknown") ----

// An earlier epoch's request 5 (GPU 0, epoch 1, n = 5) that memd holds interrupted (no page kept); this worker is
// epoch 2. Both slots are taken by two granted requests, so a resume waits for memd's answer.
constexpr RequestId kInterrupted = 5;
struct ResumeFixture {
  ResumeFixture()
      : h(/*seed=*/9, /*chaos=*/false, [](test::FakeMemd& m) {
          m.epoch = 2;
          m.interrupted[kInterrupted];
          m.listed_interrupted = {kInterrupted};
        }) {
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<RequestId> id = h.worker->Submit(1, 40);
      EXPECT_TRUE(id.ok()) << id.status();
    }
    EXPECT_TRUE(h.worker->Poll().ok());
    h.worker->events().clear();
    EXPECT_EQ(h.memd.slots_free(), 0u);
  }
  std::vector<RequestId> Listed() const {
    std::vector<RequestId> out;
    for (const EmbeddedWorker::Resumable& r : h.worker->ListResumable()) out.push_back(r.request);
    return out;
  }
  RequestId SubmitResume() {
    absl::StatusOr<RequestId> id = h.worker->Submit(1, 40, kInterrupted);
    EXPECT_TRUE(id.ok()) << id.status();
    h.Check();
    EXPECT_EQ(h.memd.resumes, 1) << "memd took the interrupted request over at the admission";
    EXPECT_TRUE(Listed().empty()) << "listed while a resume of it is open";
    return id.ok() ? *id : 0;
  }
  // Polls and returns the kinds of the events of `id`.
  std::vector<EmbeddedEvent::Kind> PollEventsOf(RequestId id) {
    EXPECT_TRUE(h.worker->Poll().ok());
    h.Check();
    std::vector<EmbeddedEvent::Kind> kinds;
    for (const EmbeddedEvent& e : h.worker->events()) {
      if (e.request == id) kinds.push_back(e.kind);
    }
    h.worker->events().clear();
    return kinds;
  }
  Harness h;
};

// The owner that resumes interrupted requests itself (workerd's Worker at its start) takes the list: each with memd's
// record, and none is listed (nor resumable through Submit) again.
TEST(EmbeddedResumeList, TakeResumableHandsTheListWithItsRecordsOver) {
  wire::RequestRecordT record;
  record.request = kInterrupted;
  record.input_tokens = 7;
  record.max_new_tokens = 9;
  Harness h(/*seed=*/9, /*chaos=*/false, [&](test::FakeMemd& m) {
    m.epoch = 2;
    m.interrupted[kInterrupted];
    m.interrupted[kInterrupted + 1];
    m.listed_interrupted = {kInterrupted + 1, kInterrupted};  // memd's order; only 5 has a record
    m.listed_records.push_back(std::make_unique<wire::RequestRecordT>(record));
  });
  ASSERT_NE(h.worker, nullptr);
  ASSERT_EQ(h.worker->ListResumable().size(), 2u);
  const std::vector<EmbeddedWorker::TakenResumable> taken = h.worker->TakeResumable();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].request, kInterrupted + 1);
  EXPECT_EQ(taken[0].record, nullptr);
  EXPECT_EQ(taken[1].request, kInterrupted);
  ASSERT_NE(taken[1].record, nullptr);
  EXPECT_EQ(taken[1].record->input_tokens, 7u);
  EXPECT_EQ(taken[1].record->max_new_tokens, 9u);
  EXPECT_TRUE(h.worker->ListResumable().empty());
  EXPECT_TRUE(h.worker->TakeResumable().empty()) << "taken twice";
  ASSERT_TRUE(h.worker->Poll().ok());
  EXPECT_TRUE(h.worker->ListResumable().empty());
  absl::StatusOr<RequestId> resume = h.worker->Submit(1, 40, kInterrupted);
  EXPECT_EQ(resume.status().code(), absl::StatusCode::kNotFound) << resume.status();
  h.Check();
}

TEST(EmbeddedResumeList, AResumeMemdRejectsAfterTakingItOverTakesItsRequestOffTheList) {
  ResumeFixture f;
  ASSERT_EQ(f.Listed(), std::vector<RequestId>{kInterrupted});
  const RequestId resume = f.SubmitResume();
  f.h.memd.RejectAdmission(resume, absl::ResourceExhaustedError("never fits"), /*took_effect=*/true);
  EXPECT_EQ(f.PollEventsOf(resume), std::vector<EmbeddedEvent::Kind>{EmbeddedEvent::kRejected});
  EXPECT_TRUE(f.Listed().empty()) << "memd dropped the interrupted request with the resume it took it over for";
  EXPECT_FALSE(f.h.memd.interrupted.contains(kInterrupted));
  absl::StatusOr<RequestId> again = f.h.worker->Submit(1, 40, kInterrupted);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
}

TEST(EmbeddedResumeList, AResumeRejectedBeforeMemdTookItLeavesItsRequestListed) {
  ResumeFixture f;
  const RequestId resume = f.SubmitResume();
  f.h.memd.RejectAdmission(resume, absl::InvalidArgumentError("bad admission"), /*took_effect=*/false);
  EXPECT_EQ(f.PollEventsOf(resume), std::vector<EmbeddedEvent::Kind>{EmbeddedEvent::kRejected});
  EXPECT_EQ(f.Listed(), std::vector<RequestId>{kInterrupted}) << "memd still holds it: offered again";
  ASSERT_TRUE(f.h.memd.interrupted.contains(kInterrupted));
  absl::StatusOr<RequestId> again = f.h.worker->Submit(1, 40, kInterrupted);
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(f.h.memd.resumes, 1) << "the second resume took it over";
}

TEST(EmbeddedResumeList, AQueuedResumeTheEngineCompletesTakesItsRequestOffTheList) {
  ResumeFixture f;
  const RequestId resume = f.SubmitResume();
  f.h.memd.AnswerWait(resume, 1);
  EXPECT_EQ(f.PollEventsOf(resume), std::vector<EmbeddedEvent::Kind>{EmbeddedEvent::kWaiting});
  ASSERT_TRUE(f.h.worker->Complete(resume).ok());
  f.h.Check();
  EXPECT_TRUE(f.Listed().empty()) << "memd ended the interrupted request when it queued its resume";
  absl::StatusOr<RequestId> again = f.h.worker->Submit(1, 40, kInterrupted);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
}

TEST(EmbeddedResumeList, AResumeCompletedBeforeMemdsAnswerIsHiddenUntilThatAnswer) {
  enum Answer { kWait, kRejectTookOver, kRejectNothingChanged };
  for (const Answer answer : {kWait, kRejectTookOver, kRejectNothingChanged}) {
    SCOPED_TRACE(answer == kWait             ? "memd queued the resume"
                 : answer == kRejectTookOver ? "memd rejected the resume after taking it over"
                                             : "memd rejected the resume before taking it over");
    ResumeFixture f;
    const RequestId resume = f.SubmitResume();
    // memd's answer is on its way (memd handled the admission first) when the engine completes the resume.
    if (answer == kWait) {
      f.h.memd.AnswerWait(resume, 1);
    } else {
      f.h.memd.RejectAdmission(resume, absl::ResourceExhaustedError("reject"), answer == kRejectTookOver);
    }
    ASSERT_TRUE(f.h.worker->Complete(resume).ok());
    f.h.Check();
    EXPECT_TRUE(f.Listed().empty()) << "offered before memd said whether it took it over";
    EXPECT_TRUE(f.PollEventsOf(resume).empty()) << "an event for a request the engine completed";
    EXPECT_EQ(f.Listed(), answer == kRejectNothingChanged ? std::vector<RequestId>{kInterrupted}
                                                          : std::vector<RequestId>{});
    EXPECT_EQ(f.h.memd.interrupted.contains(kInterrupted), answer == kRejectNothingChanged);
  }
}

// A resume the engine completes while memd is away (review finding, 2026-12-04): queued (memd took its request over),
// the request stays off the list and a second resume is refused here; waiting for memd's first answer, it is hidden
// until the return, whose list is the new memd's (here: memd journaled the take-over, so it lists nothing).
TEST(EmbeddedResumeList, AResumeCompletedWhileMemdIsAwayKeepsItsRequestOffTheList) {
  for (const bool queued : {true, false}) {
    SCOPED_TRACE(queued ? "queued (AdmitWait) when memd died" : "unanswered when memd died");
    ResumeFixture f;
    const RequestId resume = f.SubmitResume();
    if (queued) {
      f.h.memd.AnswerWait(resume, 1);
      ASSERT_EQ(f.PollEventsOf(resume), std::vector<EmbeddedEvent::Kind>{EmbeddedEvent::kWaiting});
    }
    ASSERT_TRUE(f.h.memd.session().ConnectionLost(std::chrono::steady_clock::now()));
    ASSERT_TRUE(f.h.worker->Poll().ok());
    ASSERT_TRUE(f.h.worker->memd_away());
    ASSERT_TRUE(f.h.worker->Complete(resume).ok());
    f.h.Check();
    EXPECT_TRUE(f.Listed().empty()) << "memd took the request over for the resume completed while it was away";
    absl::StatusOr<RequestId> again = f.h.worker->Submit(1, 40, kInterrupted);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
    f.h.memd.listed_interrupted.clear();  // the new memd: the take-over was journaled
    f.h.memd.take_rehello = true;
    ASSERT_TRUE(f.h.worker->Poll().ok());
    f.h.Check();
    ASSERT_FALSE(f.h.worker->memd_away());
    EXPECT_TRUE(f.Listed().empty());
  }
}

}  // namespace
}  // namespace dhs::lib
