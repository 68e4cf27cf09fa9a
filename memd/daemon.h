// memd/daemon.h: the memory daemon process around the decision core (brief §3, §4; docs/protocol.md).
//
// Daemon owns the host-pool segment (memd/pool_segment.h: named by the canonical run directory; a dead memd's one is
// adopted when its geometry matches and its journal verifies, else replaced (one of another geometry that still names
// requests only with replace_host_pool: OpenPool); created with every page reserved; removed
// by the destructor unless requests still hold host pages, then kept for the next memd), the
// RouterServer "memd" in the run directory, and the ResidencyManager. One event loop (Serve): each inbound message is
// verified (common Server: a bad message gets an ErrorReply and the loop keeps serving), mapped to one core event,
// then the core's orders are drained and sent to the owning worker (the ROUTER peer that sent that GPU's Hello).
// A periodic tick calls Populate() and, less often, RetryBackups(). dhsctl's IntrospectQuery is answered with the
// shared renderers DumpToJson / DumpToTable, from a dump of only what the view shows (DumpScopeOf: the `pages` view at
// most kMaxPageRows rows; a `from` at or past M is OUT_OF_RANGE, a count above it INVALID_ARGUMENT). On every tick the
// Prometheus text (from a counts-only dump, O(GPUs): a full dump is O(M) and would stall the loop) is published to a
// mutex-guarded snapshot (metrics()) that the HTTP thread reads.
//
// The daemon makes no residency decision: each inbound message is decoded and checked for its wire form (a Hello's
// page size, the peer that registered the GPU, HostPageRef segments, rows -> pages), mapped to one core event, and
// each order drained from the core is encoded as exactly one wire message (memd/orders.h lists the mapping). The core's
// OrderIds are the wire order ids. Roles: worker-only messages are accepted only from the peer that said Hello for the
// GPU of the request / order they name (CheckWorkerPeer); Hello only from the routing id worker/<gpu>; Heartbeat and
// IntrospectQuery from any peer. Ids: a request id a worker names must be in its GPU's range (CheckRequestIdRange).
// Fencing (issue 11): a GPU is fenced (ResidencyManager::FenceGpu; the core alone holds "fenced" and why, the daemon
// asks it: fenced(), FenceReason()) when its worker's connection closes (socket monitor), when the worker sends
// nothing for worker_timeout, when an order to it cannot be sent, and when a Hello for it arrives while it is up (a
// restarted worker: the previous epoch ends). Orders for a fenced GPU are dropped; every message of its worker but
// Hello is refused FAILED_PRECONDITION "fenced: ..."; a Hello re-registers it (new epoch,
// HelloReply.interrupted_requests). BackupComplete with order 0 is refused since protocol version 3 (INVALID_ARGUMENT):
// host copies written outside a ReclaimOrder come as HostCopyWritten.
// Request records (issue 11, resume; memd/request_records.h): AdmitRequest.record opens one (an oversize record
// refuses the admission), TokensCommitted grows it, CompleteAck and an admission's reject release it, and the
// HelloReply of a GPU's next worker carries its interrupted requests' records (interrupted_records).
// memd restart (issue 11): the core writes the host journal in the segment (memd/host_journal.h) and every record
// change is mirrored in RUN_DIR/records (memd/record_journal.h) before the message is answered; Start adopts what a
// dead memd left (ResidencyManager::AdoptHostPages): its requests are interrupted requests of their GPUs, each with
// its record, as if the GPUs had been fenced (docs/operations.md, "memd restart: what survives").
//
// Thread-safety: Serve/Run and the constructor/destructor from one thread; metrics() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/host_pool.h"
#include "common/request_timeline.h"
#include "common/transport.h"
#include "memd/host_journal.h"
#include "memd/cluster_tier.h"
#include "memd/kv_events.h"
#include "memd/pool_segment.h"
#include "memd/reclaim_policy.h"  // kDefaultReclaimPolicy
#include "memd/model_journal.h"
#include "memd/record_journal.h"
#include "memd/request_records.h"
#include "memd/residency_manager.h"

