// workerd/memd_return.cc: see memd_return.h.
#include "workerd/memd_return.h"

#include <map>
#include <vector>

#include "common/check.h"

namespace dhs {

absl::StatusOr<ReturnDone> CarryOutReturn(const wire::HelloReplyT& reply, RequestBook& book, const ReturnFacts& facts,
                                          ReturnHandler& handler) {
  ReturnDone done{.plan = PlanReturn(reply, book, facts)};
  const ReturnPlan& plan = done.plan;
  book.ForgetUnacknowledged();  // 1: the dead memd acknowledges nothing more; the new one grants none of those ids
  book.HeldByMemd(reply.interrupted_requests);  // no new id (a resume's, a submit's) is one memd still holds
  std::set<RequestId> completed;  // refused requests whose own end sent their Complete (step 6 skips them)
  std::vector<RequestId> unheld;  // refused requests memd holds nothing of (step 8)
  for (const auto& [id, why] : plan.refused) {  // 2
    const RequestLife* life = book.Find(id);
    if (life == nullptr) continue;
    const bool listed = plan.interrupted.contains(id);
    RefusedEnd how = RefusedEnd::kFenced;
    if (life->phase == RequestPhase::kEnding) how = listed ? RefusedEnd::kEndedComplete : RefusedEnd::kEnded;
    if (how == RefusedEnd::kEndedComplete) completed.insert(id);
    if (how == RefusedEnd::kFenced && !listed) unheld.push_back(id);
    if (absl::Status s = handler.EndRefused(id, why, how, listed); !s.ok()) return s;
  }
  handler.ReturnToKv(plan.adopted);  // 3
  for (RequestId id : plan.adopted) {  // 4 (an adopted request the handler ended meanwhile is not in the book)
    if (book.Find(id) != nullptr) handler.Adopted(id);
  }
  std::vector<RequestId> ending;  // 5: collected first (each end leaves the book)
  for (const auto& [id, life] : book.requests()) {
    if (life.phase == RequestPhase::kEnding) ending.push_back(id);
  }
  for (RequestId id : ending) {
    if (absl::Status s = handler.EndDeferred(id, plan.interrupted.contains(id)); !s.ok()) return s;
    ++done.ended;
  }
  for (RequestId id : plan.end_interrupted) {  // 6
    if (completed.contains(id)) continue;
    if (absl::Status s = handler.EndInterrupted(id); !s.ok()) return s;
  }
  std::map<RequestId, const wire::RequestRecordT*> records;  // 7
  for (const auto& rec : reply.interrupted_records) {
    if (rec != nullptr) records.emplace(rec->request, rec.get());
  }
  for (RequestId id : plan.resumable) {
    auto it = records.find(id);
    if (absl::Status s = handler.ResumableFound(id, it == records.end() ? nullptr : it->second); !s.ok()) return s;
  }
  for (RequestId id : unheld) {  // 8: after every Complete and takeover (memd_return.h)
    if (absl::Status s = handler.ResumeRefused(id); !s.ok()) return s;
  }
  for (RequestId id : plan.resend) {  // 9: sent last
    const RequestLife* life = book.Find(id);
    if (life == nullptr || !WaitsForGrant(life->phase)) continue;  // ended (step 5), or not waiting any more
    if (life->phase == RequestPhase::kUnsent) {
      DHS_CHECK_OK(book.Transition(id, RequestPhase::kUnsent, RequestPhase::kWaiting));
    }
    if (absl::Status s = handler.Resend(id); !s.ok()) return s;
    ++done.resent;
  }
  return done;
}

}  // namespace dhs
