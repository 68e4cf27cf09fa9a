// workerd/request_book.h: the worker's book of requests in flight (issue 23, "one owner per request lifecycle"):
// each request's phase, its ids, its record, and the outputs of resumed requests that wait for their client.
//
// A request's life is ONE enum, RequestPhase, changed only through TransitionRequest(), which checks the move against
// kRequestTransitions (the pattern of memd/history_page.h). What used to be booleans beside a phase is either a phase
// (admission unsent, told to wait, paused while memd is away, ending while memd is away) or a counter of its token
// stream (TokenCounts: committed to memd, held from the client, what a re-attached client had); whether a client is
// attached is the client itself (RequestLife::client, absent while a resumed request waits for one).
//
//   phase      meaning                                                        left by
//   kUnsent    submitted while memd was away: its AdmitRequest goes after     the re-Hello (kWaiting), an end
//              the re-Hello
//   kWaiting   AdmitRequest sent, no answer yet                               AdmitWait, AdmitGrant, AdmitReject, an end
//   kQueued    memd answered AdmitWait (it does not fit in free memory now)   AdmitGrant, AdmitReject, an end
//   kGranted   AdmitGrant taken (slot, residency plan), not started yet       StartGranted (kActive), an end
//   kActive    stepping: prefill, then decode                                 memd away (kPaused), an end
//   kPaused    memd away: paused (held-token or tail bound)                   the re-Hello (kActive), an end
//   kEnding    ended while memd was away: its end (final chunk, Complete)     Close after the re-Hello
//              waits for the re-Hello; `ended_in` keeps the phase it left
// An end with memd up closes the request (Close) from any phase: it leaves the book.
//
// Ids (docs/protocol.md "Request ids"): the client's id (SubmitRequest.request) is the client's own; memd sees the
// node request id (NodeRequestId). The book maps (client peer, client id) to the node id of each attached request,
// and keeps the ids of requests ended while waiting for their grant until memd acknowledged their Complete (a grant
// that crossed the Complete is ignored, and the id is not handed out again meanwhile).
//
// The record (AdmitRequest.record, issue 11): RecordOf and SubmitOfRecord are the one function each way between a
// request's record and the submit it came from.
//
// Events in (Open, Transition, DeferEnd, Attach, Close, OnCompleteAck, KeepDetached, ...), decisions out (node ids,
// the granted ones to start, the outputs to drop); no sockets, no clocks (`now` is passed in), no model. The Worker
// keeps each request's model-side state beside its RequestLife.
//
// Invariants (CheckInvariants): see there.
//
// Thread-safety: none; the worker thread drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "dhs_generated.h"
#include "workerd/model/config.h"
#include "workerd/resumed_outputs.h"
#include "workerd/serving.h"

