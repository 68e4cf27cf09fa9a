// workerd/memd_session.cc: see memd_session.h.
#include "workerd/memd_session.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <string>

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "workerd/request_book.h"

namespace dhs {

std::string_view MemdStateName(MemdState state) {
  switch (state) {
    case MemdState::kConnected: return "connected";
    case MemdState::kLost: return "lost";
    case MemdState::kAway: return "away";
    case MemdState::kHelloOut: return "hello-out";
  }
  return "unknown";
}

absl::Status TransitionMemd(MemdState& state, MemdState from, MemdState to) {
  if (state != from) {
    return absl::FailedPreconditionError(
        absl::StrFormat("memd session is %s, expected %s", MemdStateName(state), MemdStateName(from)));
  }
  const bool allowed = std::find(std::begin(kMemdTransitions), std::end(kMemdTransitions), std::pair{from, to}) !=
                       std::end(kMemdTransitions);
  if (!allowed) {
    return absl::FailedPreconditionError(
        absl::StrFormat("no memd session transition %s -> %s", MemdStateName(from), MemdStateName(to)));
  }
  state = to;
  return absl::OkStatus();
}

absl::Status MemdSession::Transition(MemdState from, MemdState to) { return TransitionMemd(state_, from, to); }

bool MemdSession::ConnectionLost(TimePoint now) {
  if (!Transition(MemdState::kConnected, MemdState::kLost).ok()) return false;
  away_since_ = now;
  backoff_ = std::chrono::milliseconds(50);
  next_attempt_ = now + backoff_;
  attempts_ = 0;
  return true;
}

bool MemdSession::TakeLoss(TimePoint now) {
  if (state_ == MemdState::kConnected) ConnectionLost(now);
  return Transition(MemdState::kLost, MemdState::kAway).ok();
}

absl::Status MemdSession::HelloSent(TimePoint now) {
  if (absl::Status s = Transition(MemdState::kAway, MemdState::kHelloOut); !s.ok()) return s;
  hello_sent_ = now;
  ++attempts_;
  return absl::OkStatus();
}

void MemdSession::RetryLater(TimePoint now) {
  if (state_ == MemdState::kHelloOut) DHS_CHECK_OK(Transition(MemdState::kHelloOut, MemdState::kAway));
  next_attempt_ = now + backoff_;
  backoff_ = std::min<std::chrono::milliseconds>(backoff_ * 2, std::chrono::seconds(1));
}

absl::Status MemdSession::Accepted() {
  if (state_ == MemdState::kHelloOut) return Transition(MemdState::kHelloOut, MemdState::kConnected);
  return Transition(MemdState::kAway, MemdState::kConnected);
}

ReturnPlan PlanReturn(const wire::HelloReplyT& reply, const RequestBook& book, const ReturnFacts& facts) {
  ReturnPlan plan;
  plan.interrupted.insert(reply.interrupted_requests.begin(), reply.interrupted_requests.end());
  std::set<RequestId> refused;
  for (size_t i = 0; i < reply.refused_reports.size(); ++i) {
    const RequestId id = reply.refused_reports[i];
    const RequestLife* life = book.Find(id);
    if (life == nullptr || WaitsForGrant(life->held_phase())) continue;  // reported: granted here (else a bogus list)
    refused.insert(id);
    plan.refused.emplace_back(id, "memd refused its report: " +
                                      (i < reply.refused_reasons.size() ? reply.refused_reasons[i] : std::string()));
  }
  // The interrupted requests a resume waiting here continues: -> whether that resume ends at this re-Hello.
  std::map<RequestId, bool> resumed_here;
  for (const auto& [id, life] : book.requests()) {
    if (!WaitsForGrant(life.held_phase())) {
      if (!refused.contains(id)) plan.adopted.insert(id);
      continue;
    }
    const RequestId of = facts.resume_of(id);
    if (of != 0) {  // ended with its resume only when every resume of it here ends
      auto [it, first] = resumed_here.emplace(of, life.phase == RequestPhase::kEnding);
      if (!first) it->second = it->second && life.phase == RequestPhase::kEnding;
    }
    if (of != 0 && life.phase != RequestPhase::kEnding && plan.interrupted.contains(id)) {
      refused.insert(id);  // the dead memd handed `of` over to it: resumed from its own record
      plan.refused.emplace_back(id, "this resume waited for its grant when memd died; memd holds it as "
                                    "interrupted, with the host pages it took over");
      continue;
    }
    plan.resend.push_back(id);
  }
  for (RequestId id : reply.interrupted_requests) {
    if (plan.adopted.contains(id)) continue;
    if (const RequestLife* life = book.Find(id); life != nullptr) {
      if (refused.contains(id)) {  // resumed, unless it ended here while memd was away
        (life->phase == RequestPhase::kEnding ? plan.end_interrupted : plan.resumable).push_back(id);
      } else if (life->phase != RequestPhase::kEnding) {  // waits for its grant, not a resume
        plan.end_interrupted.push_back(id);
      }
      continue;
    }
    if (auto it = resumed_here.find(id); it != resumed_here.end()) {
      if (it->second) plan.end_interrupted.push_back(id);  // its resume ends: so does it
      continue;                                            // else its resume takes it over
    }
    const bool ended = book.StaleGrant(id) || facts.ended_here(id);
    (ended ? plan.end_interrupted : plan.resumable).push_back(id);
  }
  return plan;
}

}  // namespace dhs
