// workerd/memd_client.h: the worker's connection to memd (docs/protocol.md, conversation contract): a DealerClient
// (identity "worker/<gpu>") to ipc://<run_dir>/memd.sock, the Hello handshake, the mapped host-pool segment from
// HelloReply, the MemdLink sends, and a non-blocking Poll that dispatches memd's messages to a MemdHandler and sends a
// Heartbeat every second.
//
// Thread-safety: none; the worker thread owns it (ZeroMQ sockets are single-thread objects).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/host_pool.h"
#include "common/transport.h"
#include "workerd/memd_link.h"

namespace dhs {

// The memd silence after which a worker ends its epoch: `configured` (--memd-timeout-ms), capped at 2/3 of memd's
// worker timeout (HelloReply.worker_timeout_ms; 0 = memd did not say: `configured`). A worker stopped (SIGSTOP) or
// starved past memd's fence must see its own timeout pass first, so that it never acts on a grant of a fenced epoch
// (memd fences after worker_timeout without a message; the worker's silence is measured from memd's last ack, which
// follows the worker's last heartbeat). At least 1 ms.
std::chrono::milliseconds EffectiveMemdTimeout(std::chrono::milliseconds configured, uint32_t memd_worker_timeout_ms);

class MemdClient final : public MemdTransport {
 public:
  // Connects to memd in `run_dir`, sends `hello` and waits up to `timeout` for HelloReply (retrying while memd is not
  // up), then maps segment 0 of the reply. Errors: PERMISSION_DENIED / FAILED_PRECONDITION at once when memd's socket
  // may not be reached (CheckSocketAccess), DEADLINE_EXCEEDED (no reply), FAILED_PRECONDITION (not accepted:
  // the reason), the ErrorReply's status, DATA_LOSS/NOT_FOUND (segment), INVALID_ARGUMENT (segment page size differs
  // from hello.page_bytes).
  static absl::StatusOr<std::unique_ptr<MemdClient>> Connect(std::string_view run_dir, const wire::HelloT& hello,
                                                             std::chrono::milliseconds timeout);

  // The host-pool pages of segment 0 (page h at h * page_bytes); empty when memd listed no segment.
  std::span<uint8_t> host_pages() const override;
  uint64_t worker_epoch() const override { return epoch_; }
  // HelloReply.interrupted_requests: requests of an earlier epoch of this GPU that memd still holds.
  const std::vector<uint64_t>& interrupted_requests() const override { return interrupted_; }
  // Liveness: memd acks our heartbeat every second; nothing from memd for `timeout` (default 2 s) ends the epoch.
  // The timeout in force is at most 2/3 of memd's worker timeout (HelloReply.worker_timeout_ms; EffectiveMemdTimeout).
  void set_memd_timeout(std::chrono::milliseconds timeout) {
    configured_timeout_ = timeout;
    AdoptWorkerTimeout(memd_worker_timeout_ms_);
  }
  std::chrono::milliseconds memd_timeout() const { return memd_timeout_; }
  // How long a worker whose memd died tries to say its re-Hello (default 30 s) before its epoch ends.
  void set_reconnect_bound(std::chrono::milliseconds bound) { reconnect_bound_ = bound; }

  // memd away (issue 11, docs/protocol.md "Re-Hello with a report"). memd died when its connection closed (the socket
  // monitor's DISCONNECTED: the process is gone; a worker that merely heard nothing for the memd timeout over a live
  // connection was stopped, or memd hangs: its epoch ends, see Poll). Then the socket is closed at once (what was
  // queued for the dead memd is dropped; exactly one connection to memd at a time) and away() is true until a memd
  // takes the re-Hello (PollAway); meanwhile every Send* drops its message (returns OK; SendTokensCommitted:
  // UNAVAILABLE) and Poll dispatches nothing (away(): MemdTransport's).
  // A re-Hello is out and not answered yet (the worker does not step meanwhile: its report holds every token).
  bool rehello_in_flight() const { return session().hello_out(); }
  // Call every iteration while away(); never blocks. Reconnects with exponential backoff (50 ms doubling to 1 s; an
  // attempt with no memd socket is skipped; an unanswered Hello is given up after the memd timeout and its socket
  // closed before the next attempt) and sends `make_hello()` (the worker's Hello with rehello, its epoch and report).
  // Returns the HelloReply once memd accepted it (no longer away; Poll serves memd again), nullopt while still away.
  // Errors, all ABORTED (the epoch ends; stays): memd did not come back within the reconnect bound; it refused the
  // re-Hello (accepted = false: e.g. it registered or fenced this GPU itself, or the epoch is stale) or answered an
  // ErrorReply; its host pool is not the segment this worker maps (another name, size or page size, or a fresh pool
  // in its place), or the epoch differs.
  absl::StatusOr<std::optional<wire::HelloReplyT>> PollAway(
      const std::function<wire::HelloT()>& make_hello) override;