namespace dhs {

enum class RequestPhase : uint8_t { kUnsent, kWaiting, kQueued, kGranted, kActive, kPaused, kEnding };

std::string_view RequestPhaseName(RequestPhase phase);

// Every allowed move, with the event that makes it (nothing else may change a request's phase):
inline constexpr std::pair<RequestPhase, RequestPhase> kRequestTransitions[] = {
    {RequestPhase::kUnsent, RequestPhase::kWaiting},   // the re-Hello: its AdmitRequest sent
    {RequestPhase::kWaiting, RequestPhase::kQueued},   // AdmitWait
    {RequestPhase::kWaiting, RequestPhase::kGranted},  // AdmitGrant
    {RequestPhase::kQueued, RequestPhase::kGranted},   // AdmitGrant after AdmitWait
    {RequestPhase::kGranted, RequestPhase::kActive},   // StartGranted: its model session opens
    {RequestPhase::kActive, RequestPhase::kPaused},    // memd away: a bound reached (held tokens, tail full)
    {RequestPhase::kPaused, RequestPhase::kActive},    // the re-Hello
    {RequestPhase::kUnsent, RequestPhase::kEnding},    // ended while memd is away (any phase before kEnding)
    {RequestPhase::kWaiting, RequestPhase::kEnding},
    {RequestPhase::kQueued, RequestPhase::kEnding},
    {RequestPhase::kGranted, RequestPhase::kEnding},
    {RequestPhase::kActive, RequestPhase::kEnding},
    {RequestPhase::kPaused, RequestPhase::kEnding},
};

// Whether a request in `phase` waits for its grant (kUnsent, kWaiting, kQueued): the submit queue.
bool WaitsForGrant(RequestPhase phase);
// Whether a request in `phase` holds a model session and may step (kActive, kPaused).
bool Steps(RequestPhase phase);

// What memd's answer to an admission (AdmitGrant, AdmitReject: docs/protocol.md contract §2, one answer per
// AdmitRequest) meets in the book (RequestBook::AnswerTo):
//   kApplies          the request waits for it (kWaiting, kQueued): it is granted or rejected now
//   kCrossedComplete  not in the book, ended while waiting or by StopAll (StaleGrant): its Complete, sent before, goes
//                     to memd after this answer and releases a grant; nothing to do
//   kUnknown          not in the book and never ended here: a grant is handed back (ResidencyAgent::RefuseGrant), a
//                     reject is ignored
//   kNotWaiting       in the book but not waiting (granted already; unsent or ending while memd is away, which no
//                     answer reaches): a second answer breaks the contract and is ignored
enum class AdmissionAnswer : uint8_t { kApplies, kCrossedComplete, kUnknown, kNotWaiting };

// Counters of a request's token stream (positions in its generated tokens).
struct TokenCounts {
  // Generated tokens memd's record holds: acknowledged (TokenLedger::Acked), or carried by its AdmitRequest or a
  // re-Hello's report.
  size_t committed = 0;
  // memd refused this request's tokens alone (TokenLedger::Refused): its later tokens are not sent; the reason.
  absl::Status refused;
  size_t client_has = 0;  // tokens a re-attached client had (Attach.received): never streamed again
  // memd away: generated[held_from..] not streamed yet (they go to the client after the re-Hello); none when
  // nothing is held.
  std::optional<size_t> held_from;
};

// One request's life, as the book keeps it.
struct RequestLife {
  RequestId id = 0;         // the node request id (memd's)
  RequestId client_id = 0;  // the client's SubmitRequest.request
  // Where its replies go; absent while a resumed request waits for its client (Attach): its chunks wait in its
  // output meanwhile.
  std::optional<ClientRef> client;
  wire::SubmitRequestT submit;  // what the client asked (its record; the AdmitRequest sent again after a re-Hello)
  RequestPhase phase = RequestPhase::kWaiting;
  RequestPhase ended_in = RequestPhase::kWaiting;  // kEnding: the phase it was ended in
  absl::Status end_status;                          // kEnding: why it ends (the first end asked)
  TokenCounts tokens;

  // The phase before a deferred end (ended_in while kEnding, else phase): what the request holds.
  RequestPhase held_phase() const { return phase == RequestPhase::kEnding ? ended_in : phase; }
  // A resumed request as its client names it: (client identity, client id).
  ResumeKey key() const { return {submit.client, client_id}; }
};

// Moves `life` from `from` to `to`. Errors: FAILED_PRECONDITION when `life` is not in `from` or the move is not in
// kRequestTransitions (`life` is then unchanged). A move to kEnding records `from` in ended_in.
absl::Status TransitionRequest(RequestLife& life, RequestPhase from, RequestPhase to);

// The record memd keeps for a resume (AdmitRequest.record): the submit's input and sampling, the request's ids and
// its generated tokens with their logits digests (`tokens`, `digests`: the same length).
std::unique_ptr<wire::RequestRecordT> RecordOf(const RequestLife& life, std::span<const model::Token> tokens,
                                               std::span<const uint64_t> digests);
// The submit a record came from (RecordOf's inverse on the submit's fields; the tokens are the caller's).
wire::SubmitRequestT SubmitOfRecord(const wire::RequestRecordT& record);

// A resumed request's output that finished before its client attached (kept for its Attach).
struct DetachedOutput {
  std::vector<model::Token> tokens;
  std::vector<uint64_t> digests;
  absl::Status error;
};

class RequestBook {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // `gpu` < kMaxGpus; `limits` valid (ValidateResumedOutputLimits).
  RequestBook(GpuId gpu, ResumedOutputLimits limits);

