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

absl::StatusOr<std::unique_ptr<ServingFrontend>> ServingFrontend::Bind(std::string_view run_dir, GpuId gpu) {
  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Bind(run_dir, absl::StrCat("worker-", gpu));
  if (!router.ok()) return router.status();
  return std::unique_ptr<ServingFrontend>(new ServingFrontend(*std::move(router), absl::StrCat("worker/", gpu)));
}

absl::Status ServingFrontend::Serve(std::chrono::milliseconds timeout) {
  for (std::chrono::milliseconds wait = timeout;; wait = std::chrono::milliseconds(0)) {
    absl::StatusOr<std::optional<Incoming>> in = router_->Poll(wait);
    if (!in.ok()) return in.status();
    if (!in->has_value()) return absl::OkStatus();
    Handle(**in);
  }
}

void ServingFrontend::Handle(const Incoming& in) {
  absl::StatusOr<Message> msg = DecodeEnvelope(in.bytes);
  if (!msg.ok()) {
    Send(in.peer, EncodeError(msg.status(), PeekSequence(in.bytes), sender_));
    return;
  }
  absl::Status status;
  if (msg->type == wire::Body::SubmitRequest) {
    absl::StatusOr<wire::SubmitRequestT> submit = ReadSubmitRequest(*msg);
    status = !submit.ok()           ? submit.status()
             : worker_ == nullptr ? absl::UnavailableError("worker not ready")
                                  : worker_->Submit(*submit, ClientRef{in.peer, msg->sequence});
  } else if (msg->type == wire::Body::WorkerStatsQuery) {
    if (worker_ == nullptr) {
      status = absl::UnavailableError("worker not ready");
    } else {
      Send(in.peer, EncodeWorkerStatsReply(worker_->StatsReply(), msg->sequence, sender_));
      return;
    }
  } else {
    status = UnknownMessageError(absl::StrCat("workerd does not serve ", BodyName(msg->type)));
  }
  if (!status.ok()) {
    DHS_LOG_LIMITED(spdlog::level::info, "workerd: {} from a client refused: {}", BodyName(msg->type), status.ToString());
    Send(in.peer, EncodeError(status, msg->sequence, sender_));
  }
}

void ServingFrontend::Send(std::string_view peer, const std::string& bytes) {
  if (absl::Status s = router_->Reply(peer, bytes); !s.ok()) {
    DHS_LOG_LIMITED(spdlog::level::warn, "workerd: reply to a client failed: {}", s.ToString());
  }
}

void ServingFrontend::Accepted(const ClientRef& client, const wire::SubmitAcceptedT& accepted) {
  Send(client.peer, EncodeSubmitAccepted(accepted, client.sequence, sender_));
}

void ServingFrontend::Chunk(const ClientRef& client, const wire::TokenChunkT& chunk) {
  Send(client.peer, EncodeTokenChunk(chunk, client.sequence, sender_));
}

}  // namespace dhs
