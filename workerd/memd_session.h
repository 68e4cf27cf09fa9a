// workerd/memd_session.h: the ONE state of the worker's conversation with memd (issue 23; issue 11, docs/protocol.md
// "Re-Hello with a report"): connected, memd lost, serving away, re-Hello out. MemdClient (the transport) owns the
// session (every MemdLink holds one: MemdLink::session()) and reports the connection's events to it; the Worker and
// the ResidencyAgent read it through their link: "memd is away" is stored here only.
//
//   state      meaning                                                          left by
//   kConnected memd answers                                                     its connection closed (kLost)
//   kLost      the connection closed (memd died); the worker has not taken it    the worker serves away (kAway)
//              yet (MemdAway::Enter: orders resolved, host writes paused)
//   kAway      serving from the GPU; the next re-Hello attempt is due at         a re-Hello sent (kHelloOut)
//              next_attempt()
//   kHelloOut  a re-Hello is out on a new connection, unanswered                unanswered / failed (kAway), accepted
//                                                                               (kConnected)
// The move goes through TransitionMemd(), checked against kMemdTransitions (memd/history_page.h's pattern).
//
// The reconnect schedule (backoff 50 ms doubling to 1 s, the attempts, when the re-Hello went out) lives here too,
// with the time passed in (no clocks). When a memd takes the re-Hello, PlanReturn says what the worker must do (which
// requests memd refused, which it adopted, which admissions go again) instead of calling back into the loop.
//
// Thread-safety: none; one thread at a time (MemdClient's rule).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"
#include "dhs_generated.h"

namespace dhs {

class RequestBook;  // workerd/request_book.h

enum class MemdState : uint8_t { kConnected, kLost, kAway, kHelloOut };

std::string_view MemdStateName(MemdState state);

// Every allowed move, with the event that makes it:
inline constexpr std::pair<MemdState, MemdState> kMemdTransitions[] = {
    {MemdState::kConnected, MemdState::kLost},  // memd's connection closed (it died)
    {MemdState::kLost, MemdState::kAway},       // the worker serves away (MemdAway::Enter)
    {MemdState::kAway, MemdState::kHelloOut},   // a re-Hello sent on a new connection
    {MemdState::kHelloOut, MemdState::kAway},   // the re-Hello unanswered for the memd timeout: retried later
    {MemdState::kHelloOut, MemdState::kConnected},  // a memd accepted the re-Hello
    {MemdState::kAway, MemdState::kConnected},  // in process (no transport): the re-Hello's reply handed in directly
};

// What the worker does when a memd accepted its re-Hello (MemdAway::Return), from the reply and the book:
struct ReturnPlan {
  // Requests of the book that end here like after a fence and are resumed (from memd's interrupted record when it
  // lists one), each with why (the client's or the engine's message):
  //   - reports memd refused (HelloReply.refused_reports): "memd refused its report: " and refused_reasons' text;
  //   - resumes waiting here for their grant that memd lists as interrupted: the dead memd had journaled the
  //     admission and handed the request it resumes over to it (its host pages), so sending it again as a resume of
  //     that request would be rejected (it is unknown now); it is resumed from its own interrupted record instead
  //     (review finding: it was ended at memd, its pages freed, and its admission rejected: the request was lost).
  // A refused request that ended here while memd was away (kEnding: finished, failed, cancelled, completed by the
  // engine) is in `refused` too, but is never resumed: it ends here as it was ending (its client gets its held tokens
  // and its own end; libdhs forgets it), with no Complete unless memd lists it interrupted (then it is also in
  // end_interrupted, and its own end sends that Complete: CarryOutReturn's step 2, workerd/memd_return.h).
  std::vector<std::pair<RequestId, std::string>> refused;
  // Requests granted here (not refused) that memd adopted: their held tokens go to their clients, their committed
  // count is every generated token (the report carried them), paused ones step again.
  std::set<RequestId> adopted;
  // Requests waiting for their grant (their AdmitRequest went to the dead memd, or never went): sent again last
  // (a resume among `refused` is not).
  std::vector<RequestId> resend;
  std::set<RequestId> interrupted;  // HelloReply.interrupted_requests
  // What becomes of each interrupted request (memd holds it from a dead epoch, with its record when it has one), one
  // rule for workerd and libdhs (issue 25; was decided twice):
  //   end_interrupted  ended at memd at once (a Complete), before any admission goes again: a request that waits for
  //                    its grant here and is not a resume (the dead memd journaled its admission, its grant never
  //                    came; it is admitted again, under the same id, after this Complete); one this worker ended (its
  //                    Complete went to the dead memd: ended while waiting, RequestBook::StaleGrant, or `ended_here`);
  //                    one whose resume here ends at this re-Hello (kEnding: the resume was cancelled or completed);
  //                    one in `refused` that ended here while memd was away (kEnding; review finding: workerd
  //                    resumed a request cancelled while memd was away when its report was refused).
  //   resumable        not in the book and not ended here, or in `refused` and not ending here: workerd resumes
  //                    each from its record (and ends one without a record); libdhs lists them to the engine
  //                    (dhs_worker_list_resumable).
  // In neither: an adopted request (in the book, granted, its report taken); a request ending here at this re-Hello
  // (kEnding: its deferred end sends its own Complete: ReturnHandler::EndDeferred, workerd/memd_return.h); an
  // interrupted request a resume waiting here takes over when its admission goes again (the dead memd never read that
  // admission). Both lists in HelloReply order.
  std::vector<RequestId> end_interrupted;
  std::vector<RequestId> resumable;
};
// What PlanReturn asks the program of a request (the book holds phases and ids, not these).
struct ReturnFacts {
  // Whether this worker ended request `id` (not in the book now) and sent its Complete (ResidencyAgent::Finished;
  // libdhs also remembers the Completes it sends itself).
  std::function<bool(RequestId)> ended_here;
  // The interrupted request that request `id` of the book resumes (its AdmitRequest.resume_of), 0 when none.
  std::function<RequestId(RequestId)> resume_of;
};
// The plan of a return (above) from memd's HelloReply and the book as it was when the re-Hello went out (before
// ForgetUnacknowledged).
ReturnPlan PlanReturn(const wire::HelloReplyT& reply, const RequestBook& book, const ReturnFacts& facts);

class MemdSession {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  MemdState state() const { return state_; }
  // memd is not connected (kLost, kAway, kHelloOut): the transport sends nothing to memd.
  bool away() const { return state_ != MemdState::kConnected; }
  // The worker took the loss and serves away (kAway, kHelloOut): ends, admissions and tokens wait for the re-Hello,
  // no host page is written (MemdAway::Enter .. Return).
  bool serving_away() const { return state_ == MemdState::kAway || state_ == MemdState::kHelloOut; }
  bool hello_out() const { return state_ == MemdState::kHelloOut; }

