// workerd/worker.h: the batching loop of one worker (brief §3, §5, §7, §11): continuous batching over the built-in
// model, the three KV modes; the memd conversation is delegated to a ResidencyAgent (workerd/residency_agent.h) and the
// sizes to workerd/geometry.h.
//
// Owns the KV store of its GPU (ResidentKvAccess in `resident` mode with a NoKvResidency, HierarchicalKvAccess
// otherwise, which is also the agent's KvResidency), the requests' model sessions and the ResidencyAgent. Sockets are
// not its business: memd is reached through a MemdLink (via the agent) and answers through the MemdHandler methods;
// clients submit through the Submitter interface and are answered through a ClientSink.
//
// The loop (Iterate, one call per iteration): (1) the agent reports KV completions to memd and advances its orders;
// (2) start granted requests; (3) one Model::Step over every active request: a chunk of the prompt for a prefilling
// request, the last generated token for a decoding one (a prepared prefix is imported with Model::ImportPrefix chunk
// by chunk, its last token joins the step); (4) sample (greedy at temperature 0, else the counter-based sampler keyed by (seed, client id, token index)), stream a
// TokenChunk per token with its logits digest, end finished requests (the agent sends Complete, KV released). A
// failed batched step rebuilds each request of the batch alone (its KV replayed from its tokens, bit-identical by
// batch invariance, brief §11); a request whose own step still fails ends with an error chunk.
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

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/prometheus.h"
#include "common/request_timeline.h"
#include "dhs_generated.h"
#include "workerd/device/device.h"
#include "workerd/geometry.h"
#include "workerd/kv/hierarchical_kv_access.h"
#include "workerd/kv_access.h"
#include "workerd/memd_link.h"
#include "workerd/model/model.h"
#include "workerd/model/sampling.h"
#include "workerd/prefix_cache.h"
#include "workerd/request_book.h"
#include "workerd/residency_agent.h"
#include "workerd/resume_import.h"
#include "workerd/serving.h"
#include "workerd/speculative_rounds.h"

