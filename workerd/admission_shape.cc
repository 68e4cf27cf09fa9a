// workerd/admission_shape.cc: see admission_shape.h.
#include "workerd/admission_shape.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dhs {

wire::AdmitRequestT AdmitRequestOf(const AdmissionShape& s) {
  wire::AdmitRequestT admit;
  admit.request = s.request;
  admit.gpu = s.gpu;
  admit.required_pages = s.required_pages;
  admit.draft_ring_pages = s.draft_ring_pages;
  admit.staging_pages = s.staging_pages;
  admit.draft_ring_bytes = s.draft_ring_bytes;
  admit.staging_bytes = s.staging_bytes;
  admit.history_rows = s.history_rows;
  // Only adaptive mode holds optional history; hisparse keeps all history on host (memd never populates it).
  const bool adaptive = s.mode == WorkerMode::kAdaptive;
  admit.complete_pages = adaptive && s.page_rows > 0 ? static_cast<uint32_t>(s.prompt_rows / s.page_rows) : 0;
  admit.optional_history = adaptive;
  for (uint32_t source = 0; source < s.sources; ++source) {
    auto info = std::make_unique<wire::RequestSourceInfoT>();
    info->source = source;
    info->history_rows = s.history_rows;
    info->complete_pages = admit.complete_pages;
    admit.sources.push_back(std::move(info));
  }
  admit.host_backed = s.resume_of != 0;
  admit.resume_of = s.resume_of;
  return admit;
}

std::unique_ptr<wire::ReportedRequestT> ReportOf(std::unique_ptr<wire::ReportedRequestT> pages,
                                                 const wire::AdmitRequestT& admit,
                                                 std::unique_ptr<wire::RequestRecordT> record) {
  if (pages == nullptr) return nullptr;
  pages->complete_pages = admit.complete_pages;
  pages->optional_history = admit.optional_history;
  pages->draft_ring_pages = admit.draft_ring_pages;
  pages->staging_pages = admit.staging_pages;
  pages->draft_ring_bytes = admit.draft_ring_bytes;
  pages->staging_bytes = admit.staging_bytes;
  pages->record = std::move(record);
  return pages;
}

absl::Status AdmitRejectError(const wire::AdmitRejectT& m) {
  const std::string text = absl::StrCat("admission refused by memd: ", m.reason);
  absl::Status error = FromWireError(m.code, text);
  return error.ok() ? absl::UnknownError(text) : error;  // a reject always ends the request
}

}  // namespace dhs
