// tools/replay/zmq_node_client.h: the NodeClient that talks to a real node (docs/protocol.md, "client/replay <->
// workerd" and "dhsctl <-> memd"): SubmitRequest / SubmitAccepted / TokenChunk / ErrorReply with one worker,
// WorkerStatsQuery at the end, and memd's IntrospectQuery (the `gpus` JSON view, O(GPUs)) sampled while the run goes on
// so that the report has peak figures (sessions admitted, pages used): every sample_interval while polling, after a
// poll that brought a request's first token or a request's end, and once in Stats(). Connect reads the worker's
// counters once (WorkerStatsQuery) as the baseline, so Stats() reports this run's counters even when the worker served
// before (--connect; WorkerCountersSince). Issue 26: memd's cluster-tier counters (the status view's "cluster") are
// totalled across memd restarts (tools/replay/cluster_counters.h ClusterTally; a new memd is told by its connection
// closing or its counters going down).
//
// Thread-safety: one thread (the ReplayDriver's), as NodeClient requires.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "dhs_generated.h"
#include "nlohmann/json.hpp"
#include "tools/replay/cluster_counters.h"
#include "tools/replay/node_client.h"

namespace dhs::replay {

struct ZmqNodeClientOptions {
  std::string worker_endpoint;  // e.g. IpcEndpoint(run_dir, "worker-0")
  std::string memd_endpoint;    // e.g. IpcEndpoint(run_dir, "memd"); "" = no memd figures
  // true: send the trace's hash_ids as a prepared-prefix reference (the worker imports that history);
  // false: send the synthesized prompt bytes (SynthesizePrompt) and let the worker prefill them.
  bool prepared_prefix = false;
  std::chrono::milliseconds sample_interval{200};  // memd status sampling period while polling
  std::chrono::milliseconds request_timeout{5000}; // stats / introspection round trips
  // ZMTP heartbeat interval on the worker connection (DealerClient::Options::heartbeat_interval): a worker that
  // stops answering for 3 intervals counts as gone. 0 = off (a closed connection is still seen at once).
  std::chrono::milliseconds worker_heartbeat{1000};
  // Re-attach (issue 11): when the worker went away with requests unfinished, wait up to this long for a worker on
  // the same endpoint (restarted by dhs-node or a supervisor) and re-attach each unfinished request (Attach with the
  // tokens received so far): the stream goes on with no token lost or repeated. 0 = off: Poll fails at once.
  std::chrono::milliseconds reattach_timeout{0};
  // This client's identity (SubmitRequest.client, Attach.client): a worker finds a resumed request by (identity,
  // request id), so two clients that use the same request ids each re-attach to their own. 0 = a random non-zero
  // value drawn at Connect (kept for the client's life: its re-attaches carry it).
  uint64_t client_identity = 0;
  // Issue 22: the worker's CURVE public key (Z85, its RUN_DIR/serving-curve.pub) for a tcp:// worker started with
  // --listen: the connection is a CURVE client of it. "" = none (ipc://).
  std::string curve_server_key;
  // Issue 24: the requests' tenants (SubmitRequest.tenant): `tenant`, or with tenants > 1 "<tenant>#<k mod tenants>"
  // (RequestTenant), k = the request's session (session_of: every turn of a session gets its tenant), or its trace
  // index where its session is unknown (a single-turn request's session is its own trace index: the same k). The prefix block size is sent with prompt bytes too (the worker derives the chain).
  std::string tenant;
  int64_t tenants = 1;
  TenantKey tenant_by = TenantKey::kSession;  // dhs-replay --tenant-by: k = the session, or the trace index
  // Issue 26 (sessions across nodes): the session of each trace index (tools/replay/sessions.h SessionTurn::session,
  // the trace index of the session's first turn), sent as SubmitRequest.session = session + 1 (RequestSession; 0
  // means none on the wire). Empty, an index past its end or a negative entry: no session sent.
  std::vector<int64_t> session_of;
};

// SubmitRequest.session of the request at `trace_index` under `options` (see ZmqNodeClientOptions::session_of).
uint64_t RequestSession(const ZmqNodeClientOptions& options, int64_t trace_index);

// The tenant of the request at `trace_index` under `options` (see ZmqNodeClientOptions::tenant).
std::string RequestTenant(const ZmqNodeClientOptions& options, int64_t trace_index);

// The worker counters of one WorkerStatsReply as NodeStats fields (census, reclaims, pages, prefix blocks, speculation).
NodeStats WorkerCountersOf(const wire::WorkerStatsReplyT& stats);

// The end reason of a TokenChunk that carries an error, told by the chunk's code (TokenChunk.end_reason), never by
// its text: CANCELLED kCancelled, WORKER_STOPPING kWorkerStopping, WORKER_EPOCH_ENDED kWorkerGone, any other kFailed.
EndReason ErrorEndReason(wire::EndReason code);

class ZmqNodeClient final : public NodeClient {
 public:
  // Connects and reads the worker's counters as the baseline. Errors: those of DealerClient::Connect;
  // UNAVAILABLE naming the endpoint when the worker does not answer the stats query within request_timeout
  // (nothing listening there, the endpoint is not a worker's, or the worker is dead).
  static absl::StatusOr<std::unique_ptr<ZmqNodeClient>> Connect(ZmqNodeClientOptions options);

