// tools/replay/budget.cc: see budget.h.
#include "tools/replay/budget.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "workerd/model/config.h"

namespace dhs::replay {
namespace {

constexpr uint64_t kFallbackBudget = uint64_t{64} << 20;  // bytes, when the preset or the probe geometry is bad

uint64_t ContextTokens(const TraceRequest& r) { return static_cast<uint64_t>(r.input_tokens + r.output_tokens); }

}  // namespace

absl::StatusOr<WorkerGeometry> ReplayGeometry(const ReplayOptions& options, uint64_t hbm_budget) {
  auto model = model::PresetConfig(options.preset);
  if (!model.ok()) return model.status();
  WorkerConfig config;
  config.hbm_budget_bytes = hbm_budget;
  config.slots = static_cast<uint32_t>(options.slots);
  config.hot_rows = options.hot_rows;
  config.speculation = options.speculation;  // a block the worker's KV cannot serve is refused here, at start
  return ComputeGeometry(*model, config);
}

uint64_t HostPoolBytes(const Trace& trace, uint64_t page_bytes, uint64_t page_rows) {
  uint64_t pages = 0;
  for (const TraceRequest& r : trace.requests) pages += (ContextTokens(r) + page_rows - 1) / page_rows;
  return (pages + 64) * page_bytes;
}

uint64_t DefaultHbmBudget(const Trace& trace, const ReplayOptions& options) {
  auto probe = ReplayGeometry(options, uint64_t{1} << 30);
  auto mc = model::PresetConfig(options.preset);
  if (!probe.ok() || !mc.ok()) return kFallbackBudget;
  const uint64_t p = probe->kv.page_rows;
  double mean_pages = 0, mean_context = 0;
  uint64_t largest_context = 0;
  for (const TraceRequest& r : trace.requests) {
    mean_pages += std::ceil(double(ContextTokens(r)) / p);
    mean_context += double(ContextTokens(r));
    largest_context = std::max(largest_context, ContextTokens(r));
  }
  mean_pages /= std::max<size_t>(1, trace.requests.size());
  mean_context /= std::max<size_t>(1, trace.requests.size());
  const uint64_t required_per_slot =
      RequiredPages(*mc, *probe, WorkerMode::kAdaptive, static_cast<uint64_t>(std::ceil(mean_context)));
  const uint64_t largest_resident = RequiredPages(*mc, *probe, WorkerMode::kResident, largest_context);
  const uint64_t pages = static_cast<uint64_t>(options.slots) * (required_per_slot + uint64_t(mean_pages / 2)) + 8;
  return std::max(pages, largest_resident + 8) * probe->page_bytes;
}

uint64_t ReferenceHbmBudget(const Trace& trace, const ReplayOptions& options) {
  auto probe = ReplayGeometry(options, uint64_t{1} << 30);
  auto mc = model::PresetConfig(options.preset);
  if (!probe.ok() || !mc.ok()) return uint64_t{1} << 30;
  std::vector<uint64_t> resident;
  resident.reserve(trace.requests.size());
  for (const TraceRequest& r : trace.requests) {
    resident.push_back(RequiredPages(*mc, *probe, WorkerMode::kResident, ContextTokens(r)));
  }
  const size_t sessions = std::min(resident.size(), static_cast<size_t>(std::max<int64_t>(1, options.slots)));
  std::partial_sort(resident.begin(), resident.begin() + sessions, resident.end(), std::greater<>());
  uint64_t pages = 0;
  for (size_t i = 0; i < sessions; ++i) pages += resident[i];
  return std::max<uint64_t>(pages, 1) * probe->page_bytes;
}

}  // namespace dhs::replay
