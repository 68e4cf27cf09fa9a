#include "tools/replay/zmq_node_client.h"

#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/prompt_tokens.h"
#include "common/protocol.h"
#include "nlohmann/json.hpp"

namespace dhs::replay {
namespace {
constexpr std::string_view kSender = "dhs-replay";
constexpr std::chrono::milliseconds kReattachAttempt{200};
// A memd sample's wait while faults may restart memd (a missed sample is skipped).
constexpr std::chrono::milliseconds kMemdSampleTimeout{300};  // one stats query of Reattach's polling
// RestartPeaks' wait for the previous phase's Completes to reach memd (they follow the requests' ends by a message).
constexpr std::chrono::milliseconds kRestartSettle{2000};
}  // namespace

absl::StatusOr<std::unique_ptr<ZmqNodeClient>> ZmqNodeClient::Connect(ZmqNodeClientOptions options) {
  std::unique_ptr<ZmqNodeClient> client(new ZmqNodeClient(std::move(options)));
  while (client->options_.client_identity == 0) {  // 64 random bits: two clients' identities differ
    std::random_device random;
    client->options_.client_identity = (static_cast<uint64_t>(random()) << 32) ^ random();
  }
  DealerClient::Options worker_options;
  worker_options.heartbeat_interval = client->options_.worker_heartbeat;
  worker_options.curve_server_key = client->options_.curve_server_key;
  auto worker = DealerClient::Connect(client->options_.worker_endpoint, worker_options);
  if (!worker.ok()) return worker.status();
  client->worker_ = std::move(*worker);
  if (!client->options_.memd_endpoint.empty()) {
    auto memd = DealerClient::Connect(client->options_.memd_endpoint);
    if (!memd.ok()) return memd.status();
    client->memd_ = std::move(*memd);
  }
  auto baseline = client->QueryWorker();
  if (!baseline.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "no answer from the worker at ", client->options_.worker_endpoint, " (", baseline.status().message(),
        "): is a workerd serving there? --connect takes a worker's socket (ipc://RUN_DIR/worker-N.sock or "
        "tcp://HOST:PORT); if the worker died, see its log"));
  }
  client->baseline_ = baseline->counters;
  return client;
}

absl::Status ZmqNodeClient::Submit(const SubmitRequest& request) {
  if (!lost_.ok()) return lost_;
  wire::SubmitRequestT body;
  body.request = request.request;
  body.client = options_.client_identity;
  if (options_.prepared_prefix && !request.prompt.hash_ids.empty() && request.prompt.tokens.empty()) {
    // The prefix blocks are imported by the worker; the tokens after them (if the ids do not cover the input) are
    // sent as prompt bytes, the same tokens SynthesizePrompt gives (common/prompt_tokens.h).
    const PromptRef& p = request.prompt;
    const uint64_t n = static_cast<uint64_t>(p.input_tokens), block = static_cast<uint64_t>(p.block_tokens);
    body.hash_ids = HashIdsOf(p);
    body.input_tokens = static_cast<uint32_t>(n);
    body.prefix_block_tokens = static_cast<uint32_t>(block);
    body.prompt = SyntheticPromptTokens(body.hash_ids, block, n, static_cast<uint64_t>(p.trace_index),
                                        PrefixCoveredTokens(body.hash_ids.size(), block, n), n);
  } else {
    const std::string prompt = SynthesizePrompt(request.prompt);
    body.prompt.assign(prompt.begin(), prompt.end());
    // Issue 24: the worker names the chain of its complete blocks (ids derived from the tokens) in this block size.
    if (request.prompt.block_tokens > 0) body.prefix_block_tokens = static_cast<uint32_t>(request.prompt.block_tokens);
  }
  body.tenant = RequestTenant(options_, request.prompt.trace_index);
  body.session = RequestSession(options_, request.prompt.trace_index);  // issue 26
  body.max_new_tokens = static_cast<uint32_t>(request.max_new_tokens);
  body.temperature = request.sampling.greedy ? 0.0f : static_cast<float>(request.sampling.temperature);
  body.top_p = 1.0f;
  body.seed = request.sampling.seed;
  const uint64_t seq = next_sequence_++;
  request_of_sequence_[seq] = request.request;
  received_[request.request] = 0;
  submitted_[request.request] = request;
  return worker_->Send(EncodeSubmitRequest(body, seq, kSender));
}

