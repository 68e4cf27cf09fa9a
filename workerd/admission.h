// workerd/admission.h: the admission side of the worker and memd's messages to it (issue 23: one room of the old
// Worker; docs/protocol.md "Conversation contract (worker <-> memd)" §2, §6): a request's AdmitRequest (its
// required pages, its record), the answers (AdmitGrant, AdmitWait, AdmitReject), CompleteAck, the granted requests
// started, and the resume of interrupted requests of an earlier epoch (issue 11: Resume, ResumeOrEnd, EndInterrupted;
// at start the Worker takes libdhs's list of them, Worker::ResumeInterrupted).
//
// AdmissionDesk is the worker's AdmissionAnswers: memd's messages reach it through libdhs (the Worker's memd_inbox(),
// lib::EmbeddedWorker::InboxFor: memd's orders (ReclaimOrder, Retire, PopulateOrder) are carried out there, on the KV
// side, and never reach this room; issue 25). It moves requests through the
// book's admission phases (kUnsent -> kWaiting -> kQueued -> kGranted -> kActive); ends go through RequestEnds (the
// loop's Finish), a refused admission's client side through ClientStreams.
//
// Thread-safety: none; the worker thread drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "dhs_generated.h"
#include "workerd/admission_shape.h"
#include "workerd/client_streams.h"
#include "workerd/geometry.h"
#include "workerd/memd_session.h"
#include "workerd/memd_link.h"
#include "workerd/model/model.h"
#include "workerd/prefix_import.h"
#include "workerd/request_book.h"
#include "workerd/residency_agent.h"
#include "workerd/resume_import.h"
#include "workerd/token_ledger.h"
#include "workerd/worker_request.h"
#include "workerd/worker_stats.h"

namespace dhs {

// What the admission side works with (each must outlive it): the Worker's parts it is handed, never the Worker.
struct AdmissionParts {
  const model::Model* model = nullptr;
  const WorkerConfig* config = nullptr;
  const WorkerGeometry* geometry = nullptr;
  MemdLink* memd = nullptr;
  RequestBook* book = nullptr;
  RequestMap* requests = nullptr;
  ResidencyAgent* agent = nullptr;
  ResumeImporter* resumes = nullptr;
  WorkerRecorder* recorder = nullptr;
  ClientStreams* clients = nullptr;
  RequestEnds* ends = nullptr;
  TokenLedger* ledger = nullptr;  // the TokensCommitted in flight: memd's answers (OnTokensCommitted / Refused)
};

class AdmissionDesk final : public AdmissionAnswers {
 public:
  explicit AdmissionDesk(const AdmissionParts& parts) : p_(parts) {}

  // r's AdmitRequest to memd: required pages for its context (input - resumed + max_new, the speculation share
  // included), its complete pages (CompletePages), its record (RecordOf: every token committed so far), a resume's
  // resume_of / host_backed. Errors: UNAVAILABLE "worker cannot reach memd: ..." (not queued).
  absl::Status SendAdmit(const WorkerRequest& r);
  // r's AdmitRequest (SendAdmit sends it; MemdAway's report repeats its declarations): its shape through
  // AdmitRequestOf (workerd/admission_shape.h, the construction libdhs's EmbeddedWorker calls too), its record, prefix
  // chain and session.
  wire::AdmitRequestT AdmissionOf(const WorkerRequest& r) const;
  // The granted request `id` (RequestBook::TakeGranted) starts: its model session opens and it moves to kActive; a
  // resume's (or shared prefix pages') host runs are planned over the pages made host-ready at the grant
  // (ResumeImporter::Begin). False when that plan failed: the loop rebuilds its KV from its tokens (every row
  // recomputed). True (nothing done) for an id no longer in flight.
  bool Start(RequestId id);

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
  // bytes, age); one dropped is logged and counted (WorkerStatsReply.resumed_outputs_dropped). Errors:
  // INVALID_ARGUMENT (the record is not a valid submit, or holds more tokens than max_new: the interrupted id is ended
  // with Complete, nothing admitted), UNAVAILABLE (memd unreachable).
  // `interrupted` = 0: a request memd holds nothing of (a re-Hello's refused report): admitted afresh with its record
  // (every row recomputed), nothing is ended.
  absl::Status Resume(RequestId interrupted, const wire::RequestRecordT& record);
  // Interrupted request `id` of an earlier epoch (memd's HelloReply lists it; `record`: its record, nullptr when memd
  // sent none): resumed (Resume) from the record, else ended (EndInterrupted). Errors: UNAVAILABLE (memd unreachable);
  // a record that cannot be resumed is logged, its request ended.
  absl::Status ResumeOrEnd(RequestId id, const wire::RequestRecordT* record);
  // Complete for an interrupted id this worker does not resume (memd frees what it kept; `keep_output`: its record
  // held every token, memd keeps the output too, workerd/README.md "Restart: a finished request's end"). Errors:
  // UNAVAILABLE.
  absl::Status EndInterrupted(RequestId interrupted, bool keep_output = false);
  // AdmissionAnswers: memd's answers (contract §2, §6).
  void OnAdmitGrant(const wire::AdmitGrantT& m) override;
  void OnAdmitWait(const wire::AdmitWaitT& m) override;
  void OnAdmitReject(const wire::AdmitRejectT& m) override;
  void OnCompleteAck(const wire::CompleteAckT& m) override;
  // memd's answer to the TokensCommitted in flight (TokenLedger::Acked / Refused; a request refused alone keeps the
  // reason, its later tokens are not sent; its stream to the client goes on).
  void OnTokensCommitted() override;
  void OnTokensRefused(const absl::Status& why) override;

 private:
  AdmissionParts p_;
};

}  // namespace dhs