namespace dhs::memd {

struct DaemonOptions {
  std::string run_dir;                      // created with MakeRunDir (0700); holds memd.sock and records/
  uint64_t page_bytes = 0;                  // bytes per page; every worker's Hello must say the same
  uint32_t host_pool_pages = 0;             // pages of the host-pool segment (> 0)
  uint32_t reserve_pages = 0;               // M_res per GPU
  std::string reclaim_policy{kDefaultReclaimPolicy};  // memd/reclaim_policy.h; chosen by measurement: memd/README.md
  uint32_t populate_pages_per_attempt = 8;  // bound of one population attempt, pages (>= 1)
  // Issue 24 (the content-addressed host tier, memd/prefix_pages.h): off by default (then byte-identical to before).
  bool prefix_sharing = false;
  std::string prefix_eviction{kDefaultPrefixEvictionPolicy};  // memd/prefix_pages.h kPrefixEvictionPolicyNames
  uint32_t prefix_tenant_quota_pages = 0;   // host pages one tenant may store; 0 = no quota
  // Issue 24: the KV event stream (memd/kv_events.h) on ipc://RUN_DIR/kv-events.sock; off by default; needs
  // prefix_sharing. kv_events_hwm: batches queued per subscriber before batches are dropped (counted).
  bool kv_events = false;
  int kv_events_hwm = 10000;
  // Issue 26: the cluster tier (docs/cluster_tier.md) on Redis: "redis://HOST:PORT" or a comma-separated list of
  // cluster seeds (HOST:PORT or redis://HOST:PORT); empty = off (the default). Needs prefix_sharing.
  // cluster_lookup_timeout: the deadline of one admission's lookup batch.
  std::string cluster_store;
  std::chrono::milliseconds cluster_lookup_timeout{5};
  std::chrono::milliseconds tick{20};       // Populate() period
  std::chrono::milliseconds retry_period{1000};  // RetryBackups() period
  std::string segment_name;                 // shm name; empty = "dhs-pool-<hash of the canonical run dir>"
  // RemoveStaleSegments: an unreadable "dhs-pool-*" segment last modified this long ago or longer is removed at start.
  std::chrono::seconds unreadable_segment_age{3600};
  // Liveness (docs/operations.md): a registered worker that sent nothing for worker_timeout is hung and its GPU is
  // fenced (workers send a Heartbeat every second); the socket monitor's disconnect of a worker's connection (dead
  // process, closed socket) fences its GPU at once. memd's socket has no ZMTP heartbeats: with router_handover (how a
  // restarted worker takes its routing id back), libzmq 4.3.4 aborts memd (assertion `!_io_error`,
  // stream_engine_base.cpp:331) when a second connection claims a live worker's id while heartbeats run.
  std::chrono::milliseconds worker_timeout{3000};
  // After adopting a dead memd's pool, the host pages not adopted stay out of use this long: a worker of the dead memd
  // may still write a backup or tail copy into one until its epoch ends (workerd --memd-timeout-ms, 2 s by default;
  // a SIGTERMed worker's shutdown, at most 5 s). Admissions that need them wait meanwhile.
  std::chrono::milliseconds adopt_grace{6000};
  // A leftover pool of this run directory that cannot be adopted (another geometry) but whose journal names requests
  // is replaced, dropping them, only when this is set (memd --replace-host-pool); else Start fails and keeps it
  // (OpenPool, issue 22).
  bool replace_host_pool = false;
};

class Daemon {
 public:
  // Creates the run directory, binds memd.sock, removes stale segments (RemoveStaleSegments), opens or creates the
  // host-pool segment (OpenPool) and adopts a dead memd's journal and records. Errors: InvalidArgument (bad options, a
  // run directory too long for the node's sockets: CheckSocketPaths), ResourceExhausted (/dev/shm too small for the
  // pool; a leftover pool is then kept), AlreadyExists (a live memd in the run dir, or the segment belongs to another
  // run directory), FailedPrecondition (a leftover pool with another geometry still holds requests and
  // replace_host_pool is not set). A start that fails never removes a pool it adopted or could adopt.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();  // closes the socket and removes the host-pool segment
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves messages and ticks until keep_going() is false (checked at least every tick).
  absl::Status Run(const std::function<bool()>& keep_going);
  // Serves at most one message (waiting up to `timeout`), then runs the tick if it is due.
  absl::Status ServeOnce(std::chrono::milliseconds timeout);

  // The latest Prometheus text (thread-safe).
  std::string metrics() const;
  const std::string& endpoint() const { return router_->endpoint(); }
  const HostPoolSegment& segment() const { return *segment_; }
  const ResidencyManager& core() const { return *core_; }
  const RequestRecordStore& records() const { return records_; }
  // The admission side of `dhsctl request CLIENT_ID` (issue 22): one bounded timeline per node request id
  // (common/request_timeline.h; the default TimelineLimits: 4096 requests, 32 events each), kept after the request
  // ended until evicted, so a client's request is found across worker epochs (not across a memd restart).
  const RequestTimelines& timelines() const { return timelines_; }