absl::Status ZmqNodeClient::Cancel(RequestId request, std::string_view reason) {
  if (!lost_.ok()) return lost_;
  wire::CancelT cancel;
  cancel.request = request;
  cancel.client = options_.client_identity;
  cancel.reason = std::string(reason);
  const uint64_t seq = next_sequence_++;
  cancel_of_sequence_[seq] = request;
  return worker_->Send(EncodeCancel(cancel, seq, kSender));
}

EndReason ErrorEndReason(wire::EndReason code) {
  switch (code) {
    case wire::EndReason::CANCELLED: return EndReason::kCancelled;
    case wire::EndReason::WORKER_STOPPING: return EndReason::kWorkerStopping;
    case wire::EndReason::WORKER_EPOCH_ENDED: return EndReason::kWorkerGone;
    default: return EndReason::kFailed;
  }
}

// The messages a worker never sends its client (docs/protocol.md): each is an INTERNAL "unexpected message from the
// worker". Handle's FromWorker takes the rest of the union; ReceiveMessage checks at compile time that both cover it.
// (A WorkerStatsReply is read by QueryWorker, which waits for it itself, never by Handle.)
using NotFromTheWorker =
    MessageSet<wire::Body::Hello, wire::Body::HelloReply, wire::Body::AdmitRequest, wire::Body::AdmitGrant,
               wire::Body::AdmitWait, wire::Body::AdmitReject, wire::Body::ReclaimOrder, wire::Body::BackupComplete,
               wire::Body::ReadersDone, wire::Body::Retire, wire::Body::PopulateOrder, wire::Body::ReadyPublish,
               wire::Body::Complete, wire::Body::CompleteAck, wire::Body::Heartbeat, wire::Body::HeartbeatAck,
               wire::Body::IntrospectQuery, wire::Body::IntrospectReply, wire::Body::SubmitRequest,
               wire::Body::WorkerStatsQuery, wire::Body::WorkerStatsReply, wire::Body::HostCopyWritten,
               wire::Body::TokensCommitted, wire::Body::Attach, wire::Body::TokensCommittedAck, wire::Body::Cancel>;

absl::Status ZmqNodeClient::Handle(std::string_view bytes, std::vector<TokenEvent>& out) {
  auto message = DecodeEnvelope(bytes);
  if (!message.ok()) return absl::InternalError(absl::StrCat("unreadable reply from the worker: ", message.status().message()));
  // One overload per message a worker sends its client; `status` is what Handle returns.
  struct FromWorker {
    ZmqNodeClient& client;
    std::vector<TokenEvent>& out;
    absl::Status status;
    void operator()(const wire::SubmitAcceptedT&) {}
    void operator()(const wire::TokenChunkT& chunk) { status = client.HandleTokenChunk(chunk, out); }
    void operator()(const wire::ErrorReplyT& reply) { status = client.HandleErrorReply(reply, out); }
  } from_worker{*this, out, absl::OkStatus()};
  const absl::Status read = ReceiveMessage<NotFromTheWorker>(*message, from_worker, [&](wire::Body type) {
    from_worker.status = absl::InternalError(absl::StrCat("unexpected message from the worker: ", BodyName(type)));
  });
  return read.ok() ? from_worker.status : read;
}

void ZmqNodeClient::Forget(RequestId request) {
  received_.erase(request);
  submitted_.erase(request);
  last_stamp_us_.erase(request);
}

