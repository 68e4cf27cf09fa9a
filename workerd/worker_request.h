// workerd/worker_request.h: a request's model-side state as the worker's rooms share it (issue 23, "one owner per
// request lifecycle"): WorkerRequest (its lifecycle, ids and token counters are its RequestBook entry, `life`), the
// request map in node-id order, the one way a request leaves it (EraseRequest), and RequestEnds, the one way any room
// ends a request (the loop's Worker::Finish).
//
// The rooms (workerd/README.md): the batching loop (Worker), the admission side and memd's messages (AdmissionDesk,
// workerd/admission.h), the memd-away handling (MemdAway, workerd/memd_away.h), the client side (ClientStreams,
// workerd/client_streams.h), the stats recorder (WorkerRecorder, workerd/worker_stats.h) and the prepared-prefix import
// (PrefixImporter, workerd/prefix_import.h). Each is handed the request map and the parts it needs, never the Worker.
//
// Thread-safety: none; the worker thread owns every request.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"
#include "workerd/model/model.h"
#include "workerd/model/sampling.h"
#include "workerd/prefix_cache.h"
#include "workerd/request_book.h"
#include "workerd/resume_import.h"
#include "workerd/speculative_rounds.h"

namespace dhs {

// SubmitRequest's sampling: greedy (argmax) at temperature 0, else token t is drawn at DrawKey{seed, client id, t}.
struct RequestSampling {
  model::SamplingParams params;
  bool greedy = true;
  uint64_t seed = 0;  // SubmitRequest.seed
};

// The prepared prefix (SubmitRequest.hash_ids) and its import through the row cache (PrefixImporter).
struct PrefixImport {
  Position tokens = 0;                 // leading input tokens imported with ImportPrefix (the prepared prefix)
  std::vector<uint64_t> hash_ids;      // the prefix's block chain (row-cache keys)
  uint32_t block_tokens = 0;           // tokens per block (SubmitRequest.prefix_block_tokens: also the chain's, issue 24)
  std::string tenant;                  // SubmitRequest.tenant (issue 24): in its chain and its row-cache keys
  std::optional<PrefixBlock> capture;  // the block being computed, captured for the row cache
};

// The request's timing points (steady clock), what TokenChunk and the latency histograms report.
struct RequestTimes {
  std::chrono::steady_clock::time_point submitted;   // Submit (a resume: Resume)
  std::chrono::steady_clock::time_point granted;     // its AdmitGrant
  std::chrono::steady_clock::time_point last_token;  // its latest token (the TPOT histogram)
  uint64_t ttft_us = 0;                              // submit to its first token, us
};

// The generated output: tokens and the logits digest of each.
struct RequestOutput {
  std::vector<model::Token> generated;
  std::vector<uint64_t> digests;  // logits digest of generated[t]
  Position resumed = 0;           // tokens committed before a resume (generated[0, resumed) are also in the input)
};

// A request's model-side state.
struct WorkerRequest {
  RequestId id = 0;             // the node request id (memd's)
  RequestId client_id = 0;      // the client's SubmitRequest.request
  RequestLife* life = nullptr;  // its entry in the RequestBook (erased with it: EraseRequest)
  std::vector<model::Token> input;  // prepared prefix (if any) then prompt; a resume's ends with its committed tokens
  PrefixImport prefix;
  uint32_t max_new = 0;
  RequestSampling sampling;
  std::optional<model::ModelSession> session;  // open from StartGranted on
  Position fed = 0;                            // tokens fed to the model (input, then generated)
  RequestOutput out;
  RequestTimes times;
  absl::Status client_error;  // the client refused a chunk (ClientSink::Chunk): the request fails with it
  RequestId resume_of = 0;    // a resume: the interrupted node id it continues (AdmitRequest.resume_of)
  ResumeState resume;         // a resume's host-backed pages, runs to import, figures (ResumeImporter)
  RoundState spec;            // its speculative rounds: proposer slot, the drafter's hidden states

  // Every token of the request in position order: input, then the tokens generated after it.
  std::vector<model::Token> Tokens() const;
  // Whether it generated all max_new tokens.
  bool finished() const { return out.generated.size() >= max_new; }
};

// The requests in flight, ordered by node id: the batch order is stable.
using RequestMap = std::map<RequestId, std::unique_ptr<WorkerRequest>>;

// The model-side state of the request `life` opened in the book (not admitted yet), submitted at `now`: its input,
// prefix, sampling and limit from life.submit.
std::unique_ptr<WorkerRequest> NewWorkerRequest(RequestLife& life, std::chrono::steady_clock::time_point now);

// The Complete of request r ending with `error` (its request and gpu are the agent's to set): a request that finished
// with all its max_new tokens keeps its output at memd past the Complete (keep_output, every token and digest from 0:
// its final chunk may still be queued in this process; workerd/README.md "Restart: a finished request's end").
wire::CompleteT CompleteOf(const WorkerRequest& r, const absl::Status& error);

// Forgets a request (ended, rejected, refused): its node id and client id become free (RequestBook::Close;
// `completed`: a Complete goes to memd for it), then it leaves `requests`.
void EraseRequest(RequestMap& requests, RequestBook& book, RequestMap::iterator it, bool completed = false);

// How a request ends (implemented by the loop, Worker::Finish): its final chunk to its client (an error's, or none
// when its last chunk went already), the copies memd would free pages under waited for, its KV and slots released,
// Complete to memd; with memd away (and no StopAll) deferred to the re-Hello (RequestPhase::kEnding). No-op for an id
// not in flight.
//
// Drop: request `id` leaves without a Complete (memd holds no grant of it: its report was refused at a re-Hello, its KV
// released by ResidencyAgent::Forget): its proposer slot is released and it is erased (RequestBook::Close). The caller
// sent its client's last chunk and recorded its end. No-op for an id not in flight.
class RequestEnds {
 public:
  virtual void Finish(RequestId id, absl::Status error) = 0;
  virtual void Drop(RequestId id) = 0;

 protected:
  ~RequestEnds() = default;
};

}  // namespace dhs
