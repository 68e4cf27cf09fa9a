#include "memd/history_page.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_format.h"

namespace dhs::memd {

std::string_view HistoryStateName(HistoryState state) {
  switch (state) {
    case HistoryState::kHostPending: return "host-pending";
    case HistoryState::kHost: return "host";
    case HistoryState::kPopulating: return "populating";
    case HistoryState::kGpu: return "gpu";
    case HistoryState::kGpuDeferred: return "gpu-deferred";
    case HistoryState::kGpuAndHost: return "gpu-and-host";
    case HistoryState::kLost: return "lost";
  }
  return "unknown";
}

bool HoldsGpuPage(HistoryState state) {
  return state == HistoryState::kPopulating || state == HistoryState::kGpu || state == HistoryState::kGpuDeferred ||
         state == HistoryState::kGpuAndHost;
}

absl::Status TransitionHistory(HistoryPage& page, HistoryState from, HistoryState to) {
  if (page.state != from) {
    return absl::FailedPreconditionError(absl::StrFormat("history page is %s, expected %s", HistoryStateName(page.state),
                                                         HistoryStateName(from)));
  }
  const bool allowed = std::find(std::begin(kHistoryTransitions), std::end(kHistoryTransitions),
                                 std::pair{from, to}) != std::end(kHistoryTransitions);
  if (!allowed) {
    return absl::FailedPreconditionError(
        absl::StrFormat("no history page transition %s -> %s", HistoryStateName(from), HistoryStateName(to)));
  }
  page.state = to;
  return absl::OkStatus();
}

}  // namespace dhs::memd