absl::Status ZmqNodeClient::HandleTokenChunk(const wire::TokenChunkT& chunk, std::vector<TokenEvent>& out) {
  TokenEvent event;
  event.request = chunk.request;
  event.tokens.assign(chunk.tokens.begin(), chunk.tokens.end());
  event.logits_digests.assign(chunk.logits_digests.begin(), chunk.logits_digests.end());
  event.finished = chunk.finished;
  // The worker ended its epoch (memd lost, or it was fenced) without ending the request: memd keeps it for the
  // GPU's next worker. With re-attaching on, it stays outstanding and is re-attached once the worker is back.
  // Told by the chunk's code (TokenChunk.end_reason), never by its message text.
  if (chunk.end_reason == wire::EndReason::WORKER_EPOCH_ENDED && options_.reattach_timeout.count() > 0 &&
      received_.contains(chunk.request)) {
    if (auto r = received_.find(chunk.request); !chunk.tokens.empty()) {
      r->second += static_cast<uint32_t>(chunk.tokens.size());
      event.finished = false;
      out.push_back(std::move(event));
    }
    return absl::OkStatus();
  }
  // The worker's stamps (issue 22): the gap since this request's previous tokens as the worker produced them.
  if (!chunk.tokens.empty() && chunk.since_submit_us > 0) {
    auto [stamp, first] = last_stamp_us_.try_emplace(chunk.request, chunk.since_submit_us);
    if (!first) {
      event.token_interval_ms =
          static_cast<double>(chunk.since_submit_us - std::min(stamp->second, chunk.since_submit_us)) / 1000.0;
      stamp->second = chunk.since_submit_us;
    }
  }
  if (awaiting_recovery_ && !chunk.tokens.empty()) {
    awaiting_recovery_ = false;
    recovered_at_.push_back(std::chrono::steady_clock::now());
  }
  if (chunk.finished) {
    Forget(chunk.request);
    event.end_reason = EndReason::kFinished;
  } else if (auto r = received_.find(chunk.request); r != received_.end()) {
    r->second += static_cast<uint32_t>(chunk.tokens.size());
  }
  event.allocation_wait_ms = static_cast<double>(chunk.allocation_wait_us) / 1000.0;
  if (chunk.error != wire::ErrorCode::OK) {
    event.error = chunk.error_message.empty() ? "request failed" : chunk.error_message;
    event.finished = true;
    // Told by the chunk's code, never by its text.
    event.end_reason = ErrorEndReason(chunk.end_reason);
    if (event.end_reason == EndReason::kWorkerStopping) ++worker_stopping_ends_;
    Forget(chunk.request);
  }
  out.push_back(std::move(event));
  return absl::OkStatus();
}

absl::Status ZmqNodeClient::HandleErrorReply(const wire::ErrorReplyT& reply, std::vector<TokenEvent>& out) {
  // A Cancel the worker answered (NOT_FOUND: the request ended first; its end came or is on its way).
  if (cancel_of_sequence_.erase(reply.answering_sequence) > 0) return absl::OkStatus();
  auto it = request_of_sequence_.find(reply.answering_sequence);
  if (it == request_of_sequence_.end()) {
    return absl::InternalError(absl::StrCat("worker error not tied to a request: ", reply.message));
  }
  if (attach_of_sequence_.erase(reply.answering_sequence) > 0 && reply.code == wire::ErrorCode::NOT_FOUND &&
      received_.contains(it->second) && received_[it->second] == 0 && submitted_.contains(it->second)) {
    ++resubmits_;  // nothing of it survived the dead worker and the client has no token: submitted again
    return Submit(SubmitRequest(submitted_[it->second]));
  }
  TokenEvent event;
  event.request = it->second;
  event.finished = true;
  event.error = absl::StrCat("rejected: ", reply.message);
  event.end_reason = EndReason::kRejected;
  received_.erase(it->second);
  submitted_.erase(it->second);
  out.push_back(std::move(event));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenEvent>> ZmqNodeClient::Poll(double timeout_ms) {
  if (!lost_.ok()) return lost_;
  std::vector<TokenEvent> events;
  const auto now = std::chrono::steady_clock::now();
  if (memd_ && now - last_sample_ >= options_.sample_interval) {
    last_sample_ = now;
    if (absl::Status s = SampleMemd(); !s.ok()) return s;
  }
  auto first = worker_->Receive(std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, timeout_ms))));
  if (!first.ok()) {
    if (!absl::IsDeadlineExceeded(first.status())) return first.status();
    if (const int drops = worker_->disconnects(); drops > 0) {
      if (options_.reattach_timeout.count() > 0) {
        if (absl::Status s = Reattach(); !s.ok()) return s;
        return events;
      }
      // The requests it had not ended end here, each with the account: the report keeps every request's reason.
      const absl::Status lost = WorkerLost(drops);
      std::vector<RequestId> open;
      for (const auto& [request, received] : received_) open.push_back(request);
      std::sort(open.begin(), open.end());
      for (RequestId request : open) {
        TokenEvent event;
        event.request = request;
        event.finished = true;
        event.error = std::string(lost.message());
        event.end_reason = EndReason::kWorkerGone;
        events.push_back(std::move(event));
      }
      received_.clear();
      submitted_.clear();
      return events;
    }
    return events;
  }
  if (absl::Status s = Handle(*first, events); !s.ok()) return s;
  // Drain what is already queued without waiting again.
  while (true) {
    auto more = worker_->Receive(std::chrono::milliseconds(0));
    if (!more.ok()) break;
    if (absl::Status s = Handle(*more, events); !s.ok()) return s;
  }
  // A first token means the request holds its required allocation now, an end that admission state changes:
  // sample memd at those moments too, so runs shorter than sample_interval still see their peaks.
  bool sample = false;
  for (const TokenEvent& e : events) {
    if (!e.tokens.empty() && seen_tokens_.insert(e.request).second) sample = true;
    if (e.finished || !e.error.empty()) {
      seen_tokens_.erase(e.request);
      sample = true;
    }
  }
  if (memd_ && sample) {
    last_sample_ = std::chrono::steady_clock::now();
    if (absl::Status s = SampleMemd(); !s.ok()) return s;
  }
  return events;
}

