// memd/recovery.h: the core's recovery room (issue 11; issue 23 gave it its own place): fencing a GPU whose worker is
// gone, interrupting its requests, adopting a dead memd's journal and a surviving worker's report, a resume's
// take-over of an interrupted request's host pages, and the checks of what they leave.
//
// Recovery works on the core's shared state (memd/core_state.h) inside one event of ResidencyManager, which owns both
// and exposes the events (FenceGpu, AdoptHostPages, AdoptGpu, ReleaseHeldPages, Admit with resume_of): the manager
// counts the event and pumps admissions afterwards; Recovery neither pumps nor counts events. It holds "fenced" and
// the epochs for the whole process: the daemon asks it (ResidencyManager::fenced, FenceReason), it keeps no copy.
//
// What each step leaves (docs: memd/README.md "Events and orders", docs/protocol.md "Liveness, fencing and epochs"):
// - Fence: copies in flight on the GPU resolved (host pages unpinned), its orders and reclaims dropped, queued
//   admissions rejected (UNAVAILABLE) except queued resumes (interrupted again), admitted requests interrupted: they
//   keep exactly their confirmed host copies (kHost), the rest kLost.
// - AdoptHostPages: the journal's requests interrupted as a fence leaves them; their GPUs fenced at the journal's
//   epoch; every other host page held until ReleaseHeldPages.
// - AdoptGpu's reports: each an admitted request (slot, GPU pages, host pages as the journal confirms them).
// - TakeOver: a resume takes every kept host page of the interrupted request it continues; that request ends.
//
// Thread-safety: none. One loop drives the core.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "memd/core_state.h"
#include "memd/prefix_sharing.h"

namespace dhs::memd {

class Recovery {
 public:
  // `state` is the core's and `prefix` its prefix-sharing room (owned by ResidencyManager, both outlive this).
  Recovery(core::State& state, PrefixSharing& prefix) : s_(state), prefix_(prefix) {}

  // ---- steps of the manager's events (each: nothing changes on error) ----
  // FenceGpu: all of it, at once (see above); `why` is kept for FenceReason. Errors: NotFound (the GPU is not
  // registered, or already fenced).
  absl::Status Fence(GpuId gpu, std::string_view why);
  // AdoptGpu's checks before the GPU is registered: FailedPrecondition (this memd registered or fenced the GPU itself,
  // or `epoch` is 0 or below the journal's epoch of it). AlreadyExists (registered) is the manager's.
  absl::Status CheckAdoptGpu(GpuId gpu, uint32_t epoch) const;
  // AdoptGpu after the GPU was registered: its epoch becomes `epoch`, each report is checked alone and adopted as an
  // admitted request or refused (counted, logged); `outcomes` (optional) gets one status per report.
  void AdoptReports(GpuId gpu, uint32_t epoch, std::span<const ReportedRequest> reports,
                    std::vector<absl::Status>* outcomes);
  // AdoptHostPages (the first event of a memd that found a dead memd's journal). Errors: FailedPrecondition (a GPU
  // or a request is known), InvalidArgument (a reserved or repeated id, epoch 0, context_pages above the host pool, a
  // history page outside the context, a host page out of range or named twice).
  // `shared` (issue 24): the journal's shared prefix pages, adopted as cached pages with prefix sharing on (freed with
  // it off). InvalidArgument also for a shared page out of range, a request's page, or a key named twice.
  absl::Status AdoptHostPages(std::span<const AdoptedRequest> requests,
                              std::span<const AdoptedSharedPage> shared = {});
  // ReleaseHeldPages: the pages held since AdoptHostPages become reusable.
  void ReleaseHeldPages();
  // Admit's resume checks (host_backed and resume_of both or neither; the interrupted request known, of the same GPU,
  // keeping no page beyond the new context). Errors: InvalidArgument, NotFound.
  absl::Status CheckResume(const AdmitRequest& admission) const;
  // The take-over: every kept host page of `interrupted` goes to the queued `r` (same history page); `interrupted`
  // ends. Precondition: CheckResume passed.
  void TakeOver(core::Request& r, RequestId interrupted);

  // ---- queries ----
  uint32_t epoch(GpuId gpu) const;  // accepted registrations (0: never registered)
  bool fenced(GpuId gpu) const;     // registered once and not registered now
  std::string FenceReason(GpuId gpu) const;  // why `gpu` was fenced ("" when up, or fenced by AdoptHostPages)
  std::vector<RequestId> InterruptedRequests(GpuId gpu) const;
  std::map<uint32_t, PageIndex> InterruptedHostPages(RequestId request) const;

  // ---- checks (parts of ResidencyManager::CheckInvariants; Internal errors) ----
  // An interrupted request: no GPU page, slot, reclaim or copy; each history page kHost (its own host page, claimed in
  // `host_pages`) or kLost; it owns exactly its kHost pages in the host pool.
  absl::Status CheckInterrupted(const core::Request& r, std::set<PageIndex>& host_pages) const;
  // A queued resume owns exactly its taken-over host pages (claimed in `host_pages`), each a history page of its
  // context, journaled (with a journal) as that page of this request, confirmed.
  absl::Status CheckQueuedResume(const core::Request& r, std::set<PageIndex>& host_pages) const;
  // With a journal: its entry of r's history page h (host page allocated) names r, h and r's context, and is
  // confirmed exactly in the states holding a complete host copy (kHost, kPopulating, kGpuAndHost).
  absl::Status CheckJournal(const core::Request& r, uint32_t h) const;

 private:
  // AdoptGpu of one report: checked first (nothing changes on error), then the request is (re)built as admitted.
  absl::Status CheckReport(GpuId gpu, const core::Gpu& g, const ReportedRequest& rep) const;
  void AdoptReport(GpuId gpu, core::Gpu& g, const ReportedRequest& rep);
  absl::Status CheckAdopted(std::span<const AdoptedRequest> requests) const;
  // Fence's steps: copies in flight on `gpu` end; queued admissions rejected or (resumes) interrupted again; admitted
  // requests interrupted.
  void FenceCopies(GpuId gpu);
  void Interrupt(core::Request& r);
  // A queued resume of a fenced GPU: interrupted again, holding the host pages it took over (none lost).
  void InterruptQueuedResume(core::Request& r);

  core::State& s_;
  PrefixSharing& prefix_;  // shared pages: abandoned writes, adopted pages, moved references (issue 24)
  std::map<GpuId, std::string> fence_reasons_;  // the latest fence of each GPU: why (FenceReason)
};

}  // namespace dhs::memd
