// workerd/worker_flags.h: THE list of workerd's flags a configuration sets (common/daemon_flag.h): workerd's CLI11
// set-up (workerd/main.cc, AddDaemonFlag) and dhs-node's [[worker]] tables (tools/node/node_config.cc) both read it.
// The order is dhs-node's: it passes the flags given in this order (after --run-dir and --gpu).
//
// Not here: --run-dir (dhs-node sets it), --check-config, the test-only flags, the link-model and asynchronous-device
// flags (their own option modules; dhs-node passes them through extra_args). The speculation flags' names and ranges
// are listed for dhs-node's early check; workerd reads them in AddSpeculationOptions (workerd/speculation/speculation_cli.h)
// and checks them at its start (ResolveSpeculation).
//
// Thread-safety: constants.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/daemon_flag.h"
#include "common/types.h"
#include "workerd/model/config.h"   // PresetNames: the model owns them
#include "workerd/serving_mode.h"   // WorkerModeNames

namespace dhs {

// --device: the device backends (brief §9); auto = cuda when built with CUDA and a GPU is present, else cpu.
inline std::vector<std::string> WorkerDeviceNames() { return {"cpu", "cuda", "auto"}; }
// --log-level: spdlog's levels.
inline std::vector<std::string> WorkerLogLevels() { return {"trace", "debug", "info", "warn", "error", "critical", "off"}; }
// --speculate (workerd/speculation/speculation_config.h, SpeculateMode).
inline std::vector<std::string> SpeculateModeNames() { return {"off", "fixed", "confidence", "synthetic"}; }

inline constexpr DaemonFlag kWorkerFlags[] = {
    {"gpu", "--gpu", DaemonFlag::kUint, 0, kMaxGpus - 1},
    {"mode", "--mode", DaemonFlag::kChoice, 0, 0, WorkerModeNames},
    {"device", "--device", DaemonFlag::kChoice, 0, 0, WorkerDeviceNames},
    {"weights", "--weights", DaemonFlag::kString},
    {"preset", "--preset", DaemonFlag::kChoice, 0, 0, model::PresetNames},
    {"seed", "--seed", DaemonFlag::kUint, 0, UINT64_MAX},
    {"hbm_budget_bytes", "--hbm-budget", DaemonFlag::kSize, 1, UINT64_MAX},
    {"slots", "--slots", DaemonFlag::kUint, 1, 4096},
    {"hot_rows", "--hot-rows", DaemonFlag::kUint, 0, UINT32_MAX},
    {"tail_rows", "--tail-rows", DaemonFlag::kUint, 0, UINT32_MAX},
    {"page_rows", "--page-rows", DaemonFlag::kUint, 1, 1u << 20},
    {"max_context", "--max-context", DaemonFlag::kUint, 1, UINT64_MAX},
    {"prefix_cache_bytes", "--prefix-cache-bytes", DaemonFlag::kSize, 0, UINT64_MAX},
    {"prefill_chunk", "--prefill-chunk", DaemonFlag::kUint, 0, UINT32_MAX},
    {"connect_timeout_ms", "--connect-timeout-ms", DaemonFlag::kUint, 1, 3600000},
    {"memd_timeout_ms", "--memd-timeout-ms", DaemonFlag::kUint, 100, 3600000},
    {"memd_reconnect_ms", "--memd-reconnect-ms", DaemonFlag::kUint, 100, 3600000},
    {"metrics_address", "--metrics-address", DaemonFlag::kString},  // issue 22: the worker's GET /metrics
    // Speculative decoding (brief §6; see above): workerd checks the combination at its start.
    {"speculate", "--speculate", DaemonFlag::kChoice, 0, 0, SpeculateModeNames},
    {"block", "--block", DaemonFlag::kUint, 1, 64},
    {"block_schedule", "--block-schedule", DaemonFlag::kString},
    {"spec_confidence", "--spec-confidence", DaemonFlag::kFraction},
    {"spec_corruption", "--spec-corruption", DaemonFlag::kFraction},
    {"drafter_weights", "--drafter-weights", DaemonFlag::kString},
    {"log_level", "--log-level", DaemonFlag::kChoice, 0, 0, WorkerLogLevels},
};

}  // namespace dhs
