// workerd/admission_shape.h: what an AdmitRequest declares of a request's shape, and the re-Hello's report built from
// it (docs/protocol.md "Conversation contract (worker <-> memd)" §2, "Re-Hello with a report"): ONE construction that
// workerd's AdmissionDesk and libdhs's EmbeddedWorker both call (issue 25, "workerd uses libdhs": the admission half
// of the memd conversation they had each written). Pure: no sockets, no clocks.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/types.h"
#include "dhs_generated.h"
#include "workerd/serving_mode.h"

namespace dhs {

// A request's shape as its AdmitRequest declares it.
struct AdmissionShape {
  RequestId request = 0;
  GpuId gpu = 0;
  WorkerMode mode = WorkerMode::kAdaptive;
  uint32_t sources = 1;        // S: one RequestSourceInfo each
  uint32_t page_rows = 1;      // p
  uint32_t required_pages = 0; // SessionRequiredPages (common/worker_shape.h), the speculation share included
  uint64_t history_rows = 0;   // rows it may ever append (its context), rows
  uint64_t prompt_rows = 0;    // rows it starts from (its prompt, a resume's committed tokens included), rows
  // The slot's share of the speculation memory (docs/protocol.md "Speculation memory"), inside required_pages:
  // bytes and pages of the draft ring and of the staging arenas.
  uint32_t draft_ring_pages = 0, staging_pages = 0;
  uint64_t draft_ring_bytes = 0, staging_bytes = 0;
  RequestId resume_of = 0;     // a resume of this interrupted request (memd hands its kept host pages over)
};

// The AdmitRequest of `s`: required pages and the speculation share, history rows, complete pages (adaptive mode:
// the prompt's whole pages, which may stay on GPU; else 0), optional history (adaptive mode only), one
// RequestSourceInfo per source, host_backed / resume_of of a resume. The record, tenant, prefix chain and session are
// the caller's.
wire::AdmitRequestT AdmitRequestOf(const AdmissionShape& s);

// The re-Hello's report of a granted request: `pages` (ResidencyAgent::Report: its slot, required pages and page
// states) with what its AdmitRequest `admit` declared (complete pages, optional history, the speculation share) and
// `record` (its record with every token generated so far; may be null). Null when `pages` is null (not reportable).
std::unique_ptr<wire::ReportedRequestT> ReportOf(std::unique_ptr<wire::ReportedRequestT> pages,
                                                 const wire::AdmitRequestT& admit,
                                                 std::unique_ptr<wire::RequestRecordT> record);

// The error a request ends with when memd rejects its admission: the code memd sent (UNKNOWN when it sent none),
// "admission refused by memd: " and memd's reason.
absl::Status AdmitRejectError(const wire::AdmitRejectT& m);

}  // namespace dhs
