// tools/replay/router.h: the multi-node replay's router (issue 26; docs/replay.md "Several nodes"): which of N nodes
// serves each request. A pure core: events in (a block stored in / removed from a node's medium, a node's blocks
// cleared, a request ended), decisions out; no sockets, no clock. MultiNodeClient (tools/replay/multi_node.h) feeds it
// the nodes' KV event streams (common/kv_event_stream.h) and the requests' ends, and submits where it decides.
//
// Policies (--route):
//   round-robin  request k (in submit order) goes to node k mod N.
//   session      a request whose session (tools/replay/sessions.h) was routed before goes to the node of that
//                session's latest routed turn (sticky); a new session goes to the next node of a round-robin over
//                new sessions only.
//   prefix       the node holding the longest prefix of the request's block chain (blocks c_0..c_{k-1} all
//                importable there: every one of them memd announces held in any medium, see HeldPrefix) wins; ties among those nodes and a miss (no node holds c_0) go to the least loaded
//                (fewest requests routed and not ended), ties of load to the first such node at or after a rotating
//                cursor (so that equal loads spread instead of all going to node 0).
//
// Thread-safety: none; one thread (the driver's).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dhs::replay {

enum class RoutePolicy { kRoundRobin, kSession, kPrefix };
inline constexpr std::string_view kRoutePolicyNames[] = {"round-robin", "session", "prefix"};  // enum order
std::string_view RoutePolicyName(RoutePolicy policy);
// "round-robin" / "session" / "prefix"; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<RoutePolicy> ParseRoutePolicy(std::string_view name);

// Why a request went where it went (JSON: RouteReasonName).
enum class RouteReason { kRoundRobin, kSessionSticky, kSessionNew, kPrefixHit, kPrefixMiss };
// "round_robin", "session_sticky", "session_new", "prefix_hit", "prefix_miss".
std::string_view RouteReasonName(RouteReason reason);

// Whether memd announces block b (0-based) of a chain of `block_tokens`-token blocks stored in pages of `page_rows`
// rows on its KV event stream: only a block with a page of its own (one whose last row lies in it,
// memd::KvBlockLedger::BlockPages(b, T, p) = floor((b+1)T/p) - floor(bT/p) > 0) is; with T < p a block inside a page
// never is (its rows are importable once the block holding that page's last row is announced). T or p 0: every block
// is announced (one page per block). False for b < 0.
bool BlockAnnounced(int64_t b, uint32_t block_tokens, uint32_t page_rows);
// The last block of a chain of `blocks` blocks that memd announces (BlockAnnounced); -1 when none is.
int64_t LastAnnouncedBlock(int64_t blocks, uint32_t block_tokens, uint32_t page_rows);

struct RouteQuery {
  int64_t trace_index = 0;      // the request (unique per run)
  int64_t session = 0;          // SessionTurn::session
  std::vector<uint64_t> chain;  // block chain hashes c_0, c_1, ... of the request's complete prefix blocks, as its
                                // node's memd names them in KV events (KvEvent::block_hash); empty: none
  uint32_t block_tokens = 0;    // tokens per block of `chain` and rows per host page of the nodes' memds (which
  uint32_t page_rows = 0;       // blocks are announced: BlockAnnounced); 0: every block is announced
};

struct RouteDecision {
  int node = 0;                // 0 .. nodes - 1
  RouteReason reason = RouteReason::kRoundRobin;
  int64_t matched_blocks = 0;  // prefix policy: leading blocks of the chain the chosen node held; else 0
};

class Router {
 public:
  // InvalidArgument when nodes < 1.
  static absl::StatusOr<Router> Create(int nodes, RoutePolicy policy);

  // Decides the node of `query` and counts it in flight there. InvalidArgument when its trace_index was routed
  // before (nothing changes).
  absl::StatusOr<RouteDecision> Route(const RouteQuery& query);
  // The request ended (finished, failed, cancelled): its node's load drops. NotFound when it was never routed or
  // has ended already (nothing changes).
  absl::Status Finished(int64_t trace_index);

  // KV events of node `node` (0 .. nodes - 1; others are ignored): a block (chain hash) stored in / removed from a
  // medium (KvMedium's value); a block is held while stored in at least one medium. Cleared: every block of the
  // node forgotten (an AllBlocksCleared event, or a new stream: that node's memd restarted).
  void BlockStored(int node, uint64_t block_hash, uint8_t medium);
  void BlockRemoved(int node, uint64_t block_hash, uint8_t medium);
  void NodeCleared(int node);

  int nodes() const { return static_cast<int>(held_.size()); }
  RoutePolicy policy() const { return policy_; }
  int64_t load(int node) const { return load_[node]; }  // requests routed to `node` and not ended
  // Leading blocks of `chain` importable on node `node`: k = b + 1 for the last announced block b (BlockAnnounced with
  // `block_tokens`, `page_rows`) such that node `node` holds every announced block c_0..c_b; blocks not announced
  // count only when a later announced block is held (their rows lie in its pages). 0 when none. With T or p 0 every
  // block is announced: the leading blocks held (0 when c_0 is not held).
  int64_t HeldPrefix(int node, const std::vector<uint64_t>& chain, uint32_t block_tokens = 0,
                     uint32_t page_rows = 0) const;
  // Blocks node `node` holds (any medium).
  int64_t held_blocks(int node) const { return static_cast<int64_t>(held_[node].size()); }
  // Where `trace_index` was routed; nullopt if never.
  std::optional<int> NodeOf(int64_t trace_index) const;

 private:
  Router(int nodes, RoutePolicy policy);
  int LeastLoaded(const std::vector<int>& candidates);  // ties: the first at or after tie_cursor_

  RoutePolicy policy_;
  std::vector<int64_t> load_;
  std::vector<absl::flat_hash_map<uint64_t, uint32_t>> held_;  // per node: block hash -> mask of media holding it
  absl::flat_hash_map<int64_t, int> routed_;                   // trace index -> node
  absl::flat_hash_map<int64_t, bool> ended_;                   // trace index -> ended
  absl::flat_hash_map<int64_t, int> session_node_;             // session -> node of its latest routed turn
  int64_t next_ = 0;       // round-robin cursor (all requests; new sessions under `session`)
  int tie_cursor_ = 0;     // prefix: where ties of load start
};

}  // namespace dhs::replay
