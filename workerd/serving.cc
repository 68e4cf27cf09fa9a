// workerd/serving.cc: see serving.h.
#include "workerd/serving.h"

#include <cmath>
#include <cstring>

#include "common/log_limiter.h"
#include "absl/strings/str_cat.h"
#include "common/prompt_tokens.h"
#include "common/protocol.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dhs {

absl::Status ValidateSubmit(const wire::SubmitRequestT& s, uint64_t max_context_tokens) {
  if (s.prompt.empty() && s.hash_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", s.request, ": empty prompt (no tokens, no hash_ids)"));
  }
  if (!s.hash_ids.empty()) {
    if (s.input_tokens == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", s.request, ": unknown prefix reference: hash_ids with input_tokens 0"));
    }
    if (s.prefix_block_tokens == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", s.request, ": unknown prefix reference: prefix_block_tokens 0"));
    }
    const uint64_t block = s.prefix_block_tokens;
    const uint64_t blocks = (uint64_t{s.input_tokens} + block - 1) / block;
    if (s.hash_ids.size() > blocks) {
      return absl::InvalidArgumentError(absl::StrCat("request ", s.request, ": unknown prefix reference: ",
                                                     s.hash_ids.size(), " hash_ids for input_tokens ", s.input_tokens,
                                                     " (at most ", blocks, " blocks of ", block, ")"));
    }
    const uint64_t suffix = s.input_tokens - PrefixCoveredTokens(s.hash_ids.size(), block, s.input_tokens);
    if (s.prompt.size() != suffix) {
      return absl::InvalidArgumentError(absl::StrCat("request ", s.request, ": prepared prefix of ", s.hash_ids.size(),
                                                     " blocks of ", block, " tokens needs ", suffix,
                                                     " prompt tokens after it to make input_tokens ", s.input_tokens,
                                                     ", got ", s.prompt.size()));
    }
  }
  if (s.max_new_tokens == 0) {
    return absl::InvalidArgumentError(absl::StrCat("request ", s.request, ": max_new_tokens must be >= 1"));
  }
  const uint64_t input = s.hash_ids.empty() ? s.prompt.size() : uint64_t{s.input_tokens};
  if (input + s.max_new_tokens > max_context_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("request ", s.request, ": too many tokens: ", input,
                                                   " input + ", s.max_new_tokens, " new > limit ",
                                                   max_context_tokens));
  }
  if (!std::isfinite(s.temperature) || s.temperature < 0) {
    return absl::InvalidArgumentError(absl::StrCat("request ", s.request, ": bad sampling: temperature ",
                                                   s.temperature, " (must be finite and >= 0)"));
  }
  if (std::isnan(s.top_p) || !(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", s.request, ": bad sampling: top_p ", s.top_p, " (must be in (0, 1])"));
  }
  return absl::OkStatus();
}

std::vector<model::Token> SubmitInputTokens(const wire::SubmitRequestT& s) {
  std::vector<model::Token> out;
  if (!s.hash_ids.empty()) {
    const uint64_t covered = PrefixCoveredTokens(s.hash_ids.size(), s.prefix_block_tokens, s.input_tokens);
    const std::vector<uint8_t> prefix =
        SyntheticPromptTokens(s.hash_ids, s.prefix_block_tokens, s.input_tokens, /*private_seed=*/0, 0, covered);
    out.assign(prefix.begin(), prefix.end());
  }
  out.insert(out.end(), s.prompt.begin(), s.prompt.end());
  return out;
}

uint64_t SubmitPrefixTokens(const wire::SubmitRequestT& s) {
  return s.hash_ids.empty() ? 0 : PrefixCoveredTokens(s.hash_ids.size(), s.prefix_block_tokens, s.input_tokens);
}

uint64_t LogitsDigest(std::span<const float> logits) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64 offset basis
  for (float f : logits) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    for (int b = 0; b < 4; ++b) {
      h ^= (bits >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ULL;  // FNV prime
    }
  }
  return h;
}

absl::StatusOr<std::unique_ptr<ServingFrontend>> ServingFrontend::Bind(std::string_view run_dir, GpuId gpu,
                                                                      ClientOutboxLimits limits) {
  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Bind(run_dir, absl::StrCat("worker-", gpu));
  if (!router.ok()) return router.status();
  return std::unique_ptr<ServingFrontend>(
      new ServingFrontend(*std::move(router), absl::StrCat("worker/", gpu), limits));
}

absl::Status ServingFrontend::Serve(std::chrono::milliseconds timeout) {
  Flush();
  std::chrono::milliseconds wait = timeout;
  for (int n = 0; n < kMaxMessagesPerServe; ++n, wait = std::chrono::milliseconds(0)) {
    absl::StatusOr<std::optional<Incoming>> in = router_->Poll(wait);
    if (!in.ok()) return in.status();
    if (!in->has_value()) return absl::OkStatus();
    Handle(**in);
  }
  return absl::OkStatus();
}

