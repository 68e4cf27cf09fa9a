// tools/replay/host_ledger.cc: see host_ledger.h.
#include "tools/replay/host_ledger.h"

namespace dhs::replay {

void HostLedger::Lose(std::pair<RequestId, uint32_t> key, bool vanished) {
  if (!lost_.insert(key).second) return;
  ++(vanished ? vanished_ : changed_);
}

void HostLedger::Observe(const HostCopySeen& seen) {
  auto& held = held_[seen.node];
  held.first = seen.client;
  held.second.insert(seen.page);
  const auto key = std::make_pair(seen.client, seen.page);
  auto [it, inserted] = digests_.emplace(key, seen.digest);
  if (inserted) return;
  ++checked_;
  if (it->second != seen.digest) Lose(key, /*vanished=*/false);
}

void HostLedger::CheckAfterFault(const std::set<RequestId>& nodes, const std::vector<HostCopySeen>& present) {
  std::map<std::pair<RequestId, uint32_t>, uint64_t> now;
  for (const HostCopySeen& p : present) now[{p.client, p.page}] = p.digest;
  for (RequestId node : nodes) {
    auto h = held_.find(node);
    if (h == held_.end()) continue;
    const RequestId client = h->second.first;
    for (uint32_t page : h->second.second) {
      const auto key = std::make_pair(client, page);
      ++checked_;
      auto it = now.find(key);
      if (it == now.end()) {
        Lose(key, /*vanished=*/true);
      } else if (it->second != digests_.at(key)) {
        Lose(key, /*vanished=*/false);
      }
    }
  }
}

void HostLedger::Forget(RequestId node) { held_.erase(node); }

std::set<RequestId> HostLedger::nodes() const {
  std::set<RequestId> out;
  for (const auto& [node, held] : held_) out.insert(node);
  return out;
}

}  // namespace dhs::replay
