// tools/replay/multi_node.cc: see multi_node.h.
#include "tools/replay/multi_node.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/prompt_tokens.h"
#include "memd/prefix_pages.h"
#include "workerd/prefix_chain.h"
#include "xxhash.h"

namespace dhs::replay {

std::vector<uint64_t> RouteChainOf(const PromptRef& prompt, const std::string& tenant, bool prepared_prefix) {
  if (prompt.block_tokens < 1 || prompt.input_tokens < 1) return {};
  const uint64_t n = static_cast<uint64_t>(prompt.input_tokens), block = static_cast<uint64_t>(prompt.block_tokens);
  const std::vector<uint64_t> ids = HashIdsOf(prompt);
  const std::vector<uint8_t> bytes = SyntheticPromptTokens(ids, block, n, static_cast<uint64_t>(prompt.trace_index), 0, n);
  const std::vector<model::Token> tokens(bytes.begin(), bytes.end());
  const std::vector<uint64_t> named = prepared_prefix ? ids : std::vector<uint64_t>{};
  const RequestPrefixChain chain = PrefixChainOf(tokens, named, static_cast<uint32_t>(block), tenant);
  std::vector<uint64_t> out;
  out.reserve(chain.block_ids.size());
  uint64_t c = memd::PrefixPages::TenantHash(tenant);
  for (uint64_t id : chain.block_ids) {  // little-endian words, as memd's HashWords
    c = XXH3_64bits_withSeed(&id, sizeof id, c);
    out.push_back(c);
  }
  return out;
}

MultiNodeClient::MultiNodeClient(MultiNodeOptions options, Router router)
    : options_(std::move(options)), router_(std::move(router)) {}

absl::StatusOr<std::unique_ptr<MultiNodeClient>> MultiNodeClient::Connect(MultiNodeOptions options) {
  const int n = static_cast<int>(options.nodes.size());
  if (n < 1) return absl::InvalidArgumentError("multi-node client: no node");
  if (options.policy == RoutePolicy::kPrefix && static_cast<int>(options.kv_event_endpoints.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("multi-node client: --route prefix needs one KV event stream per "
                                                   "node (", options.kv_event_endpoints.size(), " for ", n, ")"));
  }
  absl::StatusOr<Router> router = Router::Create(n, options.policy);
  if (!router.ok()) return router.status();
  auto self = std::unique_ptr<MultiNodeClient>(new MultiNodeClient(std::move(options), std::move(*router)));
  // Subscribers first: events of the first requests are published while the others connect.
  for (int i = 0; i < static_cast<int>(self->options_.kv_event_endpoints.size()); ++i) {
    auto sub = KvEventSubscriber::Connect(self->options_.kv_event_endpoints[i], {});
    if (!sub.ok()) return absl::Status(sub.status().code(), absl::StrCat("node ", i, ": ", sub.status().message()));
    self->subscribers_.push_back(std::move(*sub));
    self->sequence_.emplace_back();
  }
  for (int i = 0; i < n; ++i) {
    auto client = ZmqNodeClient::Connect(self->options_.nodes[i]);
    if (!client.ok()) {
      return absl::Status(client.status().code(), absl::StrCat("node ", i, ": ", client.status().message()));
    }
    self->clients_.push_back(std::move(*client));
  }
  return self;
}

absl::Status MultiNodeClient::DrainKvEvents() {
  for (size_t i = 0; i < subscribers_.size(); ++i) {
    const int node = static_cast<int>(i);
    for (;;) {
      auto batch = subscribers_[i]->Next(std::chrono::milliseconds(0));
      if (!batch.ok()) {
        if (batch.status().code() == absl::StatusCode::kInternal) {
          return absl::Status(batch.status().code(), absl::StrCat("node ", node, " KV events: ", batch.status().message()));
        }
        continue;  // a batch that does not decode: skipped (the sequence check counts what it held as lost)
      }
      if (!*batch) break;
      const KvSequenceStep step = sequence_[i].Next(**batch);
      if (step.new_stream) {  // memd (re)started, or we joined: what we knew of this node is void
        router_.NodeCleared(node);
        ++kv_streams_started_;
      }
      ApplyBatch(node, **batch);
    }
  }
  return absl::OkStatus();
}

void MultiNodeClient::ApplyBatch(int node, const KvEventBatch& batch) {
  for (const KvEvent& e : batch.events) {
    ++kv_events_seen_;
    switch (e.kind) {
      case KvEventKind::kBlockStored:
        router_.BlockStored(node, e.block_hash, static_cast<uint8_t>(e.medium));
        break;
      case KvEventKind::kBlockRemoved:
        router_.BlockRemoved(node, e.block_hash, static_cast<uint8_t>(e.medium));
        break;
      case KvEventKind::kAllBlocksCleared:
        router_.NodeCleared(node);
        break;
    }
  }
}

int64_t MultiNodeClient::kv_events_lost() const {
  int64_t lost = 0;
  for (const KvSequenceCheck& s : sequence_) lost += static_cast<int64_t>(s.lost());
  return lost;
}

int MultiNodeClient::NodeOfRequest(RequestId request) const {
  auto it = routed_.find(request);
  return it == routed_.end() ? -1 : it->second.first;
}

absl::Status MultiNodeClient::Submit(const SubmitRequest& request) {
  if (absl::Status s = DrainKvEvents(); !s.ok()) return s;
  const int64_t index = request.prompt.trace_index;
  SessionTurn turn{index, 0, -1};
  if (index >= 0 && index < static_cast<int64_t>(options_.sessions.size())) turn = options_.sessions[index];
  RouteQuery query;
  query.trace_index = index;
  query.session = turn.session;
  if (options_.policy == RoutePolicy::kPrefix) {
    const ZmqNodeClientOptions& o = options_.nodes.front();
    query.chain = RouteChainOf(request.prompt, RequestTenant(o, index), o.prepared_prefix);
    query.block_tokens = static_cast<uint32_t>(std::max<int64_t>(0, request.prompt.block_tokens));
    query.page_rows = options_.page_rows;
    // The block the wait below asks for: the last one memd announces (not c_0: with blocks smaller than a page c_0
    // has no page of its own and is never announced; a shared first block is announced long before, maybe elsewhere).
    const int64_t last = LastAnnouncedBlock(static_cast<int64_t>(query.chain.size()), query.block_tokens, query.page_rows);
    if (last >= 0) settle_block_[index] = query.chain[last];
    const std::optional<int> parent_node = turn.parent >= 0 ? router_.NodeOf(turn.parent) : std::nullopt;
    auto parent_block = settle_block_.find(turn.parent);
    if (parent_node && parent_block != settle_block_.end() && ended_[turn.parent]) {
      if (absl::Status s = SettleKvEvents(*parent_node, parent_block->second); !s.ok()) return s;
    }
  }
  absl::StatusOr<RouteDecision> d = router_.Route(query);
  if (!d.ok()) return d.status();
  routed_[request.request] = {d->node, index};
  decisions_.push_back(RoutedRequest{index, turn.session, turn.turn, *d});
  absl::Status s = clients_[d->node]->Submit(request);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("node ", d->node, ": ", s.message()));
  return absl::OkStatus();
}

