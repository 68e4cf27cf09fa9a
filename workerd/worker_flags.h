// workerd/worker_flags.h: THE list of workerd's flags a configuration sets (common/daemon_flag.h): workerd's CLI11
// set-up (workerd/main.cc, AddDaemonFlag) and dhs-node's [[worker]] tables (tools/node/node_config.cc) both read it.
// The order is dhs-node's: it passes the flags given in this order (after --run-dir and --gpu).
//
// Not here: --run-dir (dhs-node sets it), --check-config, the test-only flags, the link-model and asynchronous-device
// flags (their own option modules; dhs-node passes them through extra_args). The speculation flags are the
// speculation component's list (workerd/speculation/speculation_flags.h, spec::kSpeculationFlags), appended below:
// workerd declares them from it in AddSpeculationOptions and checks their combination at its start.
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
#include "workerd/speculation/speculation_flags.h"  // spec::kSpeculationFlags: the speculation component owns them

namespace dhs {

// --device: the device backends (brief §9); auto = cuda when built with CUDA and a GPU is present, else cpu.
inline std::vector<std::string> WorkerDeviceNames() { return {"cpu", "cuda", "auto"}; }
// --log-level: spdlog's levels.
inline std::vector<std::string> WorkerLogLevels() { return {"trace", "debug", "info", "warn", "error", "critical", "off"}; }
// workerd's own flags; kWorkerFlags below is this list, then the speculation flags.
inline constexpr DaemonFlag kWorkerOwnFlags[] = {
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
    {"log_level", "--log-level", DaemonFlag::kChoice, 0, 0, WorkerLogLevels},
};

inline constexpr auto kWorkerFlags = ConcatDaemonFlags(kWorkerOwnFlags, spec::kSpeculationFlags);

}  // namespace dhs
