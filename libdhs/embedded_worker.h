// libdhs/embedded_worker.h: the C++ core behind include/dhs/dhs.h (issue 25): one GPU's worker side of the KV
// hierarchy without a model, for an engine that brings its own. It wires the classes workerd uses below its batching
// loop: a Device (the library's, region_device.h: CpuDevice or CudaDevice; or the caller's: OpenOver), the memd
// conversation (a MemdTransport: the MemdClient it connects, or one the caller holds: OpenOver; Hello, host pool,
// memd's messages), and workerd's KvStack (the same class the Worker holds): HierarchicalKvAccess (tail, hot cache,
// ready map, host copies, the fused resolver) and the ResidencyAgent (memd's orders carried out: reclaim, population,
// backups; memd away's KV half). The engine sees requests and events, never a memd order.
//
// Owns: the device, the memd connection, the KV store, the agent, the requests' lifecycle in workerd's RequestBook
// (workerd/request_book.h: the one phase enum and table of both; an engine's request is a detached one, its caller its
// client: unsent / waiting / queued while it waits for its grant, granted -> active at once, ending when completed while
// memd is away), each request's declared rows (its KV through KvPort), and the events for the engine. dhs.cc is the
// thin C wrapper (argument checks of the C structs, handles, messages).
//
// Thread-safety: none; dhs.cc serialises the calls on one worker with its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "workerd/device/device.h"
#include "workerd/kv/hierarchical_kv_access.h"
#include "workerd/kv_stack.h"
#include "libdhs/embedded_shape.h"
#include "libdhs/kv_port.h"
#include "libdhs/region_device.h"
#include "workerd/memd_client.h"
#include "workerd/memd_return.h"
#include "workerd/request_book.h"
#include "workerd/token_ledger.h"
#include "workerd/residency_agent.h"
#include "workerd/serving_mode.h"
#include "workerd/worker_stats.h"