namespace dhs {

// Counters since start (WorkerStatsReply).
struct WorkerStats {
  Census census;                 // summed over groups
  uint64_t reclaims_obeyed = 0;
  uint64_t pages_reclaimed = 0;
  uint64_t pages_populated = 0;
  uint64_t pages_kept = 0;
  uint64_t pages_backed_up = 0;
  uint64_t finished_requests = 0;
  uint64_t failed_requests = 0;
  uint64_t tokens_generated = 0;
  uint64_t prefix_blocks_imported = 0;  // prepared-prefix blocks imported from the row cache (not computed)
  uint64_t prefix_blocks_computed = 0;  // prepared-prefix blocks computed (and offered to the cache)
  uint64_t submits_refused = 0;         // submits refused with "submit queue full"
  uint64_t requests_resumed = 0;        // interrupted requests of an earlier epoch resumed (Resume)
  uint64_t rows_recomputed = 0;         // rows those resumed requests recomputed from their tokens, rows
  uint64_t rows_imported = 0;           // rows they imported from host instead (pages with a confirmed host copy)
  uint64_t resume_us_max = 0;           // the longest resume (Resume to its first new token), us
  uint64_t commits_deferred = 0;        // steps whose tokens went to memd with a later step (one message in flight)
  uint32_t waiting_requests_peak = 0;   // the most requests waiting for their grant at once
  uint64_t memd_aways = 0;              // times memd died under this worker (EnterAway)
  uint64_t tokens_while_away = 0;       // tokens generated while memd was away (held from clients until it was back)
  uint64_t paused_while_away = 0;       // requests paused while memd was away (held-token or tail bound)
  uint64_t resumed_outputs_dropped = 0; // resumed outputs dropped unclaimed (config.resumed_outputs bound)
  // Host-page integrity (issue 22; HierarchicalKvAccess::host_integrity):
  HostIntegrityCounters host_integrity;  // pages checksummed / verified (bytes) / mismatched
  uint64_t requests_cancelled = 0;      // requests ended by their client's Cancel (issue 22)
  // Speculation (--speculate; workerd/speculative_rounds.h RoundCounters):
  uint64_t spec_rounds = 0;          // verified rounds (K_r >= 2)
  uint64_t spec_round_tokens = 0;    // tokens those rounds emitted: sum of A_r + 1
  uint64_t spec_proposed = 0;        // proposals verified: sum of K_r - 1
  uint64_t spec_accepted = 0;        // proposals accepted: sum of A_r
  uint64_t spec_propose_us = 0;      // time in Proposer::Propose, us (the synthetic proposer's target steps)
  std::vector<uint64_t> spec_width_rounds;  // [K] = rounds of K_r = K queries (index 0 and 1 unused)
  // Metrics (issue 22; docs/operations.md "Worker metrics"), us:
  LatencyHistogram ttft = MakeLatencyHistogram();            // submit (a resume: its start) to its first token
  LatencyHistogram tpot = MakeLatencyHistogram();            // between a request's consecutive tokens
  LatencyHistogram admission_wait = MakeLatencyHistogram();  // submit to AdmitGrant
  std::map<std::string, uint64_t> failures;  // failed_requests by reason (FailureReason), sums to failed_requests
};

// The reason label of a failed request: its status code's name in lower case ("unavailable", "resource_exhausted",
// "invalid_argument", ...).
std::string FailureReason(const absl::Status& error);


// The worker's timeline bound (common/request_timeline.h): the latest 1024 requests, 8 events each (it records at most
// submitted, first_token and end per request).
inline constexpr TimelineLimits kWorkerTimelineLimits{1024, 8};

class Worker final : public MemdHandler, public Submitter {
 public:
  // `model`, `device`, `memd`, `client` must outlive the Worker. `host_pool`: the mapped host-pool pages of segment 0
  // (HostPoolSegment::PageData(0), pages * page_bytes bytes); may be empty in resident mode.
  // Errors: INVALID_ARGUMENT (config, see ComputeGeometry; host pool not whole pages), RESOURCE_EXHAUSTED (device).
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const model::Model* model, Device* device,
                                                        const WorkerConfig& config, std::span<uint8_t> host_pool,
                                                        MemdLink* memd, ClientSink* client);
  ~Worker() override;

  // A client's request. Validates it (ValidateSubmit; an id the same client (ClientRef.peer) has in flight ->
  // ALREADY_EXISTS; config.submit_queue requests already waiting for their grant -> RESOURCE_EXHAUSTED "submit queue
  // full (N)"), gives it a node request id (NodeRequestId), sends SubmitAccepted to the client and AdmitRequest
  // to memd. A returned error is the client's ErrorReply; nothing else changed.
  //
  // Request ids: the client's id (SubmitRequest.request) is the client's own and is any uint64; the client sees it in
  // SubmitAccepted and every TokenChunk. memd and every message to it see the node request id:
  // (gpu << 48) | ((epoch - 1) mod 2^24) << 24 | n with n in [1, 2^24), unique among this worker's requests in flight,
  // so two workers never collide, a restarted worker (a new epoch, set_epoch) never reuses an id of the interrupted
  // requests memd still holds from the previous epochs, and 0 / 2^64-1 (reserved by memd) are never used. n is the
  // client's id when that is in range and free (dhsctl then shows the client's id on GPU 0, epoch 1), else the next
  // free value of a per-worker counter.
  absl::Status Submit(const wire::SubmitRequestT& submit, const ClientRef& client) override;

  // One iteration of the serving loop (header comment). Returns whether work remains (requests active, waiting for a
  // grant, or orders in flight). Errors: UNAVAILABLE once a message to memd could not be sent (the conversation is
  // broken); request failures end their request.
  absl::StatusOr<bool> Iterate();

