// workerd/resume_import.h: carries out a resumed request's ResumePlan (workerd/resume_plan.h; issue 11 "resume from
// host KV", issue 22 host-page integrity) on the worker's KV hierarchy, through libdhs's data path (lib::KvPort: the
// checks, host-ready marks and imports dhs_request_import makes), and on its model: the grant's host-backed pages
// checked against memd's checksums, made host-ready, the host runs imported when the request's prefill reaches them
// (payload rows and index keys, no compute), the figures (rows imported / recomputed, time to the first new token).
// The Worker keeps the request and its prefill: it asks NextHostRow where recomputing must stop and ImportRun at that
// row; when an import fails (the importer logs it and counts every row recomputed) the Worker rebuilds the request's
// KV from its tokens (fed = 0) and calls AfterRebuild, as after any KV rebuild. The result is exact either way: a
// recomputed row has the bits of the imported one (batch invariance, brief §11).
//
// Thread-safety: none; the worker thread drives every method.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "dhs_generated.h"
#include "libdhs/kv_port.h"
#include "workerd/model/model.h"
#include "workerd/resume_plan.h"

namespace dhs {

// One request's resume state (held by the worker's request, changed only by ResumeImporter). Empty for a request
// that is not a resume.
struct ResumeState {
  std::optional<std::chrono::steady_clock::time_point> started;  // set for a resumed request (AdmissionDesk::Resume)
  std::vector<HostBackedPage> host_backed;  // the grant's host-backed pages that matched their checksums, ascending
  std::deque<HostRun> runs;                 // the plan's runs not imported yet, in position order
  Position rows_imported = 0, rows_recomputed = 0;  // its history: imported from host / recomputed (planned, moved
                                                    // by fallbacks)
};

// Per resumed request, once its first new token came: its history's rows imported from host and recomputed from its
// tokens, in rows, and the time from Resume to that token, us.
struct ResumeFigures {
  RequestId request = 0;  // the node id it resumed as
  uint64_t rows_imported = 0;
  uint64_t rows_recomputed = 0;
  uint64_t resume_us = 0;
};

// Counters since start (WorkerStats.rows_imported / rows_recomputed / resume_us_max).
struct ResumeCounters {
  uint64_t rows_imported = 0;    // rows resumed requests imported from host (a fallback moves them to recomputed)
  uint64_t rows_recomputed = 0;  // rows they recomputed from their tokens
  uint64_t resume_us_max = 0;    // the longest resume (Resume to its first new token), us
};

class ResumeImporter {
 public:
  // `port`: libdhs's data path over the worker's KV hierarchy, nullptr in resident mode (nothing is imported: every
  // row recomputed). `model` and `port` must outlive it; `page_rows` = p.
  ResumeImporter(const model::Model* model, lib::KvPort* port, uint32_t page_rows)
      : model_(model), port_(port), page_rows_(page_rows) {}

  // A resumed request (AdmissionDesk::Resume) started at `now`.
  static void Start(ResumeState& s, std::chrono::steady_clock::time_point now) { s.started = now; }
  static bool resumed(const ResumeState& s) { return s.started.has_value(); }

  // Its AdmitGrant (after the agent planned its residency, before any row of it is appended): the grant's host-backed
  // pages (GrantHostBacked), each checked against memd's checksum and, those that match, made host-ready
  // (KvPort::TakeGrantedHostPages, what libdhs's grant does too); a page that does not match (or has none) is not
  // host-backed: its rows are recomputed (logged). Resident mode (no port): nothing checked, nothing imported.
  // Errors: KvPort::TakeGrantedHostPages' (the request must end).
  absl::Status OnGrant(ResumeState& s, RequestId id, RequestId client_id, const wire::AdmitGrantT& grant);
  // Its start (a resumed request of `tokens` tokens, or a request granted shared prefix pages, issue 24: its
  // host-backed pages are then those shared pages, and `tokens` its input): the plan of its host runs (PlanResume;
  // logged; resident mode: none, every row recomputed). False when that failed (logged, every row counted
  // recomputed): the caller rebuilds its KV from the tokens, then AfterRebuild.
  bool Begin(ResumeState& s, RequestId id, RequestId client_id, Position tokens);
  // The first row of its next host run (`tokens` when none): recomputing stops there.
  Position NextHostRow(const ResumeState& s, Position tokens) const;
  // Whether host runs remain to import.
  static bool importing(const ResumeState& s) { return !s.runs.empty(); }
  // Whether a host run starts at `fed` (ImportRun imports it).
  bool RunAt(const ResumeState& s, Position fed) const;
  // Imports the run starting at `fed` into its KV and `session` (payload rows and index keys; no compute) and moves
  // `fed` past it; no-op unless RunAt. False when the import failed (logged, every row counted recomputed): the
  // caller rebuilds its KV from the tokens (fed = 0), then AfterRebuild.
  bool ImportRun(ResumeState& s, RequestId id, model::ModelSession& session, Position& fed);
  // After a rebuild of its KV from the tokens (its rows up to the request's `fed` recomputed): its host-backed pages
  // host-ready again, so their confirmed copies are never written again and the runs left can still be imported;
  // the rows imported so far count as recomputed (all of them, with no run left, when that failed: logged).
  void AfterRebuild(ResumeState& s, RequestId id);
  // Its first new token came at `now`: the figures (kept per client id, resume_us_max, logged). No-op unless
  // resumed(s).
  void FirstNewToken(const ResumeState& s, RequestId id, RequestId client_id,
                     std::chrono::steady_clock::time_point now);

  const ResumeCounters& counters() const { return counters_; }
  // Client id -> figures, one entry per resume, kept for the worker's life.
  const std::map<RequestId, ResumeFigures>& figures() const { return figures_; }

 private:
  // `rows` of its planned imports recomputed instead (the figures move).
  void CountRecomputed(ResumeState& s, Position rows);
  // An import failed: logged; every row recomputed, no run left.
  void Abandon(ResumeState& s, RequestId id, const absl::Status& why);

  const model::Model* model_;
  lib::KvPort* port_;
  uint32_t page_rows_;
  ResumeCounters counters_;
  std::map<RequestId, ResumeFigures> figures_;
};

}  // namespace dhs
