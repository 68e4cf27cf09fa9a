// workerd/memd_return.h: the ONE way a return is carried out (issue 25: workerd's MemdAway and libdhs's
// EmbeddedWorker each acted on the ReturnPlan in their own loop, in their own order). A memd accepted the worker's
// re-Hello (docs/protocol.md "Re-Hello with a report"); PlanReturn (workerd/memd_session.h) decides who is refused,
// adopted, sent again, ended at memd or resumable; CarryOutReturn gives each of those decisions, in one order, to the
// program's ReturnHandler, which does what only that program can (a client's chunk, an engine's event, a resume).
//
// The order (each step over the plan's lists in their order):
//   1. the book forgets the ids the dead memd never acknowledged (RequestBook::ForgetUnacknowledged) and avoids, for
//      new ids, those memd holds as interrupted (RequestBook::HeldByMemd);
//   2. each refused report's request ends (EndRefused): like after a fence, or, when it ended here while memd was
//      away, as it was ending (then with its own Complete when memd lists it interrupted);
//   3. the KV half: the agent adopts the adopted requests' pages, host writes resume (ReturnToKv);
//   4. each adopted request goes on (Adopted: every token it generated is in memd's record now);
//   5. each request that ended here while memd was away (kEnding) ends now (EndDeferred), granted or not;
//   6. each of memd's interrupted requests the plan ends at memd gets its Complete (EndInterrupted), but one whose
//      Complete step 2 sent;
//   7. each resumable interrupted request goes to the handler (ResumableFound) with memd's record of it, if any: workerd
//      resumes it, libdhs lists it to the engine (dhs_worker_list_resumable; the engine decides);
//   8. each refused request of step 2 that memd holds nothing of (kFenced, not listed) may be resumed from the
//      program's own record (ResumeRefused: workerd does, libdhs does not), after the Completes and takeovers of
//      steps 5-7 (review finding: workerd resumed in step 2, and the resume could take the id of an interrupted
//      request memd still held, then rejected as "already known": the request was lost; step 1 now also avoids
//      those ids);
//   9. the admissions still waiting for their grant go again (Resend; a kUnsent one moves to kWaiting first).
// Steps 2-6 send no AdmitRequest: the admissions of a return (steps 7-9) follow the Completes of steps 2-6 (step 7
// also ends, with a Complete, an interrupted request it cannot resume). New node ids avoid every id memd holds
// (step 1), so an admission never names an interrupted id whatever the order.
// A handler error (UNAVAILABLE: memd unreachable) stops the return there; the caller's epoch then ends.
//
// Thread-safety: none; the worker's thread.
#pragma once

#include <cstddef>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "dhs_generated.h"
#include "workerd/memd_session.h"
#include "workerd/request_book.h"

namespace dhs {

// How a refused report's request ends (ReturnHandler::EndRefused).
enum class RefusedEnd : uint8_t {
  kFenced,         // it was stepping: it ends like after a fence and may be resumed (memd's record, or the worker's)
  kEnded,          // it ended here while memd was away (kEnding) and memd holds nothing of it: its own end, no Complete
  kEndedComplete,  // as kEnded, and memd lists it interrupted: its own end with its Complete (the handler sends it)
};

// The program's side of a return (MemdAway for workerd, EmbeddedWorker for libdhs). Each call names a request of the
// book (steps 2, 4, 5, 8) or one of memd's interrupted requests (steps 6, 7) of the return being carried out.
class ReturnHandler {
 public:
  virtual ~ReturnHandler() = default;
  // Step 2. `why`: PlanReturn's reason ("memd refused its report: ..."); `listed`: memd lists it interrupted (a kFenced
  // one is then resumable from memd's record, step 7; else step 8 offers its resume). The request leaves the book
  // here; no AdmitRequest may be sent (step 8 resumes). Errors: UNAVAILABLE.
  virtual absl::Status EndRefused(RequestId id, const std::string& why, RefusedEnd how, bool listed) = 0;
  // Step 3 (KvStack::ReturnFromAway(adopted)).
  virtual void ReturnToKv(const std::set<RequestId>& adopted) = 0;
  // Step 4: memd adopted granted request `id` with the report's record (every token generated here).
  virtual void Adopted(RequestId id) = 0;
  // Step 5: request `id` ended here while memd was away (kEnding); `listed`: memd lists it interrupted (a waiting one
  // whose admission the dead memd journaled: its Complete ends it there). It leaves the book. Errors: UNAVAILABLE.
  virtual absl::Status EndDeferred(RequestId id, bool listed) = 0;
  // Step 6: memd's interrupted request `id` ends at memd (its Complete). Errors: UNAVAILABLE.
  virtual absl::Status EndInterrupted(RequestId id) = 0;
  // Step 7: memd's interrupted request `id` is resumable; `record`: memd's record of it (HelloReply.interrupted_records),
  // nullptr when it sent none. Errors: UNAVAILABLE.
  virtual absl::Status ResumableFound(RequestId id, const wire::RequestRecordT* record) = 0;
  // Step 8: refused request `id` (step 2's kFenced, not listed: memd holds nothing of it) may be resumed from the
  // program's own record of it (taken at step 2). Errors: UNAVAILABLE.
  virtual absl::Status ResumeRefused(RequestId id) = 0;
  // Step 9: request `id` (waiting for its grant: kWaiting, or kQueued by the dead memd) has its AdmitRequest sent
  // again. Errors: UNAVAILABLE.
  virtual absl::Status Resend(RequestId id) = 0;
};

// What a return did (the programs log and count it).
struct ReturnDone {
  ReturnPlan plan;
  size_t ended = 0;   // step 5's deferred ends
  size_t resent = 0;  // step 9's admissions
};

// Carries out the return of `reply` (memd accepted the re-Hello) over `book` as it was when the re-Hello went out
// (header: steps 1-9). Errors: the handler's (the steps after it are not done).
absl::StatusOr<ReturnDone> CarryOutReturn(const wire::HelloReplyT& reply, RequestBook& book, const ReturnFacts& facts,
                                          ReturnHandler& handler);

}  // namespace dhs
