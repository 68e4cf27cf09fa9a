// workerd/worker.h: the batching loop of one worker (brief §3, §5, §7, §11): continuous batching over the built-in
// model, the three KV modes; the memd conversation is delegated to a ResidencyAgent (workerd/residency_agent.h) and the
// sizes to workerd/geometry.h.
//
// Owns the KV store of its GPU with its residency and the ResidencyAgent through a KvStack (workerd/kv_stack.h, the
// wiring libdhs's EmbeddedWorker shares: ResidentKvAccess in `resident` mode with a NoKvResidency, HierarchicalKvAccess
// otherwise, which is also the agent's KvResidency), the requests' model sessions and the worker's
// rooms (issue 23, "one owner per request lifecycle"; workerd/README.md): the RequestBook (each request's phase, ids,
// record), the admission side and memd's answers (AdmissionDesk, workerd/admission.h: AdmissionAnswers, Resume), the
// memd-away handling (MemdAway, workerd/memd_away.h), the client side (ClientStreams, workerd/client_streams.h), the
// stats recorder (WorkerRecorder, workerd/worker_stats.h), the prepared-prefix import (PrefixImporter,
// workerd/prefix_import.h), the resume importer and the speculative rounds. They share the request map
// (workerd/worker_request.h) and end a request through RequestEnds (Finish, here). Sockets are not its business:
// memd is reached through a MemdLink (via the agent and the rooms) and answers through memd_inbox() (libdhs's
// MemdHandler: memd's orders stay on the KV side, its answers go to admission());
// clients submit through the Submitter interface and are answered through a ClientSink.
//
// The loop (Iterate, one call per iteration): (1) the agent reports KV completions to memd and advances its orders;
// (2) start granted requests; (3) one Model::Step over every active request: a chunk of the prompt for a prefilling
// request, the last generated token for a decoding one (a prepared prefix is imported with Model::ImportPrefix chunk
// by chunk, its last token joins the step); (4) sample (greedy at temperature 0, else the counter-based sampler keyed
// by (seed, client id, token index)), stream a TokenChunk per token with its logits digest, end finished requests
// (the agent sends Complete, KV released). A failed batched step rebuilds each request of the batch alone (its KV
// replayed from its tokens, bit-identical by batch invariance, brief §11); a request whose own step still fails ends
// with an error chunk.
//
// Committed tokens (issue 11, resume): memd keeps each request's record (AdmitRequest.record: input, sampling,
// max_new, client id) and, per step, one TokensCommitted with the step's tokens, queued on the memd socket before the
// step's TokenChunks go to the clients. One TokensCommitted is in flight at a time (MemdClient): while memd has not
// acknowledged it, later steps' tokens wait in the request and go with the next message (so a dead memd never fills
// the worker's queue); the chunks stream anyway, without waiting for memd (a round trip per step). So a killed worker
// can leave the client with tokens memd's record lacks (its last steps), or the record with the last step's token the
// client lacks (killed between the two sends): both are prefixes of one stream. Nothing is lost or repeated in the
// client's stream: the resumed worker regenerates from the record's end with the same keyed draws (exact: DrawKey,
// batch invariance) and the re-attaching client says how many tokens it has (Attach): only later ones are sent.
//
// Modes (WorkerMode): resident: every row on GPU, required pages = whole context; hisparse: hierarchical KV, every
// completed page backed up to its host page, no optional history; adaptive: hierarchical with resident-first optional
// history (brief §4): completed imported pages with a granted optional GPU page are kept there without host backup,
// backed up only on a ReclaimOrder.
//
// Thread-safety: none; one worker thread drives every method.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "dhs_generated.h"
#include "workerd/admission.h"
#include "workerd/client_streams.h"
#include "workerd/device/device.h"
#include "workerd/geometry.h"
#include "workerd/kv/hierarchical_kv_access.h"
#include "workerd/kv_stack.h"
#include "libdhs/embedded_worker.h"
#include "libdhs/kv_port.h"
#include "workerd/kv_access.h"
#include "workerd/memd_away.h"
#include "workerd/memd_link.h"
#include "workerd/model/model.h"
#include "workerd/prefix_import.h"
#include "workerd/request_book.h"
#include "workerd/token_ledger.h"
#include "workerd/residency_agent.h"
#include "workerd/resume_import.h"
#include "workerd/serving.h"
#include "workerd/speculative_rounds.h"
#include "workerd/worker_request.h"
#include "workerd/worker_stats.h"