  absl::Status Submit(const SubmitRequest& request) override;
  // Issue 22: sends Cancel{request, client identity, reason}. The worker's NOT_FOUND answer (the request ended before
  // the Cancel arrived: its end is on its way) is ignored.
  absl::Status Cancel(RequestId request, std::string_view reason) override;
  // As NodeClient::Poll. Once the worker's connection dropped (the worker exited or was killed, or missed heartbeats)
  // and every message it sent before was handed out (a dead worker is seen within seconds, not after the driver's idle
  // timeout): without re-attaching, the requests it had not ended end here (end reason kWorkerGone; the error says
  // whether the worker stopped, i.e. ended requests with "worker stopping" first, or went away) and from then on
  // every call (Submit, Cancel, Poll, Stats) fails UNAVAILABLE with that account ("the worker at ... stopped: ..." /
  // "... went away ..."), so the per-request reasons reach the report.
  absl::StatusOr<std::vector<TokenEvent>> Poll(double timeout_ms) override;
  // Times the worker went away and every unfinished request was re-attached to its successor.
  int reattaches() const { return reattaches_; }
  // Requests submitted again after a re-attach: the successor did not know them (Attach NOT_FOUND) and the client had
  // none of their tokens (the dead worker never told memd of them, so nothing of them survived; resubmitting is exact).
  int resubmits() const { return resubmits_; }
  // The identity this client sends (ZmqNodeClientOptions::client_identity, drawn at Connect when 0).
  uint64_t client_identity() const { return options_.client_identity; }
  // For each re-attach, when the first token of any request arrived after it (time to recover, issue 11).
  const std::vector<std::chrono::steady_clock::time_point>& recovered_at() const { return recovered_at_; }
  absl::StatusOr<NodeStats> Stats() override;
  // As NodeClient::RestartPeaks: waits up to kRestartSettle for memd's gpus view to show no used slot (the previous
  // phase's Completes processed; a shared node's other clients may keep some: then it goes on after the wait), then
  // clears the peaks. Errors: memd's introspection failing (not with re-attaching on).
  absl::Status RestartPeaks() override;