absl::Status ZmqNodeClient::WorkerLost(int drops) {
  if (worker_stopping_ends_ > 0) {
    lost_ = absl::UnavailableError(absl::StrCat(
        "the worker at ", options_.worker_endpoint, " stopped: it ended ", worker_stopping_ends_,
        worker_stopping_ends_ == 1 ? " request" : " requests",
        " with \"worker stopping\" (SIGTERM, or its node stopping) and closed its connection"));
  } else {
    lost_ = absl::UnavailableError(absl::StrCat(
        "the worker at ", options_.worker_endpoint, " went away (its connection closed ", drops,
        drops == 1 ? " time" : " times", "): it exited, was killed or stopped answering heartbeats; see its log"));
  }
  return lost_;
}

absl::Status ZmqNodeClient::Reattach() {
  const auto deadline = std::chrono::steady_clock::now() + options_.reattach_timeout;
  DealerClient::Options worker_options;
  worker_options.heartbeat_interval = options_.worker_heartbeat;
  worker_options.curve_server_key = options_.curve_server_key;
  last_stamp_us_.clear();  // a new worker stamps from its own submit time
  absl::Status last = absl::DeadlineExceededError("no attempt");
  while (std::chrono::steady_clock::now() < deadline) {
    auto worker = DealerClient::Connect(options_.worker_endpoint, worker_options);
    if (!worker.ok()) return worker.status();
    worker_ = std::move(*worker);
    // Answers once a worker serves the endpoint again; short attempts, so that its arrival is seen soon.
    auto view = QueryWorker(kReattachAttempt);
    if (view.ok()) {
      baseline_ = NodeStats{};  // a new worker's counters start at 0 (the dead worker's are gone with it)
      for (const auto& [request, received] : received_) {
        wire::AttachT attach;
        attach.request = request;
        attach.received = received;
        attach.client = options_.client_identity;
        const uint64_t seq = next_sequence_++;
        request_of_sequence_[seq] = request;
        attach_of_sequence_[seq] = request;
        if (absl::Status s = worker_->Send(EncodeAttach(attach, seq, kSender)); !s.ok()) return s;
      }
      ++reattaches_;
      awaiting_recovery_ = true;
      return absl::OkStatus();
    }
    last = view.status();
  }
  return absl::UnavailableError(absl::StrCat("the worker at ", options_.worker_endpoint, " went away and none came back "
                                             "within ", options_.reattach_timeout.count(), " ms to re-attach ",
                                             received_.size(), " unfinished requests (", last.message(), ")"));
}

