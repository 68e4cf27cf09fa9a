#include "tools/node/node_geometry.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "workerd/geometry.h"
#include "workerd/model/config.h"

namespace dhs::node {
namespace {

// The worker's page size from its preset and sizes; nullopt for a worker with a weights file.
absl::StatusOr<std::optional<uint64_t>> WorkerPageBytes(const WorkerEntry& w, size_t index) {
  if (w.settings.contains("weights")) return std::optional<uint64_t>();
  auto get = [&](const char* key, auto fallback) {
    auto it = w.settings.find(key);
    return it == w.settings.end() ? fallback : static_cast<decltype(fallback)>(std::stoull(it->second));
  };
  const auto preset = w.settings.find("preset");
  absl::StatusOr<model::ModelConfig> model =
      model::PresetConfig(preset == w.settings.end() ? model::kDefaultPreset : preset->second);  // workerd's default
  if (!model.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("worker[", index, "].preset: ", model.status().message()));
  }
  WorkerConfig config;
  config.gpu = w.gpu;
  if (auto mode = w.settings.find("mode"); mode != w.settings.end()) {  // the geometry rules depend on it
    absl::StatusOr<WorkerMode> parsed = ParseWorkerMode(mode->second);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("worker[", index, "].mode: ", parsed.status().message()));
    }
    config.mode = *parsed;
  }
  config.prefill_chunk = get("prefill_chunk", config.prefill_chunk);
  config.page_rows = get("page_rows", config.page_rows);
  config.tail_rows = get("tail_rows", config.tail_rows);
  config.hot_rows = get("hot_rows", config.hot_rows);
  config.slots = get("slots", config.slots);
  config.hbm_budget_bytes = get("hbm_budget_bytes", config.hbm_budget_bytes);
  absl::StatusOr<WorkerGeometry> g = ComputeGeometry(*model, config);
  if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("worker[", index, "]: ", g.status().message()));
  return std::optional<uint64_t>(g->host_page_bytes);  // memd's pool pages are host pages
}

}  // namespace

absl::StatusOr<uint64_t> ResolvePageBytes(const NodeConfig& config) {
  std::optional<uint64_t> page_bytes;
  std::string source;
  if (auto it = config.memd.find("page_bytes"); it != config.memd.end()) {
    page_bytes = std::stoull(it->second);
    source = "memd.page_bytes";
  }
  for (size_t i = 0; i < config.workers.size(); ++i) {
    absl::StatusOr<std::optional<uint64_t>> bytes = WorkerPageBytes(config.workers[i], i);
    if (!bytes.ok()) return bytes.status();
    if (!bytes->has_value()) {
      if (!config.memd.contains("page_bytes")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "memd.page_bytes: missing; worker[", i, "] loads a weights file, so its page size must be given"));
      }
      continue;
    }
    if (!page_bytes.has_value()) {
      page_bytes = **bytes;
      source = absl::StrCat("worker[", i, "]");
    } else if (*page_bytes != **bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "worker[%d]: its pages are %d bytes (preset and page_rows) but %s gives %d; memd and every worker must agree",
          i, **bytes, source, *page_bytes));
    }
  }
  if (!page_bytes.has_value()) return absl::InvalidArgumentError("worker: missing (one [[worker]] table per GPU)");
  return *page_bytes;
}

}  // namespace dhs::node
