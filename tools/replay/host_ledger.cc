// tools/replay/host_ledger.cc: see host_ledger.h.
#include "tools/replay/host_ledger.h"

namespace dhs::replay {

void HostLedger::Lose(std::pair<RequestId, uint32_t> key, bool vanished) {
  if (!lost_.insert(key).second) return;
  ++(vanished ? vanished_ : changed_);
}

void HostLedger::Observe(const HostCopySeen& seen) {
  const auto key = std::make_pair(seen.client, seen.page);
  auto [it, inserted] = digests_.emplace(key, seen.digest);
  if (inserted) return;
  ++checked_;
  if (it->second != seen.digest) Lose(key, /*vanished=*/false);
}

void HostLedger::CheckAfterFault(const std::set<RequestId>& clients, const std::vector<HostCopySeen>& present) {
  std::map<std::pair<RequestId, uint32_t>, uint64_t> now;
  for (const HostCopySeen& p : present) now[{p.client, p.page}] = p.digest;
  for (const auto& [key, digest] : digests_) {
    if (!clients.contains(key.first)) continue;
    ++checked_;
    auto it = now.find(key);
    if (it == now.end()) {
      Lose(key, /*vanished=*/true);
    } else if (it->second != digest) {
      Lose(key, /*vanished=*/false);
    }
  }
}

void HostLedger::Forget(RequestId client) {
  digests_.erase(digests_.lower_bound({client, 0}), digests_.upper_bound({client, UINT32_MAX}));
}

std::set<RequestId> HostLedger::clients() const {
  std::set<RequestId> out;
  for (const auto& [key, digest] : digests_) out.insert(key.first);
  return out;
}

}  // namespace dhs::replay
