#include "workerd/resume_plan.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace dhs {

std::vector<HostBackedPage> GrantHostBacked(std::span<const uint32_t> host_backed_pages,
                                            std::span<const uint64_t> host_backed_checksums, uint32_t imported_pages) {
  std::vector<uint32_t> pages(host_backed_pages.begin(), host_backed_pages.end());
  if (pages.empty()) {
    for (uint32_t j = 0; j < imported_pages; ++j) pages.push_back(j);
  }
  std::map<uint32_t, uint64_t> once;  // ascending, once; the checksum listed last
  for (size_t i = 0; i < pages.size(); ++i) {
    once[pages[i]] = i < host_backed_checksums.size() ? host_backed_checksums[i] : 0;
  }
  std::vector<HostBackedPage> out;
  for (const auto& [page, checksum] : once) out.push_back({page, checksum});
  return out;
}

std::vector<uint32_t> SharedPagesKept(std::span<const uint32_t> shared_pages, std::span<const HostBackedPage> kept) {
  std::vector<uint32_t> out;
  for (uint32_t j : shared_pages) {
    const bool matched = std::any_of(kept.begin(), kept.end(), [j](const HostBackedPage& h) { return h.page == j; });
    if (matched && std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
  }
  return out;
}

absl::StatusOr<ResumePlan> PlanResume(std::span<const HostBackedPage> host_backed, Position tokens,
                                      uint32_t page_rows) {
  if (tokens < 1 || page_rows == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume plan: ", tokens, " tokens, ", page_rows, " rows per page (need >= 1 of each)"));
  }
  const Position p = page_rows;
  ResumePlan plan;
  std::map<uint32_t, uint64_t> ready;  // ascending, once; the checksum listed last
  for (const HostBackedPage& h : host_backed) ready[h.page] = h.checksum;
  for (const auto& [page, checksum] : ready) plan.host_ready.push_back({page, checksum});
  plan.usable_pages = static_cast<uint32_t>((tokens - 1) / p);
  for (const auto& [j, checksum] : ready) {
    if (j >= plan.usable_pages) break;
    if (!plan.runs.empty() && plan.runs.back().first + plan.runs.back().pages == j) {
      ++plan.runs.back().pages;
    } else {
      plan.runs.push_back({j, 1});
    }
  }
  Position row = 0;  // the first row not planned yet
  for (const HostRun& run : plan.runs) {
    const Position begin = Position{run.first} * p;
    if (row < begin) plan.recompute.push_back({row, begin});
    row = begin + Position{run.pages} * p;
    plan.rows_imported += Position{run.pages} * p;
  }
  plan.recompute.push_back({row, tokens});  // row <= usable_pages * p <= tokens - 1: never empty
  plan.rows_recomputed = tokens - plan.rows_imported;
  return plan;
}

}  // namespace dhs