namespace dhs::lib {

// What a submit names for prefix sharing (issue 24; dhs_request_desc's ABI 1.1 fields): the spans are the caller's,
// read during Submit only.
struct SubmitPrefix {
  std::string tenant;                  // "" = the default tenant
  uint64_t session = 0;                // the engine's session (client) id: RequestRecord.client
  std::span<const int32_t> tokens;     // the prompt's first tokens (<= input_rows); empty: no chain
  std::span<const uint64_t> block_ids; // ids of blocks 0, 1, ... (Mooncake hash_ids); derived after them
  uint32_t block_tokens = 0;           // tokens per block (0: no chain)
};

// One event for the engine (dhs_event).
struct EmbeddedEvent {
  enum Kind : uint32_t { kGranted = 1, kWaiting = 2, kRejected = 3, kReclaimed = 4, kFailed = 5 };
  Kind kind = kGranted;
  RequestId request = 0;
  absl::Status status;   // kRejected / kFailed
  uint32_t slot = 0;     // kGranted
  uint32_t value = 0;    // kWaiting: queue position
  uint32_t pages = 0;    // kWaiting: deficit; kReclaimed: pages; kGranted of a resume: host-backed pages imported
  uint32_t import_pages = 0;  // kGranted of a resume: pages 0 .. import_pages-1 host-backed (ImportRows)
  uint32_t shared_pages = 0;  // kGranted: shared prefix pages among `pages` (AdmitGrant.shared_pages, checked)
};

// Counters of the worker (dhs_worker_stats_json).
struct EmbeddedCounters {
  uint64_t submitted = 0, granted = 0, completed = 0, failed = 0, rejected = 0, reclaim_orders = 0;
  uint64_t rows_appended = 0, queries_resolved = 0;
  uint64_t prefix_lookups = 0, shared_pages_granted = 0;  // blocks named at first admissions; shared pages imported
  uint64_t memd_aways = 0, memd_returns = 0;  // memd deaths served through; re-Hellos memd took
  uint64_t reports_refused = 0, admissions_resent = 0, ends_deferred = 0;
  // CommitTokens: tokens given; memd acknowledged (journaled); TokensCommitted that had to wait (one in flight);
  // refusals by memd; requests whose record memd refused alone (their later tokens are refused here).
  uint64_t tokens_committed = 0, tokens_acked = 0, commits_deferred = 0, commits_refused = 0, records_refused = 0;
};

class EmbeddedWorker final : private MemdHandler, private ReturnHandler {
 public:
  // Checks the shape (INVALID_ARGUMENT naming the field), connects to memd (MemdClient::Connect's errors), maps its
  // host pool and allocates the KV pool (HierarchicalKvAccess::Create's errors).
  // An engine pool (config.engine_pool) must be aligned to kEnginePoolAlignment and hold RegionOf(config).bytes bytes
  // (INVALID_ARGUMENT otherwise); it is zeroed and used as the region (the device's UseCallerMemoryForNextPool).
  // `backend`: the device (region_device.h: kCpuRegion, or kCudaRegion in a CUDA build); its check runs before memd
  // is contacted, and its errors are Open's.
  static absl::StatusOr<std::unique_ptr<EmbeddedWorker>> Open(const EmbeddedConfig& config,
                                                              const RegionBackend& backend = kCpuRegion);
  // The same worker over a memd conversation the caller holds (issue 25: the library takes its memd link from
  // outside; a test's in-process fake memd, tests/workerd/worker_test_util.h): `memd` answered HelloOf(config) (its
  // host pool, epoch and interrupted requests are read from it), is not owned and must outlive the worker. Nothing
  // of config.run_dir is used. Errors: as Open's, without the connection's.
  // `device` (issue 25: workerd's Worker opens its KV side here, over its own device): nullptr, the library's
  // CpuDevice and region (as Open); else the caller's (not owned, must outlive the worker; config.engine_pool must be
  // nullptr): the store's pools are the device's own, so there is no single region (Pool() and Resolve answer
  // FAILED_PRECONDITION; the caller reads rows through port(), as the Worker's model does).
  static absl::StatusOr<std::unique_ptr<EmbeddedWorker>> OpenOver(const EmbeddedConfig& config, MemdTransport& memd,
                                                                   Device* device = nullptr);
  const RegionLayout& region() const { return region_; }
  bool engine_pool() const { return config_.engine_pool != nullptr; }
  // Ends every open request (Complete to memd, delivered for up to 1 s) and frees everything. Opened over the caller's
  // device (OpenOver with a device: workerd's Worker): frees its KV side only; nothing is sent.
  ~EmbeddedWorker() override;

  const EmbeddedConfig& config() const { return config_; }
  // memd's GPU page (p rows of every source), host page (with the index keys), and the pages the budget holds.
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t host_page_bytes() const { return host_page_bytes_; }
  uint32_t capacity_pages() const { return capacity_pages_; }
  uint64_t worker_epoch() const { return memd_->worker_epoch(); }
  // The region (RegionLayout: the KV pool, then the staging arenas; the CPU backend's host-visible bytes). Errors:
  // FAILED_PRECONDITION when the worker was opened over the caller's device (no single region).
  absl::StatusOr<std::span<uint8_t>> Pool() const;