  // The worker stops (SIGTERM, docs/operations.md): every unfinished request (waiting for its grant, granted or
  // active) ends as a failed one would: a final TokenChunk with `why` to its client, then (once the copies memd would
  // free pages under ended, as for any end) Complete to memd. Returns how many requests were ended. New submits
  // should not be served afterwards (WorkerProcess::Shutdown no longer reads the serving socket).
  size_t StopAll(const absl::Status& why);
  // The client `peer` went away (its connection is gone): each of its unfinished requests ends as a failed one
  // (`why`), its pages return to memd (Complete). Returns how many ended.
  size_t EndClient(const std::string& peer, const absl::Status& why);
  // Resumes an interrupted request of an earlier epoch of this GPU (HelloReply.interrupted_records; issue 11): admits
  // it again under a new node id with its record, committed tokens included, as a resume of the interrupted id
  // (AdmitRequest.host_backed + resume_of: memd hands the new id EVERY kept host page of the interrupted one and ends
  // the interrupted id in that event). Of its n tokens (input, then the committed tokens), each page wholly before the
  // last token ((n-1) / p pages) that the grant names host-backed (AdmitGrant.host_backed_pages) is imported from
  // host, never computed (its index keys read from its host page, its payload host-resident:
  // HierarchicalKvAccess::ImportHostPages / ImportHostRows; rows_imported counts them); every other row (pages
  // without a confirmed copy, and the tail) is recomputed from the tokens (rows_recomputed), in position order with
  // the imports, so each recomputed row reads exactly the earlier rows and index keys an uninterrupted run had; then
  // decoding continues at token t = committed, drawn at (seed, client id, t), so the tokens equal those of an
  // uninterrupted run. Resident mode, or nothing kept: everything is recomputed. It has no client until one Attaches
  // (its tokens wait in the request); it is found by (record.client, record.client_request), the client's identity
  // and id (ResumeKey).
  // A request whose record holds all max_new tokens is not admitted (its interrupted id is ended with Complete): it
  // waits finished for its client. A finished output waits under config.resumed_outputs (ResumedOutputBound: count,
  // bytes, age); one dropped is logged and counted (WorkerStatsReply.resumed_outputs_dropped). Errors: INVALID_ARGUMENT (the record is not a valid submit, or holds more tokens
  // than max_new: the interrupted id is ended with Complete, nothing admitted), UNAVAILABLE (memd unreachable).
  // `interrupted` = 0: a request memd holds nothing of (a re-Hello's refused report): admitted afresh with its record
  // (every row recomputed), nothing is ended.
  absl::Status Resume(RequestId interrupted, const wire::RequestRecordT& record);
  // Lost ends (README.md "Restart: a finished request's end"): the outputs of requests the GPU's previous worker
  // finished (HelloReply.finished_records: every token, no input), each kept for its client's Attach as a resumed
  // request's finished output (the same bound; nothing is admitted, no Complete). A record whose tokens are not all
  // there (tokens != max_new_tokens or digests' length differs) is logged and skipped. Returns how many were kept.
  size_t KeepFinishedOutputs(const std::vector<std::unique_ptr<wire::RequestRecordT>>& records);
  // A client (re-)attaches to the resumed request `client_id` of client identity `client_identity` (Attach.client =
  // the SubmitRequest.client it was submitted with; 0 = none) having `received` tokens of it: SubmitAccepted, then
  // one TokenChunk with the tokens from `received` on that are known now (final when the request finished), and
  // from then on the request streams to `client` as a submitted one; tokens below `received` are never sent again.
  // Resumed requests are found by (client_identity, client_id): two clients that used the same ids each get their own.
  // Errors: NOT_FOUND (no resumed request with that key waits for a client, or its output was dropped unclaimed),
  // ALREADY_EXISTS (`client` has another request with that id in flight; nothing changed).
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
  // unknown, finished, or already ending); nothing changed. `reason` is cut to 256 bytes.
  absl::Status Cancel(RequestId client_id, uint64_t client_identity, const ClientRef& client,
                      std::string_view reason) override;
  // The GPU's epoch from memd's HelloReply (>= 1; 1 until set): part of every node request id (Submit).
  void set_epoch(uint64_t epoch) { book_.set_epoch(epoch); }
  // HelloReply.interrupted_requests (with interrupted_records): each one this worker neither serves nor ended is
  // resumed (Resume) when it has a record, else ended (Complete); one this worker ended already (its Complete went to
  // a memd that died), or one it still waits a grant for (the dead memd's grant never came), is ended (Complete:
  // a waiting one is admitted again afterwards). Errors: UNAVAILABLE (memd unreachable); a record that cannot be
  // resumed is logged and its request ended.
  absl::Status ResumeInterrupted(std::span<const uint64_t> ids,
                                 const std::vector<std::unique_ptr<wire::RequestRecordT>>& records);

