#include "memd/request_state.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_format.h"

namespace dhs::memd {

std::string_view RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kQueued: return "queued";
    case RequestState::kAdmitted: return "admitted";
    case RequestState::kReclaiming: return "reclaiming";
    case RequestState::kCompleted: return "completed";
    case RequestState::kInterrupted: return "interrupted";
  }
  return "unknown";
}

bool RequestTransitionAllowed(RequestState from, RequestState to) {
  return std::find(std::begin(kRequestTransitions), std::end(kRequestTransitions), std::pair{from, to}) !=
         std::end(kRequestTransitions);
}

absl::Status TransitionRequest(RequestState& state, RequestState from, RequestState to) {
  if (state != from) {
    return absl::FailedPreconditionError(
        absl::StrFormat("request is %s, expected %s", RequestStateName(state), RequestStateName(from)));
  }
  if (!RequestTransitionAllowed(from, to)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("no request transition %s -> %s", RequestStateName(from), RequestStateName(to)));
  }
  state = to;
  return absl::OkStatus();
}

}  // namespace dhs::memd
