// tools/node/node_config.h: the configuration of `dhs-node` (issue 11, "The node launcher"): one TOML document
// (docs/operations.md "Running a node with dhs-node") -> NodeConfig, and NodeConfig -> the command lines of memd and
// of each workerd. Pure functions: no files, no processes (the fuzz target fuzz/node_config_fuzz.cc and
// tests/tools/node_config_test.cc drive them).
//
// Tables and keys (every key is optional unless marked required; a key not given is not passed, so the daemon's own
// default applies):
//   [node]       run_dir (required, string), memd_path, workerd_path (strings: executables; default: next to dhs-node)
//   [memd]       memd's flags, one key each: the list memd's own CLI11 set-up reads (memd/memd_flags.h, kMemdFlags:
//                page_bytes, host_pool_bytes | host_pool_pages (one of them required), reserve_pages, reclaim_policy,
//                populate_pages_per_attempt, metrics_address, worker_timeout_ms, adopt_grace_ms, log_level)
//   [[worker]]   one per GPU: workerd's flags, one key each: the list workerd's CLI11 set-up reads
//                (workerd/worker_flags.h, kWorkerFlags: gpu (required, unique), mode, device, weights | preset, seed,
//                hbm_budget_bytes, slots, hot_rows, tail_rows, page_rows, max_context, prefix_cache_bytes,
//                prefill_chunk, connect_timeout_ms, memd_timeout_ms, memd_reconnect_ms, metrics_address, the
//                speculation keys, log_level); extra_args (array of strings passed last, e.g. the link-model flags)
//   [supervise]  backoff_initial_ms, backoff_max_ms, backoff_reset_ms, max_restarts, restart_window_s, stop_grace_ms,
//                start_timeout_ms, probe_interval_ms, restart_workers_with_memd, liveness_probe_ms,
//                memd_liveness_timeout_ms, worker_liveness_timeout_ms (SupervisorPolicy, tools/node/supervisor.h)
// Byte sizes (*_bytes) are integers or strings with a unit: K/M/G/T = 1000^n, KiB/MiB/GiB/TiB = 1024^n (as memd's
// --host-pool-bytes).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"
#include "tools/node/supervisor.h"

namespace dhs::node {

// One key's value as the daemon's flag takes it (canonical decimal for numbers), keyed by the TOML key name.
using Settings = std::map<std::string, std::string>;

struct WorkerEntry {
  GpuId gpu = 0;
  Settings settings;                    // every key given except gpu and extra_args
  std::vector<std::string> extra_args;  // passed after the generated flags
};

struct NodeConfig {
  std::string run_dir;
  std::string memd_path, workerd_path;  // "" = the default (next to dhs-node)
  Settings memd;                        // [memd] keys given
  std::vector<WorkerEntry> workers;     // in the file's order; at least one; GPU ids unique
  SupervisorPolicy supervise;
};

// Parses and validates a dhs-node configuration. Errors: INVALID_ARGUMENT whose message names the key as a path
// ("memd.page_bytes", "worker[1].slots") and the problem: a TOML syntax error (line and column), an unknown table or
// key, a wrong type, a value out of range or not among the choices, a missing required key, two keys that exclude
// each other, a GPU configured twice, a run directory too long for the node's sockets.
absl::StatusOr<NodeConfig> ParseNodeConfig(std::string_view toml_text);

// A byte size: a non-negative integer, or digits with a unit K/M/G/T (1000^n) or KiB/MiB/GiB/TiB (1024^n), case-
// insensitive, optional "B" after K/M/G/T. Errors: INVALID_ARGUMENT (no digits, unknown unit, beyond 2^64-1).
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);

// memd's command line (without the executable): --run-dir, then one flag per [memd] key, with --page-bytes
// `page_bytes` (> 0; ResolvePageBytes) when [memd] does not give it.
std::vector<std::string> MemdArgs(const NodeConfig& config, uint64_t page_bytes);
// The command line of the workerd of config.workers[index]: --run-dir, --gpu, one flag per key, extra_args.
std::vector<std::string> WorkerArgs(const NodeConfig& config, size_t index);

}  // namespace dhs::node
