// workerd/kv/kv_page.cc: see kv_page.h.
#include "workerd/kv/kv_page.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_format.h"

namespace dhs {
namespace {

template <class State, class NameOf, size_t N>
absl::Status Transition(State& state, State from, State to, const std::pair<State, State> (&table)[N],
                        std::string_view what, NameOf name) {
  if (state != from) {
    return absl::FailedPreconditionError(
        absl::StrFormat("KV page's %s copy is %s, expected %s", what, name(state), name(from)));
  }
  if (std::find(std::begin(table), std::end(table), std::pair{from, to}) == std::end(table)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("no KV page %s copy transition %s -> %s", what, name(from), name(to)));
  }
  state = to;
  return absl::OkStatus();
}

}  // namespace

std::string_view HostCopyName(HostCopy state) {
  switch (state) {
    case HostCopy::kNone: return "none";
    case HostCopy::kWriting: return "writing";
    case HostCopy::kWritten: return "written";
    case HostCopy::kVerified: return "verified";
    case HostCopy::kImported: return "imported";
  }
  return "unknown";
}

std::string_view GpuCopyName(GpuCopy state) {
  switch (state) {
    case GpuCopy::kNone: return "none";
    case GpuCopy::kFilling: return "filling";
    case GpuCopy::kReady: return "ready";
  }
  return "unknown";
}

absl::Status TransitionPage(KvPage& page, HostCopy from, HostCopy to) {
  return Transition(page.host, from, to, kHostCopyTransitions, "host", HostCopyName);
}

absl::Status TransitionPage(KvPage& page, GpuCopy from, GpuCopy to) {
  return Transition(page.gpu, from, to, kGpuCopyTransitions, "GPU", GpuCopyName);
}

}  // namespace dhs
