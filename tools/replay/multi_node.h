// tools/replay/multi_node.h: the NodeClient of a multi-node replay (issue 26; `dhs-replay --nodes N --route P`,
// docs/replay.md "Several nodes"): one ZmqNodeClient per node, a Router (tools/replay/router.h) that picks each
// request's node, and with --route prefix one KvEventSubscriber per node whose block stored / removed events feed the
// router. The driver sees one node; each request goes to the node the router decides and its events come back merged.
//
// Thread-safety: one thread (the ReplayDriver's), as NodeClient requires.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/kv_event_stream.h"
#include "tools/replay/node_client.h"
#include "tools/replay/router.h"
#include "tools/replay/sessions.h"
#include "tools/replay/zmq_node_client.h"

namespace dhs::replay {

struct MultiNodeOptions {
  std::vector<ZmqNodeClientOptions> nodes;       // one per node (its worker and memd endpoints); at least 1
  RoutePolicy policy = RoutePolicy::kRoundRobin;
  // With kPrefix: each node's KV event stream, IpcEndpoint(run_dir, kKvEventsSocket), in node order (its memd runs
  // with --prefix-sharing on --kv-events on). Empty otherwise.
  std::vector<std::string> kv_event_endpoints;
  // SessionTurn of each trace index (DeriveSessions of the replayed trace; position = TraceRequest::index). A trace
  // index beyond it is its own session.
  std::vector<SessionTurn> sessions;
  double kv_settle_ms = 500;  // see MultiNodeClient::Submit
  // Rows per host page of the nodes' memds (workerd's page_rows): which blocks memd announces (BlockAnnounced,
  // tools/replay/router.h). 0: every block (one page per block).
  uint32_t page_rows = 0;
};

// One routing decision, in submit order (the report's "routing").
struct RoutedRequest {
  int64_t trace_index = 0;
  int64_t session = 0;
  int64_t turn = 0;
  RouteDecision decision;
};

// The chain hashes c_0, c_1, ... memd names the complete prefix blocks of `prompt` by (memd/prefix_pages.h:
// c_{-1} = TenantHash(tenant), c_b = XXH3_64(le64(id_b), seed c_{b-1})), with the block ids the worker sends
// (workerd/prefix_chain.h PrefixChainOf over the prompt's tokens: the trace's hash ids with `prepared_prefix`, else
// ids derived from the tokens). Empty when block_tokens < 1. Pure function.
std::vector<uint64_t> RouteChainOf(const PromptRef& prompt, const std::string& tenant, bool prepared_prefix);

class MultiNodeClient final : public NodeClient {
 public:
  // Connects every node's client (ZmqNodeClient::Connect) and, with kPrefix, its KV event subscriber.
  // Errors: InvalidArgument (no node; kPrefix without one endpoint per node), those of the connects (naming the node).
  static absl::StatusOr<std::unique_ptr<MultiNodeClient>> Connect(MultiNodeOptions options);

  // Drains the KV events that arrived, routes the request and submits it to its node. With kPrefix, a next turn whose
  // previous turn (MultiNodeOptions::sessions) has ended on node n first waits, up to kv_settle_ms, until n's events
  // announce the last block of that turn's chain that memd announces (LastAnnouncedBlock with
  // MultiNodeOptions::page_rows; no wait when none is): memd publishes a block when its host copy is confirmed, which can
  // reach this client after the turn's last token (two sockets), and the route must not depend on that race. A wait
  // that runs out counts in kv_settle_timeouts() (the turn is routed on what is known).
  absl::Status Submit(const SubmitRequest& request) override;
  absl::Status Cancel(RequestId request, std::string_view reason) override;
  // Drains the KV events, then polls every node (at once; when none had an event, each for timeout_ms / N). A
  // request's end (finished or error) is told to the router. Errors: a node client's, naming the node.
  absl::StatusOr<std::vector<TokenEvent>> Poll(double timeout_ms) override;
  // Every node's Stats() (node_stats()), summed: worker counters added (AddWorkerCounters), sessions_admitted_max,
  // host_pages_shared and the host page peaks added (the peaks are each node's own, so their sum is an upper bound),
  // host bytes per session averaged over nodes, gpus of all nodes in node order.
  absl::StatusOr<NodeStats> Stats() override;
  // Every node's RestartPeaks (issue 27). Errors: a node's, naming it.
  absl::Status RestartPeaks() override;

  const std::vector<RoutedRequest>& decisions() const { return decisions_; }
  ZmqNodeClient& node_client(int node) { return *clients_[node]; }  // 0 .. nodes - 1 (its re-attaches, resubmits)
  const std::vector<NodeStats>& node_stats() const { return node_stats_; }
  const Router& router() const { return router_; }
  // The node a request went to; -1 when not routed.
  int NodeOfRequest(RequestId request) const;
  int64_t kv_events_seen() const { return kv_events_seen_; }
  int64_t kv_events_lost() const;  // sequence gaps over all streams
  int64_t kv_streams_started() const { return kv_streams_started_; }  // new streams seen (memd starts)
  int64_t kv_settle_timeouts() const { return kv_settle_timeouts_; }

 private:
  MultiNodeClient(MultiNodeOptions options, Router router);
  absl::Status DrainKvEvents();
  void ApplyBatch(int node, const KvEventBatch& batch);  // its events to the router
  int64_t TraceIndexOf(RequestId request) const;

  MultiNodeOptions options_;
  Router router_;
  std::vector<std::unique_ptr<ZmqNodeClient>> clients_;
  std::vector<std::unique_ptr<KvEventSubscriber>> subscribers_;
  std::vector<KvSequenceCheck> sequence_;
  // Waits (kPrefix) until `node` holds `block` or kv_settle_ms ran out.
  absl::Status SettleKvEvents(int node, uint64_t block);

  absl::flat_hash_map<RequestId, std::pair<int, int64_t>> routed_;  // request -> (node, trace index)
  absl::flat_hash_map<int64_t, uint64_t> settle_block_;  // trace index -> its chain's last announced block (kPrefix)
  absl::flat_hash_map<int64_t, bool> ended_;                        // trace index -> ended
  std::vector<RoutedRequest> decisions_;
  std::vector<NodeStats> node_stats_;
  int64_t kv_events_seen_ = 0;
  int64_t kv_streams_started_ = 0;
  int64_t kv_settle_timeouts_ = 0;
};

}  // namespace dhs::replay
