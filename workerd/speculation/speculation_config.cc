#include "workerd/speculation/speculation_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "workerd/speculation/block_width.h"
#include "workerd/speculation/speculation_flags.h"  // kSpeculateModes

namespace dhs::spec {

std::string_view SpeculateModeName(SpeculateMode mode) {
  for (const auto& [m, name] : kSpeculateModes) {
    if (m == mode) return name;
  }
  return "off";
}

absl::StatusOr<SpeculateMode> ParseSpeculateMode(std::string_view name) {
  for (const auto& [m, n] : kSpeculateModes) {
    if (n == name) return m;
  }
  std::vector<std::string> names = SpeculateModeNames();
  const std::string last = names.back();
  names.pop_back();
  return absl::InvalidArgumentError(absl::StrCat("--speculate '", std::string(name), "': expected ",
                                                 absl::StrJoin(names, ", "), " or ", last));
}

absl::Status CheckSpeculation(const SpeculationConfig& config, int64_t max_block, bool staging) {
  if (config.mode == SpeculateMode::kOff) return absl::OkStatus();
  if ((config.mode == SpeculateMode::kFixed || config.mode == SpeculateMode::kConfidence) &&
      config.drafter_weights.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--speculate ", std::string(SpeculateModeName(config.mode)),
                                                   " needs the drafter: give --drafter-weights FILE (dhs-gen-weights "
                                                   "--drafter makes one)"));
  }
  if (!(config.confidence >= 0.0 && config.confidence <= 1.0) ||
      !(config.corruption >= 0.0 && config.corruption <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--spec-confidence ", config.confidence, " and --spec-corruption ",
                                                   config.corruption, " must be in [0, 1]"));
  }
  if (config.block < 1 || config.block > max_block) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--block ", config.block, " outside [1, ", max_block, "]: ",
        staging ? "the tail T must hold a page and a block (K_r <= T - p + 1; the rows of a round's union beyond the "
                  "hot cache go to the staging arenas)"
                : "without staging arenas (--staging-arenas 0) a round's K_r queries select up to K_r * (k + w) rows "
                  "that must fit the hot cache B, and the tail T must hold a page and a block (K_r <= T - p + 1)"));
  }
  if (!config.schedule.empty() && config.schedule != kOnlineSchedule) {
    absl::StatusOr<BlockWidthSchedule> s = BlockWidthSchedule::Parse(config.schedule, config.block);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--block-schedule: ", s.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace dhs::spec