absl::StatusOr<nlohmann::json> ZmqNodeClient::Introspect(wire::IntrospectWhat what,
                                                        std::chrono::milliseconds timeout) {
  wire::IntrospectQueryT query;
  query.what = what;
  query.format = wire::IntrospectFormat::Json;
  // Issue 26 review: the memd that answered the latest reply is gone (its connection closed): the next status sample
  // is a new memd's, whose cluster counters start from 0 (ClusterTally).
  if (memd_->PeerClosed()) memd_changed_ = true;
  auto reply_bytes = memd_->Request(EncodeIntrospectQuery(query, next_sequence_++, kSender), timeout);
  if (!reply_bytes.ok()) return absl::UnavailableError(absl::StrCat("memd introspection: ", reply_bytes.status().message()));
  auto message = DecodeEnvelope(*reply_bytes);
  if (!message.ok()) return message.status();
  if (message->type == wire::Body::ErrorReply) return ReadErrorStatus(*message);
  auto reply = ReadIntrospectReply(*message);
  if (!reply.ok()) return reply.status();
  nlohmann::json doc = nlohmann::json::parse(reply->document, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InternalError("memd introspection: reply is not JSON");
  return doc;
}

// One `gpus` view per sample: its size and memd's cost grow with the GPUs only, not with M or the requests (issue 12).
absl::Status ZmqNodeClient::SampleMemd() {
  // With re-attaching on (faults), memd may be restarting: a sample it does not answer soon is skipped, not fatal.
  const bool tolerant = options_.reattach_timeout.count() > 0;
  auto gpus = Introspect(wire::IntrospectWhat::Gpus,
                         tolerant ? std::min(options_.request_timeout, kMemdSampleTimeout) : options_.request_timeout);
  if (!gpus.ok()) return tolerant ? absl::OkStatus() : gpus.status();
  if (!gpus->is_array()) return absl::OkStatus();
  int64_t admitted = 0;  // sessions holding their required allocation now: admitted or reclaiming, one slot each
  for (const auto& g : *gpus) admitted += g.value("slots_used", int64_t{0});
  peaks_.sessions_admitted_max = std::max(peaks_.sessions_admitted_max, admitted);
  for (const auto& g : *gpus) {
    const GpuId gpu = g.value("gpu", 0u);
    auto it = std::find_if(peaks_.gpus.begin(), peaks_.gpus.end(), [&](const GpuMemoryUse& u) { return u.gpu == gpu; });
    if (it == peaks_.gpus.end()) {
      peaks_.gpus.push_back(GpuMemoryUse{.gpu = gpu});
      it = peaks_.gpus.end() - 1;
    }
    it->capacity_pages = g.value("M", int64_t{0});
    it->reserve_pages = g.value("M_res", int64_t{0});
    const int64_t req = g.value("M_req", int64_t{0});
    const int64_t opt = g.value("M_opt", int64_t{0});
    it->peak_required_pages = std::max(it->peak_required_pages, req);
    it->peak_optional_pages = std::max(it->peak_optional_pages, opt);
    int64_t& used = peak_used_pages_[gpu];
    used = std::max(used, req + opt);
  }
  // Issue 24: the host pool per admitted session (status view: host.allocated pages of host.page_bytes, less the
  // cached prefix pages no session holds).
  auto status = Introspect(wire::IntrospectWhat::Status,
                           tolerant ? std::min(options_.request_timeout, kMemdSampleTimeout) : options_.request_timeout);
  if (!status.ok() || !status->is_object()) return absl::OkStatus();  // a figure only: a missed sample is skipped
  const nlohmann::json host = status->value("host", nlohmann::json::object());
  int64_t cached = 0;  // cached prefix pages: no session holds them (reusable room), not counted per session
  if (status->contains("prefix")) {
    const nlohmann::json& p = (*status)["prefix"];
    cached = p.value("cached_pages", int64_t{0});
    host_pages_shared_ = p.value("shared_pages", int64_t{0}) + cached;
  }
  if (status->contains("cluster")) {  // issue 26: memd --cluster-store (its totals since it started)
    // A malformed object is a figure lost, not the run's failure: the sample is skipped.
    if (absl::StatusOr<ClusterCounters> c = ClusterCountersOfJson((*status)["cluster"]); c.ok()) {
      cluster_tally_.Add(ClusterSample{std::move(*c), memd_changed_});
      memd_changed_ = false;
    }
  }
  const int64_t allocated = host.value("allocated", int64_t{0});
  const int64_t held = std::max<int64_t>(0, allocated - cached);
  host_pages_held_peak_ = std::max(host_pages_held_peak_, held);
  host_pages_allocated_peak_ = std::max(host_pages_allocated_peak_, allocated);
  if (admitted > 0) {
    const double per_session = double(held) * double(host.value("page_bytes", int64_t{0})) / double(admitted);
    host_bytes_per_session_sum_ += per_session;
    host_bytes_per_session_peak_ = std::max(host_bytes_per_session_peak_, per_session);
    ++host_samples_;
  }
  return absl::OkStatus();
}

uint64_t RequestSession(const ZmqNodeClientOptions& options, int64_t trace_index) {
  if (trace_index < 0 || static_cast<size_t>(trace_index) >= options.session_of.size()) return 0;
  const int64_t session = options.session_of[static_cast<size_t>(trace_index)];
  return session < 0 ? 0 : static_cast<uint64_t>(session) + 1;
}

absl::Status ZmqNodeClient::RestartPeaks() {
  if (!memd_) return absl::OkStatus();
  constexpr std::chrono::milliseconds kPollEvery{5};
  const bool tolerant = options_.reattach_timeout.count() > 0;
  const auto deadline = std::chrono::steady_clock::now() + kRestartSettle;
  while (true) {
    auto gpus = Introspect(wire::IntrospectWhat::Gpus,
                           tolerant ? std::min(options_.request_timeout, kMemdSampleTimeout) : options_.request_timeout);
    if (!gpus.ok() && !tolerant) return gpus.status();
    int64_t used = 0;
    if (gpus.ok() && gpus->is_array()) {
      for (const auto& g : *gpus) used += g.value("slots_used", int64_t{0});
    }
    if (used == 0 || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPollEvery);
  }
  peaks_.sessions_admitted_max = 0;
  peaks_.gpus.clear();
  peak_used_pages_.clear();
  host_bytes_per_session_sum_ = host_bytes_per_session_peak_ = 0;
  host_samples_ = 0;
  host_pages_held_peak_ = host_pages_allocated_peak_ = 0;
  return absl::OkStatus();
}

std::string RequestTenant(const ZmqNodeClientOptions& options, int64_t trace_index) {
  if (options.tenants <= 1) return options.tenant;
  // A session's turns share its tenant (its session id, the first turn's trace index, mod tenants): a next turn under
  // another tenant could not reuse the previous turn's prefix. A request of no known session: its trace index.
  const uint64_t session = options.tenant_by == TenantKey::kSession ? RequestSession(options, trace_index) : 0;
  const int64_t key = session != 0 ? static_cast<int64_t>(session - 1) : trace_index;
  return absl::StrCat(options.tenant, "#", key % options.tenants);
}

NodeStats WorkerCountersOf(const wire::WorkerStatsReplyT& stats) {
  NodeStats c;
  c.census.direct = static_cast<int64_t>(stats.census_direct);
  c.census.hot = static_cast<int64_t>(stats.census_hot);
  c.census.host = static_cast<int64_t>(stats.census_host);
  c.reclaims = static_cast<int64_t>(stats.reclaims_obeyed);
  c.repopulated_pages = static_cast<int64_t>(stats.pages_populated);
  c.prefix_blocks_imported = static_cast<int64_t>(stats.prefix_blocks_imported);
  c.prefix_blocks_computed = static_cast<int64_t>(stats.prefix_blocks_computed);
  c.host_bytes_recovered = static_cast<int64_t>(stats.bytes_recovered);  // issue 27
  c.prefix_lookups = static_cast<int64_t>(stats.prefix_lookups);  // issue 24
  c.prefix_hits_host = static_cast<int64_t>(stats.prefix_hits_host);
  c.prefix_hits_worker = static_cast<int64_t>(stats.prefix_hits_worker);
  c.prefill_tokens_saved = static_cast<int64_t>(stats.prefill_tokens_saved);
  c.prefix_shared_pages_granted = static_cast<int64_t>(stats.prefix_shared_pages_granted);
  c.speculate = stats.speculate.empty() ? "off" : stats.speculate;
  c.spec_rounds = static_cast<int64_t>(stats.spec_rounds);
  c.spec_round_tokens = static_cast<int64_t>(stats.spec_round_tokens);
  c.spec_proposed = static_cast<int64_t>(stats.spec_proposed);
  c.spec_accepted = static_cast<int64_t>(stats.spec_accepted);
  c.spec_propose_us = static_cast<int64_t>(stats.spec_propose_us);
  c.spec_width_rounds.assign(stats.spec_width_rounds.begin(), stats.spec_width_rounds.end());
  c.staging_bytes = static_cast<int64_t>(stats.staging_bytes);
  c.draft_ring_bytes = static_cast<int64_t>(stats.draft_ring_bytes);
  return c;
}

absl::StatusOr<ZmqNodeClient::WorkerView> ZmqNodeClient::QueryWorker(std::optional<std::chrono::milliseconds> timeout) {
  wire::WorkerStatsQueryT query;
  auto reply_bytes = worker_->Request(EncodeWorkerStatsQuery(query, next_sequence_++, kSender),
                                      timeout.value_or(options_.request_timeout));
  if (!reply_bytes.ok()) return absl::UnavailableError(absl::StrCat("worker stats: ", reply_bytes.status().message()));
  auto message = DecodeEnvelope(*reply_bytes);
  if (!message.ok()) return message.status();
  auto stats = ReadWorkerStatsReply(*message);
  if (!stats.ok()) return stats.status();
  WorkerView view;
  view.counters = WorkerCountersOf(*stats);
  view.gpu = stats->gpu;
  view.page_bytes = static_cast<int64_t>(stats->page_bytes);
  view.capacity_pages = static_cast<int64_t>(stats->capacity_pages);
  return view;
}

absl::StatusOr<NodeStats> ZmqNodeClient::Stats() {
  if (!lost_.ok()) return lost_;
  if (const int drops = worker_->disconnects(); drops > 0 && options_.reattach_timeout.count() == 0) {
    return WorkerLost(drops);  // it stopped (or died) after the last request ended: say which
  }
  if (memd_) {
    if (absl::Status s = SampleMemd(); !s.ok()) return s;
  }
  auto view = QueryWorker();
  if (!view.ok() && options_.reattach_timeout.count() > 0) {  // a worker killed at the end: its successor's counters
    if (absl::Status s = Reattach(); !s.ok()) return s;
    view = QueryWorker();
  }
  if (!view.ok()) return view.status();
  NodeStats now = view->counters;
  now.sessions_admitted_max = peaks_.sessions_admitted_max;
  now.gpus = peaks_.gpus;
  NodeStats out = WorkerCountersSince(now, baseline_);
  out.host_pages_shared = host_pages_shared_;  // issue 24
  out.cluster = cluster_tally_.Totals();  // issue 26: across memd restarts
  out.host_bytes_per_session_peak = host_bytes_per_session_peak_;
  out.host_pages_held_peak = host_pages_held_peak_;
  out.host_pages_allocated_peak = host_pages_allocated_peak_;
  out.host_bytes_per_session_mean = host_samples_ > 0 ? host_bytes_per_session_sum_ / double(host_samples_) : 0;
  for (GpuMemoryUse& g : out.gpus) {
    if (g.gpu != view->gpu) continue;
    g.page_bytes = view->page_bytes;
    g.peak_used_bytes = peak_used_pages_[g.gpu] * g.page_bytes;
  }
  if (out.gpus.empty()) {
    out.gpus.push_back(GpuMemoryUse{.gpu = view->gpu, .capacity_pages = view->capacity_pages,
                                    .page_bytes = view->page_bytes});
  }
  return out;
}

}  // namespace dhs::replay
