// workerd/speculation/speculation_flags.h: THE list of the speculation flags (brief §6; issue 23, one list per
// vocabulary). The speculation component owns them: AddSpeculationOptions (speculation_cli.h) declares them on
// workerd's and dhs-replay's CLI from this list, and workerd/worker_flags.h appends the list to kWorkerFlags, which
// dhs-node's [[worker]] tables read (tools/node/node_config.cc). Header-only (no library to link), like
// workerd/serving_mode.h: dhs-node checks a configuration against it without linking the speculation code.
//
// Thread-safety: constants and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/daemon_flag.h"
#include "workerd/speculation/speculation_config.h"  // SpeculateMode

namespace dhs::spec {

// --speculate's modes and their names, in this order (help texts and error messages list them so). The names are
// configuration text (dhs-node's speculate key, WorkerStatsReply.speculate): they must not change.
inline constexpr std::array<std::pair<SpeculateMode, std::string_view>, 4> kSpeculateModes = {{
    {SpeculateMode::kOff, "off"},
    {SpeculateMode::kFixed, "fixed"},
    {SpeculateMode::kConfidence, "confidence"},
    {SpeculateMode::kSynthetic, "synthetic"},
}};

// Every mode's name, in kSpeculateModes order (CLI11 IsMember, dhs-node's check).
inline std::vector<std::string> SpeculateModeNames() {
  std::vector<std::string> names;
  for (const auto& entry : kSpeculateModes) names.emplace_back(entry.second);
  return names;
}

// The speculation flags, in the order dhs-node passes them. --block's range is the widest round any worker takes;
// CheckSpeculation (speculation_config.h) then checks the block against the worker's geometry at its start.
inline constexpr DaemonFlag kSpeculationFlags[] = {
    {"speculate", "--speculate", DaemonFlag::kChoice, 0, 0, SpeculateModeNames},
    {"block", "--block", DaemonFlag::kUint, 1, 64},
    {"block_schedule", "--block-schedule", DaemonFlag::kString},
    {"spec_confidence", "--spec-confidence", DaemonFlag::kFraction},
    {"spec_corruption", "--spec-corruption", DaemonFlag::kFraction},
    {"drafter_weights", "--drafter-weights", DaemonFlag::kString},
};

}  // namespace dhs::spec
