#include "workerd/resume_import.h"

#include <algorithm>

#include "spdlog/spdlog.h"

namespace dhs {
namespace {

uint64_t MicrosSince(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(to - from).count());
}

}  // namespace

absl::Status ResumeImporter::OnGrant(ResumeState& s, RequestId id, RequestId client_id,
                                     const wire::AdmitGrantT& grant) {
  s.host_backed = GrantHostBacked(grant.host_backed_pages, grant.host_backed_checksums, grant.imported_pages);
  if (port_ == nullptr || s.host_backed.empty()) return absl::OkStatus();
  // Host-page integrity (issue 22): each host-backed page is checked against memd's checksum before anything
  // imports it; a page that does not match (or has none) is treated as not host-backed: its rows are recomputed
  // from the record's tokens (and its host page written again with them, the same bytes as the confirmed copy). Those
  // that match are host-ready from now on, as libdhs takes them (KvPort::TakeGrantedHostPages): their confirmed copy
  // is never written again (the pages recomputed after the last token included: the record may end before rows the
  // dead worker had backed up).
  absl::StatusOr<lib::KvPort::GrantedHostPages> taken = port_->TakeGrantedHostPages(id, std::move(s.host_backed));
  if (!taken.ok()) return taken.status();
  s.host_backed = std::move(taken->pages);
  if (taken->mismatched > 0) {
    spdlog::warn("worker: resumed request {} (client {}): {} of its {} host-backed pages do not match their "
                 "checksums; their rows are recomputed from its tokens", id, client_id, taken->mismatched,
                 taken->mismatched + s.host_backed.size());
  }
  return absl::OkStatus();
}

bool ResumeImporter::Begin(ResumeState& s, RequestId id, RequestId client_id, Position tokens) {
  // Resident mode: nothing imported, every row recomputed.
  const std::vector<HostBackedPage> backed = port_ != nullptr ? s.host_backed : std::vector<HostBackedPage>{};
  absl::StatusOr<ResumePlan> plan = PlanResume(backed, tokens, page_rows_);
  if (!plan.ok()) {
    s.rows_recomputed = tokens;
    counters_.rows_recomputed += static_cast<uint64_t>(std::max<Position>(tokens, 0));
    Abandon(s, id, plan.status());
    return false;
  }
  s.runs.assign(plan->runs.begin(), plan->runs.end());
  s.rows_imported = plan->rows_imported;  // planned; a fallback moves them
  s.rows_recomputed = plan->rows_recomputed;
  if (resumed(s)) {  // the resume counters count resumes only (shared prefix pages: WorkerStats.prefix_*)
    counters_.rows_imported += static_cast<uint64_t>(s.rows_imported);
    counters_.rows_recomputed += static_cast<uint64_t>(s.rows_recomputed);
  }
  spdlog::info("worker: {} {} (client {}) granted: {} of its {} pages before the last token are host-backed ({} "
               "runs): {} rows to import from host, {} rows to recompute from its tokens",
               resumed(s) ? "resumed request" : "request with shared prefix pages", id, client_id,
               s.rows_imported / page_rows_, plan->usable_pages, s.runs.size(), s.rows_imported, s.rows_recomputed);
  return true;  // the host-backed pages are host-ready since the grant (OnGrant)
}

Position ResumeImporter::NextHostRow(const ResumeState& s, Position tokens) const {
  if (s.runs.empty()) return tokens;
  return Position{s.runs.front().first} * page_rows_;
}

bool ResumeImporter::RunAt(const ResumeState& s, Position fed) const {
  return !s.runs.empty() && fed == NextHostRow(s, fed);
}

bool ResumeImporter::ImportRun(ResumeState& s, RequestId id, model::ModelSession& session, Position& fed) {
  if (!RunAt(s, fed)) return true;
  const HostRun run = s.runs.front();
  std::vector<std::vector<float>> keys;
  absl::Status st = port_->ImportRows(id, run.first, run.pages, keys);
  if (st.ok()) st = model_->ImportKeys(session, run.pages * page_rows_, keys);
  if (!st.ok()) {
    Abandon(s, id, st);
    return false;
  }
  fed += Position{run.pages} * page_rows_;
  s.runs.pop_front();
  return true;
}

void ResumeImporter::CountRecomputed(ResumeState& s, Position rows) {
  if (resumed(s)) {
    counters_.rows_imported -= static_cast<uint64_t>(rows);
    counters_.rows_recomputed += static_cast<uint64_t>(rows);
  }
  s.rows_recomputed += rows;
  s.rows_imported -= rows;
}

void ResumeImporter::Abandon(ResumeState& s, RequestId id, const absl::Status& why) {
  spdlog::warn("worker: request {}: import of its host pages failed ({}); recomputing every row", id,
               why.ToString());
  CountRecomputed(s, s.rows_imported);
  s.runs.clear();
}

void ResumeImporter::AfterRebuild(ResumeState& s, RequestId id) {
  if (s.host_backed.empty()) return;
  Position ahead = 0;  // the rows of the runs left: still imported when the pages are host-ready again
  for (const HostRun& run : s.runs) ahead += Position{run.pages} * page_rows_;
  absl::Status st = port_ != nullptr ? port_->MakeHostReady(id, s.host_backed)
                                     : absl::FailedPreconditionError("resident mode");
  if (st.ok()) {
    CountRecomputed(s, s.rows_imported - ahead);
    return;
  }
  if (port_ != nullptr) {
    spdlog::warn("worker: request {}: its host-backed pages are not host-ready again ({}); their host pages are "
                 "written again with the same rows", id, st.ToString());
  }
  CountRecomputed(s, s.rows_imported);
  s.runs.clear();
}

void ResumeImporter::FirstNewToken(const ResumeState& s, RequestId id, RequestId client_id,
                                   std::chrono::steady_clock::time_point now) {
  if (!resumed(s)) return;
  const uint64_t us = MicrosSince(*s.started, now);
  counters_.resume_us_max = std::max(counters_.resume_us_max, us);
  figures_[client_id] = ResumeFigures{id, static_cast<uint64_t>(s.rows_imported),
                                      static_cast<uint64_t>(s.rows_recomputed), us};
  spdlog::info("worker: request {} (client {}) resumed: first new token after {} us ({} rows imported from host, "
               "{} rows recomputed)", id, client_id, us, s.rows_imported, s.rows_recomputed);
}

}  // namespace dhs