 private:
  struct GpuInfo {
    std::string peer;          // ROUTER routing id of the worker
    uint32_t page_rows = 0;    // p
    uint32_t capacity_pages = 0;
    uint32_t pid = 0;          // the worker's pid (its Hello), for the logs
    WorkerShape shape;         // its Hello's shape (issue 14), shown in the status view (GpuDump::worker) only
    uint64_t model_fingerprint = 0;  // Hello.model_fingerprint (0: not known): the cluster tier's geometry.model
    uint64_t connection = 0;   // connection of its latest message (an Incoming::connection id: TakeDisconnected names it)
    std::chrono::steady_clock::time_point last_heard;  // its latest message
  };

  Daemon(DaemonOptions options, std::unique_ptr<HostPoolSegment> segment, std::unique_ptr<HostJournal> journal,
         std::unique_ptr<RouterServer> router, std::unique_ptr<ResidencyManager> core, RecordJournal record_journal);
  // Registers Receive for every member of the wire message list (common/protocol.h, DHS_WIRE_MESSAGES).
  void Register();
  // One message from `peer`, dispatched over the list (ReceiveMessage): a message memd serves goes to its On*
  // handler; one it does not (NotForMemd in daemon.cc) is refused UNKNOWN_MESSAGE "memd does not serve <Name>".
  absl::StatusOr<std::string> Receive(const Message& m, std::string_view peer);
  // Start's last step: the journal's requests (`journaled`) and, when the pool was `reused`, the record files' granted
  // requests become interrupted requests (ResidencyManager::AdoptHostPages) with their records; other record files
  // are removed. Errors: INTERNAL when the core refuses the list (nothing adopted).
  absl::Status AdoptLeftovers(const std::map<RequestId, JournaledRequest>& journaled, bool reused,
                              const std::map<PageIndex, JournaledSharedPage>& shared = {});
  // A worker's Hello (HelloRefusal's checks, then ReHello or StartEpoch): registers the worker of its GPU and answers
  // HelloReply with its epoch, interrupted and finished records and the host segment; or accepted = false and why.
  absl::StatusOr<std::string> OnHello(const wire::HelloT& hello, const Message& m, std::string_view peer);
  // Why a Hello from `peer` is refused before any state changes ("" when it may go on): a peer that is not
  // worker/<gpu> (counted in refused_peers), another host page size, no pages or rows, an unknown serving mode, or
  // another M for a GPU already registered.
  // Part of HelloRefusal (issue 26): a Hello whose model fingerprint differs from its GPU's earlier worker's, or
  // with prefix sharing on from another GPU's ("" when accepted; 0 = not known, never compared).
  std::string ModelRefusal(const wire::HelloT& hello) const;
  std::string HelloRefusal(const wire::HelloT& hello, std::string_view peer);
  // A (non-re-)Hello's new epoch: fences the GPU's previous worker if it was still up, then registers the GPU in the
  // core (ResidencyManager::RegisterGpu). Returns the core's refusal ("" when registered).
  std::string StartEpoch(const wire::HelloT& hello);
  // Keeps the accepted worker of `hello.gpu` (its GpuInfo: peer, shape, connection, heard now); counts the Hello.
  void KeepWorker(const wire::HelloT& hello, std::string_view peer);
  // The reply's interrupted requests with their records and, for a new epoch (not a re-Hello), the GPU's finished
  // records (lost ends: outputs the dead worker may not have delivered).
  void AddHelloRecords(const wire::HelloT& hello, wire::HelloReplyT& reply);
  // The host pool segment a HelloReply names (memd has one: segment 0).
  std::unique_ptr<wire::HostSegmentInfoT> HostSegmentInfo() const;
  // A re-Hello with a report (a worker that survived a memd restart; ResidencyManager::AdoptGpu): fills the reply's
  // refused reports and keeps the reported records; returns why the Hello is refused ("" when accepted).
  std::string ReHello(const wire::HelloT& hello, wire::HelloReplyT& reply);
  absl::StatusOr<std::string> OnAdmit(const wire::AdmitRequestT& a, const Message& m, std::string_view peer);
  absl::StatusOr<std::string> OnBackupComplete(const wire::BackupCompleteT& b, const Message& m, std::string_view peer);
  absl::StatusOr<std::string> OnHostCopyWritten(const wire::HostCopyWrittenT& w, const Message& m, std::string_view peer);
  absl::StatusOr<std::string> OnReadersDone(const wire::ReadersDoneT& r, const Message& m, std::string_view peer);
  absl::StatusOr<std::string> OnReadyPublish(const wire::ReadyPublishT& r, const Message& m, std::string_view peer);
  absl::StatusOr<std::string> OnComplete(const wire::CompleteT& c, const Message& m, std::string_view peer);
  // Appends each entry's tokens to its request's record (RequestRecordStore::Commit); entries of other GPUs' requests
  // are refused (CheckWorkerPeer). Answers TokensCommittedAck, or an ErrorReply naming how many entries were refused.
  absl::StatusOr<std::string> OnTokensCommitted(const wire::TokensCommittedT& t, const Message& m, std::string_view peer);
  absl::StatusOr<std::string> OnIntrospect(const wire::IntrospectQueryT& q, const Message& m);
  // The role check of a worker-only message (BackupComplete, HostCopyWritten, ReadersDone, ReadyPublish, Complete):
  // `peer` must be the worker that said Hello for `gpu`, the GPU of the request or order the message names. With
  // `gpu` unknown to the core (nullopt), any registered worker passes (the core refuses the unknown id). Else
  // PERMISSION_DENIED, counted in refused_peers; the message then changes nothing.
  absl::Status CheckWorkerPeer(std::string_view peer, std::optional<GpuId> gpu, std::string_view what);
  // The id check of a request-scoped message (AdmitRequest, HostCopyWritten, Complete) from the worker of `gpu`:
  // `request` must be in GPU `gpu`'s range of node request ids (GpuOfNodeRequestId(request) == gpu; the worker gives
  // ids with MakeNodeRequestId, common/types.h), or the reserved 2^64-1, which the core refuses by name. Else
  // INVALID_ARGUMENT naming both GPUs, counted in
  // foreign_request_ids; the message then changes nothing.
  absl::Status CheckRequestIdRange(RequestId request, GpuId gpu, std::string_view what);
  // Both checks for a worker-only message naming `request`: a request the core knows must come from its GPU's worker
  // (CheckWorkerPeer); an unknown one from a registered worker, in that worker's GPU's range (CheckRequestIdRange;
  // the core then refuses the unknown id NOT_FOUND).
  absl::Status CheckRequestPeer(std::string_view peer, RequestId request, std::string_view what);
  void Tick();
  // Liveness: fences the GPU whose worker's connection closed / who was silent for worker_timeout.
  // A close is taken from the socket monitor (TakeDisconnected) into closing_; the fence comes in ServeOnce once the
  // messages already queued on the socket are served (FenceClosed): a worker that sent Complete and exited at once
  // has its Complete queued before its close, and it must end the request, not leave it interrupted (found by
  // libdhs_api CompleteThenCloseEndsTheRequestAtMemd, which forces the two to be taken together).
  void CheckDisconnects();
  void FenceClosed();
  void CheckSilentWorkers();
  // Records a message from `peer` (liveness); FAILED_PRECONDITION when `peer` is a fenced worker and `type` is not
  // a Hello (or an IntrospectQuery, which any peer may send).
  absl::Status Heard(std::string_view peer, wire::Body type);
  // Fences `gpu` in the core, which alone holds "fenced" and `why` (its orders are dropped from now on), logs `why`.
  // No-op when not up.
  void Fence(GpuId gpu, const std::string& why);
  // Drains the core's outbox and sends each order as one wire message to the worker of its GPU; a CompleteAck is
  // returned instead (encoded with `answering_sequence`): it is the reply of the Complete being handled.
  std::string FlushOrders(uint64_t answering_sequence = 0);
  std::string Encode(const GrantOrder& order);
  std::string Encode(const WaitOrder& order);
  std::string Encode(const RejectOrder& order);
  // The one AdmitReject encoder; `took_over`: AdmitReject.took_over (a resume's interrupted request ended with it).
  std::string EncodeReject(RequestId request, const absl::Status& why, uint64_t sequence, RequestId took_over = 0);
  std::string Encode(const ReclaimOrder& order);
  std::string Encode(const PopulateOrder& order);
  std::string Encode(const RetireOrder& order);
  uint64_t AdmitSequence(RequestId request) const;
  void SendToGpu(GpuId gpu, const std::string& bytes);
  // A reply (Server::OnReplyFailure) that could not be queued to `peer`: when `peer` is the worker of a GPU that is
  // up, that GPU is fenced as for an order (a lost HelloReply, CompleteAck, ErrorReply, ... breaks the conversation);
  // else (an introspection client, a fenced worker) it is logged, rate-limited, and the client times out.
  void ReplyNotDelivered(std::string_view peer, const absl::Status& why);
  void PublishMetrics();