namespace dhs {

class Worker final : public Submitter, private RequestEnds {
 public:
  // `model`, `device`, `memd`, `client` must outlive the Worker. `memd` answered this worker's Hello (MakeHello): its
  // host pool (mapped, segment 0; may be empty in resident mode), epoch and interrupted requests are read from it.
  // The KV side is opened through libdhs (lib::EmbeddedWorker::OpenOver over `memd` and `device` with
  // EmbeddedConfigOf's shape). Errors: INVALID_ARGUMENT (config, see ComputeGeometry; a shape libdhs refuses),
  // FAILED_PRECONDITION (a hierarchical mode without a host pool), RESOURCE_EXHAUSTED (device).
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const model::Model* model, Device* device,
                                                        const WorkerConfig& config, MemdTransport* memd,
                                                        ClientSink* client);
  ~Worker() override;

  // A client's request. Validates it (ValidateSubmit; an id the same client (ClientRef.peer) has in flight ->
  // ALREADY_EXISTS; config.submit_queue requests already waiting for their grant -> RESOURCE_EXHAUSTED "submit queue
  // full (N)"), gives it a node request id (RequestBook::NodeRequestId), sends SubmitAccepted to the client and
  // AdmitRequest to memd (memd away: after the re-Hello, kUnsent). A returned error is the client's ErrorReply; nothing
  // else changed.
  //
  // Request ids: the client's id (SubmitRequest.request) is the client's own and is any uint64; the client sees it in
  // SubmitAccepted and every TokenChunk. memd and every message to it see the node request id:
  // (gpu << 48) | ((epoch - 1) mod 2^24) << 24 | n with n in [1, 2^24), unique among this worker's requests in flight,
  // so two workers never collide, a restarted worker (a new epoch, book().set_epoch) never reuses an id of the
  // interrupted requests memd still holds from the previous epochs, and 0 / 2^64-1 (reserved by memd) are never used.
  // n is the client's id when that is in range and free (dhsctl then shows the client's id on GPU 0, epoch 1), else
  // the next free value of a per-worker counter.
  absl::Status Submit(const wire::SubmitRequestT& submit, const ClientRef& client) override;
  // A client (re-)attaches to the resumed request `client_id` of client identity `client_identity` (Attach.client =
  // the SubmitRequest.client it was submitted with; 0 = none) having `received` tokens of it: SubmitAccepted, then
  // one TokenChunk with the tokens from `received` on that are known now (final when the request finished), and
  // from then on the request streams to `client` as a submitted one; tokens below `received` are never sent again.
  // Resumed requests (AdmissionDesk::Resume) are found by (client_identity, client_id): two clients that used the same
  // ids each get their own. Errors: NOT_FOUND (no resumed request with that key waits for a client, or its output was
  // dropped unclaimed), ALREADY_EXISTS (`client` has another request with that id in flight; nothing changed).
  // ClientStreams::Attach.
  absl::Status Attach(RequestId client_id, uint32_t received, const ClientRef& client,
                      uint64_t client_identity = 0) override;
  // Cancel (issue 22; docs/protocol.md "Cancel"): ends the request `client_id` of `client` (found by (client.peer,
  // client_id) as Submit keys it, else, for a resumed request no client re-attached to, by (client_identity,
  // client_id)) as a failed one: its final TokenChunk carries RequestCancelledError(reason) (error CANCELLED,
  // end_reason CANCELLED) and, through Finish, the copies memd would free pages under are waited for, its KV, slot
  // and speculation slot are released and memd gets its Complete, whatever its phase (waiting for its grant,
  // prefilling, decoding; between two iterations no speculative round is open). A resumed request nobody re-attached
  // to gets its final chunk on `client` (the Cancel's sequence) and is not kept for an Attach. With memd away the
  // end (chunk and Complete) waits for the re-Hello, as every end does. Errors: NOT_FOUND (no such request in flight:
  // unknown, finished, or already ending); nothing changed. `reason` is cut to 256 bytes. ClientStreams::Cancel.
  absl::Status Cancel(RequestId client_id, uint64_t client_identity, const ClientRef& client,
                      std::string_view reason) override;
  wire::WorkerStatsReplyT StatsReply() const override;
  // The worker's timelines of client id `client_request` (submitted, first_token, end; at most
  // kWorkerTimelineLimits), as WorkerStatsReply.timeline_json (WorkerRecorder::TimelineJson).
  std::string TimelineJson(uint64_t client_request) const override { return recorder_.TimelineJson(client_request); }

