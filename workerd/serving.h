// workerd/serving.h: the client side of the worker's wire (docs/protocol.md, "client/replay <-> workerd"):
// submit validation, the prepared-prefix token generator, the logits digest, the ClientSink the serving core writes
// to, and ServingFrontend, the RouterServer `worker-<gpu>` that feeds SubmitRequest / WorkerStatsQuery to a Worker.
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
#include "workerd/model/config.h"

namespace dhs {

class Worker;

// Tokens per prepared-prefix block (Mooncake hash_ids, brief §10).
inline constexpr uint32_t kPrefixBlockTokens = 512;

// Checks a SubmitRequest against the limits. `max_context_tokens`: prompt (or input_tokens) + max_new_tokens must not
// exceed it. Errors (INVALID_ARGUMENT, the message names the field): empty prompt without hash_ids ("empty prompt"),
// prompt and hash_ids both given, max_new_tokens == 0, too many tokens ("too many tokens: ..."), hash_ids with
// input_tokens 0 or with hash_ids.size() != ceil(input_tokens / 512) ("unknown prefix reference: ..."), temperature
// < 0 or NaN, top_p outside (0, 1] or NaN ("bad sampling: ...").
absl::Status ValidateSubmit(const wire::SubmitRequestT& submit, uint64_t max_context_tokens);

// The prepared prefix of `input_tokens` tokens named by `hash_ids`: token j (0..511) of block b is
// PrefixToken(hash_ids[b], j) = byte 7 (the top byte) of splitmix64(hash_id * 512 + j). Equal ids give equal blocks,
// so shared prefixes stay shared. Precondition: ValidateSubmit passed.
model::Token PrefixToken(uint64_t hash_id, uint32_t j);
std::vector<model::Token> PreparedPrefixTokens(std::span<const uint64_t> hash_ids, uint32_t input_tokens);

// 64-bit FNV-1a over the bit patterns of the logits (each float as its 4 little-endian bytes, in order): the digest
// the exactness checks compare (TokenChunk.logits_digests).
uint64_t LogitsDigest(std::span<const float> logits);

// Where a request's replies go: the client's routing id and the SubmitRequest's sequence (every reply repeats it).
struct ClientRef {
  std::string peer;
  uint64_t sequence = 0;
};

// What the serving core sends to clients.
class ClientSink {
 public:
  virtual ~ClientSink() = default;
  virtual void Accepted(const ClientRef& client, const wire::SubmitAcceptedT& accepted) = 0;
  virtual void Chunk(const ClientRef& client, const wire::TokenChunkT& chunk) = 0;
};

// The RouterServer `worker-<gpu>` in the run dir. Serve() answers SubmitRequest (ErrorReply on a validation error,
// the worker keeps serving), WorkerStatsQuery (WorkerStatsReply) and anything else with an ErrorReply
// (UNKNOWN_MESSAGE; undecodable -> INVALID_MESSAGE). As a ClientSink it encodes SubmitAccepted / TokenChunk.
class ServingFrontend final : public ClientSink {
 public:
  // Binds ipc://<run_dir>/worker-<gpu>.sock. Errors: as RouterServer::Bind.
  static absl::StatusOr<std::unique_ptr<ServingFrontend>> Bind(std::string_view run_dir, GpuId gpu);

  void set_worker(Worker* worker) { worker_ = worker; }
  // Serves the messages that arrive within `timeout` (at least one wait of `timeout`, then drains without waiting).
  // Errors only from the socket.
  absl::Status Serve(std::chrono::milliseconds timeout);

  void Accepted(const ClientRef& client, const wire::SubmitAcceptedT& accepted) override;
  void Chunk(const ClientRef& client, const wire::TokenChunkT& chunk) override;
  const std::string& endpoint() const { return router_->endpoint(); }

 private:
  ServingFrontend(std::unique_ptr<RouterServer> router, std::string sender)
      : router_(std::move(router)), sender_(std::move(sender)) {}
  void Handle(const Incoming& in);
  void Send(std::string_view peer, const std::string& bytes);

  std::unique_ptr<RouterServer> router_;
  std::string sender_;
  Worker* worker_ = nullptr;
};

}  // namespace dhs
