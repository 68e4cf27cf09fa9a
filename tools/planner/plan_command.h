// tools/planner/plan_command.h: the `dhsctl plan` subcommand (issue 14; docs/planner.md): registers its options on a
// CLI11 app and runs the planner (planner.h). It needs no running memd, except with --live.
//
//   dhsctl plan [--preset NAME | --file DESCRIPTION.json] --context TOKENS [--hot-rows B] [--tail-rows T]
//               [--slots N] [--metadata-bytes-per-hot-slot M] [--hbm-bytes X] [--host-bytes Y] [--miss-rate MU]
//               [--tpot-base-ms A --tpot-spec-ms B] [--live [--gpu G]] [--json]
//
// NAME: a brief-scale preset (planner.h PresetNames) or a workerd model, "workerd:NAME" (workerd_presets.h).
// --live adds what the running memd would admit now in sessions of this shape (ComputeLive over memd's `status`);
// without --preset and --file the shape is the one the worker of GPU G declared in its Hello (default: the first
// registered GPU), in its serving mode, and only GPU G is counted.
// Exit codes: 0 the plan was printed; 2 bad command line or input (the message names the option or field), a
// topology whose page differs from memd's, --gpu not registered, or a worker that declared no shape; 1 the
// description file cannot be read, or (--live) memd is not running; 3 (--live) memd did not answer in time; 4 (--live)
// memd answered with an error.
//
// Thread-safety: one thread (the CLI's).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"

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
  std::optional<uint32_t> gpu;  // --gpu G (with --live)
};

// Adds the `plan` subcommand to `app`; its options land in `*options` (which must outlive the parse). Integer
// options take plain non-negative decimal numbers (CLI11 alone would wrap "-1").
CLI::App* AddPlanSubcommand(CLI::App& app, PlanCommandOptions* options);

// Fetches memd's `status` view as JSON (dhsctl's IntrospectQuery). Errors: UNAVAILABLE memd not running,
// DEADLINE_EXCEEDED no answer in time, any other code: memd's error reply.
using FetchStatusJson = std::function<absl::StatusOr<std::string>()>;

// Runs the parsed `plan` subcommand: prints the table, or the JSON with `json` (the app's --json) or `plan --json`,
// to stdout; errors to stderr. `fetch_status` is called once with --live (and may be empty without it).
// Returns the exit code above.
int RunPlanCommand(const PlanCommandOptions& options, bool json, const FetchStatusJson& fetch_status = {});

}  // namespace dhs::planner