 private:
  explicit ZmqNodeClient(ZmqNodeClientOptions options) : options_(std::move(options)) {}
  absl::Status SampleMemd();  // updates the peaks from memd's requests and gpus views
  absl::StatusOr<nlohmann::json> Introspect(wire::IntrospectWhat what, std::chrono::milliseconds timeout);
  // One message of the worker: a TokenChunk or an ErrorReply becomes at most one event in `out`. Internal for an
  // unreadable or unexpected message.
  absl::Status Handle(std::string_view bytes, std::vector<TokenEvent>& out);
  absl::Status HandleTokenChunk(const wire::TokenChunkT& chunk, std::vector<TokenEvent>& out);
  // The worker refused a Submit (kRejected), an Attach (NOT_FOUND: submitted again when nothing of it arrived) or a
  // Cancel (ignored: the request ended first).
  absl::Status HandleErrorReply(const wire::ErrorReplyT& reply, std::vector<TokenEvent>& out);
  void Forget(RequestId request);  // an ended request: no longer re-attached, resubmitted or stamped
  struct WorkerView {  // one WorkerStatsReply: the counters as NodeStats fields, plus the pool geometry
    NodeStats counters;
    GpuId gpu = 0;
    int64_t page_bytes = 0;
    int64_t capacity_pages = 0;
  };
  // `timeout`: the reply's deadline (request_timeout when unset).
  absl::StatusOr<WorkerView> QueryWorker(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // The worker's connection dropped (and no re-attach): the account of it (UNAVAILABLE), kept in lost_.
  absl::Status WorkerLost(int drops);
  // The worker went away: reconnects within reattach_timeout and sends Attach for each unfinished request. Errors:
  // UNAVAILABLE (no worker answered in time).
  absl::Status Reattach();

  ZmqNodeClientOptions options_;
  std::unique_ptr<DealerClient> worker_;
  std::unique_ptr<DealerClient> memd_;
  uint64_t next_sequence_ = 1;
  absl::flat_hash_map<uint64_t, RequestId> request_of_sequence_;  // Submit sequence -> request (ErrorReply)
  std::chrono::steady_clock::time_point last_sample_{};
  NodeStats baseline_;  // the worker's counters when Connect ran
  absl::flat_hash_set<RequestId> seen_tokens_;  // requests whose first token arrived
  absl::flat_hash_map<RequestId, uint32_t> received_;  // unfinished requests -> tokens received (Attach.received)
  int reattaches_ = 0;
  int resubmits_ = 0;
  absl::flat_hash_map<RequestId, SubmitRequest> submitted_;  // unfinished requests as submitted (for a resubmit)
  absl::flat_hash_map<uint64_t, RequestId> attach_of_sequence_;  // Attach sequence -> request
  absl::flat_hash_map<uint64_t, RequestId> cancel_of_sequence_;  // Cancel sequence -> request (issue 22)
  absl::flat_hash_map<RequestId, uint64_t> last_stamp_us_;  // request -> its latest chunk's since_submit_us (this
                                                             // worker connection; cleared by a re-attach)
  int64_t worker_stopping_ends_ = 0;  // requests the worker ended with end_reason WORKER_STOPPING
  absl::Status lost_;  // set once the worker's connection dropped without a re-attach (WorkerLost)
  bool awaiting_recovery_ = false;  // re-attached; no token since
  std::vector<std::chrono::steady_clock::time_point> recovered_at_;
  NodeStats peaks_;  // sessions_admitted_max and per-GPU peaks, from memd samples
  absl::flat_hash_map<GpuId, int64_t> peak_used_pages_;  // max M_req + M_opt seen, pages
  // Issue 24: memd's host pool per admitted session, bytes, summed over the samples with a session (mean) and its
  // peak; memd's shared + cached prefix pages at the latest status sample.
  double host_bytes_per_session_sum_ = 0, host_bytes_per_session_peak_ = 0;
  int64_t host_samples_ = 0, host_pages_shared_ = 0;
  // Issue 26: memd's cluster tier, its status samples totalled across memd restarts (cluster_counters.h);
  // memd_changed_: memd's connection that delivered the latest reply closed since the last status sample (a new memd
  // answers the next one), set by Introspect.
  ClusterTally cluster_tally_;
  bool memd_changed_ = false;
  int64_t host_pages_held_peak_ = 0, host_pages_allocated_peak_ = 0;  // issue 24: memd's host pool, sampled
};

}  // namespace dhs::replay
