// tools/planner/plan_command.h: the `dhsctl plan` subcommand (issue 14; docs/planner.md): registers its options on a
// CLI11 app and runs the planner (planner.h). It needs no running memd.
//
//   dhsctl plan (--preset NAME | --file DESCRIPTION.json) --context TOKENS [--hot-rows B] [--tail-rows T]
//               [--slots N] [--metadata-bytes-per-hot-slot M] [--hbm-bytes X] [--host-bytes Y] [--miss-rate MU]
//               [--tpot-base-ms A --tpot-spec-ms B] [--json]
//
// Exit codes: 0 the plan was printed; 2 bad command line or input (the message names the option or field);
// 1 the description file cannot be read. `--live` is refused (exit 2): it needs memd's live state (not yet).
//
// Thread-safety: one thread (the CLI's).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"

namespace dhs::planner {

struct PlanCommandOptions {
  std::string preset;
  std::string file;
  uint64_t context_tokens = 0;
  std::optional<uint64_t> hot_rows, tail_rows, slots, metadata_bytes_per_hot_slot;
  std::optional<uint64_t> hbm_bytes, host_bytes;
  double miss_rate = 0.1;
  std::optional<double> tpot_base_ms, tpot_spec_ms;
  bool json = false;
  bool live = false;
};

// Adds the `plan` subcommand to `app`; its options land in `*options` (which must outlive the parse). Integer
// options take plain non-negative decimal numbers (CLI11 alone would wrap "-1").
CLI::App* AddPlanSubcommand(CLI::App& app, PlanCommandOptions* options);

// Runs the parsed `plan` subcommand: prints the table, or the JSON with `json` (the app's --json) or `plan --json`,
// to stdout; errors to stderr.
// Returns the exit code above.
int RunPlanCommand(const PlanCommandOptions& options, bool json);

}  // namespace dhs::planner