  // Moves kConnected -> kLost at `now` (the schedule restarts: first attempt after 50 ms). False when not connected
  // (the loss was seen already).
  bool ConnectionLost(TimePoint now);
  // The worker takes the loss (kLost -> kAway; from kConnected, as an in-process test does, through kLost). False when
  // it was taken already (kAway, kHelloOut): once per death.
  bool TakeLoss(TimePoint now);
  // Whether the next re-Hello attempt is due (kAway and now >= next_attempt()).
  bool AttemptDue(TimePoint now) const { return state_ == MemdState::kAway && now >= next_attempt_; }
  // A re-Hello went out at `now`: kAway -> kHelloOut, one more attempt. Errors: FAILED_PRECONDITION (not kAway).
  absl::Status HelloSent(TimePoint now);
  // Whether the re-Hello out has gone unanswered longer than `timeout`.
  bool HelloExpired(TimePoint now, std::chrono::milliseconds timeout) const {
    return state_ == MemdState::kHelloOut && now - hello_sent_ > timeout;
  }
  // The attempt failed (no memd socket, a failed connect or send, an unanswered Hello): the next one after the
  // backoff, which doubles (at most 1 s). kHelloOut -> kAway.
  void RetryLater(TimePoint now);
  // Whether memd has been away longer than `bound` (the epoch then ends).
  bool ReconnectExpired(TimePoint now, std::chrono::milliseconds bound) const {
    return away() && now - away_since_ > bound;
  }
  // A memd accepted the re-Hello: kHelloOut (or kAway) -> kConnected. Errors: FAILED_PRECONDITION (connected).
  absl::Status Accepted();

  TimePoint away_since() const { return away_since_; }
  TimePoint next_attempt() const { return next_attempt_; }
  std::chrono::milliseconds backoff() const { return backoff_; }
  uint32_t attempts() const { return attempts_; }

 private:
  absl::Status Transition(MemdState from, MemdState to);

  MemdState state_ = MemdState::kConnected;
  TimePoint away_since_{}, next_attempt_{}, hello_sent_{};
  std::chrono::milliseconds backoff_{50};
  uint32_t attempts_ = 0;
};

// Moves `state` from `from` to `to`. Errors: FAILED_PRECONDITION when `state` is not `from` or the move is not in
// kMemdTransitions (`state` unchanged).
absl::Status TransitionMemd(MemdState& state, MemdState from, MemdState to);

}  // namespace dhs
