// workerd/serving.h: the client side of the worker's wire (docs/protocol.md, "client/replay <-> workerd"):
// submit validation, the prepared-prefix token generator, the logits digest, the ClientSink the serving core writes
// to, the Submitter it feeds (implemented by Worker), and ServingFrontend, the RouterServer `worker-<gpu>` that feeds
// SubmitRequest / WorkerStatsQuery to a Submitter and sends the replies through a ClientOutbox (bounded buffering of
// replies to clients that do not read, workerd/client_outbox.h). serving.h does not know the Worker (worker.h includes it, not the
// other way round), as the Worker knows memd only as a MemdLink.
//
// Thread-safety: the free functions are pure; ServingFrontend is driven by the worker thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/transport.h"
#include "dhs_generated.h"
#include "workerd/client_outbox.h"
#include "workerd/model/config.h"

namespace dhs {

// Checks a SubmitRequest against the limits. `max_context_tokens`: input + max_new_tokens must not exceed it.
// Errors (INVALID_ARGUMENT, the message names the field): empty prompt without hash_ids ("empty prompt"),
// max_new_tokens == 0, too many tokens ("too many tokens: ..."), hash_ids with input_tokens 0, prefix_block_tokens 0
// or more ids than ceil(input_tokens / prefix_block_tokens) blocks ("unknown prefix reference: ..."), a prompt
// whose length is not the input after the prefix ("prepared prefix of ..."), temperature < 0 or NaN, top_p outside
// (0, 1] or NaN ("bad sampling: ...").
absl::Status ValidateSubmit(const wire::SubmitRequestT& submit, uint64_t max_context_tokens);

// The input tokens of a validated submit: with hash_ids, the prepared prefix (min(input_tokens, ids * block) tokens,
// token j of block b = PrefixBlockToken(hash_ids[b], j), common/prompt_tokens.h; equal ids give equal blocks) then
// `prompt`; else `prompt`. SubmitPrefixTokens: how many leading tokens the prefix covers (0 without hash_ids).
// Precondition: ValidateSubmit passed.
std::vector<model::Token> SubmitInputTokens(const wire::SubmitRequestT& submit);
uint64_t SubmitPrefixTokens(const wire::SubmitRequestT& submit);

// 64-bit FNV-1a over the bit patterns of the logits (each float as its 4 little-endian bytes, in order): the digest
// the exactness checks compare (TokenChunk.logits_digests).
uint64_t LogitsDigest(std::span<const float> logits);

// Where a request's replies go: the client's routing id and the SubmitRequest's sequence (every reply repeats it).
struct ClientRef {
  std::string peer;
  uint64_t sequence = 0;
};

// What the serving core sends to clients. Accepted and a final chunk (`finished`) are always taken (one per request).
// A chunk that is not final may be refused: RESOURCE_EXHAUSTED when the client's reply buffer is full (it does not
// read, ClientOutbox); the caller then fails the request (its final chunk carries the error) and sends no more of its
// chunks.
class ClientSink {
 public:
  virtual ~ClientSink() = default;
  virtual void Accepted(const ClientRef& client, const wire::SubmitAcceptedT& accepted) = 0;
  virtual absl::Status Chunk(const ClientRef& client, const wire::TokenChunkT& chunk) = 0;
};

// What the frontend hands client requests to (the serving core).
class Submitter {
 public:
  virtual ~Submitter() = default;
  // A client's request. A returned error is the client's ErrorReply; nothing else changed.
  virtual absl::Status Submit(const wire::SubmitRequestT& submit, const ClientRef& client) = 0;
  // A client re-attaches to a request resumed after a worker restart (Attach message, protocol version 5), having
  // `received` of its tokens; `client_identity` is Attach.client (the SubmitRequest.client it was submitted with,
  // 0 = none): resumed requests are found by (client_identity, client_id). A returned error is the client's ErrorReply.
  virtual absl::Status Attach(RequestId client_id, uint32_t received, const ClientRef& client,
                              uint64_t client_identity = 0) = 0;
  // Cancel (issue 22): `client` (its routing id, and the Cancel's sequence) cancels its request `client_id`;
  // `client_identity` = Cancel.client also finds a resumed request no client has re-attached to yet. A returned error
  // is the client's ErrorReply (NOT_FOUND: no such request in flight; nothing changed).
  virtual absl::Status Cancel(RequestId client_id, uint64_t client_identity, const ClientRef& client,
                              std::string_view reason) = 0;
  // The counters of WorkerStatsReply.
  virtual wire::WorkerStatsReplyT StatsReply() const = 0;
  // WorkerStatsReply.timeline_json for WorkerStatsQuery.timeline (issue 22): the submitter's timelines of the client
  // request id, as common/request_timeline.h TimelinesToJson renders them. Default: none.
  virtual std::string TimelineJson(uint64_t client_request) const { return {}; }
};

// The serving address of `workerd --listen` (issue 22): "tcp://ADDR:PORT" as given, "tcp://:PORT" (no address) as
// "tcp://127.0.0.1:PORT" (loopback by default: another host is served only when its address is named, e.g. "*" or an
// interface's address). PORT: 1..65535, or "*" (a free port; the log names the one bound). Errors: INVALID_ARGUMENT
// naming the value (not tcp://, no port, a bad port).
absl::StatusOr<std::string> ParseListenEndpoint(std::string_view spec);

// The RouterServer `worker-<gpu>` in the run dir, and with `tcp_listen` a second one on that tcp:// endpoint with
// ZeroMQ CURVE (the run directory's server key, common/curve_keys.h: a client must hold serving-curve.pub; one
// without it, or with another key, is never served). Both serve the same clients' messages: Serve() answers
// SubmitRequest (ErrorReply on a validation error, the worker keeps serving), Attach (a resumed request's client
// re-attaches: Submitter::Attach), Cancel (Submitter::Cancel; issue 22), WorkerStatsQuery (WorkerStatsReply) and
// anything else with an ErrorReply (UNKNOWN_MESSAGE; undecodable -> INVALID_MESSAGE). As a ClientSink it encodes
// SubmitAccepted / TokenChunk. A client's peer (ClientRef::peer) is the index of its socket (one byte) then its
// routing id, so ids of the two sockets never meet.
//
// Every reply goes through a ClientOutbox: what the socket cannot take now (the client's ZeroMQ queue is full: it
// does not read) waits there, up to the limits; Serve first sends what waits. Beyond the client's limit a streamed
// chunk is refused (Chunk: RESOURCE_EXHAUSTED, the request fails), an ErrorReply / WorkerStatsReply is dropped and
// counted (client_replies_dropped), and the client's new submits are refused (RESOURCE_EXHAUSTED "client not
// reading"). A client whose connection is gone loses what waited for it; TakeGonePeers names it (its requests end).
class ServingFrontend final : public ClientSink {
 public:
  // The most messages one Serve call reads (a flood of submits cannot starve the serving loop).
  static constexpr int kMaxMessagesPerServe = 64;
  // ZMTP heartbeats of the tcp:// socket: a router on another host that vanishes (its host died, the network broke)
  // is seen gone after kTcpHeartbeatTimeout without an answer, and its requests end ("client went away").
  static constexpr std::chrono::milliseconds kTcpHeartbeatInterval{2000};
  static constexpr std::chrono::milliseconds kTcpHeartbeatTimeout{10000};

