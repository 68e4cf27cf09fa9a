// workerd/admission.cc: see admission.h.
#include "workerd/admission.h"

#include <chrono>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/fault_point.h"
#include "common/session_digest.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dhs {

wire::AdmitRequestT AdmissionDesk::AdmissionOf(const WorkerRequest& r) const {
  const WorkerConfig& config = *p_.config;
  // A resumed input holds its committed tokens.
  const uint64_t ctx = r.input.size() - r.out.resumed + r.max_new;
  const model::ModelConfig& mc = p_.model->config();
  const WorkerGeometry::Speculation& spec = p_.geometry->speculation;
  wire::AdmitRequestT admit = AdmitRequestOf(AdmissionShape{
      .request = r.id,
      .gpu = config.gpu,
      .mode = config.mode,
      .sources = static_cast<uint32_t>(mc.n_sources()),
      .page_rows = config.page_rows,
      .required_pages = RequiredPages(mc, *p_.geometry, config.mode, ctx),  // the speculation share included
      .history_rows = ctx,
      .prompt_rows = r.input.size(),
      .draft_ring_pages = spec.draft_ring_pages,
      .staging_pages = spec.staging_pages,
      .draft_ring_bytes = spec.slot_draft_ring_bytes,
      .staging_bytes = spec.slot_staging_bytes,
      .resume_of = r.resume_of,  // a resume takes the interrupted request's kept host pages over
  });
  admit.record = RecordOf(*r.life, r.out.generated, r.out.digests);
  SetPrefixChain(r, config.mode, admit);  // issue 24: memd grants the shared pages of its complete blocks
  // Issue 26 (sessions across nodes): its session and the digests of its prompt's complete pages (resident mode
  // holds no host pages: nothing to look up).
  if (config.mode != WorkerMode::kResident && r.life->submit.session != 0) {
    admit.session = r.life->submit.session;
    admit.session_page_digests = SessionPageDigests(std::span<const model::Token>(r.input), config.page_rows);
  }
  return admit;
}

absl::Status AdmissionDesk::SendAdmit(const WorkerRequest& r) {
  if (absl::Status s = p_.memd->SendAdmitRequest(AdmissionOf(r)); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("worker cannot reach memd: ", s.message()));
  }
  return absl::OkStatus();
}

bool AdmissionDesk::Start(RequestId id) {
  // Every granted request holds its own slot (memd's AdmitGrant.slot) and its residency plan: it starts at once.
  auto it = p_.requests->find(id);
  if (it == p_.requests->end()) return true;
  WorkerRequest& r = *it->second;
  r.session.emplace(p_.model->NewSession(id));
  DHS_CHECK_OK(p_.book->Transition(id, RequestPhase::kGranted, RequestPhase::kActive));
  // A resume, or a request granted shared prefix pages (issue 24): its host-backed pages are imported, not computed.
  if (!ResumeImporter::resumed(r.resume) && r.resume.host_backed.empty()) return true;
  return p_.resumes->Begin(r.resume, r.id, r.client_id, static_cast<Position>(r.input.size()));
}

// ---- memd's messages ----