absl::Status MultiNodeClient::SettleKvEvents(int node, uint64_t block) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(options_.kv_settle_ms);
  while (router_.HeldPrefix(node, {block}) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ++kv_settle_timeouts_;
      return absl::OkStatus();
    }
    auto batch = subscribers_[node]->Next(std::chrono::milliseconds(5));  // wait on that node's stream, then drain
    if (!batch.ok() && batch.status().code() == absl::StatusCode::kInternal) return batch.status();
    if (batch.ok() && *batch) {
      const KvSequenceStep step = sequence_[node].Next(**batch);
      if (step.new_stream) {
        router_.NodeCleared(node);
        ++kv_streams_started_;
      }
      ApplyBatch(node, **batch);
    }
    if (absl::Status s = DrainKvEvents(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status MultiNodeClient::Cancel(RequestId request, std::string_view reason) {
  const int node = NodeOfRequest(request);
  if (node < 0) return absl::OkStatus();  // never submitted: nothing to cancel
  absl::Status s = clients_[node]->Cancel(request, reason);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("node ", node, ": ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenEvent>> MultiNodeClient::Poll(double timeout_ms) {
  if (absl::Status s = DrainKvEvents(); !s.ok()) return s;
  std::vector<TokenEvent> out;
  auto poll_all = [&](double each_ms) -> absl::Status {
    for (size_t i = 0; i < clients_.size(); ++i) {
      auto events = clients_[i]->Poll(each_ms);
      if (!events.ok()) {
        return absl::Status(events.status().code(), absl::StrCat("node ", i, ": ", events.status().message()));
      }
      for (TokenEvent& e : *events) out.push_back(std::move(e));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = poll_all(0); !s.ok()) return s;
  if (out.empty() && timeout_ms > 0) {
    if (absl::Status s = poll_all(timeout_ms / static_cast<double>(clients_.size())); !s.ok()) return s;
  }
  for (const TokenEvent& e : out) {
    if (!e.finished && e.error.empty()) continue;
    auto it = routed_.find(e.request);
    if (it != routed_.end()) {
      (void)router_.Finished(it->second.second);  // a second end is the driver's to report
      ended_[it->second.second] = true;
    }
  }
  return out;
}

absl::Status MultiNodeClient::RestartPeaks() {
  for (size_t i = 0; i < clients_.size(); ++i) {
    if (absl::Status s = clients_[i]->RestartPeaks(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("node ", i, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<NodeStats> MultiNodeClient::Stats() {
  node_stats_.clear();
  NodeStats total;
  double bytes_mean = 0, bytes_peak = 0;
  for (size_t i = 0; i < clients_.size(); ++i) {
    auto s = clients_[i]->Stats();
    if (!s.ok()) return absl::Status(s.status().code(), absl::StrCat("node ", i, ": ", s.status().message()));
    node_stats_.push_back(*s);
    AddWorkerCounters(total, *s);
    total.sessions_admitted_max += s->sessions_admitted_max;
    total.host_pages_shared += s->host_pages_shared;
    if (s->cluster) {  // issue 26
      if (!total.cluster) total.cluster.emplace();
      *total.cluster += *s->cluster;
    }
    total.host_pages_held_peak += s->host_pages_held_peak;
    total.host_pages_allocated_peak += s->host_pages_allocated_peak;
    bytes_mean += s->host_bytes_per_session_mean;
    bytes_peak = std::max(bytes_peak, s->host_bytes_per_session_peak);
    total.gpus.insert(total.gpus.end(), s->gpus.begin(), s->gpus.end());
    if (total.speculate.empty()) total.speculate = s->speculate;
    total.staging_bytes += s->staging_bytes;
    total.draft_ring_bytes += s->draft_ring_bytes;
  }
  total.host_bytes_per_session_mean = bytes_mean / static_cast<double>(clients_.size());
  total.host_bytes_per_session_peak = bytes_peak;
  return total;
}

}  // namespace dhs::replay
