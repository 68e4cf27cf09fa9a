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

std::vector<std::unique_ptr<wire::RequestRecordT>> MemdAway::DropRefused(ReturnPlan& plan) {
  // Refused reports: memd changed nothing of them. Each ends here like after a fence (its client re-attaches) and is
  // resumed: from memd's interrupted record (AdmissionDesk::ResumeInterrupted), else from this worker's record. One
  // that ended here while memd was away (kEnding) ends as it was ending instead, never resumed (review finding: a
  // request cancelled while memd was away was resumed).
  std::vector<std::unique_ptr<wire::RequestRecordT>> own;
  for (const auto& [id, why] : plan.refused) {
    auto it = p_.requests->find(id);
    if (it == p_.requests->end()) continue;
    WorkerRequest& r = *it->second;
    if (r.life->phase == RequestPhase::kEnding) {
      spdlog::info("worker: request {} ended while memd was away; memd refused its report ({}); it ends here", id,
                   why);
      FlushHeld(r);  // its held tokens (and the final chunk of a finished one)
      if (plan.interrupted.contains(id)) {
        // memd holds it interrupted: its end is the usual one (memd is back), its Complete the loop's (CompleteOf: a
        // finished one's output kept at memd for a lost end, its session pages published) instead of
        // end_interrupted's bare one, and the agent remembers it ended here, so a later memd that lists it again
        // (this Complete died unread with memd) has it ended, not resumed (review findings).
        std::erase(plan.end_interrupted, id);
        p_.ends->Finish(id, r.life->end_status);
        continue;
      }
      p_.agent->Forget(id);
      p_.clients->ReportEnd(r, r.life->end_status);  // its own end (a failed one's final chunk)
      p_.ends->Drop(id);
      continue;
    }
    p_.agent->Forget(id);
    spdlog::warn("worker: request {} ends like after a fence ({}); it is resumed", id, why);
    if (!plan.interrupted.contains(id)) own.push_back(RecordOf(*r.life, r.out.generated, r.out.digests));
    const absl::Status ended = WorkerEpochEndedError(why);
    DHS_CHECK_OK(p_.clients->Chunk(r, {}, {}, true, ended));  // a final chunk is always taken
    p_.recorder->Refused(id, r.out.generated.size(), ended, std::chrono::steady_clock::now());
    p_.ends->Drop(id);
  }
  return own;
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

size_t MemdAway::EndDeferred() {
  std::vector<std::pair<RequestId, absl::Status>> ended;  // failed, finished or left by its client while away
  for (auto& [id, r] : *p_.requests) {
    const RequestPhase phase = r->life->phase;
    if (phase == RequestPhase::kEnding) {
      ended.emplace_back(id, r->life->end_status);
    } else if (phase == RequestPhase::kActive && !r->client_error.ok()) {
      ended.emplace_back(id, r->client_error);
    } else if (phase == RequestPhase::kActive && r->finished()) {
      ended.emplace_back(id, absl::OkStatus());
    }
  }
  for (auto& [id, why] : ended) p_.ends->Finish(id, why);
  return ended.size();
}

absl::Status MemdAway::Return(const wire::HelloReplyT& reply) {
  // The transport moved the session on the reply (MemdClient::PollAway); an in-process caller hands it in here.
  if (p_.memd->session().away()) DHS_CHECK_OK(p_.memd->session().Accepted());
  ReturnPlan plan = PlanReturn(
      reply, *p_.book,
      ReturnFacts{.ended_here = [this](RequestId id) { return p_.agent->Finished(id); },
                  .resume_of = [this](RequestId id) { return p_.requests->at(id)->resume_of; }});
  p_.book->ForgetUnacknowledged();  // the dead memd acknowledges nothing more; the new one grants none of those ids
  std::vector<std::unique_ptr<wire::RequestRecordT>> own = DropRefused(plan);
  // Adopted: the report carried every token (nothing stepped while the Hello was out), so the held ones go out.
  for (RequestId id : plan.adopted) {
    WorkerRequest& r = *p_.requests->at(id);
    r.life->tokens.committed = r.out.generated.size();
    r.life->tokens.refused = absl::OkStatus();  // the new memd took the whole record: its tokens go on
    if (r.life->phase == RequestPhase::kPaused) {
      DHS_CHECK_OK(p_.book->Transition(id, RequestPhase::kPaused, RequestPhase::kActive));
    }
    FlushHeld(r);
  }
  p_.stack->ReturnFromAway(plan.adopted);  // the agent adopts them, host writes resume
  const size_t ended = EndDeferred();
  if (absl::Status s = p_.admission->ResumeInterrupted(plan, reply.interrupted_records);
      !s.ok()) {
    return s;
  }
  for (const auto& rec : own) {
    absl::Status s = p_.admission->Resume(0, *rec);
    if (absl::IsUnavailable(s)) return s;
    if (!s.ok()) spdlog::warn("worker: {}; ended", s.ToString());
  }
  // Sent again last (the resumes above sent their own).
  if (absl::Status s = p_.admission->Resend(plan.resend); !s.ok()) return s;
  const WorkerStats& counts = p_.recorder->counts();
  spdlog::info("worker: memd is back: {} requests adopted, {} refused, {} ended while away; {} tokens generated and "
               "{} requests paused while away (since start)", plan.adopted.size(), reply.refused_reports.size(),
               ended, counts.tokens_while_away, counts.paused_while_away);
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