  // The GPU's epoch from memd's HelloReply (>= 1; 1 until set; 0 counts as 1): part of every node request id.
  void set_epoch(uint64_t epoch) { epoch_ = epoch == 0 ? 1 : epoch; }
  uint64_t epoch() const { return epoch_; }

  // A client's submit (validated by the caller): a new request in kWaiting (kUnsent when `memd_away`), attached to
  // `client`, under a new node id. Errors, nothing changed: ALREADY_EXISTS (client.peer has submit.request in
  // flight), RESOURCE_EXHAUSTED "submit queue full (N)" (`submit_queue` requests wait for their grant already).
  absl::StatusOr<RequestLife*> Open(const wire::SubmitRequestT& submit, const ClientRef& client, bool memd_away,
                                    uint32_t submit_queue);
  // A resumed request (detached: no client until Attach) in kWaiting, under a node id that is not `avoid` (the
  // interrupted id it continues).
  RequestLife* OpenResumed(const wire::SubmitRequestT& submit, RequestId avoid) {
    return OpenDetached(submit, /*memd_away=*/false, avoid);
  }
  // A request without a client of the book's, in kWaiting (kUnsent when `memd_away`), under a node id that is not
  // `avoid`: a resumed request until its Attach, or (libdhs's EmbeddedWorker, issue 25) an engine's request, whose
  // caller is its client (submit.request 0: its node id from the counter). Never fails (no client id to collide).
  RequestLife* OpenDetached(const wire::SubmitRequestT& submit, bool memd_away, RequestId avoid = 0);

  // TransitionRequest on request `id`; a move to kGranted queues it for TakeGranted, a move from it leaves the
  // queue. Errors: NOT_FOUND (no such
  // request), TransitionRequest's.
  absl::Status Transition(RequestId id, RequestPhase from, RequestPhase to);
  // memd away: request `id` ends after the re-Hello with `why` (kEnding). A second end keeps the first `why`.
  // Errors: NOT_FOUND.
  absl::Status DeferEnd(RequestId id, absl::Status why);
  // The granted requests not started yet, in grant order; the queue is emptied.
  std::vector<RequestId> TakeGranted();
  // Issue 27: granted requests the next TakeGranted would start (the loop must not sleep on its sockets meanwhile).
  size_t granted_not_started() const { return granted_.size(); }

  // The client `client` attaches to detached request `id` (Attach, or a Cancel that answers it): it is found by
  // (client.peer, client id) from now on. Errors, nothing changed: NOT_FOUND, FAILED_PRECONDITION (a client is
  // attached already), ALREADY_EXISTS (client.peer has another request with that client id in flight).
  absl::Status AttachClient(RequestId id, const ClientRef& client);
  // The request `client_id` that `peer` has in flight, or nullptr.
  RequestLife* FindByClient(const std::string& peer, RequestId client_id);
  // The first detached request (node-id order: anonymous clients may share a key) of `key`, or nullptr.
  RequestLife* FindDetached(const ResumeKey& key);
  RequestLife* Find(RequestId id);
  const RequestLife* Find(RequestId id) const;
  // The node ids of `peer`'s attached requests, in (peer, client id) order.
  std::vector<RequestId> IdsOfPeer(const std::string& peer) const;

