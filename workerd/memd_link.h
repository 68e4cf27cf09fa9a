// workerd/memd_link.h: the worker side of the memd conversation as two interfaces (docs/protocol.md, "Conversation
// contract (worker <-> memd)"), so that the serving core (Worker) never touches sockets:
//   MemdLink     what the worker sends to memd (implemented by MemdClient over ZeroMQ, or by a test's fake memd);
//   MemdHandler  what memd sends to the worker (MemdClient::Poll and fakes call it): AdmissionAnswers (about the
//                worker's requests: workerd's AdmissionDesk, libdhs's EmbeddedWorker) and memd's orders (carried
//                out on the KV side: libdhs's EmbeddedWorker, KvStack::Order; for workerd through InboxFor);
//   MemdTransport  a MemdLink with the conversation's receiving side (Poll, PollAway) and what the Hello's answer
//                said (host pool, epoch, interrupted requests): what libdhs's EmbeddedWorker is opened over
//                (MemdClient over ZeroMQ, or the in-process fake memd of tests/workerd/worker_test_util.h).
// Every message is the object-API table of schemas/dhs.fbs; units are those of the schema (GPU pages, history pages,
// host pages, rows).
//
// Thread-safety: none; one worker thread calls both sides.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dhs_generated.h"
#include "workerd/memd_session.h"

namespace dhs {

class MemdLink {
 public:
  virtual ~MemdLink() = default;
  // The conversation's one state (connected / lost / away / re-Hello out; workerd/memd_session.h): the transport
  // (MemdClient) moves it on its connection's events, the Worker when it serves away and when a memd takes the
  // re-Hello; the Worker and the ResidencyAgent read it. A test's fake link holds one too.
  MemdSession& session() { return session_; }
  const MemdSession& session() const { return session_; }
  // Each Send queues the message for memd without blocking. Errors: UNAVAILABLE when it cannot be queued.
  virtual absl::Status SendAdmitRequest(const wire::AdmitRequestT& m) = 0;
  // Only for a ReclaimOrder (m.order != 0); pages are GPU pages.
  virtual absl::Status SendBackupComplete(const wire::BackupCompleteT& m) = 0;
  // History pages written to their host pages outside any ReclaimOrder (protocol version 3).
  virtual absl::Status SendHostCopyWritten(const wire::HostCopyWrittenT& m) = 0;
  virtual absl::Status SendReadersDone(const wire::ReadersDoneT& m) = 0;
  virtual absl::Status SendReadyPublish(const wire::ReadyPublishT& m) = 0;
  virtual absl::Status SendComplete(const wire::CompleteT& m) = 0;
  // At most one per step (protocol version 5): the tokens not yet committed, queued before they go to the clients.
  // UNAVAILABLE: not sent now (the previous one is not acknowledged, or memd's queue is full); resend them later.
  virtual absl::Status SendTokensCommitted(const wire::TokensCommittedT& m) = 0;

 private:
  MemdSession session_;
};

// memd's answers about the requests a worker admits (contract §2, §6): what the owner of the requests handles
// (workerd's AdmissionDesk; libdhs's EmbeddedWorker for an engine's). memd's orders are not here: the KV side carries
// them out (KvStack::Order; issue 25: the engine, and workerd's serving front end, never see one).
class AdmissionAnswers {
 public:
  virtual ~AdmissionAnswers() = default;
  virtual void OnAdmitGrant(const wire::AdmitGrantT& m) = 0;
  virtual void OnAdmitWait(const wire::AdmitWaitT& m) = 0;
  // memd's AdmitReject (or an ErrorReply to the AdmitRequest, which MemdClient hands on as one). m.took_over != 0: a
  // resume memd rejected after taking its interrupted request over (it never fits): that request is gone too.
  virtual void OnAdmitReject(const wire::AdmitRejectT& m) = 0;
  virtual void OnCompleteAck(const wire::CompleteAckT& m) = 0;
  // memd answered the TokensCommitted in flight: every entry applied (TokensCommittedAck), or not all of them
  // (ErrorReply `why`: the others were applied; which ones the reply does not say). workerd's steps resend nothing
  // (a resumed request regenerates from the record's end); libdhs, whose engine's tokens exist nowhere else, resends.
  virtual void OnTokensCommitted() {}
  virtual void OnTokensRefused(const absl::Status& why) {}
};

// Every message memd sends a worker (MemdTransport::Poll dispatches to it): the answers, and memd's orders.
class MemdHandler : public AdmissionAnswers {
 public:
  virtual void OnReclaimOrder(const wire::ReclaimOrderT& m) = 0;
  virtual void OnRetire(const wire::RetireT& m) = 0;
  virtual void OnPopulateOrder(const wire::PopulateOrderT& m) = 0;
};

// The worker's load, sent with each Heartbeat (Heartbeat.active_requests, pending_copies, decode_tokens_per_s).
struct MemdLoad {
  uint32_t active_requests = 0;
  uint32_t pending_copies = 0;
  float decode_tokens_per_s = 0;
};

// The whole conversation with one memd as one interface (issue 25, "EmbeddedWorker takes its parts from outside"):
// what the worker sends (MemdLink), what it receives (Poll: memd's messages to a MemdHandler; PollAway: the re-Hello
// while memd is away) and what memd's HelloReply said. MemdClient implements it over ZeroMQ (its comments give the
// timing rules: heartbeats, the memd timeout, the reconnect bound); a test's fake memd implements it in process, so
// that a test decides which message comes when.
class MemdTransport : public MemdLink {
 public:
  // The mapped host-pool pages of segment 0 (page h at h * host_page_bytes); empty when memd listed none.
  virtual std::span<uint8_t> host_pages() const = 0;
  // HelloReply.worker_epoch: part of every node request id (RequestBook::set_epoch).
  virtual uint64_t worker_epoch() const = 0;
  // The latest HelloReply's interrupted requests of this GPU (at the Hello, then at each re-Hello memd took) and the
  // records memd kept of them (those that have one).
  virtual const std::vector<uint64_t>& interrupted_requests() const = 0;
  virtual const std::vector<std::unique_ptr<wire::RequestRecordT>>& interrupted_records() const = 0;
  // Dispatches every message memd sent that is here now to `handler` (never blocks); `load` goes with the Heartbeat.
  // Errors: ABORTED once the epoch ended (stays), the transport's own.
  virtual absl::Status Poll(MemdHandler& handler, const MemdLoad& load) = 0;
  // While session().away(): tries the re-Hello (`make_hello()`: the worker's Hello with its report). The HelloReply
  // once a memd took it (session() connected again), nullopt while still away. Errors: ABORTED (the epoch ended).
  virtual absl::StatusOr<std::optional<wire::HelloReplyT>> PollAway(
      const std::function<wire::HelloT()>& make_hello) = 0;
  // Messages still queued when the transport closes are delivered for up to `linger` (a closing worker's Completes).
  virtual void SetLinger(std::chrono::milliseconds linger) {}
  bool away() const { return session().away(); }
};

}  // namespace dhs
