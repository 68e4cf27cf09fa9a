// tools/replay/host_ledger.cc: see host_ledger.h.
#include "tools/replay/host_ledger.h"

#include <algorithm>

namespace dhs::replay {

bool HostLedger::Lose(std::pair<RequestId, uint32_t> key, bool vanished) {
  if (!lost_.insert(key).second) return false;
  ++(vanished ? vanished_ : changed_);
  return true;
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

std::vector<std::pair<RequestId, uint32_t>> HostLedger::CheckAfterFault(const std::set<RequestId>& nodes,
                                                                        const std::vector<HostCopySeen>& present,
                                                                        const std::set<RequestId>& unread,
                                                                        const std::set<RequestId>& listed_after) {
  std::map<std::pair<RequestId, uint32_t>, uint64_t> now;
  for (const HostCopySeen& p : present) now[{p.client, p.page}] = p.digest;
  std::vector<std::pair<RequestId, uint32_t>> lost;
  for (RequestId node : nodes) {
    auto h = held_.find(node);
    if (h == held_.end()) continue;
    if (unread.contains(node)) {
      if (!listed_after.contains(node)) {
        held_.erase(h);  // ended during the check: memd freed its pages with it
      } else {
        unchecked_ += h->second.second.size();
      }
      continue;
    }
    const RequestId client = h->second.first;
    for (uint32_t page : h->second.second) {
      const auto key = std::make_pair(client, page);
      ++checked_;
      auto it = now.find(key);
      const bool vanished = it == now.end();
      if ((vanished || it->second != digests_.at(key)) && Lose(key, vanished)) lost.push_back(key);
    }
  }
  return lost;
}

void HostLedger::Forget(RequestId node) {
  held_.erase(node);
  uncovered_last_.erase(node);
}

void HostLedger::ObserveCoverage(const CoverageSeen& seen) {
  // Only a client's first incarnation is checked: the client's rows also count what a resumed one still recomputes,
  // and an interrupted one keeps none of its tail pages.
  if (first_node_.try_emplace(seen.client, seen.node).first->second != seen.node) return;
  const uint32_t covered = seen.confirmed_due + seen.on_gpu;
  const uint32_t uncovered = seen.due_pages > covered ? seen.due_pages - covered : 0;
  auto [last, fresh] = uncovered_last_.try_emplace(seen.node, uncovered);
  const uint32_t twice = fresh ? 0 : std::min(last->second, uncovered);
  last->second = uncovered;
  uint32_t& worst = unconfirmed_[seen.client];
  worst = std::max(worst, twice);
}

uint64_t HostLedger::pages_unconfirmed() const {
  uint64_t n = 0;
  for (const auto& [client, pages] : unconfirmed_) n += pages;
  return n;
}

std::set<RequestId> HostLedger::nodes() const {
  std::set<RequestId> out;
  for (const auto& [node, held] : held_) out.insert(node);
  return out;
}

}  // namespace dhs::replay