void AdmissionDesk::OnAdmitGrant(const wire::AdmitGrantT& m) {
  switch (p_.book->AnswerTo(m.request)) {
    case AdmissionAnswer::kApplies:
      break;
    case AdmissionAnswer::kCrossedComplete:  // ended (StopAll, Cancel, its client gone) while memd granted it: the
      return;                                // Complete sent then (memd reads it after this grant) releases it
    case AdmissionAnswer::kUnknown:
      spdlog::warn("worker: AdmitGrant for request {} that is not waiting; releasing it", m.request);
      p_.agent->RefuseGrant(m);
      return;
    case AdmissionAnswer::kNotWaiting:
      spdlog::warn("worker: second AdmitGrant for request {}; ignored", m.request);
      return;
  }
  WorkerRequest& r = *p_.requests->at(m.request);
  const RequestPhase phase = r.life->phase;
  r.times.granted = std::chrono::steady_clock::now();
  p_.recorder->Granted(r);
  const uint64_t rows = r.input.size() - r.out.resumed + r.max_new - 1;  // rows ever appended
  if (absl::Status s = p_.agent->OnGrant(m, rows / p_.config->page_rows); !s.ok()) {
    p_.ends->Finish(r.id, s);
    return;
  }
  // A resume's host-backed pages (every one memd took over) and shared prefix pages, checked against their checksums
  // (issue 22) and made host-ready (KvPort::TakeGrantedHostPages, as libdhs's grant).
  if (absl::Status s = p_.resumes->OnGrant(r.resume, r.id, r.client_id, m); !s.ok()) {
    p_.ends->Finish(r.id, s);
    return;
  }
  // Issue 24: its shared prefix pages are imported like a resume's host-backed pages (Start).
  CountSharedGrant(r, m, p_.config->mode, p_.config->page_rows, p_.recorder->counts());
  DHS_CHECK_OK(p_.book->Transition(r.id, phase, RequestPhase::kGranted));  // queued for Start
}

void AdmissionDesk::OnAdmitWait(const wire::AdmitWaitT& m) {
  if (RequestLife* life = p_.book->Find(m.request); life != nullptr && life->phase == RequestPhase::kWaiting) {
    DHS_CHECK_OK(p_.book->Transition(m.request, RequestPhase::kWaiting, RequestPhase::kQueued));
  }
  spdlog::debug("worker: request {} waits for admission (queue position {}, deficit {} pages)", m.request,
                m.queue_position, m.deficit_pages);
}

void AdmissionDesk::OnAdmitReject(const wire::AdmitRejectT& m) {
  if (const AdmissionAnswer answer = p_.book->AnswerTo(m.request); answer != AdmissionAnswer::kApplies) {
    // Granted already, it holds its slot, its plan and its KV, and ends only through Finish (Complete): a reject
    // after the grant breaks the contract (§2: one answer per AdmitRequest) and is not obeyed. Not here: nothing to end.
    spdlog::warn("worker: AdmitReject for request {}, which {}; ignored", m.request,
                 answer == AdmissionAnswer::kNotWaiting ? "memd granted already" : "is not here");
    return;
  }
  auto it = p_.requests->find(m.request);
  WorkerRequest& r = *it->second;
  const absl::Status error = AdmitRejectError(m);
  p_.clients->ReportEnd(r, error);
  EraseRequest(*p_.requests, *p_.book, it);  // never admitted: nothing to release
}

void AdmissionDesk::OnCompleteAck(const wire::CompleteAckT& m) {
  p_.book->OnCompleteAck(m.request);
  ReachFaultPoint(FaultPoint::kComplete);  // test-only: memd released the request (common/fault_point.h)
  spdlog::debug("worker: request {} released {} pages", m.request, m.released_pages);
}

void AdmissionDesk::OnTokensCommitted() {
  if (p_.ledger != nullptr) p_.ledger->Acked(*p_.book);
}

void AdmissionDesk::OnTokensRefused(const absl::Status& why) {
  if (p_.ledger == nullptr) return;
  if (std::optional<RequestId> alone = p_.ledger->Refused(*p_.book, why)) {
    ++p_.recorder->counts().records_refused;
    spdlog::warn("worker: memd refused the tokens of request {}: {}; its record keeps what memd acknowledged", *alone,
                 why.ToString());
  }
}

// ---- resume (issue 11) ----