  // Request `id` leaves the book (ended, rejected, refused): its client id is free again and it leaves the granted
  // queue. `completed`: a Complete goes to memd for it; one whose AdmitRequest memd holds without a grant (held
  // phase kWaiting or kQueued) is then remembered until OnCompleteAck (StaleGrant). No-op for an unknown id.
  void Close(RequestId id, bool completed);
  // StopAll ends `id`: remembered until OnCompleteAck (StaleGrant, unacknowledged_stops).
  void MarkStopping(RequestId id) { stopping_.insert(id); }
  void OnCompleteAck(RequestId id);
  // Whether a grant for `id` is one that crossed its Complete (ended by StopAll or while waiting; not acknowledged).
  bool StaleGrant(RequestId id) const { return stopping_.contains(id) || ended_waiting_.contains(id); }
  // What memd's answer (AdmitGrant, AdmitReject) to request `id`'s admission meets here: ONE rule for workerd's
  // AdmissionDesk and libdhs's EmbeddedWorker (issue 25; they each wrote it). See AdmissionAnswer.
  AdmissionAnswer AnswerTo(RequestId id) const;
  size_t unacknowledged_stops() const { return stopping_.size(); }
  // A new memd took the re-Hello (docs/protocol.md "Re-Hello with a report"): the Completes it did not acknowledge
  // went to the dead memd, which answers none; the new one grants none of those ids (a journaled admission comes back
  // as an interrupted request, not a grant): forgotten (StaleGrant false, unacknowledged_stops 0).
  void ForgetUnacknowledged() {
    stopping_.clear();
    ended_waiting_.clear();
  }
  // The ids memd holds as interrupted (its HelloReply's list at a return; CarryOutReturn): a re-Hello keeps the
  // epoch, so one of them may be an id of this epoch that left the book, and memd rejects the admission of an id it
  // knows ("already known") until that request's Complete or takeover. NodeRequestId avoids them until the next
  // return replaces the list (review finding, 2026-12-03: a resume took such an id and was rejected: lost).
  void HeldByMemd(const std::vector<RequestId>& ids) { held_by_memd_ = std::set<RequestId>(ids.begin(), ids.end()); }

  // A node request id for client id `client_id` (docs/protocol.md "Request ids", worker.h Submit): gpu | epoch | n,
  // n = client_id when in [1, 2^24) and free, else the next free value of the counter; never `avoid`, an id in the
  // book, an id ended while waiting whose CompleteAck has not come, or an id memd holds as interrupted (HeldByMemd).
  RequestId NodeRequestId(RequestId client_id, RequestId avoid = 0);

  // A resumed request's output kept for its client's Attach under the bound: returns the outputs dropped now
  // (already erased here; the caller logs and counts them).
  std::vector<DroppedOutput> KeepDetached(const ResumeKey& key, DetachedOutput output, TimePoint now);
  // Its client attached: the output, forgotten here; nullopt when none is kept for `key`.
  std::optional<DetachedOutput> ClaimDetached(const ResumeKey& key);
  // The outputs kept for the age bound or longer as of `now`, erased here.
  std::vector<DroppedOutput> ExpireDetached(TimePoint now);
  size_t detached_outputs() const { return detached_done_.size(); }

  const std::map<RequestId, RequestLife>& requests() const { return requests_; }
  // Requests whose held phase waits for the grant (the submit queue); that steps (kActive, kPaused); that do not.
  uint32_t waiting_for_grant() const;
  uint32_t active() const;
  uint32_t not_active() const;

  // INTERNAL naming the broken invariant, else OK. O(requests + outputs). Invariants: every node id is of this GPU
  // with n in [1, 2^24); each (peer, client id) maps to an attached request of that peer and client id, and no
  // detached request is mapped; the granted queue holds exactly the kGranted requests, once each; a kEnding request
  // has a held phase before kEnding, any other has no end status; no id in the book is among those ended while
  // waiting; the kept outputs are exactly those the bound counts (and the bound's invariants hold).
  absl::Status CheckInvariants() const;

 private:
  RequestLife* Insert(RequestLife life);

  GpuId gpu_;
  uint64_t epoch_ = 1;
  uint64_t next_node_ = 1;  // the counter of NodeRequestId
  std::map<RequestId, RequestLife> requests_;  // ordered: the batch order is stable
  std::map<std::pair<std::string, RequestId>, RequestId> client_ids_;  // (client peer, client id) -> node id
  std::deque<RequestId> granted_;                                       // granted, not started yet
  std::set<RequestId> stopping_;       // StopAll's Completes not acknowledged yet
  std::set<RequestId> ended_waiting_;  // ended while waiting for their grant, CompleteAck not come
  std::set<RequestId> held_by_memd_;   // HeldByMemd: memd's interrupted ids at the latest return
  std::map<ResumeKey, DetachedOutput> detached_done_;
  ResumedOutputBound resumed_bound_;  // which of detached_done_ to drop
};

}  // namespace dhs