  // At start (WorkerProcess::Start, before any submit): every interrupted request of this GPU that memd's HelloReply
  // lists, as libdhs lists it (lib::EmbeddedWorker::TakeResumable: after a restart, "list what can be resumed"), is
  // resumed from its record or, without one, ended (AdmissionDesk::ResumeOrEnd). Errors: UNAVAILABLE (memd
  // unreachable).
  absl::Status ResumeInterrupted();
  // One iteration of the serving loop (header comment). Returns whether work remains (requests active, waiting for a
  // grant, or orders in flight). Errors: UNAVAILABLE once a message to memd could not be sent (the conversation is
  // broken); request failures end their request.
  absl::StatusOr<bool> Iterate();
  // The worker stops (SIGTERM, docs/operations.md): every unfinished request (waiting for its grant, granted or
  // active) ends as a failed one would: a final TokenChunk with `why` to its client, then (once the copies memd would
  // free pages under ended, as for any end) Complete to memd, memd away or not. Returns how many requests were ended
  // (book().unacknowledged_stops() counts those whose CompleteAck has not come). New submits should not be served
  // afterwards (WorkerProcess::Shutdown no longer reads the serving socket).
  size_t StopAll(const absl::Status& why);

  // memd's messages: the MemdHandler MemdClient::Poll (or a test's fake memd) dispatches to. libdhs's
  // (lib::EmbeddedWorker::InboxFor): memd's orders are carried out on the KV side (held while the model's readers are
  // outstanding, until the next Iterate; dropped when memd dies), the answers go to admission().
  MemdHandler& memd_inbox() { return *inbox_; }
  // The rooms (workerd/README.md):
  // memd's answers (AdmitGrant, AdmitWait, AdmitReject, CompleteAck, the tokens') and the resume of interrupted
  // requests.
  AdmissionDesk& admission() { return *admission_; }
  // memd away and its return: Enter, Report, Return (the re-Hello), away().
  MemdAway& memd_away() { return *away_; }
  // The client side: EndClient (a client gone), the streams.
  ClientStreams& clients() { return *clients_; }
  // Every request's phase and ids: set_epoch (memd's HelloReply.epoch, part of every node request id), active() /
  // not_active() (requests stepping / not), unacknowledged_stops() (StopAll's Completes not acknowledged).
  RequestBook& book() { return book_; }
  const RequestBook& book() const { return book_; }

  // The counters since start, the other rooms' included.
  WorkerStats stats() const;
  // INTERNAL naming the broken invariant, else OK. The book's and the token ledger's invariants hold; the requests
  // served here are exactly the book's, each pointing at its own entry; a request's committed count (memd's record)
  // never passes its generated tokens. Checked after every event by the worker fuzz target and the in-process fake
  // memd (tests/workerd/worker_test_util.h Pump), as EmbeddedWorker::CheckInvariants is for libdhs.
  // O(requests + ledger entries).
  absl::Status CheckInvariants() const;
  // Per resumed request (by client id), once its first new token came (AdmissionDesk::Resume): its history's rows
  // imported from host (pages with a confirmed host copy) and recomputed from its tokens (pages without one, and the
  // tail), in rows, and the time from Resume to that token, us. Kept for the worker's life (one entry per resume;
  // ResumeImporter).
  using ResumeFigures = dhs::ResumeFigures;
  const std::map<RequestId, ResumeFigures>& resume_figures() const { return resumes_->figures(); }
  const WorkerGeometry& geometry() const { return geometry_; }
  // Copies and orders in flight (Heartbeat.pending_copies).
  uint32_t pending_orders() const { return lib_->stack().pending_orders(); }  // held ones included
  // Test/introspection: the hierarchical KV store, or nullptr in resident mode. Its staging_bytes() are the staging
  // arenas allocated at start (brief §6: M_stage = χ * N * K_max * k * d_KV, K_max = --block;
  // WorkerGeometry::staging_bytes; 0 without: speculation off, --staging-arenas 0), WorkerStatsReply.staging_bytes.
  HierarchicalKvAccess* hierarchical() { return hier_; }
  // Test/introspection: libdhs's data path the model's KV calls go through (libdhs/kv_port.h), in every mode (resident
  // mode's store is KvStack's resident PortStore: no tail bound, no host tier).
  const lib::KvPort* kv_port() const { return port_; }
  lib::KvPort* kv_port() { return port_; }