  // Dispatches every message already received to `handler` (never blocks), answers memd's Heartbeats and sends ours
  // once a second with `load`. Undecodable messages are logged and dropped. Errors: from the socket, and ABORTED
  // once this worker's epoch ended: memd refused a message with ErrorReply.reason FENCED (nothing after it
  // is dispatched), or nothing came from memd for the memd timeout (checked before anything queued is dispatched: a
  // worker resumed after SIGSTOP never acts on an order of an epoch memd may have fenced). ABORTED stays.
  using Load = MemdLoad;
  absl::Status Poll(MemdHandler& handler, const Load& load) override;
  // Start-up (issue 22, docs/protocol.md "Start-up and the silence clock"): between HelloReply and the first Poll the
  // worker prepares (pins memd's host pool, allocates its pools, creates the Worker: seconds to minutes at production
  // sizes) and no MemdHandler exists yet, while memd's silence clock already runs (it started at the Hello). KeepAlive
  // keeps the conversation going meanwhile: it waits up to `wait` for memd's messages, answers memd's Heartbeats and
  // sends ours when due (as Poll does, with an idle load), and holds every other message, in arrival order, for the
  // first Poll, which dispatches them before anything newer (nothing is acted on before the Worker exists). Errors: as
  // CheckEpoch (ABORTED: fenced, or nothing from memd for the memd timeout: this worker could not run); memd's death
  // makes the client away() instead (the held messages are dropped: nothing of a dead memd is acted on) and the
  // first Poll / PollAway go on from there. Threads: the client may be used by another thread than the one that
  // connected (WorkerProcess::Start keeps it alive on a helper thread while its own thread prepares), one thread at a
  // time, handed over with a memory barrier (a thread join), as ZeroMQ requires of its sockets.
  absl::Status KeepAlive(std::chrono::milliseconds wait);
  // Messages KeepAlive holds for the first Poll.
  size_t held_messages() const { return held_.size(); }
  // ABORTED once the epoch ended (as Poll: fenced, or memd silent for the memd timeout over a connection that is
  // still open, checked now), else OK. A connection found closed (DealerClient::PeerClosed: also right after a
  // SIGSTOP, before the socket monitor reported it) makes the client away() instead, whatever the silence: a dead
  // memd, not a hung one.
  absl::Status CheckEpoch();
  // TEST ONLY: the socket monitor's events stay queued (DealerClient::HoldMonitorEventsForTest), as in a worker just
  // resumed after SIGSTOP whose ZeroMQ I/O thread has not run yet.
  void HoldConnectionEventsForTest() { dealer_->HoldMonitorEventsForTest(true); }
  // Messages still queued when the client closes are delivered for up to `linger` (a stopping worker's Completes).
  void SetLinger(std::chrono::milliseconds linger) override {
    if (dealer_ != nullptr) dealer_->SetLinger(linger);
  }

