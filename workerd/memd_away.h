// workerd/memd_away.h: the worker while memd is away, and its return (issue 11, docs/protocol.md "Re-Hello with a
// report"; issue 23: one room of the old Worker), over the link's MemdSession (workerd/memd_session.h: "memd is away"
// is stored there only) and its decisions (PlanReturn: who is refused, adopted, sent again).
//
// Enter: memd died (its connection closed); its orders are resolved locally (ResidencyAgent::EnterAway) and, until
// Return, the worker keeps decoding its granted requests from the GPU without writing a host page
// (HierarchicalKvAccess::PauseHostWrites): nothing is sent to memd; submits are accepted and wait (their AdmitRequest
// goes after the re-Hello); the step's tokens are held from the clients (Hold: memd's record must have them first); a
// request pauses (Pause) when its held tokens reach config.away_held_tokens or its next step would need a host write
// (its tail is full: MayStep); a request that ends (finished, failed, its client gone) stays until the re-Hello
// (RequestPhase::kEnding), then ends as usual.
//
// Report: the re-Hello's report. Return: memd accepted the re-Hello; the return is carried out by CarryOutReturn
// (workerd/memd_return.h, libdhs's too), this class its ReturnHandler: each refused report's request ends here like
// after a fence and is resumed (one that ended while away ends as it was ending), host writes resume, the adopted
// ones' held tokens go to their clients, the ends deferred while away happen (RequestEnds), the interrupted requests
// are resumed and the waiting admissions sent again (AdmissionDesk).
//
// Thread-safety: none; the worker thread drives it.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "dhs_generated.h"
#include "workerd/admission.h"
#include "workerd/client_streams.h"
#include "workerd/geometry.h"
#include "workerd/kv/hierarchical_kv_access.h"
#include "workerd/kv_stack.h"
#include "workerd/memd_link.h"
#include "workerd/memd_return.h"
#include "workerd/memd_session.h"
#include "workerd/request_book.h"
#include "workerd/token_ledger.h"
#include "workerd/residency_agent.h"
#include "workerd/worker_request.h"
#include "workerd/worker_stats.h"

namespace dhs {

// What the memd-away handling works with (each must outlive it): the Worker's parts it is handed, never the Worker.
struct AwayParts {
  const WorkerConfig* config = nullptr;
  const WorkerGeometry* geometry = nullptr;
  MemdLink* memd = nullptr;               // its session() is the one away state
  RequestBook* book = nullptr;
  RequestMap* requests = nullptr;
  ResidencyAgent* agent = nullptr;
  HierarchicalKvAccess* hier = nullptr;  // nullptr in resident mode (no host writes to pause)
  WorkerRecorder* recorder = nullptr;
  ClientStreams* clients = nullptr;
  AdmissionDesk* admission = nullptr;
  RequestEnds* ends = nullptr;
  KvStack* stack = nullptr;  // the KV half of Enter and Return (KvStack::EnterAway, ReturnFromAway)
  TokenLedger* ledger = nullptr;  // Enter: the TokensCommitted in flight is never answered (TokenLedger::Lost)
};

class MemdAway final : private ReturnHandler {
 public:
  explicit MemdAway(const AwayParts& parts) : p_(parts) {}

  // Whether the worker serves away (Enter .. Return; the link's MemdSession::serving_away()).
  bool away() const { return p_.memd->session().serving_away(); }
  // memd died: the worker serves away (header). The state is the link's MemdSession (MemdSession::TakeLoss: once
  // per death; from kConnected too, for an in-process caller). A second call for the same death does nothing.
  void Enter();
  // The re-Hello's report (Hello.report): one ReportedRequest per granted request: slot, required pages, pages
  // (ResidencyAgent::Report), AdmitRequest.complete_pages, optional_history, the speculation share and its record with
  // every token it generated.
  std::vector<std::unique_ptr<wire::ReportedRequestT>> Report() const;
  // memd accepted the re-Hello (`reply`; header, worker.h "ReturnFromAway"). The link's session is connected
  // afterwards (MemdClient moved it on the reply; an in-process caller's is moved here). Errors: UNAVAILABLE (memd
  // unreachable).
  absl::Status Return(const wire::HelloReplyT& reply);

  // Whether r may step now with `rows` more rows: never once it ends or finished; with memd up always; away only
  // while its client reads, its held tokens are below config.away_held_tokens and its tail has room for `rows` rows
  // without a host write.
  bool MayStep(const WorkerRequest& r, Position rows) const;
  // r may not step while away (MayStep false): an active one that still has tokens to give pauses until the
  // re-Hello (kPaused; logged once, counted in paused_while_away). Nothing with memd up.
  void Pause(WorkerRequest& r);
  // r produced its last `new_tokens` tokens while away: they are held from its client (held_from) until the re-Hello
  // (counted in tokens_while_away).
  void Hold(WorkerRequest& r, size_t new_tokens);

 private:
  // ReturnHandler (workerd/memd_return.h: CarryOutReturn's steps, the order libdhs's return follows too):
  // A refused report's request: kFenced: dropped here (nothing sent to memd; RequestEnds::Drop) and ended to its
  // client like after a fence; resumed from memd's record when memd lists it (ResumableFound), else from its own record
  // (kept in refused_records_; ResumeRefused: AdmissionDesk::Resume, every row recomputed). Ended here while memd was
  // away: its held tokens and its own end, never resumed; kEndedComplete: that end is RequestEnds::Finish (its
  // Complete).
  absl::Status EndRefused(RequestId id, const std::string& why, RefusedEnd how, bool listed) override;
  absl::Status ResumeRefused(RequestId id) override;
  void ReturnToKv(const std::set<RequestId>& adopted) override;
  // Its held tokens go out, a paused one steps again; one whose client failed that chunk (or finished) ends now.
  void Adopted(RequestId id) override;
  // RequestEnds::Finish with the end it deferred (its Complete goes whether memd lists it or not).
  absl::Status EndDeferred(RequestId id, bool listed) override;
  absl::Status EndInterrupted(RequestId id) override;  // AdmissionDesk::EndInterrupted
  absl::Status ResumableFound(RequestId id, const wire::RequestRecordT* record) override;  // AdmissionDesk::ResumeOrEnd
  absl::Status Resend(RequestId id) override;  // AdmissionDesk::SendAdmit
  // The tokens held from r's client while memd was away, in one chunk (final when r finished).
  void FlushHeld(WorkerRequest& r);

  AwayParts p_;
  size_t adopted_ended_ = 0;  // adopted requests that ended at the return (Adopted): the log's "ended while away"
  // The records of the refused requests memd holds nothing of, from EndRefused to ResumeRefused (one return).
  std::map<RequestId, std::unique_ptr<wire::RequestRecordT>> refused_records_;
};

}  // namespace dhs
