// workerd/speculation/speculation_cli.h: the speculation options (speculation_config.h) on a CLI11 app, shared by workerd
// and dhs-replay so that both spell them alike. Header-only: includers bring CLI11.
//
//   --speculate off|fixed|confidence|synthetic  [--block K] [--block-schedule "1:8,33:6,128:4"]
//   [--spec-confidence X] [--spec-corruption X] [--drafter-weights FILE]
//
// ResolveSpeculationMode turns the mode's text into the config after parsing; CheckSpeculation (run with the worker's
// geometry) checks the values, errors naming the option.
#pragma once

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "workerd/speculation/speculation_config.h"

namespace dhs::spec {

struct SpeculationFlags {
  std::string mode = "off";
  SpeculationConfig config;
};

inline void AddSpeculationOptions(CLI::App& app, SpeculationFlags* flags) {
  app.add_option("--speculate", flags->mode,
                 "speculative decoding: off | fixed | confidence (need --drafter-weights) | synthetic (benchmarks only: "
                 "the target's own greedy continuation, corrupted with --spec-corruption)")
      ->check(CLI::IsMember({"off", "fixed", "confidence", "synthetic"}))->capture_default_str();
  app.add_option("--block", flags->config.block, "K_max: target queries per round, anchor included (1 = none)")
      ->capture_default_str();
  app.add_option("--block-schedule", flags->config.schedule,
                 "block width by live sessions, \"from:width,...\" (e.g. 1:8,33:6,128:4; widths <= --block), or \"online\" "
                 "(chosen each step from measured acceptance, step time and load, up to --block)");
  app.add_option("--spec-confidence", flags->config.confidence, "confidence mode's threshold, in [0, 1]")
      ->capture_default_str();
  app.add_option("--spec-corruption", flags->config.corruption,
                 "synthetic mode: probability a proposal is corrupted, in [0, 1]")->capture_default_str();
  app.add_option("--drafter-weights", flags->config.drafter_weights,
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
