// tools/replay/router.cc: see router.h.
#include "tools/replay/router.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dhs::replay {

std::string_view RoutePolicyName(RoutePolicy policy) { return kRoutePolicyNames[static_cast<int>(policy)]; }

absl::StatusOr<RoutePolicy> ParseRoutePolicy(std::string_view name) {
  for (int i = 0; i < 3; ++i) {
    if (name == kRoutePolicyNames[i]) return static_cast<RoutePolicy>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown route policy '", std::string(name), "' (expected round-robin, session or prefix)"));
}

std::string_view RouteReasonName(RouteReason reason) {
  switch (reason) {
    case RouteReason::kRoundRobin: return "round_robin";
    case RouteReason::kSessionSticky: return "session_sticky";
    case RouteReason::kSessionNew: return "session_new";
    case RouteReason::kPrefixHit: return "prefix_hit";
    case RouteReason::kPrefixMiss: return "prefix_miss";
  }
  return "unknown";
}

Router::Router(int nodes, RoutePolicy policy) : policy_(policy), load_(nodes, 0), held_(nodes) {}

absl::StatusOr<Router> Router::Create(int nodes, RoutePolicy policy) {
  if (nodes < 1) return absl::InvalidArgumentError(absl::StrCat("router: ", nodes, " nodes (at least 1)"));
  return Router(nodes, policy);
}

int Router::LeastLoaded(const std::vector<int>& candidates) {
  int64_t best = -1;
  for (int n : candidates) best = best < 0 ? load_[n] : std::min(best, load_[n]);
  const int count = nodes();
  for (int step = 0; step < count; ++step) {
    const int n = (tie_cursor_ + step) % count;
    if (load_[n] == best && std::find(candidates.begin(), candidates.end(), n) != candidates.end()) {
      tie_cursor_ = (n + 1) % count;
      return n;
    }
  }
  return candidates.front();  // unreachable: candidates is never empty
}

bool BlockAnnounced(int64_t b, uint32_t block_tokens, uint32_t page_rows) {
  if (b < 0) return false;
  if (block_tokens == 0 || page_rows == 0) return true;
  const uint64_t t = block_tokens, p = page_rows, ub = static_cast<uint64_t>(b);
  return (ub + 1) * t / p > ub * t / p;  // memd::KvBlockLedger::BlockPages(b, T, p) > 0
}

int64_t LastAnnouncedBlock(int64_t blocks, uint32_t block_tokens, uint32_t page_rows) {
  for (int64_t b = blocks - 1; b >= 0; --b) {
    if (BlockAnnounced(b, block_tokens, page_rows)) return b;
  }
  return -1;
}

int64_t Router::HeldPrefix(int node, const std::vector<uint64_t>& chain, uint32_t block_tokens,
                           uint32_t page_rows) const {
  int64_t k = 0;
  for (int64_t b = 0; b < static_cast<int64_t>(chain.size()); ++b) {
    if (!BlockAnnounced(b, block_tokens, page_rows)) continue;  // inside a later block's page: counts with it
    if (!held_[node].contains(chain[b])) break;
    k = b + 1;
  }
  return k;
}

absl::StatusOr<RouteDecision> Router::Route(const RouteQuery& query) {
  if (routed_.contains(query.trace_index)) {
    return absl::InvalidArgumentError(absl::StrCat("router: request ", query.trace_index, " routed twice"));
  }
  RouteDecision d;
  switch (policy_) {
    case RoutePolicy::kRoundRobin:
      d.node = static_cast<int>(next_++ % nodes());
      d.reason = RouteReason::kRoundRobin;
      break;
    case RoutePolicy::kSession:
      if (auto it = session_node_.find(query.session); it != session_node_.end()) {
        d.node = it->second;
        d.reason = RouteReason::kSessionSticky;
      } else {
        d.node = static_cast<int>(next_++ % nodes());
        d.reason = RouteReason::kSessionNew;
      }
      break;
    case RoutePolicy::kPrefix: {
      std::vector<int64_t> held(nodes());
      for (int n = 0; n < nodes(); ++n) held[n] = HeldPrefix(n, query.chain, query.block_tokens, query.page_rows);
      const int64_t best = *std::max_element(held.begin(), held.end());
      std::vector<int> candidates;
      for (int n = 0; n < nodes(); ++n) {
        if (held[n] == best) candidates.push_back(n);
      }
      d.node = LeastLoaded(candidates);
      d.matched_blocks = best;
      d.reason = best > 0 ? RouteReason::kPrefixHit : RouteReason::kPrefixMiss;
      break;
    }
  }
  session_node_[query.session] = d.node;
  routed_[query.trace_index] = d.node;
  ended_[query.trace_index] = false;
  ++load_[d.node];
  return d;
}

absl::Status Router::Finished(int64_t trace_index) {
  auto it = ended_.find(trace_index);
  if (it == ended_.end()) return absl::NotFoundError(absl::StrCat("router: request ", trace_index, " never routed"));
  if (it->second) return absl::NotFoundError(absl::StrCat("router: request ", trace_index, " ended already"));
  it->second = true;
  --load_[routed_.at(trace_index)];
  return absl::OkStatus();
}

void Router::BlockStored(int node, uint64_t block_hash, uint8_t medium) {
  if (node < 0 || node >= nodes() || medium >= 32) return;
  held_[node][block_hash] |= uint32_t{1} << medium;
}

void Router::BlockRemoved(int node, uint64_t block_hash, uint8_t medium) {
  if (node < 0 || node >= nodes() || medium >= 32) return;
  auto it = held_[node].find(block_hash);
  if (it == held_[node].end()) return;
  it->second &= ~(uint32_t{1} << medium);
  if (it->second == 0) held_[node].erase(it);
}

void Router::NodeCleared(int node) {
  if (node >= 0 && node < nodes()) held_[node].clear();
}

std::optional<int> Router::NodeOf(int64_t trace_index) const {
  auto it = routed_.find(trace_index);
  if (it == routed_.end()) return std::nullopt;
  return it->second;
}

}  // namespace dhs::replay
