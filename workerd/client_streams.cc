// workerd/client_streams.cc: see client_streams.h.
#include "workerd/client_streams.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dhs {

void ClientStreams::Accept(const ClientRef& client, RequestId client_id, uint32_t queue_position) {
  wire::SubmitAcceptedT accepted;
  accepted.request = client_id;
  accepted.queue_position = queue_position;
  sink_->Accepted(client, accepted);
}

absl::Status ClientStreams::Chunk(WorkerRequest& r, std::vector<model::Token> tokens, std::vector<uint64_t> digests,
                                  bool finished, const absl::Status& error) {
  if (!r.life->client) return absl::OkStatus();  // detached: kept in r.out for its Attach
  const auto now = std::chrono::steady_clock::now();
  wire::TokenChunkT chunk;
  chunk.request = r.client_id;
  for (model::Token t : tokens) chunk.tokens.push_back(static_cast<uint8_t>(t));
  chunk.logits_digests = std::move(digests);
  chunk.finished = finished;
  chunk.ttft_us = r.times.ttft_us;
  chunk.since_submit_us = MicrosSince(r.times.submitted, now);
  chunk.allocation_wait_us = WaitsForGrant(r.life->held_phase()) ? chunk.since_submit_us
                                                                 : MicrosSince(r.times.submitted, r.times.granted);
  if (!error.ok()) {
    chunk.error = ToWireError(error);
    chunk.error_message = std::string(error.message());
    chunk.end_reason = EndReasonOf(error);  // WORKER_EPOCH_ENDED: the client re-attaches (matches the code, not text)
  }
  return sink_->Chunk(*r.life->client, chunk);
}

void ClientStreams::Stream(WorkerRequest& r, size_t new_tokens) {
  const std::vector<model::Token>& generated = r.out.generated;
  const bool finished = r.finished();
  // A re-attached client that had tokens the record lacked gets only the ones after those (same draws: equal).
  const size_t first = std::max(generated.size() - new_tokens, r.life->tokens.client_has);
  const bool has = generated.size() <= first;
  if (has && !finished) return;
  const auto from = static_cast<ptrdiff_t>(first);
  absl::Status sent =
      has ? Chunk(r, {}, {}, true, absl::OkStatus())
          : Chunk(r, std::vector<model::Token>(generated.begin() + from, generated.end()),
                  std::vector<uint64_t>(r.out.digests.begin() + from, r.out.digests.end()), finished,
                  absl::OkStatus());
  if (!sent.ok()) {
    // The client does not read: the request fails (the loop ends it; its final chunk carries this error).
    r.client_error = absl::Status(sent.code(), absl::StrCat("request ", r.client_id, " failed after ",
                                                            generated.size() - 1, " tokens: ", sent.message()));
  }
}

void ClientStreams::ReportEnd(WorkerRequest& r, const absl::Status& error) {
  if (!error.ok()) {
    DHS_CHECK_OK(Chunk(r, {}, {}, true, error));  // a final chunk is always taken (nothing sent when detached)
  }
  const auto now = std::chrono::steady_clock::now();
  recorder_->Ended(r.id, r.out.generated.size(), error, now);
  if (!r.life->client) {  // kept for its Attach
    DropUnclaimed(book_->KeepDetached(r.life->key(), DetachedOutput{r.out.generated, r.out.digests, error}, now));
  }
}

void ClientStreams::KeepOutput(const ResumeKey& key, DetachedOutput output) {
  DropUnclaimed(book_->KeepDetached(key, std::move(output), std::chrono::steady_clock::now()));
}

size_t ClientStreams::KeepFinishedOutputs(const std::vector<std::unique_ptr<wire::RequestRecordT>>& records) {
  size_t kept = 0;
  for (const auto& rec : records) {
    if (rec == nullptr) continue;
    if (rec->tokens.size() != rec->max_new_tokens || rec->logits_digests.size() != rec->tokens.size()) {
      spdlog::warn("worker: finished record of request {} (client {}) skipped: {} tokens, {} digests, max_new {}",
                   rec->request, rec->client_request, rec->tokens.size(), rec->logits_digests.size(),
                   rec->max_new_tokens);
      continue;
    }
    // A resumed request of that key waits for its client (clients without an identity share keys): it is the one.
    if (book_->FindDetached({rec->client, rec->client_request}) != nullptr) continue;
    KeepOutput({rec->client, rec->client_request},
               DetachedOutput{std::vector<model::Token>(rec->tokens.begin(), rec->tokens.end()), rec->logits_digests,
                              absl::OkStatus()});
    ++kept;
  }
  if (kept > 0) {
    spdlog::info("worker: {} outputs of requests the previous worker finished are kept for a client whose final "
                 "chunk died with it (Attach)", kept);
  }
  return kept;
}

