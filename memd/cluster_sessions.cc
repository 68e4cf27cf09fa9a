// memd/cluster_sessions.cc: see cluster_sessions.h.
#include "memd/cluster_sessions.h"

#include <algorithm>

#include "common/page_checksum.h"

namespace dhs::memd {

std::vector<SessionPublishPage> SessionPagesToPublish(const core::Request& r, std::span<const uint64_t> digests,
                                                      const std::function<bool(uint32_t)>& held) {
  std::vector<SessionPublishPage> out;
  const size_t pages = std::min(digests.size(), r.history.size());
  for (size_t h = 0; h < pages; ++h) {
    if (h < r.prefix.size() && r.prefix[h].session == 0) continue;  // a prefix page: found under its prefix key
    if (held && held(static_cast<uint32_t>(h))) continue;           // a shared page it was granted: stored already
    const HistoryPage& page = r.history[h];
    const bool confirmed = page.state == HistoryState::kHost || page.state == HistoryState::kPopulating ||
                           page.state == HistoryState::kGpuAndHost;
    if (!confirmed || page.checksum == kNoChecksum) continue;
    out.push_back({static_cast<uint32_t>(h), page.host_page, page.checksum, digests[h]});
  }
  return out;
}

ClusterAsk SessionAlternates(std::span<const PrefixAddress> wanted, uint64_t tenant, uint64_t session_hash,
                             std::span<const uint64_t> digests, uint32_t page_rows) {
  ClusterAsk ask;
  ask.asked.assign(wanted.begin(), wanted.end());
  ask.alternate.assign(wanted.size(), -1);
  if (session_hash == 0 || page_rows == 0) return ask;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const PrefixAddress& w = wanted[i];
    if (w.session != 0 || w.page >= digests.size()) continue;  // a session address already, or no digest
    ask.alternate[i] = static_cast<int32_t>(ask.asked.size());
    ask.asked.push_back(PrefixPages::SessionAddress(tenant, session_hash, digests[w.page], page_rows, w.page));
  }
  return ask;
}

int32_t ServedBy(const ClusterAsk& ask, const std::vector<bool>& found, size_t i) {
  if (i < found.size() && found[i]) return static_cast<int32_t>(i);
  const int32_t alt = i < ask.alternate.size() ? ask.alternate[i] : -1;
  if (alt >= 0 && static_cast<size_t>(alt) < found.size() && found[static_cast<size_t>(alt)]) return alt;
  return -1;
}

}  // namespace dhs::memd
