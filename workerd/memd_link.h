// workerd/memd_link.h: the worker side of the memd conversation as two interfaces (docs/protocol.md, "Conversation
// contract (worker <-> memd)"), so that the serving core (Worker) never touches sockets:
//   MemdLink     what the worker sends to memd (implemented by MemdClient over ZeroMQ, or by a test's fake memd);
//   MemdHandler  what memd sends to the worker (implemented by Worker; MemdClient::Poll and fakes call it).
// Every message is the object-API table of schemas/dhs.fbs; units are those of the schema (GPU pages, history pages,
// host pages, rows).
//
// Thread-safety: none; one worker thread calls both sides.
#pragma once

#include "absl/status/status.h"
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

class MemdHandler {
 public:
  virtual ~MemdHandler() = default;
  virtual void OnAdmitGrant(const wire::AdmitGrantT& m) = 0;
  virtual void OnAdmitWait(const wire::AdmitWaitT& m) = 0;
  virtual void OnAdmitReject(const wire::AdmitRejectT& m) = 0;
  virtual void OnReclaimOrder(const wire::ReclaimOrderT& m) = 0;
  virtual void OnRetire(const wire::RetireT& m) = 0;
  virtual void OnPopulateOrder(const wire::PopulateOrderT& m) = 0;
  virtual void OnCompleteAck(const wire::CompleteAckT& m) = 0;
  // memd answered the TokensCommitted in flight: every entry applied (TokensCommittedAck), or not all of them
  // (ErrorReply `why`: the others were applied; which ones the reply does not say). workerd's steps resend nothing
  // (a resumed request regenerates from the record's end); libdhs, whose engine's tokens exist nowhere else, resends.
  virtual void OnTokensCommitted() {}
  virtual void OnTokensRefused(const absl::Status& why) {}
};

}  // namespace dhs