  // A new request: input_rows >= 1 prompt rows, max_rows >= input_rows rows at most. resume_of != 0: the resume of
  // an interrupted request of this GPU (ListResumable): memd hands it the interrupted request's confirmed host
  // pages; at the grant they are checked against memd's checksums (a page that does not match is not imported: its
  // rows are appended again by the engine) and made host-ready (HierarchicalKvAccess::CheckHostCopies,
  // ImportHostPages); ImportRows then takes them as appended. Errors: INVALID_ARGUMENT, NOT_FOUND (resume_of not
  // listed), UNAVAILABLE (memd away or the send failed).
  // `prefix` (issue 24): the tenant, session and prefix chain (workerd/prefix_chain.h's PrefixChainOf over its tokens
  // and ids): memd grants the chain's stored pages as shared host pages (importable like a resume's). Errors also:
  // INVALID_ARGUMENT (more tokens than input_rows).
  absl::StatusOr<RequestId> Submit(uint64_t input_rows, uint64_t max_rows, RequestId resume_of = 0,
                                   const SubmitPrefix& prefix = {});
  // A granted resume: its host-backed pages first .. first+count-1 taken as appended (rows into the tail from host,
  // no recomputation; HierarchicalKvAccess::ImportHostRows); keys_out: empty or L_idx * count * p * d_idx bytes,
  // [indexer][position][d_idx], receives their index keys. Errors: NOT_FOUND, FAILED_PRECONDITION (not granted, not
  // a resume, rows appended are not first * p, a page not host-backed), INVALID_ARGUMENT (keys_out's size).
  absl::Status ImportRows(RequestId request, uint32_t first, uint32_t count, std::span<uint8_t> keys_out);
  // A granted request's import plan for a prefill of `tokens` rows (dhs_request_import_plan, ABI 1.4): the runs of
  // its host-backed pages wholly before row tokens - 1 (the last row is always computed: its logits give the next
  // token), in position order (workerd's PlanResume, workerd/resume_plan.h). The engine appends the rows before each
  // run itself, then ImportRows the run. Empty when nothing is importable. Errors: NOT_FOUND, FAILED_PRECONDITION (not
  // granted), INVALID_ARGUMENT (tokens 0 or beyond max_rows).
  absl::StatusOr<std::vector<HostRun>> ImportPlan(RequestId request, uint64_t tokens);
  // Serves memd's messages, the agent's completions, requests a changed host page failed; events accumulate.
  // memd away (it died: its connection closed; docs/protocol.md "Re-Hello with a report", as workerd's MemdAway):
  // memd's orders are resolved locally, host writes pause, and each Poll tries the re-Hello with a report of every
  // granted request (MemdClient::PollAway); meanwhile granted requests keep appending while their tail has room and
  // resolving, submits wait, completes of granted requests are deferred. When a memd takes the re-Hello: refused
  // reports fail their requests (kFailed), the others go on, host writes resume, the deferred ends happen and the
  // waiting admissions are sent again. Errors: ABORTED (epoch ended: fenced, memd silent over a live connection, or no
  // memd took the re-Hello within the reconnect bound / refused it / started a fresh pool).
  absl::Status Poll();
  bool memd_away() const { return memd_->away(); }
  std::deque<EmbeddedEvent>& events() { return events_; }

  // rows: count * S * d_KV bytes [position][source]; keys: empty or L_idx * count * d_idx bytes [indexer][position].
  // Every source must hold exactly `first` rows.
  absl::Status Append(RequestId request, Position first, uint32_t count, std::span<const uint8_t> rows,
                      std::span<const uint8_t> keys);
  // Layer-wise (dhs_request_append_source): `count` rows (count * d_KV bytes) of one source from `first` (= that
  // source's appended rows). A failure after some rows leaves them appended (the message says how many).
  absl::Status AppendSource(RequestId request, SourceId source, Position first, uint32_t count,
                            std::span<const uint8_t> rows);
  // dhs_request_append_keys: count * d_idx bytes of indexer `indexer` for positions first .. first+count-1, each
  // appended on some source, in a page whose host copy no Poll confirmed yet (HierarchicalKvAccess::StoreIndexKeys).
  absl::Status AppendKeys(RequestId request, uint32_t indexer, Position first, uint32_t count,
                          std::span<const uint8_t> keys);
  // The group of `source` (source < sources).
  uint32_t GroupOf(SourceId source) const { return port_->GroupOf(source); }
  // One query: selection (length <= k), its output (sources.size() * length byte offsets into the region: a row in
  // the hot cache, tail or ready map, or, for a held round's union, in a staging arena) and the position of the query
  // that made it (dhs_resolve_at; KvQuery.at: a round's query j sits at n_r + j; kNoPosition unknown).
  struct Query {
    RequestId request = 0;
    std::span<const Position> selection;
    std::span<int64_t> locations;
    Position at = kNoPosition;
  };
  absl::Status Resolve(std::span<const SourceId> sources, std::span<Query> queries);
  absl::Status ReadersDone(std::span<const SourceId> sources);
  absl::Status Hold(RequestId request, Position from);
  absl::Status Commit(RequestId request, Position length);
  absl::Status Complete(RequestId request);
  // The interrupted requests the engine may resume, with their records' sizes: (id, input rows, max rows). At open
  // every one memd's HelloReply lists; after a return those PlanReturn finds resumable (neither ended here nor
  // adopted). One is hidden while a resume of it is open here (not ending), and leaves the list once memd took it
  // over for that resume: at the resume's grant, its AdmitWait, or memd's AdmitReject naming it (took_over: memd ended
  // both). A reject without took_over changed nothing at memd: the request stays listed. One whose resume the engine
  // completed before memd's first answer is hidden until that answer.
  // Complexity: O(listed + open requests).
  struct Resumable { RequestId request; uint64_t input_rows, max_rows; };
  std::vector<Resumable> ListResumable() const;
  // The owner of the worker takes every interrupted request ListResumable lists, to resume or end each itself
  // (workerd's Worker at its start: Worker::ResumeInterrupted): each with memd's record of it (nullptr when memd sent
  // none; valid until memd's next HelloReply), in memd's order. None of them is listed again. O(listed).
  struct TakenResumable { RequestId request; const wire::RequestRecordT* record; };
  std::vector<TakenResumable> TakeResumable();
  // The interrupted requests an open (not ending) resume here continues.
  std::set<RequestId> LiveResumes() const;