  // MemdLink. Once the epoch ended (Poll's ABORTED) nothing is sent: each returns that ABORTED status.
  absl::Status SendAdmitRequest(const wire::AdmitRequestT& m) override;
  absl::Status SendBackupComplete(const wire::BackupCompleteT& m) override;
  absl::Status SendHostCopyWritten(const wire::HostCopyWrittenT& m) override;
  absl::Status SendReadersDone(const wire::ReadersDoneT& m) override;
  absl::Status SendReadyPublish(const wire::ReadyPublishT& m) override;
  absl::Status SendComplete(const wire::CompleteT& m) override;
  // One in flight: UNAVAILABLE (nothing sent) until memd answered the previous one (TokensCommittedAck or
  // ErrorReply); the worker then sends those tokens with its next step. ABORTED once the epoch ended (checked now).
  absl::Status SendTokensCommitted(const wire::TokensCommittedT& m) override;
  // HelloReply.interrupted_records: the records memd kept of those requests (the ones that have one).
  const std::vector<std::unique_ptr<wire::RequestRecordT>>& interrupted_records() const override { return records_; }
  // HelloReply.finished_records (lost ends, workerd/README.md "Restart"): outputs of the previous epoch's finished
  // requests, for their clients' Attach (Worker::KeepFinishedOutputs).
  const std::vector<std::unique_ptr<wire::RequestRecordT>>& finished_records() const { return finished_records_; }

 private:
  MemdClient(std::unique_ptr<DealerClient> dealer, std::string sender, GpuId gpu, std::string run_dir)
      : dealer_(std::move(dealer)), sender_(std::move(sender)), gpu_(gpu), run_dir_(std::move(run_dir)) {}
  uint64_t NextSeq() { return ++seq_; }
  // Decodes one message from memd and dispatches it over the wire message list (ReceiveMessage: each member is
  // handled here or by `handler`, or is not expected from memd: logged and dropped).
  void Dispatch(const std::string& bytes, MemdHandler& handler);
  // memd's ErrorReply `msg`: ends the TokensCommitted in flight, rejects the AdmitRequest it answers, or ends the epoch
  // (fenced); anything else is logged.
  void OnErrorReply(const Message& msg, MemdHandler& handler);
  // Sends our Heartbeat (with `load`) when one is due: every second, or a third of the memd timeout when shorter.
  absl::Status HeartbeatIfDue(const Load& load);
  void EnterAway();
  // The next attempt after the current one failed (MemdSession::RetryLater: backoff doubled, at most 1 s); the
  // socket is closed.
  void RetryLater(std::chrono::steady_clock::time_point now);
  // A HelloReply to the re-Hello: checked (see PollAway); OK -> connected again.
  absl::Status AcceptReHello(const wire::HelloReplyT& reply);
  // Whether memd's pool in `reply` is the segment mapped here (name, sizes, and the same shm object).
  absl::Status CheckSamePool(const wire::HelloReplyT& reply) const;

  std::unique_ptr<DealerClient> dealer_;
  std::string sender_;
  GpuId gpu_;
  uint64_t seq_ = 0;
  uint64_t epoch_ = 0;
  std::unique_ptr<HostPoolSegment> segment_;
  absl::flat_hash_map<uint64_t, uint64_t> admit_seq_;  // AdmitRequest sequence -> RequestId (for an ErrorReply)
  std::chrono::steady_clock::time_point last_heartbeat_{};
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();  // latest message from memd
  std::chrono::steady_clock::time_point last_check_ = std::chrono::steady_clock::now();  // latest CheckEpoch
  std::chrono::milliseconds memd_timeout_{2000};        // in force
  std::chrono::milliseconds configured_timeout_{2000};  // --memd-timeout-ms
  uint32_t memd_worker_timeout_ms_ = 0;                 // HelloReply.worker_timeout_ms (0: not told)
  void AdoptWorkerTimeout(uint32_t memd_worker_timeout_ms);
  absl::Status ended_;  // ABORTED once the epoch ended
  std::vector<uint64_t> interrupted_;
  std::vector<std::unique_ptr<wire::RequestRecordT>> finished_records_;
  std::vector<std::string> held_;  // memd's messages received by KeepAlive, for the first Poll (start-up)
  std::vector<std::unique_ptr<wire::RequestRecordT>> records_;
  uint64_t commit_seq_ = 0;  // the TokensCommitted in flight (0: none): one at a time
  std::string run_dir_;
  uint64_t pool_inode_ = 0;  // the mapped segment's shm object (a fresh pool of a new memd is another one)
  std::chrono::milliseconds reconnect_bound_{30000};
};

}  // namespace dhs