void ClientStreams::ExpireOutputs(std::chrono::steady_clock::time_point now) {
  if (book_->detached_outputs() > 0) DropUnclaimed(book_->ExpireDetached(now));
}

void ClientStreams::DropUnclaimed(const std::vector<DroppedOutput>& dropped) {
  for (const DroppedOutput& d : dropped) {
    ++recorder_->counts().resumed_outputs_dropped;
    spdlog::warn("worker: the resumed output of request {} of client {} ({} bytes) is dropped, no client attached to "
                 "it within the bound ({}; waited {} ms): an Attach now gets NOT_FOUND", d.key.second, d.key.first,
                 d.bytes, ResumedDropReasonName(d.reason), d.waited.count());
  }
}

absl::Status ClientStreams::CatchUp(WorkerRequest& r, RequestId client_id, uint32_t received,
                                    const ClientRef& client, bool finished, const absl::Status& error) {
  Accept(client, client_id, 0);
  std::vector<model::Token> tokens;
  std::vector<uint64_t> digests;
  TokenCounts& counts = r.life->tokens;
  const size_t known = counts.held_from.value_or(r.out.generated.size());  // held ones go after the re-Hello
  for (size_t t = received; t < known; ++t) {
    tokens.push_back(r.out.generated[t]);
    digests.push_back(r.out.digests[t]);
  }
  counts.client_has = std::max<size_t>(received, known);
  if (!tokens.empty() || finished) return Chunk(r, std::move(tokens), std::move(digests), finished, error);
  return absl::OkStatus();
}

absl::Status ClientStreams::Attach(RequestId client_id, uint32_t received, const ClientRef& client,
                                   uint64_t client_identity) {
  const ResumeKey key{client_identity, client_id};
  if (std::optional<DetachedOutput> done = book_->ClaimDetached(key)) {
    RequestLife life;  // the finished request's output, streamed once
    life.client_id = client_id;
    life.client = client;
    WorkerRequest r;
    r.client_id = client_id;
    r.life = &life;
    r.out.generated = std::move(done->tokens);
    r.out.digests = std::move(done->digests);
    r.times.submitted = r.times.granted = std::chrono::steady_clock::now();
    DHS_CHECK_OK(CatchUp(r, client_id, received, client, true, done->error));  // a final chunk is always taken
    return absl::OkStatus();
  }
  // A running resumed request of that key (the first in node-id order: anonymous clients may share a key).
  RequestLife* life = book_->FindDetached(key);
  if (life == nullptr) {
    return absl::NotFoundError(absl::StrCat("request ", client_id, " of client ", client_identity,
                                            " is not a resumed request of this worker"));
  }
  if (absl::Status s = book_->AttachClient(life->id, client); !s.ok()) return s;  // the client's id is in use
  WorkerRequest& r = *requests_->at(life->id);
  if (absl::Status s = CatchUp(r, client_id, received, client, false, absl::OkStatus()); !s.ok()) r.client_error = s;
  return absl::OkStatus();
}

absl::Status ClientStreams::Cancel(RequestId client_id, uint64_t client_identity, const ClientRef& client,
                                   std::string_view reason) {
  constexpr size_t kMaxReasonBytes = 256;
  reason = reason.substr(0, kMaxReasonBytes);
  // By (peer, client id), else a resumed request no client re-attached to (the first in node-id order, as Attach).
  RequestLife* life = book_->FindByClient(client.peer, client_id);
  if (life == nullptr) life = book_->FindDetached({client_identity, client_id});
  WorkerRequest* r = life != nullptr ? requests_->at(life->id).get() : nullptr;
  if (r == nullptr || life->phase == RequestPhase::kEnding || r->finished()) {
    return absl::NotFoundError(absl::StrCat("cancel: request ", client_id, " of this client is not in flight here ",
                                            r == nullptr ? "(unknown, or finished already)"
                                                         : "(already ending or finished)"));
  }
  if (!life->client) DHS_CHECK_OK(book_->AttachClient(r->id, client));  // its final chunk answers the Cancel
  ++recorder_->counts().requests_cancelled;
  spdlog::info("worker: request {} (client {}) cancelled by its client: {}", r->id, client_id, reason);
  ends_->Finish(r->id, RequestCancelledError(reason));  // final chunk, copies waited for, KV and slots released
  return absl::OkStatus();
}

size_t ClientStreams::EndClient(const std::string& peer, const absl::Status& why) {
  const std::vector<RequestId> ids = book_->IdsOfPeer(peer);
  for (RequestId id : ids) ends_->Finish(id, why);  // error chunk (dropped: no one reads it), KV released, Complete
  return ids.size();
}

}  // namespace dhs
