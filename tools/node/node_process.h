// tools/node/node_process.h: the process part of `dhs-node` (issue 11): executes the Supervisor's orders (spawn a
// child with fork + exec, signal it, probe its readiness over the node's sockets, notify systemd) and turns what the
// operating system reports (SIGCHLD, SIGTERM, SIGINT through a signalfd; the monotonic clock) into Supervisor events.
// It decides nothing itself.
//
// Readiness probes (one short request each, ProbeTimeout below):
// - memd: answers an IntrospectQuery (Gpus, JSON) on <run_dir>/memd.sock;
// - a worker of GPU g: answers a WorkerStatsQuery on <run_dir>/worker-<g>.sock with gpu = g (a worker serves its
//   socket only after memd accepted its Hello) and memd's GPU list holds g.
// Logs: each child's stdout and stderr are appended to <run_dir>/memd.log or <run_dir>/worker-<g>.log.
// systemd: "node ready" sends READY=1 (common/sd_notify.h); the children get the environment without NOTIFY_SOCKET.
//
// Thread-safety: one thread (the main thread: children get PR_SET_PDEATHSIG(SIGTERM), tied to the thread that
// spawned them).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/node/node_config.h"

namespace dhs::node {

inline constexpr std::chrono::milliseconds kProbeTimeout{250};

struct NodePaths {
  std::string memd;     // memd executable
  std::string workerd;  // workerd executable
};

// Starts the node of `config` and supervises it until it stops. Blocks SIGTERM, SIGINT and SIGCHLD in the calling
// thread (they are read from a signalfd). Returns the exit code (0 after a clean stop on SIGTERM/SIGINT, 1 when it
// gave up or could not run: an unusable run directory, executables not found; the message is logged).
int RunNode(const NodeConfig& config, uint64_t page_bytes, const NodePaths& paths);

// Whether memd on `run_dir` answers and lists GPU `gpu` (nullopt: just answers), within `timeout`.
bool ProbeMemd(const std::string& run_dir, std::optional<GpuId> gpu, std::chrono::milliseconds timeout);
// Whether the worker of GPU `gpu` on `run_dir` answers a WorkerStatsQuery as GPU `gpu` within `timeout`.
bool ProbeWorker(const std::string& run_dir, GpuId gpu, std::chrono::milliseconds timeout);

}  // namespace dhs::node
