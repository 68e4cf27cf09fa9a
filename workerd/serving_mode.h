// workerd/serving_mode.h: the serving modes (brief §4): THE one list of their names. workerd owns the vocabulary;
// memd (a Hello's serving_mode), dhs-replay (--mode), dhs-node ([[worker]] mode) and the planner ask it here.
// Header-only (no library to link): memd checks a Hello's serving_mode against it without linking the worker.
//
// resident: every row on GPU, required pages = the whole context; hisparse: hierarchical KV, every history page
// required; adaptive: hierarchical KV, history pages optional (reclaimable). Names are wire text
// (Hello.serving_mode): they must not change.
//
// Thread-safety: pure functions over constants.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dhs {

enum class WorkerMode : uint8_t { kResident, kHisparse, kAdaptive };

// The modes and their names, in this order (help texts list them so).
inline constexpr std::array<std::pair<WorkerMode, std::string_view>, 3> kWorkerModes = {{
    {WorkerMode::kResident, "resident"},
    {WorkerMode::kHisparse, "hisparse"},
    {WorkerMode::kAdaptive, "adaptive"},
}};

// The name of `mode` ("unknown" for a value outside the enum).
constexpr std::string_view WorkerModeName(WorkerMode mode) {
  for (const auto& [m, name] : kWorkerModes) {
    if (m == mode) return name;
  }
  return "unknown";
}

// Every mode's name, in kWorkerModes order (CLI11 IsMember, help texts).
inline std::vector<std::string> WorkerModeNames() {
  std::vector<std::string> names;
  for (const auto& entry : kWorkerModes) names.emplace_back(entry.second);
  return names;
}

// The names as prose: "resident, hisparse or adaptive" (error messages).
inline std::string WorkerModeList() {
  std::vector<std::string> names = WorkerModeNames();
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

// The mode named `name` (exact, lower case). Errors: INVALID_ARGUMENT naming it and the known names.
inline absl::StatusOr<WorkerMode> ParseWorkerMode(std::string_view name) {
  for (const auto& [m, n] : kWorkerModes) {
    if (n == name) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode '", std::string(name), "' (", absl::StrJoin(WorkerModeNames(), ", "), ")"));
}

}  // namespace dhs
