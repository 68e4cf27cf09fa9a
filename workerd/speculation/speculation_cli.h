// workerd/speculation/speculation_cli.h: the speculation options (speculation_config.h) on a CLI11 app, shared by workerd
// and dhs-replay so that both spell them alike. Header-only: includers bring CLI11.
//
//   --speculate off|fixed|confidence|synthetic  [--block K] [--block-schedule "1:8,33:6,128:4"]
//   [--spec-confidence X] [--spec-corruption X] [--drafter-weights FILE]
//
// The flags' names, ranges and choices come from kSpeculationFlags (speculation_flags.h), the list dhs-node reads too.
// ResolveSpeculation turns the mode's text into the config after parsing; CheckSpeculation (run with the worker's
// geometry) checks the values, errors naming the option.
#pragma once

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/cli_flags.h"  // AddDaemonFlag
#include "workerd/speculation/speculation_config.h"
#include "workerd/speculation/speculation_flags.h"  // kSpeculationFlags: the one list

namespace dhs::spec {

struct SpeculationFlags {
  std::string mode = "off";
  SpeculationConfig config;
};

inline void AddSpeculationOptions(CLI::App& app, SpeculationFlags* flags) {
  // Each flag's name, range and choices from kSpeculationFlags (speculation_flags.h), as dhs-node reads them.
  auto add = [&app](std::string_view flag, auto& value, std::string help) {
    return AddDaemonFlag(app, kSpeculationFlags, flag, value, std::move(help));
  };
  add("--speculate", flags->mode,
      "speculative decoding: off | fixed | confidence (need --drafter-weights) | synthetic (benchmarks only: the "
      "target's own greedy continuation, corrupted with --spec-corruption)")->capture_default_str();
  add("--block", flags->config.block, "K_max: target queries per round, anchor included (1 = none)")
      ->capture_default_str();
  add("--block-schedule", flags->config.schedule,
      "block width by live sessions, \"from:width,...\" (e.g. 1:8,33:6,128:4; widths <= --block), or \"online\" "
      "(chosen each step from measured acceptance, step time and load, up to --block)");
  add("--spec-confidence", flags->config.confidence, "confidence mode's threshold, in [0, 1]")->capture_default_str();
  add("--spec-corruption", flags->config.corruption, "synthetic mode: probability a proposal is corrupted, in [0, 1]")
      ->capture_default_str();
  add("--drafter-weights", flags->config.drafter_weights,
      "fixed / confidence: the drafter's safetensors weights (dhs-gen-weights --drafter makes one)");
}

// The workerd arguments that give a worker `config` (empty when off): what dhs-replay passes to the workerd it starts.
inline std::vector<std::string> SpeculationArgs(const SpeculationConfig& config) {
  if (config.mode == SpeculateMode::kOff) return {};
  std::vector<std::string> args = {"--speculate", std::string(SpeculateModeName(config.mode)), "--block",
                                   std::to_string(config.block), "--spec-confidence", std::to_string(config.confidence),
                                   "--spec-corruption", std::to_string(config.corruption)};
  if (!config.schedule.empty()) args.insert(args.end(), {"--block-schedule", config.schedule});
  if (!config.drafter_weights.empty()) args.insert(args.end(), {"--drafter-weights", config.drafter_weights});
  return args;
}

// The config with the parsed mode. Errors: INVALID_ARGUMENT (unknown mode).
inline absl::StatusOr<SpeculationConfig> ResolveSpeculation(const SpeculationFlags& flags) {
  absl::StatusOr<SpeculateMode> mode = ParseSpeculateMode(flags.mode);
  if (!mode.ok()) return mode.status();
  SpeculationConfig c = flags.config;
  c.mode = *mode;
  return c;
}

}  // namespace dhs::spec