  // Token records (dhs_request_commit_tokens, ABI 1.5; issue 11's records for an engine's vocabulary): memd keeps each
  // request's record (opened with its AdmitRequest: the prompt tokens the submit gave, its sizes) and the tokens the
  // engine commits here, token t of its generated tokens at index t, with optional logits digests (empty: 0 each),
  // so that after a restart of the engine (or of memd) the request's tokens come back with it (ResumableTokens). The
  // tokens go to memd in one TokensCommitted per Poll (one in flight; memd journals them before it answers); while
  // memd is away they wait and the re-Hello's report carries them. A resume (Submit with resume_of) starts from the
  // interrupted record's tokens: the engine's next commit continues after them. A token is any int32 (kept as its
  // bits). Errors: NOT_FOUND, FAILED_PRECONDITION (not granted; no record: max_rows == input_rows; memd refused this
  // request's tokens before: the message has its reason), INVALID_ARGUMENT (digests of another length), OUT_OF_RANGE
  // (more than max_rows - input_rows tokens in all), RESOURCE_EXHAUSTED (the record would pass memd's bound of
  // kMaxRecordBytes: common/record_bounds.h); nothing committed on an error.
  absl::Status CommitTokens(RequestId request, std::span<const int32_t> tokens, std::span<const uint64_t> digests);
  // The record of interrupted request `interrupted` (ListResumable): the prompt tokens its submit gave and the tokens
  // committed for it. Errors: NOT_FOUND (not listed, or no record kept), FAILED_PRECONDITION (a record of workerd's
  // built-in model: byte tokens, not an engine's).
  struct RecordTokens { std::vector<uint32_t> prompt, generated; };
  absl::StatusOr<RecordTokens> ResumableTokens(RequestId interrupted) const;
  std::string StatsJson() const;
  // memd's messages for an owner that admits its own requests (workerd's Worker, issue 25): the handler its transport's
  // Poll (or a test's fake memd) delivers to. memd's orders (ReclaimOrder, Retire, PopulateOrder) are carried out
  // here, as for an engine's requests (KvStack::Order: held while readers of the port are outstanding, dropped when
  // memd dies); the answers (AdmitGrant, AdmitWait, AdmitReject, CompleteAck, the tokens' answers) go to `answers` (not
  // owned; called only from the returned handler, which is valid until the worker is destroyed or InboxFor is called
  // again: a second call replaces it). The owner does not call Poll (its own admissions, away and return); it
  // carries the held orders out itself, with stack().CarryOutHeld() (memd up).
  MemdHandler& InboxFor(AdmissionAnswers& answers);
  // The KV side (workerd's Worker, opened over its transport and device, serves its model through these): workerd's
  // KvStack (store, residency, agent) and the data path over it.
  KvStack& stack() { return *stack_; }
  KvPort& port() { return *port_; }
  // INTERNAL naming the broken invariant, else OK: the book's (RequestBook::CheckInvariants), and the requests here
  // are exactly the book's, none of them kGranted (a grant starts it: kActive) or kPaused (the engine decides what
  // steps while memd is away). O(requests). The fuzz target checks it after every call.
  absl::Status CheckInvariants() const;
  // The timelines kept under request id `request` (WorkerRecorder::TimelineJson; dhs_request_timeline_json).
  std::string TimelineJson(RequestId request) const { return recorder_.TimelineJson(request); }

