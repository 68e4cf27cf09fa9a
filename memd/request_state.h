// memd/request_state.h: the state of one request in memd's core (brief §3, §4), its allowed transitions and the one
// validating TransitionRequest() (the pattern of memd/history_page.h and memd/gpu_page_table.h).
//
//   state         what it holds                                                       left by
//   kQueued       nothing (a queued resume: the host pages it took over)              grant, fence (resume), Complete
//   kAdmitted     slot, required pages, a host page per context page, a_r GPU pages  reclaim, fence, Complete
//   kReclaiming   as kAdmitted; its optional pages are being reclaimed                retire / abort, fence, Complete
//   kInterrupted  its confirmed host copies only (its GPU was fenced)                 a resume takes it over, Complete
//   kCompleted    nothing: released (the core erases it in the same event)            -
//
// A request the core erases (Complete of a queued or interrupted request, a resume's predecessor, a rejected
// admission) leaves without a transition: it no longer exists. A new request starts kQueued; adopted ones (a dead
// memd's journal, a surviving worker's report) are built kQueued and moved at once.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/status/status.h"

namespace dhs::memd {

// kInterrupted: admitted on a GPU that was fenced (its worker died or hung, ResidencyManager::FenceGpu): no GPU page,
// no slot, only the host pages that hold a confirmed host copy; ended by Complete or taken over by a resume.
enum class RequestState : uint8_t { kQueued = 0, kAdmitted = 1, kReclaiming = 2, kCompleted = 3, kInterrupted = 4 };
inline constexpr int kRequestStates = 5;

std::string_view RequestStateName(RequestState state);

// Every allowed move, with the event that makes it (nothing else may change a request's state):
inline constexpr std::pair<RequestState, RequestState> kRequestTransitions[] = {
    {RequestState::kQueued, RequestState::kAdmitted},         // grant; AdoptGpu (a surviving worker's report)
    {RequestState::kAdmitted, RequestState::kReclaiming},     // a reclaim of its optional pages starts
    {RequestState::kReclaiming, RequestState::kAdmitted},     // the reclaim retired, or aborted by a failed backup
    {RequestState::kAdmitted, RequestState::kCompleted},      // Complete
    {RequestState::kReclaiming, RequestState::kCompleted},    // Complete (the reclaim is cancelled)
    {RequestState::kAdmitted, RequestState::kInterrupted},    // FenceGpu
    {RequestState::kReclaiming, RequestState::kInterrupted},  // FenceGpu (the reclaim is dropped)
    {RequestState::kQueued, RequestState::kInterrupted},      // FenceGpu of a queued resume; AdoptHostPages
};

// True when `from -> to` is listed in kRequestTransitions.
bool RequestTransitionAllowed(RequestState from, RequestState to);

// Moves `state` from `from` to `to`. Errors: FailedPrecondition when `state` is not `from` or the move is not in
// kRequestTransitions (`state` is then unchanged).
absl::Status TransitionRequest(RequestState& state, RequestState from, RequestState to);

}  // namespace dhs::memd