 private:
  using Request = WorkerRequest;
  // One request's part of a step: its tokens, and whether the step's last logits give its next token.
  struct BatchItem {
    Request* r;
    std::vector<model::Token> tokens;
    bool emits;
    bool round = false;        // a speculative round: tokens = anchor then draft.tokens (SpeculativeRounds)
    spec::DraftResult draft;
  };
  Worker(const model::Model* model, Device* device, WorkerConfig config, WorkerGeometry geometry, MemdLink* memd);
  // RequestEnds: ends request `id` (worker_request.h). memd away (and no StopAll): deferred to the re-Hello (kEnding).
  void Finish(RequestId id, absl::Status error) override;
  // RequestEnds: request `id` leaves without a Complete (a refused report; MemdAway::EndRefused).
  void Drop(RequestId id) override;
  // The active requests' next tokens (importing prepared-prefix chunks first; a failed import ends its request).
  std::vector<BatchItem> CollectBatch();
  // After a failed batched step: each request rebuilt from its tokens and stepped alone (brief §11).
  void RetryAlone(std::vector<BatchItem>& items);
  // Host-page integrity (issue 22): fails with DATA_LOSS every request the KV found with a changed host page
  // (HierarchicalKvAccess::TakeDataLoss), first removing its entries from `items` (when given).
  void FailDataLoss(std::vector<BatchItem>* items = nullptr);
  absl::Status RunBatch();
  // Speculation (SpeculativeRounds; brief §6): decoding items the rounds open get the proposer's tokens (one
  // Propose for the batch) and their rows from n_r + 1 on held unverified.
  void AddProposals(std::vector<BatchItem>& items);
  // A verified round (SpeculativeRounds::Finish): its A_r + 1 tokens emitted (each with its query's logits digest).
  // An error fails the request. hidden: the pass's hidden states (empty unless SpeculativeRounds::WantsHidden).
  absl::Status FinishRound(BatchItem& item, std::span<const float> logits, std::span<const float> hidden);
  // Rebuilds r's KV from its tokens: released and planned again (ResidencyAgent::RebuildKv), its first r.fed tokens
  // fed again in chunks (bit-identical, brief §11).
  absl::Status ReplayFed(Request& r);
  // Samples r's next token (DrawKey{seed, client id, t}) and queues it for CommitStep.
  void EmitToken(Request& r, std::span<const float> logits);
  // Appends `token` (its logits' digest) to r's output and queues it for CommitStep.
  void RecordToken(Request& r, model::Token token, std::span<const float> logits);
  // The step's tokens: one TokensCommitted to memd (with any tokens an earlier step could not queue), then one
  // TokenChunk per request to its client (ClientStreams::Stream); memd away: held from the clients (MemdAway::Hold).
  // A TokensCommitted that cannot be queued is logged; the tokens still stream.
  void CommitStep();

  const model::Model* model_;
  Device* device_;
  WorkerConfig config_;
  WorkerGeometry geometry_;
  MemdLink* memd_;
  // The KV side, libdhs's (issue 25, "workerd uses it"): the EmbeddedWorker opened over memd_ and device_ owns the
  // KV store, its residency and the ResidencyAgent (its KvStack, workerd/kv_stack.h) and the data path over them
  // (port_: libdhs/kv_port.h, the object behind dhs_request_append_source, dhs_resolve, dhs_readers_done,
  // dhs_request_hold / commit). Every mode: the model reaches the store only through it: kv_ is port_kv_, a
  // PortKvAccess over port_. hier_ (nullptr in resident mode) and agent_ point into it. Declared before every room
  // that uses them (destroyed after them). memd's messages arrive through it (memd_inbox(): orders carried out there);
  // the admission and memd's answers are still the Worker's (AdmissionDesk).
  std::unique_ptr<lib::EmbeddedWorker> lib_;
  lib::KvPort* port_ = nullptr;
  std::unique_ptr<lib::PortKvAccess> port_kv_;
  KvAccess* kv_ = nullptr;
  HierarchicalKvAccess* hier_ = nullptr;
  ResidencyAgent* agent_ = nullptr;  // the memd conversation
  RequestBook book_;  // every request's lifecycle, ids and the resumed outputs waiting for their client
  TokenLedger ledger_;  // which tokens go to memd's records next (one TokensCommitted in flight, the probe queue)
  RequestMap requests_;  // ordered: the batch order is stable
  WorkerRecorder recorder_;
  std::unique_ptr<ResumeImporter> resumes_;  // resumed requests' host imports and figures
  std::unique_ptr<SpeculativeRounds> rounds_;  // --speculate: proposer, width schedule, slots
  std::unique_ptr<PrefixImporter> prefixes_;   // prepared-prefix imports through the row cache
  std::unique_ptr<ClientStreams> clients_;
  std::unique_ptr<AdmissionDesk> admission_;
  MemdHandler* inbox_ = nullptr;  // libdhs's handler of memd's messages (lib_->InboxFor(*admission_))
  std::unique_ptr<MemdAway> away_;
  std::vector<RequestId> step_tokens_;  // requests that produced a token in this step (RecordToken -> CommitStep)
  bool stopping_all_ = false;  // StopAll: ends happen now, memd away or not
  size_t last_batch_ = 0;    // requests in the latest step
};

}  // namespace dhs
