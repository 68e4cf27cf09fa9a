// workerd/client_streams.h: the client side of the worker (issue 23: one room of the old Worker): each request's
// stream of TokenChunks to its client (ClientSink), a re-attaching client's catch-up (Attach), Cancel, a client gone
// (EndClient), the client's part of every end (its final chunk, the counts, a detached request's output kept for its
// Attach), and the resumed outputs no client claimed (dropped under the bound, logged and counted).
//
// Streams what the loop produced; decides nothing about the loop: ends go through RequestEnds (the loop's Finish), the
// lifecycle and the client ids through the RequestBook.
//
// Thread-safety: none; the worker thread drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "workerd/request_book.h"
#include "workerd/serving.h"
#include "workerd/worker_request.h"
#include "workerd/worker_stats.h"

namespace dhs {

class ClientStreams {
 public:
  // Every argument must outlive it.
  ClientStreams(ClientSink* sink, RequestBook* book, RequestMap* requests, WorkerRecorder* recorder,
                RequestEnds* ends)
      : sink_(sink), book_(book), requests_(requests), recorder_(recorder), ends_(ends) {}

  // SubmitAccepted for client id `client_id` to `client`, at `queue_position` (requests not active before it).
  void Accept(const ClientRef& client, RequestId client_id, uint32_t queue_position);
  // One TokenChunk of r to its client (nothing when r is detached: its output waits in r.out for its Attach). A
  // refused one (not final) returns the sink's error (the caller fails r); a final chunk is always taken.
  absl::Status Chunk(WorkerRequest& r, std::vector<model::Token> tokens, std::vector<uint64_t> digests, bool finished,
                     const absl::Status& error);
  // After a step that gave r `new_tokens` tokens (the last ones of r.out): the ones its client lacks (a re-attached
  // client that had tokens the record lacked gets only later ones), final when r finished. A refused chunk sets
  // r.client_error (the loop ends r; its final chunk carries that error).
  void Stream(WorkerRequest& r, size_t new_tokens);
  // The client's side of any end (the loop's Finish, an admission memd refused): a failed request's final chunk, the
  // counts (WorkerRecorder::Ended), and a detached request's output (or error) kept for its Attach.
  void ReportEnd(WorkerRequest& r, const absl::Status& error);
  // A resumed request that had all its tokens (never admitted again): its output kept for its client's Attach.
  void KeepOutput(const ResumeKey& key, DetachedOutput output);
  // Lost ends (workerd/README.md "Restart: a finished request's end"): the outputs of requests the GPU's previous
  // worker finished (HelloReply.finished_records: every token, no input), each kept for its client's Attach as a
  // resumed request's finished output (the same bound; nothing is admitted, no Complete). A record whose tokens are
  // not all there (tokens != max_new_tokens or digests' length differs) is logged and skipped, as is one whose key a
  // resumed request waiting for its client has. Returns how many were kept.
  size_t KeepFinishedOutputs(const std::vector<std::unique_ptr<wire::RequestRecordT>>& records);
  // The kept outputs past their age bound at `now` are dropped (logged and counted).
  void ExpireOutputs(std::chrono::steady_clock::time_point now);

  // Submitter::Attach (worker.h): SubmitAccepted, then one TokenChunk with the tokens from `received` on that are
  // known now (final when the request finished); from then on the request streams to `client`. Errors: NOT_FOUND (no
  // resumed request of (client_identity, client_id) waits for a client, or its output was dropped unclaimed),
  // ALREADY_EXISTS (`client` has another request with that id in flight; nothing changed).
  absl::Status Attach(RequestId client_id, uint32_t received, const ClientRef& client, uint64_t client_identity);
  // Submitter::Cancel (worker.h): ends the request as a failed one (RequestCancelledError(reason), reason cut to 256
  // bytes) through RequestEnds. Errors: NOT_FOUND (no such request in flight; nothing changed).
  absl::Status Cancel(RequestId client_id, uint64_t client_identity, const ClientRef& client,
                      std::string_view reason);
  // The client `peer` went away: each of its requests ends as a failed one (`why`). Returns how many ended.
  size_t EndClient(const std::string& peer, const absl::Status& why);

 private:
  // The outputs the book's bound dropped (resumed outputs no client claimed): logged and counted.
  void DropUnclaimed(const std::vector<DroppedOutput>& dropped);
  // Attach's catch-up of r: SubmitAccepted, then r's known tokens from `received` on.
  absl::Status CatchUp(WorkerRequest& r, RequestId client_id, uint32_t received, const ClientRef& client,
                       bool finished, const absl::Status& error);

  ClientSink* sink_;
  RequestBook* book_;
  RequestMap* requests_;
  WorkerRecorder* recorder_;
  RequestEnds* ends_;
};

}  // namespace dhs