  DaemonOptions options_;
  bool keep_pool_ = false;  // the destructor keeps the segment (a start that failed after adopting it)
  std::unique_ptr<HostPoolSegment> segment_;
  std::unique_ptr<HostJournal> journal_;  // over segment_->journal(); the core writes it
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<ResidencyManager> core_;
  std::unique_ptr<Server> server_;
  std::map<GpuId, GpuInfo> gpus_;
  // GPUs whose worker's connection closed (the connection id the close named), fenced by FenceClosed unless a Hello of
  // a new connection took the GPU first.
  std::vector<std::pair<GpuId, uint64_t>> closing_;
  RequestRecordStore records_;  // the requests' records for resume (opened with AdmitRequest.record)
  RecordJournal record_journal_;  // records_ mirrored in RUN_DIR/records, for the next memd
  // Issue 26: each GPU's model (Hello.model_fingerprint), mirrored in RUN_DIR/models (memd/model_journal.h) so that
  // a restarted memd knows which model wrote the host pages it adopted; ModelRefusal compares against it.
  ModelJournal model_journal_;
  ModelFingerprints models_;
  // Sets `gpu`'s model in models_ and the journal (a failed write is logged: this memd still compares it).
  void KeepModel(GpuId gpu, uint64_t model);
  // Complete.keep_output: the request's record (with Complete's output tokens) goes to records_'s finished ones.
  void KeepFinishedRecord(const wire::CompleteT& c);
  // Drops a request's record from records_ and from record_journal_ (both: they mirror each other).
  void ReleaseRecord(RequestId request) {
    records_.Release(request);
    record_journal_.Release(request);
  }
  std::map<RequestId, uint64_t> admit_sequence_;  // the AdmitRequest's sequence, repeated by its Grant/Wait/Reject
  uint64_t next_sequence_ = 1;
  DaemonCounters counters_;
  RequestTimelines timelines_;
  // Adds `event` to `request`'s timeline now (memd's clock: CLOCK_MONOTONIC us).
  void Note(RequestId request, TimelineEvent event, uint64_t pages = 0, std::string detail = {});
  std::chrono::steady_clock::time_point next_tick_, next_retry_;
  std::optional<std::chrono::steady_clock::time_point> release_held_at_;  // ReleaseHeldPages due (adopted pool)
  std::set<GpuId> adopt_waiting_gpus_;  // GPUs the adopted journal names that have not said Hello to this memd yet
  // Ends the adoption's hold of host pages now (the grace passed, or every GPU of the journal registered).
  void ReleaseHeldNow(std::string_view why);
  std::unique_ptr<KvEventPublisher> kv_events_;  // issue 24: null with the stream off
  void PublishKvEvents();  // the core's KV events since the last call, as one batch
  // Issue 26, the cluster tier (memd/cluster_tier.h; null when --cluster-store is not given).
  std::unique_ptr<ClusterTier> cluster_;
  // The page geometry of GPU `gpu`'s worker (its Hello's shape and memd's host page bytes); nullopt when it declared
  // no shape.
  std::optional<PageGeometry> GeometryOf(GpuId gpu) const;
  // The pages confirmed shared since the last call, offered to the write-behind queue (their bytes read from the pool).
  void PublishClusterPages();
  // Issue 26, sessions: at the Complete `c` of a finished turn with a session (its record's) and page digests, its
  // history pages with confirmed host copies (ResidencyManager::SessionPages) are offered to the cluster tier under
  // the session key; before the Complete event, which frees them.
  void PublishSessionPages(const wire::CompleteT& c);
  // Before an admission's grant decision: its pages the host tier lacks asked of the store (the lookup deadline);
  // the ones found and checked copied into reusable host pages and stored as cached shared pages
  // (ResidencyManager::ImportClusterPages), so the grant takes them as host hits. Every failure is a counted miss.
  // Returns the pages imported (noted in the request's timeline).
  uint32_t ImportClusterPages(const AdmitRequest& admit);
  mutable std::mutex metrics_mu_;
  std::string metrics_;
};

}  // namespace dhs::memd
