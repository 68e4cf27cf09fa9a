// workerd/serving.cc: see serving.h.
#include "workerd/serving.h"

#include "common/fault_point.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "common/curve_keys.h"
#include "common/log_limiter.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
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
  if (s.tenant.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request ", s.request, ": tenant of ", s.tenant.size(),
                                                   " bytes (at most ", kMaxTenantBytes, ")"));
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

absl::StatusOr<std::string> ParseListenEndpoint(std::string_view spec) {
  const std::string text(spec);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--listen '", text, "': ", why,
                                                   " (expected tcp://ADDR:PORT, tcp://:PORT for 127.0.0.1, PORT "
                                                   "1-65535 or *)"));
  };
  if (text.rfind("tcp://", 0) != 0) return bad("not a tcp:// address");
  const std::string rest = text.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return bad("no port");
  std::string addr = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  if (port != "*") {
    int value = 0;
    if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) ||
        (value = std::stoi(port)) < 1 || value > 65535) {
      return bad("bad port");
    }
  }
  if (addr.empty()) addr = "127.0.0.1";  // loopback unless an address is named
  return absl::StrCat("tcp://", addr, ":", port);
}

absl::StatusOr<std::unique_ptr<ServingFrontend>> ServingFrontend::Bind(std::string_view run_dir, GpuId gpu,
                                                                      ClientOutboxLimits limits,
                                                                      std::string_view tcp_listen) {
  std::vector<std::unique_ptr<RouterServer>> routers;
  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Bind(run_dir, absl::StrCat("worker-", gpu));
  if (!router.ok()) return router.status();
  routers.push_back(*std::move(router));
  if (!tcp_listen.empty()) {  // issue 22: the tcp:// socket, CURVE always
    absl::StatusOr<std::string> endpoint = ParseListenEndpoint(tcp_listen);
    if (!endpoint.ok()) return endpoint.status();
    absl::StatusOr<CurveKeyPair> keys = LoadOrCreateServerKeys(run_dir);
    if (!keys.ok()) return keys.status();
    RouterServer::Options options;
    options.curve_secret_key = keys->secret_key;
    options.heartbeat_interval = kTcpHeartbeatInterval;
    options.heartbeat_timeout = kTcpHeartbeatTimeout;
    absl::StatusOr<std::unique_ptr<RouterServer>> tcp = RouterServer::BindTcp(*endpoint, options);
    if (!tcp.ok()) return tcp.status();
    spdlog::info("workerd: serving on {} (CURVE; clients need {}/{})", (*tcp)->endpoint(), run_dir, kCurvePublicFile);
    routers.push_back(*std::move(tcp));
  }
  return std::unique_ptr<ServingFrontend>(
      new ServingFrontend(std::move(routers), absl::StrCat("worker/", gpu), limits));
}

absl::Status ServingFrontend::Serve(std::chrono::milliseconds timeout) {
  Flush();
  std::vector<RouterServer*> sockets;
  for (auto& r : routers_) sockets.push_back(r.get());
  std::chrono::milliseconds wait = timeout;
  for (int n = 0; n < kMaxMessagesPerServe; ++n, wait = std::chrono::milliseconds(0)) {
    absl::StatusOr<int> ready = RouterServer::WaitReadable(sockets, wait);
    if (!ready.ok()) return ready.status();
    if (*ready < 0) return absl::OkStatus();
    absl::StatusOr<std::optional<Incoming>> in = routers_[*ready]->Poll(std::chrono::milliseconds(0));
    if (!in.ok()) return in.status();
    if (!in->has_value()) continue;
    (*in)->peer.insert((*in)->peer.begin(), static_cast<char>(*ready));  // the socket's index, then the routing id
    Handle(**in);
  }
  return absl::OkStatus();
}

// The messages no client sends a worker (docs/protocol.md): each is refused UNKNOWN_MESSAGE "workerd does not serve
// <Name>". Handle's FromClient serves the rest of the union; ReceiveMessage checks at compile time that both cover it.
using NotFromClients =
    MessageSet<wire::Body::Hello, wire::Body::HelloReply, wire::Body::AdmitRequest, wire::Body::AdmitGrant,
               wire::Body::AdmitWait, wire::Body::AdmitReject, wire::Body::ReclaimOrder, wire::Body::BackupComplete,
               wire::Body::ReadersDone, wire::Body::Retire, wire::Body::PopulateOrder, wire::Body::ReadyPublish,
               wire::Body::Complete, wire::Body::CompleteAck, wire::Body::Heartbeat, wire::Body::HeartbeatAck,
               wire::Body::ErrorReply, wire::Body::IntrospectQuery, wire::Body::IntrospectReply,
               wire::Body::SubmitAccepted, wire::Body::TokenChunk, wire::Body::WorkerStatsReply,
               wire::Body::HostCopyWritten, wire::Body::TokensCommitted, wire::Body::TokensCommittedAck>;