 private:
  // A request's engine-side state, beside its RequestLife in book_ (its phase; kept under the same id).
  struct Request {
    uint64_t input_rows = 0, max_rows = 0;
    // Its rows per source and its speculative hold are the KV store's (KvPort reads them there).
    RequestId resume_of = 0;  // the interrupted request it resumes (0: a new one)
    // The granted host-backed pages that matched their checksums (a resume's, or shared prefix pages), ascending, all
    // host-ready: ImportRows and ImportPlan work on them (empty: no import allowed).
    std::vector<HostBackedPage> host_backed;
    uint32_t slot = 0;         // AdmitGrant.slot (its hot cache and tail region)
    // Its generated tokens (CommitTokens; a resume's start with the interrupted record's) and their logits digests;
    // the book's TokenCounts say how many memd's record holds (a TokensCommitted memd answered, its AdmitRequest or a
    // re-Hello's report) and whether memd refused this request's tokens alone (later commits are refused).
    std::vector<uint32_t> tokens;
    std::vector<uint64_t> digests;
    std::shared_ptr<const wire::AdmitRequestT> admit;  // its AdmitRequest (sent again after a memd restart)
    // The recorder's times (workerd's WorkerRecorder): its Submit, its previous committed token; resumed: the
    // tokens it started with (a resume's carried tokens): the first committed after them is its first token (TTFT).
    std::chrono::steady_clock::time_point submitted, last_token;
    size_t resumed = 0;
  };

