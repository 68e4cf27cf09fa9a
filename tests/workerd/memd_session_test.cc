// MemdSession (workerd/memd_session.h): the one connected / lost / away / re-Hello state of the worker's conversation
// with memd, alone: the transition table move by move, the reconnect schedule with time passed in (50 ms doubling to
// 1 s), the reconnect bound, and PlanReturn over a RequestBook (refused reports of requests here, adopted granted
// ones, waiting admissions to send again), and CarryOutReturn's steps in order (workerd/memd_return.h).
#include "workerd/memd_session.h"

#include <algorithm>
#include <map>
#include <random>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "workerd/memd_return.h"
#include "workerd/request_book.h"

namespace dhs {
namespace {

using std::chrono::milliseconds;
using TimePoint = MemdSession::TimePoint;

constexpr MemdState kStates[] = {MemdState::kConnected, MemdState::kLost, MemdState::kAway, MemdState::kHelloOut};

TimePoint At(int64_t ms) { return TimePoint{} + milliseconds(ms); }

TEST(MemdSession, TheTableHoldsExactlyTheDocumentedMovesAndRefusesTheRest) {
  const std::set<std::pair<MemdState, MemdState>> want = {
      {MemdState::kConnected, MemdState::kLost}, {MemdState::kLost, MemdState::kAway},
      {MemdState::kAway, MemdState::kHelloOut},  {MemdState::kHelloOut, MemdState::kAway},
      {MemdState::kHelloOut, MemdState::kConnected}, {MemdState::kAway, MemdState::kConnected}};
  for (MemdState from : kStates) {
    for (MemdState to : kStates) {
      const bool listed = std::find(std::begin(kMemdTransitions), std::end(kMemdTransitions), std::pair{from, to}) !=
                          std::end(kMemdTransitions);
      EXPECT_EQ(listed, want.contains({from, to})) << MemdStateName(from) << " -> " << MemdStateName(to);
      MemdState state = from;
      const absl::Status s = TransitionMemd(state, from, to);
      EXPECT_EQ(s.ok(), listed) << MemdStateName(from) << " -> " << MemdStateName(to);
      EXPECT_EQ(state, listed ? to : from);
      if (!listed) EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
      MemdState other = from == MemdState::kConnected ? MemdState::kAway : MemdState::kConnected;
      const MemdState before = other;
      EXPECT_FALSE(TransitionMemd(other, from, to).ok()) << "a move from a state the session is not in";
      EXPECT_EQ(other, before);
    }
  }
}

// memd dies at t = 1000 ms: the first attempt is due at 1050; failed attempts back off 50, 100, 200, 400, 800, 1000,
// 1000 ms (doubling, capped at 1 s). A re-Hello out at 3000 is given up after the memd timeout (500 ms: 3501).
TEST(MemdSession, TheReconnectScheduleBacksOffFrom50MsToOneSecond) {
  MemdSession s;
  EXPECT_FALSE(s.away());
  ASSERT_TRUE(s.ConnectionLost(At(1000)));
  EXPECT_FALSE(s.ConnectionLost(At(1001))) << "a death is seen once";
  EXPECT_EQ(s.state(), MemdState::kLost);
  EXPECT_TRUE(s.away());
  EXPECT_FALSE(s.serving_away()) << "the worker has not taken the loss yet";
  EXPECT_FALSE(s.AttemptDue(At(2000))) << "no attempt before the worker serves away";
  ASSERT_TRUE(s.TakeLoss(At(1002)));
  EXPECT_TRUE(s.serving_away());
  EXPECT_FALSE(s.TakeLoss(At(1003))) << "the worker takes a death once";
  EXPECT_EQ(s.next_attempt(), At(1050));
  EXPECT_FALSE(s.AttemptDue(At(1049)));
  EXPECT_TRUE(s.AttemptDue(At(1050)));
  int64_t now = 1050;
  for (int64_t wait : {50, 100, 200, 400, 800, 1000, 1000}) {
    s.RetryLater(At(now));
    EXPECT_EQ(s.next_attempt(), At(now + wait));
    now += wait;
  }
  ASSERT_TRUE(s.HelloSent(At(3000)).ok());
  EXPECT_EQ(s.attempts(), 1u);
  EXPECT_TRUE(s.hello_out());
  EXPECT_FALSE(s.AttemptDue(At(9000))) << "one re-Hello at a time";
  EXPECT_FALSE(s.HelloSent(At(3001)).ok());
  EXPECT_FALSE(s.HelloExpired(At(3500), milliseconds(500)));
  EXPECT_TRUE(s.HelloExpired(At(3501), milliseconds(500)));
  s.RetryLater(At(3501));
  EXPECT_EQ(s.state(), MemdState::kAway);
  EXPECT_FALSE(s.ReconnectExpired(At(31000), milliseconds(30000)));
  EXPECT_TRUE(s.ReconnectExpired(At(31001), milliseconds(30000)));
  ASSERT_TRUE(s.HelloSent(At(4600)).ok());
  EXPECT_TRUE(s.serving_away());
  ASSERT_TRUE(s.Accepted().ok());
  EXPECT_FALSE(s.away());
  EXPECT_FALSE(s.serving_away());
  EXPECT_FALSE(s.Accepted().ok()) << "connected already";
  EXPECT_FALSE(s.ReconnectExpired(At(99999), milliseconds(1)));
  ASSERT_TRUE(s.ConnectionLost(At(50000)));  // the next death starts the schedule again
  EXPECT_EQ(s.next_attempt(), At(50050));
  EXPECT_EQ(s.attempts(), 0u);
}

// An in-process worker (no transport) takes the loss from kConnected and hands the reply in from kAway.
TEST(MemdSession, AWorkerWithoutATransportTakesTheLossAndTheReplyDirectly) {
  MemdSession s;
  ASSERT_TRUE(s.TakeLoss(At(0)));
  EXPECT_EQ(s.state(), MemdState::kAway);
  ASSERT_TRUE(s.Accepted().ok());
  EXPECT_EQ(s.state(), MemdState::kConnected);
}

wire::SubmitRequestT Submit(RequestId id) {
  wire::SubmitRequestT s;
  s.request = id;
  s.prompt = {1};
  s.max_new_tokens = 2;
  return s;
}

// Requests (GPU 0, epoch 1, client ids 1..6 = node ids 1..6): 1 waiting, 2 unsent (submitted while away), 3 granted,
// 4 active, 5 active and ended while away, 6 ended while waiting (its Complete unacknowledged). memd refuses 4's
// report (and 9's, not here) and adopts the rest: adopted {3, 5}, refused {4}, resend {1, 2} in id order.
// memd lists as interrupted 7 (unknown here), 1, 3, 4, 6, 8 (ended here after its grant: `ended_here`) and 10 (not
// ended here): ended at memd 1 (admitted again), 6 and 8, in the reply's order; resumable 7, 4 and 10; 3 is adopted.
TEST(MemdSession, PlanReturnSortsTheBookByWhatMemdAnswered) {
  RequestBook book(0, ResumedOutputLimits{});
  for (RequestId c = 1; c <= 6; ++c) ASSERT_TRUE(book.Open(Submit(c), ClientRef{"p", 0}, c == 2, 10).ok());
  book.Close(6, /*completed=*/true);  // a Complete of a waiting request: StaleGrant until its CompleteAck
  ASSERT_TRUE(book.StaleGrant(6));
  ASSERT_TRUE(book.Transition(3, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
  for (RequestId id : {4, 5}) {
    ASSERT_TRUE(book.Transition(id, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
  }
  book.TakeGranted();
  ASSERT_TRUE(book.Transition(4, RequestPhase::kGranted, RequestPhase::kActive).ok());
  ASSERT_TRUE(book.Transition(5, RequestPhase::kGranted, RequestPhase::kActive).ok());
  ASSERT_TRUE(book.DeferEnd(5, absl::CancelledError("gone")).ok());
  wire::HelloReplyT reply;
  reply.refused_reports = {4, 9};
  reply.refused_reasons = {"bad pages"};
  reply.interrupted_requests = {7, 1, 3, 4, 6, 8, 10};
  const ReturnPlan plan =
      PlanReturn(reply, book, ReturnFacts{.ended_here = [](RequestId id) { return id == 8 || id == 3; },
                                          .resume_of = [](RequestId) { return RequestId{0}; }});
  ASSERT_EQ(plan.refused.size(), 1u);
  EXPECT_EQ(plan.refused[0].first, 4u);
  EXPECT_EQ(plan.refused[0].second, "memd refused its report: bad pages");
  EXPECT_EQ(plan.adopted, (std::set<RequestId>{3, 5}));
  EXPECT_EQ(plan.resend, (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(plan.interrupted, (std::set<RequestId>{1, 3, 4, 6, 7, 8, 10}));
  EXPECT_EQ(plan.end_interrupted, (std::vector<RequestId>{1, 6, 8}));
  EXPECT_EQ(plan.resumable, (std::vector<RequestId>{7, 4, 10}));
}

// Granted requests 1 (cancelled while memd was away), 2 (finished while away) and 3 (active); memd refuses all three
// reports and lists 1 and 3 as interrupted. All three are refused; 1 and 2 ended here and are never resumed: 1 is
// ended at memd (end_interrupted), 2 has nothing there; 3 is resumable (review finding: workerd resumed 1).
TEST(MemdSession, PlanReturnNeverResumesARefusedRequestThatEndedHere) {
  RequestBook book(0, ResumedOutputLimits{});
  for (RequestId c = 1; c <= 3; ++c) {
    ASSERT_TRUE(book.Open(Submit(c), ClientRef{"p", 0}, false, 10).ok());
    ASSERT_TRUE(book.Transition(c, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
  }
  book.TakeGranted();
  for (RequestId c = 1; c <= 3; ++c) ASSERT_TRUE(book.Transition(c, RequestPhase::kGranted, RequestPhase::kActive).ok());
  ASSERT_TRUE(book.DeferEnd(1, absl::CancelledError("gone")).ok());
  ASSERT_TRUE(book.DeferEnd(2, absl::OkStatus()).ok());
  wire::HelloReplyT reply;
  reply.refused_reports = {1, 2, 3};
  reply.interrupted_requests = {3, 1};
  const ReturnPlan plan = PlanReturn(reply, book, ReturnFacts{.ended_here = [](RequestId) { return false; },
                                                              .resume_of = [](RequestId) { return RequestId{0}; }});
  ASSERT_EQ(plan.refused.size(), 3u);
  EXPECT_TRUE(plan.adopted.empty());
  EXPECT_TRUE(plan.resend.empty());
  EXPECT_EQ(plan.end_interrupted, (std::vector<RequestId>{1}));
  EXPECT_EQ(plan.resumable, (std::vector<RequestId>{3}));
}

// Resumes waiting here (facts.resume_of), memd restarted. Node ids 1..5 waiting, each a resume: 1 of 11, 2 of 12,
// 3 of 13, 4 of 14 (ending here: its client cancelled it while memd was away), 5 of 15 (ending here too); 6 waits and
// is no resume; 7 is granted (refused report, its id reused by an earlier request this worker ended: ended_here(7)).
// memd lists as interrupted 1 (it read 1's admission and handed 11 over to it), 12 (it never read 2's), 4 (it read
// 4's), 15 (it never read 5's), 6 and 7:
//   1: refused (resumed from its own record, not sent again); 12: neither (2's admission takes it over); 4: neither
//   (its own end sends the Complete); 15: ended (its resume 5 ends); 6: ended and sent again; 7: resumable (refused,
//   ended_here is about ids not in the book). `resend` lists 2, 3, 6 and the ending 4 and 5 (every request whose
//   held phase waits, but the resume 1; the program's deferred end drops the ending ones).
TEST(MemdSession, PlanReturnLetsAWaitingResumeKeepWhatMemdHandedItOver) {
  RequestBook book(0, ResumedOutputLimits{});
  for (RequestId c = 1; c <= 7; ++c) ASSERT_TRUE(book.Open(Submit(c), ClientRef{"p", 0}, false, 10).ok());
  ASSERT_TRUE(book.DeferEnd(4, absl::CancelledError("gone")).ok());
  ASSERT_TRUE(book.DeferEnd(5, absl::CancelledError("gone")).ok());
  ASSERT_TRUE(book.Transition(7, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
  wire::HelloReplyT reply;
  reply.refused_reports = {7};
  reply.interrupted_requests = {1, 12, 4, 15, 6, 7};
  const ReturnPlan plan = PlanReturn(
      reply, book, ReturnFacts{.ended_here = [](RequestId id) { return id == 7; },
                               .resume_of = [](RequestId id) { return id <= 5 ? id + 10 : RequestId{0}; }});
  ASSERT_EQ(plan.refused.size(), 2u);
  EXPECT_EQ(plan.refused[0].first, 7u);
  EXPECT_EQ(plan.refused[0].second, "memd refused its report: ");
  EXPECT_EQ(plan.refused[1].first, 1u);
  EXPECT_NE(plan.refused[1].second.find("waited for its grant"), std::string::npos) << plan.refused[1].second;
  EXPECT_TRUE(plan.adopted.empty());
  EXPECT_EQ(plan.resend, (std::vector<RequestId>{2, 3, 4, 5, 6}));
  EXPECT_EQ(plan.end_interrupted, (std::vector<RequestId>{15, 6}));
  EXPECT_EQ(plan.resumable, (std::vector<RequestId>{1, 7}));
}

// Two resumes of interrupted 21 wait here: 1, cancelled while memd was away (kEnding), and 2, submitted after it.
// memd lists 21 (it read neither admission): 2's admission takes it over, whatever the book's order (21 is ended only
// when every resume of it ends). A refused report of waiting request 3 is bogus (a report holds granted requests
// only): ignored, 3 is sent again, once.
TEST(MemdSession, PlanReturnKeepsAnInterruptedRequestForItsLiveResumeAndIgnoresABogusRefusal) {
  for (const bool live_first : {false, true}) {
    SCOPED_TRACE(live_first ? "the live resume first" : "the ending resume first");
    RequestBook book(0, ResumedOutputLimits{});
    for (RequestId c = 1; c <= 3; ++c) ASSERT_TRUE(book.Open(Submit(c), ClientRef{"p", 0}, false, 10).ok());
    const RequestId ending = live_first ? 2 : 1;
    ASSERT_TRUE(book.DeferEnd(ending, absl::CancelledError("gone")).ok());
    wire::HelloReplyT reply;
    reply.refused_reports = {3};
    reply.interrupted_requests = {21};
    const ReturnPlan plan = PlanReturn(
        reply, book, ReturnFacts{.ended_here = [](RequestId) { return false; },
                                 .resume_of = [](RequestId id) { return id <= 2 ? RequestId{21} : RequestId{0}; }});
    EXPECT_TRUE(plan.refused.empty());
    EXPECT_EQ(plan.resend, (std::vector<RequestId>{1, 2, 3}));
    EXPECT_TRUE(plan.end_interrupted.empty());
    EXPECT_TRUE(plan.resumable.empty());
  }
}

// A ReturnHandler that writes each call down and leaves the book as the programs' handlers do (a refused request and
// a deferred end leave it); `fail_at`: the call that answers UNAVAILABLE.
class RecordingHandler final : public ReturnHandler {
 public:
  RecordingHandler(RequestBook& book, std::string fail_at = "") : book_(book), fail_at_(std::move(fail_at)) {}
  std::vector<std::string> calls;

  absl::Status EndRefused(RequestId id, const std::string&, RefusedEnd how, bool listed) override {
    book_.Close(id, /*completed=*/how == RefusedEnd::kEndedComplete);
    const char* name[] = {"fenced", "ended", "ended+complete"};
    return Call(absl::StrCat("EndRefused ", id, " ", name[static_cast<int>(how)], listed ? " listed" : ""));
  }
  void ReturnToKv(const std::set<RequestId>& adopted) override {
    std::string ids;
    for (RequestId id : adopted) absl::StrAppend(&ids, " ", id);
    calls.push_back("ReturnToKv" + ids);
  }
  void Adopted(RequestId id) override { calls.push_back(absl::StrCat("Adopted ", id)); }
  absl::Status EndDeferred(RequestId id, bool listed) override {
    book_.Close(id, /*completed=*/true);
    return Call(absl::StrCat("EndDeferred ", id, listed ? " listed" : ""));
  }
  absl::Status EndInterrupted(RequestId id) override { return Call(absl::StrCat("EndInterrupted ", id)); }
  absl::Status ResumableFound(RequestId id, const wire::RequestRecordT* record) override {
    return Call(absl::StrCat("ResumableFound ", id, record != nullptr ? " record" : ""));
  }
  absl::Status ResumeRefused(RequestId id) override { return Call(absl::StrCat("ResumeRefused ", id)); }
  absl::Status Resend(RequestId id) override {
    const RequestPhase phase = book_.Find(id)->phase;  // a kUnsent one was moved first; a kQueued one stays
    EXPECT_TRUE(phase == RequestPhase::kWaiting || phase == RequestPhase::kQueued) << id;
    return Call(absl::StrCat("Resend ", id));
  }

 private:
  absl::Status Call(std::string call) {
    calls.push_back(call);
    return call == fail_at_ ? absl::UnavailableError("memd unreachable") : absl::OkStatus();
  }
  RequestBook& book_;
  std::string fail_at_;
};

// Requests (node ids = client ids): 1 waiting, 2 unsent, 3 active, 4 active (its report refused; memd lists it),
// 5 active and ended while away, 6 and 7 active, ended while away, their reports refused (memd lists 6, not 7), 8 and
// 9 waiting and ended while away (memd lists 8: the dead memd journaled its admission), 10 active (its report
// refused; memd holds nothing of it). memd lists as interrupted 4, 6, 8, 11 (unknown here, with its record), 12
// (ended here) and 1 (waits here: the dead memd journaled it).
// Steps (memd_return.h): the refused four end (6 with its Complete); the KV takes {3, 5}; 3 and 5 go on; the
// deferred ends 5, 8, 9 in id order; Completes of 12 and 1 (6's went with its end); 4 and 11 resumable; 10 resumed
// from the program's record, after every Complete; 1 and 2 (moved to kWaiting) sent again. A handler error stops the
// return at that call. Afterwards no new node id is one memd holds (a submit of client id 12 or 4 gets another).
TEST(MemdReturn, CarryOutReturnGivesEachDecisionToTheHandlerInOneOrder) {
  for (const std::string fail_at : {"", "EndInterrupted 12"}) {
    SCOPED_TRACE(fail_at.empty() ? "every call answers OK" : "memd unreachable at " + fail_at);
    RequestBook book(0, ResumedOutputLimits{});
    for (RequestId c = 1; c <= 10; ++c) ASSERT_TRUE(book.Open(Submit(c), ClientRef{"p", 0}, c == 2, 10).ok());
    for (RequestId id : {3, 4, 5, 6, 7, 10}) {
      ASSERT_TRUE(book.Transition(id, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
    }
    book.TakeGranted();
    for (RequestId id : {3, 4, 5, 6, 7, 10}) {
      ASSERT_TRUE(book.Transition(id, RequestPhase::kGranted, RequestPhase::kActive).ok());
    }
    for (RequestId id : {5, 6, 7, 8, 9}) ASSERT_TRUE(book.DeferEnd(id, absl::CancelledError("gone")).ok());
    wire::HelloReplyT reply;
    reply.refused_reports = {4, 6, 7, 10};
    reply.refused_reasons = {"bad pages", "bad pages", "bad pages", "bad pages"};
    reply.interrupted_requests = {4, 6, 8, 11, 12, 1};
    reply.interrupted_records.push_back(std::make_unique<wire::RequestRecordT>());
    reply.interrupted_records.back()->request = 11;
    RecordingHandler handler(book, fail_at);
    absl::StatusOr<ReturnDone> done =
        CarryOutReturn(reply, book,
                       ReturnFacts{.ended_here = [](RequestId id) { return id == 12; },
                                   .resume_of = [](RequestId) { return RequestId{0}; }},
                       handler);
    std::vector<std::string> want = {
        "EndRefused 4 fenced listed", "EndRefused 6 ended+complete listed", "EndRefused 7 ended",
        "EndRefused 10 fenced",
        "ReturnToKv 3 5", "Adopted 3", "Adopted 5",
        "EndDeferred 5", "EndDeferred 8 listed", "EndDeferred 9",
        "EndInterrupted 12", "EndInterrupted 1",
        "ResumableFound 4", "ResumableFound 11 record", "ResumeRefused 10",
        "Resend 1", "Resend 2"};
    if (!fail_at.empty()) {
      want.resize(static_cast<size_t>(std::find(want.begin(), want.end(), fail_at) - want.begin()) + 1);
      EXPECT_TRUE(absl::IsUnavailable(done.status())) << done.status();
    } else {
      ASSERT_TRUE(done.ok()) << done.status();
      EXPECT_EQ(done->ended, 3u);
      EXPECT_EQ(done->resent, 2u);
      EXPECT_EQ(done->plan.end_interrupted, (std::vector<RequestId>{6, 12, 1}));  // 6's Complete went with its end
      std::vector<RequestId> left;
      for (const auto& [id, life] : book.requests()) left.push_back(id);
      EXPECT_EQ(left, (std::vector<RequestId>{1, 2, 3}));  // the refused and the deferred ends left the book
      for (RequestId client : {12, 4}) {  // memd holds 12 and 4 (ids of this epoch no longer in the book)
        absl::StatusOr<RequestLife*> life = book.Open(Submit(client), ClientRef{"q", 0}, false, 1000);
        ASSERT_TRUE(life.ok()) << life.status();
        EXPECT_NE((*life)->id, client) << "a new request took an id memd holds as interrupted";
      }
    }
    EXPECT_EQ(handler.calls, want);
  }
}

// Randomized (seeded): random books (waiting, unsent, queued, granted, active, paused, ending from each; some waiting
// ones resumes of interrupted requests) and random replies (refused reports and interrupted ids among the book's,
// their resumes' and unknown ones; records for some). After every CarryOutReturn:
//   - each request of the book got exactly one of: EndRefused (memd refused its report, or a resume memd lists),
//     Adopted (granted here; then EndDeferred as well when it ended while away), EndDeferred (waiting, ending), Resend
//     (waiting); only the adopted that go on and the resent stay in the book, none of them kUnsent;
//   - no interrupted id gets two Completes (EndInterrupted, EndRefused with its Complete, EndDeferred of a listed one)
//     and none is both resumable and given a Complete; a resumable one is handed memd's record exactly when memd sent
//     one;
//   - the steps come in the header's order.
TEST(MemdReturn, RandomBooksAndRepliesNeverEndOrResumeARequestTwice) {
  std::mt19937_64 rng(20261203);
  constexpr RequestPhase kRoles[] = {RequestPhase::kWaiting, RequestPhase::kUnsent, RequestPhase::kQueued,
                                     RequestPhase::kGranted, RequestPhase::kActive, RequestPhase::kPaused};
  for (int round = 0; round < 3000; ++round) {
    SCOPED_TRACE(round);
    RequestBook book(0, ResumedOutputLimits{});
    const RequestId n = 1 + rng() % 8;
    std::map<RequestId, RequestId> resume_of;
    std::set<RequestId> granted;
    for (RequestId c = 1; c <= n; ++c) {
      const RequestPhase role = kRoles[rng() % std::size(kRoles)];
      ASSERT_TRUE(book.Open(Submit(c), ClientRef{"p", 0}, role == RequestPhase::kUnsent, 10).ok());
      if (role == RequestPhase::kQueued) {
        ASSERT_TRUE(book.Transition(c, RequestPhase::kWaiting, RequestPhase::kQueued).ok());
      }
      if (role == RequestPhase::kGranted || role == RequestPhase::kActive || role == RequestPhase::kPaused) {
        ASSERT_TRUE(book.Transition(c, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
        granted.insert(c);
      }
      if (WaitsForGrant(role) && rng() % 3 == 0) resume_of[c] = 20 + rng() % 4;  // 20..23
    }
    book.TakeGranted();
    for (RequestId c : granted) {
      ASSERT_TRUE(book.Transition(c, RequestPhase::kGranted, RequestPhase::kActive).ok());
      if (rng() % 4 == 0) ASSERT_TRUE(book.Transition(c, RequestPhase::kActive, RequestPhase::kPaused).ok());
    }
    std::set<RequestId> ending;
    for (RequestId c = 1; c <= n; ++c) {
      if (rng() % 4 == 0) {
        ASSERT_TRUE(book.DeferEnd(c, absl::CancelledError("gone")).ok());
        ending.insert(c);
      }
    }
    wire::HelloReplyT reply;
    std::set<RequestId> listed;
    for (RequestId id = 1; id <= 30; ++id) {  // 1..n the book's, 20..23 resumed here, the rest unknown
      if (rng() % 5 == 0) reply.refused_reports.push_back(id);
      if (rng() % 3 == 0 && listed.insert(id).second) {
        reply.interrupted_requests.push_back(id);
        if (rng() % 2 == 0) {
          reply.interrupted_records.push_back(std::make_unique<wire::RequestRecordT>());
          reply.interrupted_records.back()->request = id;
        }
      }
    }
    std::shuffle(reply.interrupted_requests.begin(), reply.interrupted_requests.end(), rng);
    std::set<RequestId> with_record;
    for (const auto& rec : reply.interrupted_records) with_record.insert(rec->request);
    const uint64_t ended_mask = rng();
    const std::set<RequestId> before = [&] {
      std::set<RequestId> ids;
      for (const auto& [id, life] : book.requests()) ids.insert(id);
      return ids;
    }();
    RecordingHandler handler(book);
    absl::StatusOr<ReturnDone> done = CarryOutReturn(
        reply, book,
        ReturnFacts{.ended_here = [&](RequestId id) { return ((ended_mask >> (id % 64)) & 1) != 0; },
                    .resume_of = [&](RequestId id) { return resume_of.contains(id) ? resume_of[id] : RequestId{0}; }},
        handler);
    ASSERT_TRUE(done.ok()) << done.status();
    // Parse the calls: "<Name> <id> ...".
    const std::vector<std::string> order = {"EndRefused",     "ReturnToKv",    "Adopted", "EndDeferred",
                                            "EndInterrupted", "ResumableFound", "ResumeRefused", "Resend"};
    size_t step = 0;
    std::map<RequestId, std::vector<std::string>> of_request;
    std::map<RequestId, int> completes;
    std::set<RequestId> resumable;
    for (const std::string& call : handler.calls) {
      const std::string name = call.substr(0, call.find(' '));
      const auto at = std::find(order.begin(), order.end(), name);
      ASSERT_NE(at, order.end()) << call;
      const size_t here = static_cast<size_t>(at - order.begin());
      ASSERT_GE(here, step) << call << " after " << order[step];
      step = here;
      if (name == "ReturnToKv") continue;
      const RequestId id = std::stoull(call.substr(name.size() + 1));
      const bool listed_flag = call.find(" listed") != std::string::npos;
      if (name == "EndInterrupted" || (name == "EndRefused" && call.find("complete") != std::string::npos) ||
          (name == "EndDeferred" && listed_flag)) {
        ++completes[id];
      }
      if (name == "ResumableFound") {
        EXPECT_TRUE(resumable.insert(id).second) << call;
        EXPECT_EQ(call.find(" record") != std::string::npos, with_record.contains(id)) << call;
        EXPECT_TRUE(listed.contains(id)) << call;
      }
      if (name == "EndRefused" || name == "Adopted" || name == "EndDeferred" || name == "Resend" ||
          name == "ResumeRefused") {
        EXPECT_TRUE(before.contains(id)) << call;
        of_request[id].push_back(name);
      }
      if (name == "EndInterrupted") EXPECT_TRUE(listed.contains(id)) << call;
    }
    for (RequestId id : before) {
      const std::vector<std::string>& got = of_request[id];
      const bool kept = book.Find(id) != nullptr;
      if (got == std::vector<std::string>{"EndRefused", "ResumeRefused"}) {  // memd holds nothing of it
        EXPECT_FALSE(kept) << id;
        EXPECT_FALSE(listed.contains(id)) << id;
        EXPECT_FALSE(ending.contains(id)) << id;
      } else if (got == std::vector<std::string>{"EndRefused"} || got == std::vector<std::string>{"EndDeferred"} ||
                 got == std::vector<std::string>{"Adopted", "EndDeferred"}) {
        EXPECT_FALSE(kept) << id;
      } else if (got == std::vector<std::string>{"Adopted"} || got == std::vector<std::string>{"Resend"}) {
        ASSERT_TRUE(kept) << id;
        EXPECT_NE(book.Find(id)->phase, RequestPhase::kUnsent) << id;
        EXPECT_NE(book.Find(id)->phase, RequestPhase::kEnding) << id;
        EXPECT_EQ(got[0] == "Adopted", granted.contains(id)) << id;
      } else {
        ADD_FAILURE() << "request " << id << " got " << got.size() << " calls";
      }
      const bool refused = !got.empty() && got[0] == "EndRefused";
      const bool ended_now = std::find(got.begin(), got.end(), "EndDeferred") != got.end() || refused;
      EXPECT_EQ(ended_now, ending.contains(id) || refused)
          << "request " << id << (ending.contains(id) ? " ended while away and was not ended" : " ended here");
    }
    for (const auto& [id, count] : completes) {
      EXPECT_EQ(count, 1) << "interrupted request " << id << " got " << count << " Completes";
      EXPECT_FALSE(resumable.contains(id)) << "interrupted request " << id << " both resumable and completed";
    }
    for (RequestId client = 1; client <= 30; ++client) {  // no new id is one memd holds
      absl::StatusOr<RequestLife*> life = book.Open(Submit(client), ClientRef{"new", 0}, false, 1000);
      ASSERT_TRUE(life.ok()) << life.status();
      EXPECT_FALSE(listed.contains((*life)->id)) << "client " << client << " got id " << (*life)->id;
    }
  }
}

}  // namespace
}  // namespace dhs