  // Binds ipc://<run_dir>/worker-<gpu>.sock, then, with `tcp_listen` (ParseListenEndpoint's form), that endpoint with
  // CURVE (LoadOrCreateServerKeys(run_dir)). Errors: as RouterServer::Bind / BindTcp, ParseListenEndpoint's,
  // LoadOrCreateServerKeys's.
  static absl::StatusOr<std::unique_ptr<ServingFrontend>> Bind(std::string_view run_dir, GpuId gpu,
                                                              ClientOutboxLimits limits = {},
                                                              std::string_view tcp_listen = "");

  void set_submitter(Submitter* submitter) { worker_ = submitter; }
  // Sends what waits in the outbox, then serves the messages that arrive within `timeout` on either socket (at least
  // one wait of `timeout`, then drains without waiting, at most kMaxMessagesPerServe). Errors only from the sockets.
  absl::Status Serve(std::chrono::milliseconds timeout);
  // Sends what waits in the outbox to each client whose socket queue takes it.
  void Flush();
  // The clients found disconnected since the last call (ClientOutbox::TakeGonePeers).
  std::vector<std::string> TakeGonePeers() { return outbox_.TakeGonePeers(); }
  const ClientOutbox& outbox() const { return outbox_; }
  // The whole WorkerStatsReply: the submitter's (Submitter::StatsReply) plus this frontend's back-pressure counters
  // (client_* fields, the submits it refused). What a WorkerStatsQuery and the worker's /metrics read.
  // Precondition: set_submitter was called.
  wire::WorkerStatsReplyT StatsReply() const;

  void Accepted(const ClientRef& client, const wire::SubmitAcceptedT& accepted) override;
  absl::Status Chunk(const ClientRef& client, const wire::TokenChunkT& chunk) override;
  const std::string& endpoint() const { return routers_.front()->endpoint(); }
  // The tcp:// endpoint bound (its port resolved), "" without --listen.
  std::string tcp_endpoint() const { return routers_.size() > 1 ? routers_[1]->endpoint() : std::string(); }
  // Replies still queued when the socket closes are delivered for up to `linger` (a stopping worker's last chunks).
  void SetLinger(std::chrono::milliseconds linger) {
    for (auto& r : routers_) r->SetLinger(linger);
  }

 private:
  ServingFrontend(std::vector<std::unique_ptr<RouterServer>> routers, std::string sender, ClientOutboxLimits limits)
      : routers_(std::move(routers)), sender_(std::move(sender)), outbox_(limits) {}
  void Handle(const Incoming& in);
  absl::Status HandleSubmit(const wire::SubmitRequestT& submit, uint64_t sequence, const std::string& peer);
  // Queues `bytes` for `peer` (ClientOutbox::Push) and sends what the socket takes. RESOURCE_EXHAUSTED when refused.
  absl::Status Send(const std::string& peer, std::string bytes, ReplyKind kind);
  // Send of a kReply (an ErrorReply or a WorkerStatsReply): a refusal drops it (logged and counted by Send).
  void SendReply(const std::string& peer, std::string bytes);
  void FlushPeer(const std::string& peer);

  std::vector<std::unique_ptr<RouterServer>> routers_;  // [0] ipc://, [1] tcp:// with CURVE (--listen)
  std::string sender_;
  ClientOutbox outbox_;
  uint64_t client_submits_refused_ = 0;  // submits refused because their client's buffer was full
  Submitter* worker_ = nullptr;
};

}  // namespace dhs