  explicit EmbeddedWorker(EmbeddedConfig config);  // out of line: Inbox is complete there
  // Open and OpenOver, with the shape's `region` (RegionOf, computed once): the engine pool's alignment and size
  // (INVALID_ARGUMENT), then the worker over `memd` (`owned`: the same transport when the worker owns it, else nullptr).
  static absl::Status CheckEnginePool(const EmbeddedConfig& config, const RegionLayout& region);
  static absl::StatusOr<std::unique_ptr<EmbeddedWorker>> Build(const EmbeddedConfig& config,
                                                               const RegionLayout& region, wire::HelloT hello,
                                                               std::unique_ptr<MemdTransport> owned,
                                                               MemdTransport& memd, Device* device,
                                                               decltype(RegionBackend::make) make_device);
  // Request `id` (r) leaves the worker: the recorder's end (finished, or failed with `error`). The caller erases it
  // and counts it.
  void RecordEnd(RequestId id, const Request& r, const absl::Status& error);
  // The request at `it` failed with `error` (its KV, if granted, released by the caller): its end recorded, erased,
  // counted, and a kFailed event for the engine.
  void EndFailed(std::map<RequestId, Request>::iterator it, const absl::Status& error);
  // memd's record of interrupted request `id` (HelloReply.interrupted_records), nullptr when it sent none.
  const wire::RequestRecordT* InterruptedRecord(RequestId id) const;
  // The granted request `id`, or NOT_FOUND / FAILED_PRECONDITION naming it.
  absl::StatusOr<Request*> Granted(RequestId id);
  // Ends a granted request with `error` (its KV released, Complete to memd) and tells the engine (kFailed).
  void Fail(RequestId id, const absl::Status& error);
  // The requests a changed host page failed (HierarchicalKvAccess::TakeDataLoss).
  void FailDataLoss();
  // memd away (Poll): entered once per death; the re-Hello's Hello (hello_ with a report of every granted request);
  // memd took it (`reply`).
  void EnterAway();
  wire::HelloT ReHello() const;
  absl::Status Return(const wire::HelloReplyT& reply);
  // ReturnHandler (workerd/memd_return.h: workerd's return steps, carried out in its order by CarryOutReturn): a
  // refused request fails (kFailed) or, completed by the engine while away, is forgotten (its Complete when memd lists
  // it); an adopted one's tokens are all in memd's record; a deferred end happens; memd's interrupted requests ended
  // here get their Complete and are no longer listed; the resumable ones stay listed (the engine decides: nothing
  // done here); waiting admissions go again.
  absl::Status EndRefused(RequestId id, const std::string& why, RefusedEnd how, bool listed) override;
  void ReturnToKv(const std::set<RequestId>& adopted) override;
  void Adopted(RequestId id) override;
  absl::Status EndDeferred(RequestId id, bool listed) override;
  absl::Status EndInterrupted(RequestId id) override { return CompleteInterrupted(id); }
  absl::Status ResumableFound(RequestId id, const wire::RequestRecordT*) override {
    resumable_.push_back(id);  // listed to the engine (ListResumable): it decides
    return absl::OkStatus();
  }
  // A refused request failed (kFailed, EndRefused): the engine decides whether to submit it again.
  absl::Status ResumeRefused(RequestId) override { return absl::OkStatus(); }
  absl::Status Resend(RequestId id) override;
  // SendComplete for memd's interrupted request `id`, which then is no longer listed resumable. Errors: UNAVAILABLE.
  absl::Status CompleteInterrupted(RequestId id);
  absl::Status Step(const absl::Status& s) { FailDataLoss(); return s; }
  // One TokensCommitted with every granted request's tokens memd has not acknowledged (CommitTokens), as workerd's
  // TokenLedger decides: unless one is in flight or memd is away (they wait; nothing lost); after memd refused a
  // message of several entries, one request per message until each is acknowledged or refused alone (a refused one
  // keeps memd's reason in TokenCounts::refused; the others lose nothing: memd takes an equal resend).
  void SendTokens();
  void OnTokensCommitted() override;
  void OnTokensRefused(const absl::Status& why) override;
  TokenLedger ledger_;  // the TokensCommitted in flight and the probe queue (workerd/token_ledger.h)

  // MemdHandler.
  void OnAdmitGrant(const wire::AdmitGrantT& m) override;
  void OnAdmitWait(const wire::AdmitWaitT& m) override;
  // memd's reject of admission `m.request`; m.took_over (a resume's interrupted request memd took over and ended with
  // this reject: it never fits) is no longer resumable. Without it nothing changed at memd (the request stays listed).
  void OnAdmitReject(const wire::AdmitRejectT& m) override;
  // memd's answer to the admission of `id`, a resume the engine completed before that answer (ended_resumes_):
  // `took_effect` (a grant, a wait, an AdmitReject with took_over) -> its interrupted request was taken over and is no
  // longer resumable; else (a reject that changed nothing) it is listed again.
  void SettleEndedResume(RequestId id, bool took_effect);
  // memd's orders, for every request of this worker (an engine's, or an InboxFor owner's): to the KV side
  // (KvStack::Order; counted).
  void OnReclaimOrder(const wire::ReclaimOrderT& m) override;
  void OnRetire(const wire::RetireT& m) override;
  void OnPopulateOrder(const wire::PopulateOrderT& m) override;
  void OnCompleteAck(const wire::CompleteAckT& m) override { book_.OnCompleteAck(m.request); }
  // The phase of open request `id` (nullptr when it is not open).
  const RequestLife* Life(RequestId id) const { return book_.Find(id); }
  // Request `id` leaves the worker: out of the book (`completed`: a Complete went to memd for it) and its state.
  void Forget(RequestId id, bool completed);
  // memd's Complete of `id` (not granted here: an admission, or an interrupted request). Errors: UNAVAILABLE.
  absl::Status SendComplete(RequestId id);

