// tools/replay/sessions.cc: see sessions.h.
#include "tools/replay/sessions.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace dhs::replay {
namespace {

// Rolling hash of a chain prefix: h_0 = seed, h_{k+1} = mix(h_k, id_k).
constexpr uint64_t kRootHash = 0x5e5510735e551073ull;
uint64_t Mix(uint64_t h, int64_t id) {
  uint64_t x = h ^ (static_cast<uint64_t>(id) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

std::vector<uint64_t> PrefixHashes(const std::vector<int64_t>& h, size_t n) {
  std::vector<uint64_t> out(n + 1);
  out[0] = kRootHash;
  for (size_t k = 0; k < n; ++k) out[k + 1] = Mix(out[k], h[k]);
  return out;
}

size_t CompleteBlocks(const TraceRequest& r, int64_t block_tokens) {
  const int64_t full = block_tokens > 0 ? r.input_tokens / block_tokens : 0;
  return static_cast<size_t>(std::clamp<int64_t>(full, 0, static_cast<int64_t>(r.hash_ids.size())));
}

}  // namespace

std::vector<SessionTurn> DeriveSessions(const Trace& trace) {
  const auto& reqs = trace.requests;
  // Pass 1: the ids that follow each prefix in the complete chains (a prefix followed by two ids is shared).
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<int64_t>> follow;
  for (const TraceRequest& r : reqs) {
    const size_t n = CompleteBlocks(r, trace.block_tokens);
    const std::vector<uint64_t> ph = PrefixHashes(r.hash_ids, n);
    for (size_t m = 0; m < n; ++m) {
      auto& ids = follow[ph[m]];
      if (ids.size() < 2) ids.insert(r.hash_ids[m]);
    }
  }
  auto shared = [&](uint64_t prefix_hash) {
    auto it = follow.find(prefix_hash);
    return it != follow.end() && it->second.size() >= 2;
  };
  // Pass 2: complete chain hash -> positions of the requests with that complete chain (latest last).
  std::vector<SessionTurn> out(reqs.size());
  absl::flat_hash_map<uint64_t, std::vector<size_t>> by_chain;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::vector<int64_t>& h = reqs[i].hash_ids;
    const std::vector<uint64_t> ph = PrefixHashes(h, h.size());
    std::optional<size_t> parent;
    for (size_t len = h.size(); len-- > 1 && !parent;) {  // proper prefixes of H_i, longest first (|C_j| = len >= 1)
      auto it = by_chain.find(ph[len]);
      if (it == by_chain.end() || shared(ph[len])) continue;
      for (auto j = it->second.rbegin(); j != it->second.rend(); ++j) {  // the latest with exactly this chain
        const std::vector<int64_t>& hj = reqs[*j].hash_ids;
        if (CompleteBlocks(reqs[*j], trace.block_tokens) == len && std::equal(hj.begin(), hj.begin() + len, h.begin())) {
          parent = *j;
          break;
        }
      }
    }
    out[i] = parent ? SessionTurn{out[*parent].session, out[*parent].turn + 1, reqs[*parent].index}
                    : SessionTurn{reqs[i].index, 0, -1};
    const size_t n = CompleteBlocks(reqs[i], trace.block_tokens);
    if (n > 0) by_chain[ph[n]].push_back(i);
  }
  return out;
}

int64_t CountSessions(const std::vector<SessionTurn>& turns) {
  absl::flat_hash_set<int64_t> ids;
  for (const SessionTurn& t : turns) ids.insert(t.session);
  return static_cast<int64_t>(ids.size());
}

}  // namespace dhs::replay
