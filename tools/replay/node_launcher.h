// tools/replay/node_launcher.h: starts a one-GPU node (memd + one workerd) as child processes for a replay run
// (the embedded default of dhs-replay), waits until both serve, and stops them (SIGTERM, then SIGKILL after a grace
// period). Each run gets its own run directory (mode 0700) holding the sockets and the two logs.
//
// Thread-safety: one thread. Children are started with fork + exec, with only async-signal-safe calls between
// them, so starting them from a process that already runs threads is safe. Each child gets
// PR_SET_PDEATHSIG(SIGTERM): it is told to stop when the thread that started it dies (call Start from the
// main thread), so a killed dhs-replay does not leave memd or workerd behind. Children start with an empty
// signal mask and default SIGINT/SIGTERM handling whatever the caller blocked.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workerd/model/config.h"  // kDefaultPreset
#include "workerd/serving_mode.h"

namespace dhs::replay {

struct NodeLaunchOptions {
  std::string memd_path;        // the memd executable
  std::string workerd_path;     // the workerd executable
  std::string run_dir;          // "" = a fresh mkdtemp directory under TempRunDirParent() (removed by Stop)
  std::string mode{WorkerModeName(WorkerMode::kAdaptive)};  // workerd --mode
  std::string preset{model::kDefaultPreset};  // workerd --preset (weights generated from --seed)
  uint64_t seed = 1;
  uint64_t hbm_budget_bytes = 0;  // workerd --hbm-budget, bytes
  uint64_t page_bytes = 0;        // memd --page-bytes (must equal the worker's host page bytes, WorkerGeometry)
  uint64_t host_pool_bytes = 0;   // memd --host-pool-bytes
  uint32_t slots = 8;             // workerd --slots
  std::vector<std::string> extra_memd_args;
  std::vector<std::string> extra_workerd_args;
  std::chrono::milliseconds start_timeout{20000};
  // Names the logs in the run directory (NodeLogPath): "" gives memd.log / workerd.log, "reference" gives
  // memd.reference.log / workerd.reference.log, so that two runs in one --run-dir (--check-exact's run, then its
  // resident reference) keep both runs' logs.
  std::string log_tag;
};

// The log of `daemon` ("memd" or "workerd") of a node in `run_dir`: <run_dir>/<daemon>.log, or
// <run_dir>/<daemon>.<log_tag>.log with a tag (NodeLaunchOptions::log_tag).
std::string NodeLogPath(const std::string& run_dir, const std::string& daemon, const std::string& log_tag);

// Where a fresh run directory (<parent>/dhs-replay-XXXXXX) goes: `tmpdir` ($TMPDIR) when set and short enough for the
// node's sockets (CheckSocketPaths, common/transport.h), else /tmp (a long TMPDIR would give a run directory whose
// worker socket does not fit sun_path).
std::string TempRunDirParent(const char* tmpdir);

// The command lines of the node's daemons (after the executable): memd's and the worker's of GPU 0, run directory
// `run_dir`, the options' extra arguments last.
std::vector<std::string> MemdArgs(const NodeLaunchOptions& options, const std::string& run_dir);
std::vector<std::string> WorkerArgs(const NodeLaunchOptions& options, const std::string& run_dir);

// What dhs-replay needs of a node it started: its directory and sockets, and stopping it (from any one thread, once
// at a time: the caller serializes Stop and keep_run_dir).
class ReplayNode {
 public:
  virtual ~ReplayNode() = default;
  // Stops the node's processes; removes a temporary run directory unless keep_run_dir() was called. Idempotent.
  virtual absl::Status Stop() = 0;
  // Keeps a temporary run directory on Stop (to read the logs after a failed run).
  virtual void keep_run_dir() = 0;
  virtual const std::string& run_dir() const = 0;
  std::string memd_endpoint() const;
  std::string worker_endpoint() const;
};

class EmbeddedNode final : public ReplayNode {
 public:
  // Starts memd, waits for its socket, starts workerd, waits for its socket. Errors: INVALID_ARGUMENT (paths; a given
  // run directory too long for the node's sockets),
  // UNAVAILABLE (a child could not be started, exited or did not come up in time; the message names how it
  // ended (DescribeWaitStatus), its log and the log's tail). On failure the run directory is kept, even a
  // temporary one, and the message says so.
  static absl::StatusOr<std::unique_ptr<EmbeddedNode>> Start(const NodeLaunchOptions& options);
  ~EmbeddedNode() override;  // Stop()
  EmbeddedNode(const EmbeddedNode&) = delete;
  EmbeddedNode& operator=(const EmbeddedNode&) = delete;

  // Stops workerd then memd; removes the run directory when Start created it (unless keep_run_dir() was
  // called). Idempotent.
  absl::Status Stop() override;
  void keep_run_dir() override { owns_run_dir_ = false; }
  const std::string& run_dir() const override { return run_dir_; }

 private:
  EmbeddedNode() = default;
  absl::Status Spawn(const std::string& path, const std::vector<std::string>& args, const std::string& log,
                     pid_t& pid);
  absl::Status WaitForSocket(const std::string& name, pid_t pid, const std::string& log,
                             std::chrono::milliseconds timeout);

  std::string run_dir_;
  bool owns_run_dir_ = false;
  pid_t memd_pid_ = -1;
  pid_t worker_pid_ = -1;
};

// Creates the run directory of a node: options.run_dir (checked for the sockets' length, created 0700) or, when
// empty, a fresh mkdtemp directory under TempRunDirParent (`temporary` set: the caller removes it). Errors:
// INVALID_ARGUMENT (too long), INTERNAL (mkdtemp), MakeRunDir's.
absl::StatusOr<std::string> CreateRunDir(const NodeLaunchOptions& options, bool& temporary);

// Issue 26 review: the parent run directory of dhs-replay --nodes N --run-dir DIR (the nodes' DIR/node<i> go under it,
// and --check-exact's resident reference node runs in DIR itself): its missing parents are created (as mkdir -p), DIR
// itself by MakeRunDir (common/transport.h): created mode 0700, or an existing one checked (owned by this user,
// granting nothing to group or others). Errors: INTERNAL (a parent cannot be created), MakeRunDir's.
absl::Status MakeNodesRunDir(const std::string& run_dir);

// How a child ended, from a waitpid status: "exit code N", "signal NAME (N)" or "status N" (anything else).
std::string DescribeWaitStatus(int status);

}  // namespace dhs::replay
