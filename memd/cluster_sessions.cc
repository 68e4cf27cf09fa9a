// memd/cluster_sessions.cc: see cluster_sessions.h.
#include "memd/cluster_sessions.h"

#include <algorithm>

#include "common/page_checksum.h"

namespace dhs::memd {

std::vector<SessionPublishPage> SessionPagesToPublish(const core::Request& r, std::span<const uint64_t> digests) {
  std::vector<SessionPublishPage> out;
  const size_t pages = std::min(digests.size(), r.history.size());
  for (size_t h = r.prefix.size(); h < pages; ++h) {
    const HistoryPage& page = r.history[h];
    const bool confirmed = page.state == HistoryState::kHost || page.state == HistoryState::kPopulating ||
                           page.state == HistoryState::kGpuAndHost;
    if (!confirmed || page.checksum == kNoChecksum) continue;
    out.push_back({static_cast<uint32_t>(h), page.host_page, page.checksum, digests[h]});
  }
  return out;
}

}  // namespace dhs::memd