void ServingFrontend::Handle(const Incoming& in) {
  absl::StatusOr<Message> msg = DecodeEnvelope(in.bytes);
  if (!msg.ok()) {
    Send(in.peer, EncodeError(msg.status(), PeekSequence(in.bytes), sender_), ReplyKind::kReply).IgnoreError();
    return;
  }
  absl::Status status;
  if (msg->type == wire::Body::SubmitRequest) {
    status = HandleSubmit(*msg, in.peer);
  } else if (msg->type == wire::Body::Attach) {
    absl::StatusOr<wire::AttachT> attach = ReadAttach(*msg);
    if (!attach.ok()) {
      status = attach.status();
    } else if (worker_ == nullptr) {
      status = absl::UnavailableError("worker not ready");
    } else {
      status = worker_->Attach(attach->request, attach->received, ClientRef{in.peer, msg->sequence}, attach->client);
    }
  } else if (msg->type == wire::Body::WorkerStatsQuery) {
    if (worker_ == nullptr) {
      status = absl::UnavailableError("worker not ready");
    } else {
      wire::WorkerStatsReplyT reply = StatsReply();
      if (absl::StatusOr<wire::WorkerStatsQueryT> q = ReadWorkerStatsQuery(*msg); q.ok() && q->timeline) {
        reply.timeline_json = worker_->TimelineJson(q->timeline_client_request);
      }
      Send(in.peer, EncodeWorkerStatsReply(reply, msg->sequence, sender_), ReplyKind::kReply).IgnoreError();
      return;
    }
  } else {
    status = UnknownMessageError(absl::StrCat("workerd does not serve ", BodyName(msg->type)));
  }
  if (!status.ok()) {
    DHS_LOG_LIMITED(spdlog::level::info, "workerd: {} from a client refused: {}", BodyName(msg->type), status.ToString());
    Send(in.peer, EncodeError(status, msg->sequence, sender_), ReplyKind::kReply).IgnoreError();
  }
}

wire::WorkerStatsReplyT ServingFrontend::StatsReply() const {
  wire::WorkerStatsReplyT reply = worker_->StatsReply();
  const ClientOutboxStats& o = outbox_.stats();
  reply.submits_refused += client_submits_refused_;
  reply.client_queued_bytes = o.queued_bytes;
  reply.client_queued_peak_bytes = o.peak_queued_bytes;
  reply.client_streams_refused = o.streams_refused;
  reply.client_replies_dropped = o.replies_dropped + o.dropped_for_gone;
  return reply;
}

absl::Status ServingFrontend::HandleSubmit(const Message& msg, const std::string& peer) {
  absl::StatusOr<wire::SubmitRequestT> submit = ReadSubmitRequest(msg);
  if (!submit.ok()) return submit.status();
  if (worker_ == nullptr) return absl::UnavailableError("worker not ready");
  if (outbox_.Full(peer)) {
    // Its replies are not read: a new request would only be failed later, after it took a slot and pages.
    ++client_submits_refused_;
    return absl::ResourceExhaustedError(absl::StrCat("request ", submit->request, ": client not reading: ",
                                                     outbox_.queued_bytes(peer), " bytes of replies wait for it (limit ",
                                                     outbox_.limits().per_client_bytes, " per client, ",
                                                     outbox_.limits().total_bytes, " in total)"));
  }
  return worker_->Submit(*submit, ClientRef{peer, msg.sequence});
}

absl::Status ServingFrontend::Send(const std::string& peer, std::string bytes, ReplyKind kind) {
  const size_t size = bytes.size();
  if (outbox_.Push(peer, std::move(bytes), kind) == PushVerdict::kRefused) {
    if (kind == ReplyKind::kReply) {
      DHS_LOG_LIMITED(spdlog::level::warn, "workerd: a reply of {} bytes to a client that does not read is dropped "
                      "(its buffer is full; counted in client_replies_dropped)", size);
    }
    return absl::ResourceExhaustedError(absl::StrCat("client not reading: its reply buffer is full (",
                                                     outbox_.queued_bytes(peer), " bytes queued, limit ",
                                                     outbox_.limits().per_client_bytes, " per client, ",
                                                     outbox_.limits().total_bytes, " in total)"));
  }
  FlushPeer(peer);
  return absl::OkStatus();
}

void ServingFrontend::FlushPeer(const std::string& peer) {
  while (const std::string* bytes = outbox_.Front(peer)) {
    absl::Status s = router_->Reply(peer, *bytes);
    if (s.ok()) {
      outbox_.Sent(peer);
    } else if (absl::IsResourceExhausted(s)) {
      return;  // its socket queue is full: the rest waits for the next Flush
    } else {
      DHS_LOG_LIMITED(spdlog::level::info, "workerd: client gone ({}); {} bytes of replies for it dropped",
                      s.ToString(), outbox_.queued_bytes(peer));
      outbox_.PeerGone(peer);
      return;
    }
  }
}

void ServingFrontend::Flush() {
  for (const std::string& peer : outbox_.Backlogged()) FlushPeer(peer);
}

void ServingFrontend::Accepted(const ClientRef& client, const wire::SubmitAcceptedT& accepted) {
  Send(client.peer, EncodeSubmitAccepted(accepted, client.sequence, sender_), ReplyKind::kEnd).IgnoreError();
}

absl::Status ServingFrontend::Chunk(const ClientRef& client, const wire::TokenChunkT& chunk) {
  return Send(client.peer, EncodeTokenChunk(chunk, client.sequence, sender_),
              chunk.finished ? ReplyKind::kEnd : ReplyKind::kStream);
}

}  // namespace dhs
