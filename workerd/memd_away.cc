// workerd/memd_away.cc: see memd_away.h.
#include "workerd/memd_away.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dhs {

void MemdAway::Enter() {
  if (!p_.memd->session().TakeLoss(std::chrono::steady_clock::now())) return;  // once per death
  ++p_.recorder->counts().memd_aways;
  p_.stack->EnterAway();  // memd's orders resolved here, host writes paused
  if (p_.ledger != nullptr) p_.ledger->Lost();  // the re-Hello's report carries every token
  spdlog::warn("worker: memd is away: serving {} granted requests from the GPU (no admissions, no host writes, "
               "tokens held from clients) until a memd takes the re-Hello", p_.book->active());
}

std::vector<std::unique_ptr<wire::ReportedRequestT>> MemdAway::Report() const {
  std::vector<std::unique_ptr<wire::ReportedRequestT>> out;
  for (const auto& [id, r] : *p_.requests) {
    if (WaitsForGrant(r->life->held_phase())) continue;  // its AdmitRequest goes again
    // What its AdmitRequest declared, with its record holding every token generated so far.
    wire::AdmitRequestT admit = p_.admission->AdmissionOf(*r);
    std::unique_ptr<wire::ReportedRequestT> rep = ReportOf(p_.agent->Report(id), admit, std::move(admit.record));
    if (rep == nullptr) continue;
    out.push_back(std::move(rep));
  }
  return out;
}

absl::Status MemdAway::EndRefused(RequestId id, const std::string& why, RefusedEnd how, bool listed) {
  // memd changed nothing of a refused report's request. It ends here like after a fence (its client re-attaches) and
  // is resumed: from memd's interrupted record (`listed`: ResumableFound), else from this worker's record, kept here
  // for ResumeRefused (step 8: after every Complete of the return).
  // One that ended here while memd was away ends as it was ending instead, never resumed (review finding: a request
  // cancelled while memd was away was resumed).
  auto it = p_.requests->find(id);
  if (it == p_.requests->end()) return absl::OkStatus();
  WorkerRequest& r = *it->second;
  if (how != RefusedEnd::kFenced) {
    spdlog::info("worker: request {} ended while memd was away; memd refused its report ({}); it ends here", id, why);
    FlushHeld(r);  // its held tokens (and the final chunk of a finished one)
    if (how == RefusedEnd::kEndedComplete) {
      // memd holds it interrupted: its end is the usual one (memd is back), its Complete the loop's (CompleteOf: a
      // finished one's output kept at memd for a lost end, its session pages published), and the agent remembers it
      // ended here, so a later memd that lists it again (this Complete died unread with memd) has it ended, not
      // resumed (review findings).
      p_.ends->Finish(id, r.life->end_status);
      return absl::OkStatus();
    }
    p_.agent->Forget(id);
    p_.clients->ReportEnd(r, r.life->end_status);  // its own end (a failed one's final chunk)
    p_.ends->Drop(id);
    return absl::OkStatus();
  }
  p_.agent->Forget(id);
  spdlog::warn("worker: request {} ends like after a fence ({}); it is resumed", id, why);
  if (!listed) refused_records_[id] = RecordOf(*r.life, r.out.generated, r.out.digests);
  const absl::Status ended = WorkerEpochEndedError(why);
  DHS_CHECK_OK(p_.clients->Chunk(r, {}, {}, true, ended));  // a final chunk is always taken
  p_.recorder->Refused(id, r.out.generated.size(), ended, std::chrono::steady_clock::now());
  p_.ends->Drop(id);
  return absl::OkStatus();
}

absl::Status MemdAway::ResumeRefused(RequestId id) {
  auto it = refused_records_.find(id);
  if (it == refused_records_.end()) return absl::OkStatus();
  std::unique_ptr<wire::RequestRecordT> own = std::move(it->second);
  refused_records_.erase(it);
  // memd holds nothing of it: admitted afresh with its own record (every row recomputed).
  absl::Status s = p_.admission->Resume(0, *own);
  if (absl::IsUnavailable(s)) return s;
  if (!s.ok()) spdlog::warn("worker: {}; ended", s.ToString());
  return absl::OkStatus();
}

void MemdAway::FlushHeld(WorkerRequest& r) {
  TokenCounts& counts = r.life->tokens;
  if (!counts.held_from) return;
  const size_t from = std::max(*counts.held_from, counts.client_has);
  counts.held_from.reset();
  const std::vector<model::Token>& generated = r.out.generated;
  const bool finished = r.finished();
  if (from >= generated.size() && !finished) return;
  std::vector<model::Token> tokens(generated.begin() + static_cast<std::ptrdiff_t>(std::min(from, generated.size())),
                                   generated.end());
  std::vector<uint64_t> digests(
      r.out.digests.begin() + static_cast<std::ptrdiff_t>(std::min(from, r.out.digests.size())), r.out.digests.end());
  if (absl::Status s = p_.clients->Chunk(r, std::move(tokens), std::move(digests), finished, absl::OkStatus());
      !s.ok()) {
    r.client_error = absl::Status(s.code(), absl::StrCat("request ", r.client_id, " failed after ", generated.size(),
                                                         " tokens: ", s.message()));
  }
}