void ServingFrontend::Handle(const Incoming& in) {
  absl::StatusOr<Message> msg = DecodeEnvelope(in.bytes);
  if (!msg.ok()) {
    SendReply(in.peer, EncodeError(msg.status(), PeekSequence(in.bytes), sender_));
    return;
  }
  // One overload per message a client sends; `status` is the refusal, if any (answered with an ErrorReply).
  struct FromClient {
    ServingFrontend& f;
    const Incoming& in;
    const Message& msg;
    absl::Status status;
    void operator()(const wire::SubmitRequestT& submit) { status = f.HandleSubmit(submit, msg.sequence, in.peer); }
    void operator()(const wire::AttachT& attach) {
      if (f.worker_ == nullptr) {
        status = absl::UnavailableError("worker not ready");
      } else {
        status = f.worker_->Attach(attach.request, attach.received, ClientRef{in.peer, msg.sequence}, attach.client);
      }
    }
    void operator()(const wire::CancelT& cancel) {  // issue 22
      if (f.worker_ == nullptr) {
        status = absl::UnavailableError("worker not ready");
      } else {
        status = f.worker_->Cancel(cancel.request, cancel.client, ClientRef{in.peer, msg.sequence}, cancel.reason);
      }
    }
    void operator()(const wire::WorkerStatsQueryT& q) {
      if (f.worker_ == nullptr) {
        status = absl::UnavailableError("worker not ready");
        return;
      }
      wire::WorkerStatsReplyT reply = f.StatsReply();
      if (q.timeline) reply.timeline_json = f.worker_->TimelineJson(q.timeline_client_request);
      f.SendReply(in.peer, EncodeWorkerStatsReply(reply, msg.sequence, f.sender_));
    }
  } from_client{*this, in, *msg, absl::OkStatus()};
  absl::Status status = ReceiveMessage<NotFromClients>(*msg, from_client, [&](wire::Body type) {
    from_client.status = UnknownMessageError(absl::StrCat("workerd does not serve ", BodyName(type)));
  });
  if (status.ok()) status = from_client.status;
  if (!status.ok()) {
    DHS_LOG_LIMITED(spdlog::level::info, "workerd: {} from a client refused: {}", BodyName(msg->type), status.ToString());
    SendReply(in.peer, EncodeError(status, msg->sequence, sender_));
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

absl::Status ServingFrontend::HandleSubmit(const wire::SubmitRequestT& submit, uint64_t sequence,
                                          const std::string& peer) {
  if (worker_ == nullptr) return absl::UnavailableError("worker not ready");
  if (outbox_.Full(peer)) {
    // Its replies are not read: a new request would only be failed later, after it took a slot and pages.
    ++client_submits_refused_;
    return absl::ResourceExhaustedError(absl::StrCat("request ", submit.request, ": client not reading: ",
                                                     outbox_.queued_bytes(peer), " bytes of replies wait for it (limit ",
                                                     outbox_.limits().per_client_bytes, " per client, ",
                                                     outbox_.limits().total_bytes, " in total)"));
  }
  return worker_->Submit(submit, ClientRef{peer, sequence});
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

void ServingFrontend::SendReply(const std::string& peer, std::string bytes) {
  const absl::Status s = Send(peer, std::move(bytes), ReplyKind::kReply);
  // Refused (RESOURCE_EXHAUSTED): the client does not read and its buffer is full. No error of the worker: Send
  // logged it and the outbox counted it (replies_dropped, reported as client_replies_dropped); the client loses only
  // this answer. Send fails in no other way.
  if (absl::IsResourceExhausted(s)) return;
  DHS_CHECK_OK(s);
}

void ServingFrontend::FlushPeer(const std::string& peer) {
  while (const std::string* bytes = outbox_.Front(peer)) {
    if (peer.empty()) {  // never a peer of Serve's
      outbox_.PeerGone(peer);
      return;
    }
    // peer = the socket's index (one byte), then the client's routing id (Serve).
    const auto index = static_cast<size_t>(static_cast<unsigned char>(peer.front()));
    absl::Status s = routers_.at(index)->Reply(std::string_view(peer).substr(1), *bytes);
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
  // A kEnd reply is always queued (ClientOutbox::Push): cannot fail.
  DHS_CHECK_OK(Send(client.peer, EncodeSubmitAccepted(accepted, client.sequence, sender_), ReplyKind::kEnd));
}

absl::Status ServingFrontend::Chunk(const ClientRef& client, const wire::TokenChunkT& chunk) {
  // Test-only (common/fault_point.h, kind "complete"): a worker armed to die when memd acknowledges a Complete keeps
  // its final chunks back, as if each were still queued in this process when it dies.
  if (chunk.finished && FaultKillArmedAt(FaultPoint::kComplete)) return absl::OkStatus();
  return Send(client.peer, EncodeTokenChunk(chunk, client.sequence, sender_),
              chunk.finished ? ReplyKind::kEnd : ReplyKind::kStream);
}

}  // namespace dhs