  // memd away (issue 11, docs/protocol.md "Re-Hello with a report"). EnterAway: memd died (its connection closed);
  // its orders are resolved locally (ResidencyAgent::EnterAway) and, until ReturnFromAway, the worker keeps decoding
  // its granted requests from the GPU without writing a host page (HierarchicalKvAccess::PauseHostWrites): nothing is
  // sent to memd; submits are accepted and wait (their AdmitRequest goes after the re-Hello); the step's tokens are
  // held from the clients (memd's record must have them first); a request pauses when its held tokens reach
  // config.away_held_tokens or its next step would need a host write (its tail is full); a request that ends (finished,
  // failed, its client gone) stays until the re-Hello (RequestPhase::kEnding), then ends as usual. The state is the
  // link's MemdSession (MemdSession::TakeLoss: once per death; from kConnected too, for an in-process caller).
  void EnterAway();
  // Whether this worker serves away (EnterAway .. ReturnFromAway; its link's MemdSession::serving_away()).
  bool away() const { return memd_->session().serving_away(); }
  // The re-Hello's report (Hello.report): one ReportedRequest per granted request: slot, required pages, pages
  // (ResidencyAgent::Report), AdmitRequest.complete_pages, optional_history and its record with every token it
  // generated.
  std::vector<std::unique_ptr<wire::ReportedRequestT>> Report() const;
  // memd accepted the re-Hello (`reply`): each refused report's request ends here like after a fence (its client gets
  // a final UNAVAILABLE "worker epoch ended: memd refused its report: ..." and re-attaches; it is resumed from memd's
  // interrupted record, or from this worker's record when memd holds none); the adopted ones' held tokens go to their
  // clients (the report carried them), their written host copies are reported again, host writes resume, the ends
  // deferred while away happen (Complete), the interrupted requests are resumed (ResumeInterrupted) and the waiting
  // admissions are sent again (who is refused, adopted or sent again: PlanReturn). The link's session is connected
  // afterwards (MemdClient moved it on the reply; an in-process caller's is moved here). Errors: UNAVAILABLE (memd
  // unreachable).
  absl::Status ReturnFromAway(const wire::HelloReplyT& reply);
  // Requests ended by StopAll whose CompleteAck has not come yet.
  size_t unacknowledged_stops() const { return book_.unacknowledged_stops(); }

  // MemdHandler: memd's messages (contract §2, §4, §5, §6).
  void OnAdmitGrant(const wire::AdmitGrantT& m) override;
  void OnAdmitWait(const wire::AdmitWaitT& m) override;
  void OnAdmitReject(const wire::AdmitRejectT& m) override;
  void OnReclaimOrder(const wire::ReclaimOrderT& m) override;
  void OnRetire(const wire::RetireT& m) override;
  void OnPopulateOrder(const wire::PopulateOrderT& m) override;
  void OnCompleteAck(const wire::CompleteAckT& m) override;