  EmbeddedConfig config_;
  wire::HelloT hello_;  // the Hello of Open (the re-Hello sends it again with a report)
  // The memd conversation (MemdClient from Open, owned in owned_memd_; the caller's from OpenOver). Declared before
  // the device: the device (a CUDA one pins memd's host pool) goes first, while the pool is still mapped.
  std::unique_ptr<MemdTransport> owned_memd_;
  MemdTransport* memd_ = nullptr;
  std::unique_ptr<Device> owned_device_;  // the library's (RegionDevice; nullptr over the caller's device)
  Device* device_ = nullptr;              // the device the store's pools are on
  const char* backend_ = "caller";        // RegionDevice::backend ("caller" over the caller's device)
  RegionLayout region_;
  uint64_t page_bytes_ = 0, host_page_bytes_ = 0;
  uint32_t capacity_pages_ = 0;
  uint8_t* region_base_ = nullptr;  // the region's first byte (the engine's pool, or the device's region)
  // The KV store and the ResidencyAgent: workerd's KvStack (workerd/kv_stack.h), the wiring workerd's Worker uses
  // too; kv_ and agent_ point into it.
  std::unique_ptr<KvStack> stack_;
  HierarchicalKvAccess* kv_ = nullptr;  // nullptr in resident mode (the port's store is KvStack's resident one)
  ResidencyAgent* agent_ = nullptr;
  std::map<RequestId, Request> requests_;
  // Latency histograms (admission wait, TTFT and TPOT from the engine's committed tokens), failures by reason and the
  // request timelines: workerd's WorkerRecorder, fed the same events (submit, grant, a token, an end).
  WorkerRecorder recorder_{0};
  // Every open request's phase and node id (RequestBook::OpenDetached; ids gpu | epoch | n as workerd's), and the ids
  // completed before memd's answer until their CompleteAck (a late grant is released by the Complete: StaleGrant).
  RequestBook book_;  // of config_.gpu: its ids are in that GPU's range (review finding: GPU 0's for every GPU)
  // The interrupted requests listed to the engine (ListResumable), in memd's order: at open every one memd listed, at
  // each return those PlanReturn finds resumable (review finding, 2026-12-03: memd's whole list was offered, so an
  // interrupted request a resume waiting here takes over stayed listed until that resume's grant).
  std::vector<RequestId> resumable_;
  // memd's interrupted requests no longer resumable: ended at a re-Hello (PlanReturn end_interrupted), or taken over by
  // a resume memd admitted (granted, queued, or rejected after it took the admission; review finding 2026-12-04: a
  // resume memd rejected as never fitting, or one completed while queued, left its request listed, and a second
  // resume of it got memd's "unknown").
  std::set<RequestId> not_resumable_;
  // Resumes the engine completed while their admission waited for memd's first answer: id -> the interrupted request
  // (hidden from ListResumable until that answer says whether memd took it over: SettleEndedResume).
  std::map<RequestId, RequestId> ended_resumes_;
  // The ids SendComplete sent a Complete for (the newest kCompletesRemembered): ended here, so a later memd that lists
  // one as interrupted (the Complete died unread with a memd, twice over) has it ended again, not listed resumable
  // (PlanReturn's ended_here, with the agent's Finished; review finding).
  static constexpr size_t kCompletesRemembered = size_t{1} << 16;
  std::map<RequestId, uint64_t> completes_sent_;               // id -> the sequence number of its last Complete
  std::deque<std::pair<RequestId, uint64_t>> completes_order_;  // (id, sequence number), oldest first
  uint64_t completes_seq_ = 0;
  // The data path (libdhs/kv_port.h, the one workerd's model uses too): appends, keys, resolves, readers (the
  // requests resolved per group since its last ReadersDone: a resolve again, or a Complete, before it is refused),
  // hold and commit.
  std::unique_ptr<KvPort> port_;
  std::deque<EmbeddedEvent> events_;
  EmbeddedCounters counters_;
  class Inbox;
  std::unique_ptr<Inbox> inbox_;  // InboxFor's handler (nullptr: none asked for)
};

}  // namespace dhs::lib
