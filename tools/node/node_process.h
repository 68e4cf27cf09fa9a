// tools/node/node_process.h: the process part of `dhs-node` (issue 11): executes the Supervisor's orders (spawn a
// child with fork + exec, signal it, probe its readiness over the node's sockets, notify systemd) and turns what the
// operating system reports (SIGCHLD, SIGTERM, SIGINT through a signalfd; the monotonic clock) into Supervisor events.
// It decides nothing itself.
//
// Readiness probes (one short request each, ProbeTimeout below):
// - memd: answers an IntrospectQuery (Gpus, JSON) on <run_dir>/memd.sock;
// - a worker of GPU g: answers a WorkerStatsQuery on <run_dir>/worker-<g>.sock with gpu = g (a worker serves its
//   socket only after memd accepted its Hello) and memd's GPU list holds g, up (not fenced).
// Liveness probes of a ready child (issue 22): memd as above; a worker must answer its WorkerStatsQuery, and memd, when
// it answers, must not list its GPU as fenced (memd away is not the worker's fault).
// Logs: each child's stdout and stderr are appended to <run_dir>/memd.log or <run_dir>/worker-<g>.log. A child that
// fails fast or makes the node give up has the last kLogTailLines lines of its log since its start shown in dhs-node's
// output (error level, "NAME | line").
// Run directory (issue 22): before anything is written there, it must be (or be creatable as) a writable directory,
// and dhs-node takes <run_dir>/dhs-node.lock (flock, exclusive, its pid inside; held for the node's life, the file
// stays): a second dhs-node on the same run directory refuses with the first one's pid, and so does one that finds a
// live memd or worker answering on the run directory's sockets (started by hand, or still stopping).
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
inline constexpr size_t kLogTailLines = 20;  // lines of a failed child's log shown by dhs-node

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

// GPU `gpu` as memd on `run_dir` sees it: memd did not answer within `timeout`, the GPU is not in its list, it is
// registered and up, or it is fenced (its worker died, hung, or its epoch ended).
enum class MemdGpu { kNoAnswer, kAbsent, kUp, kFenced };
MemdGpu ProbeMemdGpu(const std::string& run_dir, GpuId gpu, std::chrono::milliseconds timeout);

// The last `lines` non-empty lines of the file `path` from byte `offset` on (the whole file when it is shorter than
// `offset`: it was replaced), looking at its last 64 KiB at most; {} when it cannot be read.
std::vector<std::string> ReadLogTail(const std::string& path, uint64_t offset, size_t lines);

// Run-directory checks (also `dhs-node --check`'s; nothing is created). CheckRunDirUsable: FAILED_PRECONDITION when
// `run_dir` exists and is not a writable directory, or does not exist and its parent is not a writable directory.
// CheckRunDirFree: FAILED_PRECONDITION when a live dhs-node holds the run directory's lock (its pid named), or a memd
// or a worker of `config` answers on its sockets.
absl::Status CheckRunDirUsable(const std::string& run_dir);
absl::Status CheckRunDirFree(const NodeConfig& config);
// Runs `path args... --check-config` (memd's or workerd's own option parsing and checks; nothing is started) and
// waits for it. Errors: FAILED_PRECONDITION naming `name`, how it exited and its output's last lines (cannot be
// started, or a non-zero exit).
absl::Status CheckChildConfig(const std::string& name, const std::string& path, std::vector<std::string> args);
// RunNode's first step: CheckRunDirUsable, MakeRunDir, takes the lock (exclusive flock on <run_dir>/dhs-node.lock,
// close-on-exec, our pid written), then CheckRunDirFree's socket checks. Returns the lock's file descriptor (held
// until closed). Errors: FAILED_PRECONDITION as above, MakeRunDir's.
absl::StatusOr<int> LockRunDir(const NodeConfig& config);

}  // namespace dhs::node