  WorkerStats stats() const;
  // Per resumed request (by client id), once its first new token came (Resume): its history's rows imported from host
  // (pages with a confirmed host copy) and recomputed from its tokens (pages without one, and the tail), in rows, and
  // the time from Resume to that token, us. Kept for the worker's life (one entry per resume; ResumeImporter).
  using ResumeFigures = dhs::ResumeFigures;
  const std::map<RequestId, ResumeFigures>& resume_figures() const { return resumes_->figures(); }
  wire::WorkerStatsReplyT StatsReply() const override;
  // TimelinesToJson of the worker's timelines of client id `client_request` (submitted, first_token, end; at most
  // kWorkerTimelineLimits), as WorkerStatsReply.timeline_json.
  std::string TimelineJson(uint64_t client_request) const override;
  const RequestTimelines& timelines() const { return timelines_; }
  const WorkerGeometry& geometry() const { return geometry_; }
  const WorkerConfig& config() const { return config_; }
  uint32_t active_requests() const;
  uint32_t waiting_requests() const;
  // Copies and orders in flight (Heartbeat.pending_copies).
  uint32_t pending_orders() const { return agent_->pending_orders(); }
  // Test/introspection: the hierarchical KV store, or nullptr in resident mode.
  HierarchicalKvAccess* hierarchical() { return hier_; }
  // Bytes of the staging arenas allocated at start (brief §6: M_stage = χ * N * K_max * k * d_KV, K_max = --block;
  // WorkerGeometry::staging_bytes), 0 without (speculation off, --staging-arenas 0, resident mode). Reported as
  // WorkerStatsReply.staging_bytes.
  int64_t staging_bytes() const { return hier_ != nullptr ? hier_->staging_bytes() : 0; }

 private:
  // A request's model-side state; its lifecycle (phase, client, submit, token counters) is its book entry.
  struct Request {
    RequestId id = 0;          // the node request id (memd's)
    RequestId client_id = 0;   // the client's SubmitRequest.request
    RequestLife* life = nullptr;  // its entry in book_ (erased with it: Worker::Erase)
    std::vector<model::Token> input;   // prepared prefix (if any) then prompt
    Position prefix_tokens = 0;        // leading input tokens imported with ImportPrefix (the prepared prefix)
    std::vector<uint64_t> hash_ids;    // the prefix's block chain (row-cache keys)
    uint32_t prefix_block_tokens = 0;  // tokens per block
    std::optional<PrefixBlock> capture;  // the block being computed, captured for the row cache
    uint32_t max_new = 0;
    model::SamplingParams sampling;
    bool greedy = true;
    uint64_t seed = 0;  // SubmitRequest.seed: token t is drawn at DrawKey{seed, client_id, t}
    std::optional<model::ModelSession> session;
    Position fed = 0;                  // tokens fed to the model (input, then generated)
    std::vector<model::Token> generated;
    std::vector<uint64_t> digests;     // logits digest of generated[t]
    std::chrono::steady_clock::time_point submitted, granted;
    std::chrono::steady_clock::time_point last_token;  // its latest token (the TPOT histogram)
    uint64_t ttft_us = 0;
    absl::Status client_error;  // the client refused a chunk (ClientSink::Chunk): the request fails with it
    Position resumed = 0;       // tokens committed before a resume (generated[0, resumed) are also in `input`)
    // Every token of the request in position order: input, then the tokens generated after it (a resumed input ends
    // with the committed ones, generated[0, resumed)).
    std::vector<model::Token> Tokens() const {
      std::vector<model::Token> all = input;
      all.insert(all.end(), generated.begin() + resumed, generated.end());
      return all;
    }
    RequestId resume_of = 0;    // a resume: the interrupted node id it continues (AdmitRequest.resume_of)
    ResumeState resume;         // a resume's host-backed pages, runs to import, figures (ResumeImporter)
    RoundState spec;            // its speculative rounds: proposer slot, the drafter's hidden states (rounds_)
  };
  Worker(const model::Model* model, Device* device, WorkerConfig config, WorkerGeometry geometry, MemdLink* memd,
         ClientSink* client);
  KvAccess& kv() { return *kv_; }
  // One request's part of a step: its tokens, and whether the step's last logits give its next token.
  struct BatchItem {
    Request* r;
    std::vector<model::Token> tokens;
    bool emits;
    bool round = false;        // a speculative round: tokens = anchor then draft.tokens (SpeculativeRounds)
    spec::DraftResult draft;
  };
  // Starts the granted requests; a resumed one's host-backed pages are made host-ready and its host runs planned
  // (ResumeImporter::Begin; a failed import: its KV rebuilt from its tokens, every row recomputed).
  void StartGranted();
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
  absl::Status ReplayFed(Request& r);
  absl::Status ImportChunk(Request& r);
  // Samples r's next token (DrawKey{seed, client id, t}) and queues it for CommitStep.
  void EmitToken(Request& r, std::span<const float> logits);
  // Appends `token` (its logits' digest) to r's output and queues it for CommitStep.
  void RecordToken(Request& r, model::Token token, std::span<const float> logits);
  // The step's tokens: one TokensCommitted to memd (with any tokens an earlier step could not queue), then one
  // TokenChunk per token to its client. A TokensCommitted that cannot be queued is logged; the tokens still stream.
  void CommitStep();
  // The TokensCommitted of `ids` (requests with tokens this step): each one's tokens from its `committed` on.
  wire::TokensCommittedT TokensCommittedOf(std::span<const RequestId> ids) const;
  // The model-side state of the request `life` opened in the book (not admitted yet), and its AdmitRequest (its
  // record included: RecordOf).
  std::unique_ptr<Request> NewRequest(RequestLife& life);
  absl::Status SendAdmit(const Request& r);
  void Finish(RequestId id, absl::Status error);
  // AdmitRequest.complete_pages of r (imported history that may stay on GPU; adaptive mode only).
  uint32_t AdmitCompletePages(const Request& r) const;
  // Whether r may step now (memd away: not ended, not finished, held tokens below the bound, room in its tail for
  // `rows` more rows without a host write). Always true with memd up.
  bool MayStep(const Request& r, Position rows) const;
  // After a re-Hello: the tokens held from r's client while memd was away, in one chunk (final when r finished).
  void FlushHeld(Request& r);
  // After a re-Hello: each refused report's request is dropped here (nothing sent to memd) and ended to its client
  // like after a fence. Returns the records (every token) of those memd does not list as `interrupted`, to resume.
  std::vector<std::unique_ptr<wire::RequestRecordT>> DropRefused(const ReturnPlan& plan);
  // The client's side of any end (Finish, an admission memd refused): a failed request's final chunk (the outbox
  // always takes a final chunk), the counts, and a detached request's output (or error) kept for its Attach.
  void ReportEnd(Request& r, const absl::Status& error);
  // The outputs the book's bound dropped (resumed outputs no client claimed): logged and counted.
  void DropUnclaimed(const std::vector<DroppedOutput>& dropped);
  // Forgets a request (ended, rejected): its node id and its client id become free (RequestBook::Close; `completed`:
  // a Complete goes to memd for it).
  void Erase(std::map<RequestId, std::unique_ptr<Request>>::iterator it, bool completed = false);
  // Sends one TokenChunk; a refused one (not final) returns the sink's error.
  absl::Status SendChunk(Request& r, std::vector<model::Token> tokens, std::vector<uint64_t> digests, bool finished,
                         const absl::Status& error);

