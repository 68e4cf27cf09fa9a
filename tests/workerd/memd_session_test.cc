// MemdSession (workerd/memd_session.h): the one connected / lost / away / re-Hello state of the worker's conversation
// with memd, alone: the transition table move by move, the reconnect schedule with time passed in (50 ms doubling to
// 1 s), the reconnect bound, and PlanReturn over a RequestBook (refused reports of requests here, adopted granted
// ones, waiting admissions to send again).
#include "workerd/memd_session.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <string>

#include "gtest/gtest.h"
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

}  // namespace
}  // namespace dhs