absl::Status AdmissionDesk::EndInterrupted(RequestId interrupted, bool keep_output) {
  wire::CompleteT done;
  done.request = interrupted;
  done.gpu = p_.config->gpu;
  done.keep_output = keep_output;  // its output waits here for its client: memd keeps it too (lost ends)
  if (absl::Status s = p_.memd->SendComplete(done); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("worker cannot reach memd: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status AdmissionDesk::Resume(RequestId interrupted, const wire::RequestRecordT& record) {
  const wire::SubmitRequestT submit = SubmitOfRecord(record);
  absl::Status valid = ValidateSubmit(submit, p_.config->max_context_tokens);
  if (record.token_kind != wire::TokenKind::Bytes) {  // issue 25: an engine's token ids, not this model's bytes
    valid = absl::InvalidArgumentError("an engine's record (libdhs token ids): the built-in model cannot resume it");
  }
  if (valid.ok() && (record.tokens.size() > record.max_new_tokens ||
                     record.logits_digests.size() != record.tokens.size())) {
    valid = absl::InvalidArgumentError(absl::StrCat(record.tokens.size(), " committed tokens, ",
                                                    record.logits_digests.size(), " digests, max_new ",
                                                    record.max_new_tokens));
  }
  // Not resumed (a bad record, or every token committed): the interrupted id ends, memd frees what it kept (nothing
  // to end for interrupted = 0, a refused report memd holds nothing of).
  if (!valid.ok()) {
    if (absl::Status s = interrupted != 0 ? EndInterrupted(interrupted) : absl::OkStatus(); !s.ok()) return s;
    return absl::InvalidArgumentError(
        absl::StrCat("interrupted request ", interrupted, ": its record is not resumable: ", valid.message()));
  }
  ++p_.recorder->counts().requests_resumed;
  if (record.tokens.size() >= record.max_new_tokens) {  // every token was committed: nothing to compute
    if (absl::Status s = interrupted != 0 ? EndInterrupted(interrupted, /*keep_output=*/true) : absl::OkStatus();
        !s.ok()) {
      return s;
    }
    spdlog::info("worker: interrupted request {} (client {}) had all its {} tokens; kept for its client", interrupted,
                 record.client_request, record.max_new_tokens);
    p_.clients->KeepOutput({record.client, record.client_request},
                           DetachedOutput{std::vector<model::Token>(record.tokens.begin(), record.tokens.end()),
                                          record.logits_digests, absl::OkStatus()});
    return absl::OkStatus();
  }
  // Detached (no client until Attach), never under the interrupted id it continues.
  std::unique_ptr<WorkerRequest> r =
      NewWorkerRequest(*p_.book->OpenResumed(submit, interrupted), std::chrono::steady_clock::now());
  ResumeImporter::Start(r->resume, r->times.submitted);
  r->out.generated.assign(record.tokens.begin(), record.tokens.end());
  r->out.digests = record.logits_digests;
  r->out.resumed = static_cast<Position>(r->out.generated.size());
  r->life->tokens.committed = r->out.generated.size();  // the new record opens with them
  r->input.insert(r->input.end(), r->out.generated.begin(), r->out.generated.end());  // imported or recomputed
  r->resume_of = interrupted;
  if (absl::Status s = SendAdmit(*r); !s.ok()) {
    p_.book->Close(r->id, /*completed=*/false);
    return s;
  }
  p_.recorder->Submitted(*r, submit.client, absl::StrCat("resume of ", interrupted, " (pages = committed tokens)"));
  spdlog::info("worker: interrupted request {} (client {}) resumes as {}: {} committed tokens, {} tokens of history",
               interrupted, r->client_id, r->id, r->out.resumed, r->input.size());
  p_.requests->emplace(r->id, std::move(r));  // detached: found by Attach through (client identity, client id)
  return absl::OkStatus();
}

absl::Status AdmissionDesk::ResumeOrEnd(RequestId id, const wire::RequestRecordT* record) {
  if (record != nullptr) {
    absl::Status s = Resume(id, *record);
    if (absl::IsUnavailable(s)) return s;
    if (!s.ok()) spdlog::warn("workerd: {}; ended", s.ToString());
    return absl::OkStatus();
  }
  if (absl::Status s = EndInterrupted(id); !s.ok()) return s;
  spdlog::info("workerd: interrupted request {} of GPU {} ended (no record)", id, p_.config->gpu);
  return absl::OkStatus();
}

}  // namespace dhs