  const model::Model* model_;
  Device* device_;
  WorkerConfig config_;
  WorkerGeometry geometry_;
  MemdLink* memd_;
  ClientSink* client_;
  std::unique_ptr<KvAccess> kv_;
  HierarchicalKvAccess* hier_ = nullptr;
  RequestBook book_;  // every request's lifecycle, ids and the resumed outputs waiting for their client
  std::map<RequestId, std::unique_ptr<Request>> requests_;  // ordered: the batch order is stable
  std::unique_ptr<KvResidency> no_residency_;  // resident mode's residency (nothing moves)
  std::unique_ptr<ResidencyAgent> agent_;      // the memd conversation
  WorkerStats stats_;
  // A failed request: counted in failed_requests and by reason (stats_.failures).
  void CountFailure(const absl::Status& error);
  RequestTimelines timelines_{kWorkerTimelineLimits};  // the serving side of `dhsctl request` (issue 22)
  PrefixRowCache prefix_cache_;
  std::unique_ptr<ResumeImporter> resumes_;  // resumed requests' host imports and figures
  std::vector<RequestId> step_tokens_;  // requests that produced a token in this step (EmitToken -> CommitStep)
  bool stopping_all_ = false;  // StopAll: ends happen now, memd away or not
  size_t last_batch_ = 0;    // requests in the latest step
  std::unique_ptr<SpeculativeRounds> rounds_;  // --speculate: proposer, width schedule, slots
};

}  // namespace dhs