void MemdAway::ReturnToKv(const std::set<RequestId>& adopted) {
  p_.stack->ReturnFromAway(adopted);  // the agent adopts them, host writes resume
}

void MemdAway::Adopted(RequestId id) {
  // The report carried every token (nothing stepped while the Hello was out), so the held ones go out.
  WorkerRequest& r = *p_.requests->at(id);
  r.life->tokens.committed = r.out.generated.size();
  r.life->tokens.refused = absl::OkStatus();  // the new memd took the whole record: its tokens go on
  if (r.life->phase == RequestPhase::kPaused) {
    DHS_CHECK_OK(p_.book->Transition(id, RequestPhase::kPaused, RequestPhase::kActive));
  }
  FlushHeld(r);
  if (r.life->phase != RequestPhase::kActive) return;  // ending (kEnding): its deferred end comes next (EndDeferred)
  // Its client failed the held chunk (FlushHeld), or it finished outside a step: it ends now (memd is back).
  if (!r.client_error.ok()) {
    p_.ends->Finish(id, r.client_error);
    ++adopted_ended_;
  } else if (r.finished()) {
    p_.ends->Finish(id, absl::OkStatus());
    ++adopted_ended_;
  }
}

absl::Status MemdAway::EndDeferred(RequestId id, bool /*listed: its Complete goes in any case*/) {
  p_.ends->Finish(id, p_.book->Find(id)->end_status);  // failed, finished or left by its client while away
  return absl::OkStatus();
}

absl::Status MemdAway::EndInterrupted(RequestId id) {
  if (absl::Status s = p_.admission->EndInterrupted(id); !s.ok()) return s;
  spdlog::info("workerd: interrupted request {} of GPU {} ended ({})", id, p_.config->gpu,
               p_.requests->contains(id) ? "its admission is sent again" : "it had ended here");
  return absl::OkStatus();
}

absl::Status MemdAway::ResumableFound(RequestId id, const wire::RequestRecordT* record) {
  return p_.admission->ResumeOrEnd(id, record);  // workerd resumes every resumable request it has a record of
}

absl::Status MemdAway::Resend(RequestId id) { return p_.admission->SendAdmit(*p_.requests->at(id)); }

absl::Status MemdAway::Return(const wire::HelloReplyT& reply) {
  // The transport moved the session on the reply (MemdClient::PollAway); an in-process caller hands it in here.
  if (p_.memd->session().away()) DHS_CHECK_OK(p_.memd->session().Accepted());
  adopted_ended_ = 0;
  absl::StatusOr<ReturnDone> done = CarryOutReturn(
      reply, *p_.book,
      ReturnFacts{.ended_here = [this](RequestId id) { return p_.agent->Finished(id); },
                  .resume_of = [this](RequestId id) { return p_.requests->at(id)->resume_of; }},
      *this);
  for (const auto& [id, rec] : refused_records_) {  // a return stopped by an error (memd lost again) before step 8
    spdlog::warn("worker: request {} (client {}) is not resumed: the return stopped before its resume; its client "
                 "re-attaches to nothing", id, rec->client_request);
  }
  refused_records_.clear();
  if (!done.ok()) return done.status();
  const WorkerStats& counts = p_.recorder->counts();
  spdlog::info("worker: memd is back: {} requests adopted, {} refused, {} ended while away, {} admissions sent again; "
               "{} tokens generated and {} requests paused while away (since start)", done->plan.adopted.size(),
               done->plan.refused.size(), done->ended + adopted_ended_, done->resent, counts.tokens_while_away,
               counts.paused_while_away);
  return absl::OkStatus();
}

bool MemdAway::MayStep(const WorkerRequest& r, Position rows) const {
  // Finished (or failed) while memd was away: it ends after the re-Hello, it never steps again.
  if (r.life->phase == RequestPhase::kEnding || r.finished()) return false;
  if (!away()) return true;
  if (!r.client_error.ok()) return false;
  const std::optional<size_t>& held = r.life->tokens.held_from;
  if (held && r.out.generated.size() - *held >= p_.config->away_held_tokens) return false;
  return p_.hier == nullptr || p_.hier->TailHasRoom(r.id, rows);
}

void MemdAway::Pause(WorkerRequest& r) {
  if (!away() || r.life->phase != RequestPhase::kActive || !r.client_error.ok() || r.finished()) return;
  DHS_CHECK_OK(p_.book->Transition(r.id, RequestPhase::kActive, RequestPhase::kPaused));  // logged once
  ++p_.recorder->counts().paused_while_away;
  const std::optional<size_t>& held = r.life->tokens.held_from;
  spdlog::info("worker: request {} (client {}) pauses until memd is back ({} tokens held, tail full or held bound {})",
               r.id, r.client_id, held ? r.out.generated.size() - *held : 0, p_.config->away_held_tokens);
}

void MemdAway::Hold(WorkerRequest& r, size_t new_tokens) {
  std::optional<size_t>& held = r.life->tokens.held_from;
  if (!held) held = r.out.generated.size() - new_tokens;
  p_.recorder->counts().tokens_while_away += new_tokens;
}

}  // namespace dhs
