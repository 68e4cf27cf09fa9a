// tools/replay/supervised_node.h: the node dhs-replay starts when it injects faults or re-attaches (issue 11): memd and
// one workerd, supervised as dhs-node supervises them (the same decision core, tools/node/supervisor.h: a crashed
// child is restarted with the same flags after a backoff, memd's death restarts the worker), and killed on purpose
// by the fault plan (tools/replay/fault_plan.h: SIGKILL of the worker or memd at seeded random times; the worker's
// test-only kill points). A background thread executes both cores' orders; it alone starts, signals and reaps the
// children (their PR_SET_PDEATHSIG is tied to it).
//
// host_rows_lost (issue 11): the thread maps memd's host-pool segment (found in /proc/<memd>/maps) and, every
// sample_interval and right before each kill it orders, reads memd's `requests` view and each live request's
// `request N` view (host_copies: history pages with a confirmed host copy) and digests those host pages into a
// HostLedger (tools/replay/host_ledger.h) keyed by client id (the low 40 bits of the node request id: dhs-replay's ids
// are in range, so RequestBook::NodeRequestId uses them) and history page; a sample keeps only pages listed before and
// after their digest (a request that ended meanwhile has its pages freed and reused). After a worker death, before the
// restart may be executed, it waits (bounded) for memd to fence the GPU and checks every recorded page of each
// interrupted request against the interrupted request's host copies (vanished or changed -> lost); after a memd
// restart, once the new memd serves, every recorded page is checked against what the new memd lists. rows lost =
// pages lost * page_rows.
//
// Thread-safety: Start / Stop / keep_run_dir from one thread at a time (dhs-replay serializes them); stats() and
// CorruptHostByteForTest from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/node/supervisor.h"
#include "tools/replay/fault_plan.h"
#include "tools/replay/node_client.h"
#include "tools/replay/node_launcher.h"

namespace dhs::replay {

struct SupervisedNodeOptions {
  NodeLaunchOptions launch;
  FaultPlanConfig faults;
  node::SupervisorPolicy policy = ChaosPolicy();
  uint32_t page_rows = 1;  // rows per page (host_rows_lost = pages lost * page_rows)
  std::chrono::milliseconds sample_interval{250};  // host-copy digests while running
  std::chrono::milliseconds fence_timeout{8000};   // a dead worker's GPU fenced by memd within this, else logged
  // Test-only: before the first timed kill that finds recorded pages, flip one byte of one page of each recorded
  // request in the mapped pool (--corrupt-host-page-for-test), so that a test proves host_rows_lost can count.
  bool corrupt_host_pages = false;
  // Issue 28 (unconfirmed host copies, host_ledger.h ObserveCoverage): the worker's tail rows T, and the rows the
  // client saw computed for a client request id (0 when unknown; called from the supervision thread). Unset: the
  // coverage is not checked.
  uint32_t tail_rows = 0;
  std::function<int64_t(RequestId client)> rows_computed;
  // dhs-node's policy tuned for many deliberate kills: backoff 100 ms doubling to 2 s, reset after 2 s ready, no
  // giving up (1e6 restarts), start timeout 60 s, probes every 50 ms, stop grace 5 s.
  static node::SupervisorPolicy ChaosPolicy();
};

// What the faults did (a snapshot; counters since Start).
struct FaultStats {
  uint64_t seed = 0;
  uint64_t worker_restarts = 0;  // worker starts after the first
  uint64_t memd_restarts = 0;    // memd starts after the first
  uint64_t worker_kills = 0;     // timed SIGKILLs of the worker (the fault plan's)
  uint64_t memd_kills = 0;       // timed SIGKILLs of memd
  uint64_t worker_deaths = 0;    // worker exits while the node ran (kills, kill points, crashes)
  uint64_t worker_crashes = 0;   // of those, ends other than SIGKILL: crashes, not faults the tool injected (issue 28)
  std::string last_crash;        // the latest crash: how it ended and its log's last line
  uint64_t hook_kills_armed = 0;  // worker starts given a --fault-kill-at
  uint64_t requests_resumed = 0;  // summed over the workers' lives (WorkerStatsReply at each ready)
  uint64_t rows_recomputed = 0;
  uint64_t host_pages_recorded = 0;
  uint64_t host_pages_checked = 0;
  uint64_t host_pages_lost = 0;
  uint64_t host_rows_lost = 0;
  uint64_t host_pages_unconfirmed = 0;  // pages that should hold a confirmed host copy and did not (issue 28)
  uint64_t fence_timeouts = 0;   // worker deaths whose fence memd did not show within fence_timeout (check skipped)
  std::vector<std::chrono::steady_clock::time_point> worker_down_at;  // each worker death: kill sent, or exit seen
  // The counters of the workers that died (WorkerStatsReply sampled every sample_interval and before a kill: up to one
  // interval of a worker killed at a kill point is missing); the report adds the last worker's to them.
  NodeStats dead_worker_counters;
};

class SupervisedNode final : public ReplayNode {
 public:
  // Starts the supervision thread and waits until memd and the worker are ready (start_timeout of the policy).
  // Errors: INVALID_ARGUMENT (executables, sizes, run directory), UNAVAILABLE (not ready in time, or the supervisor
  // gave up; the message names the logs); the run directory is then kept.
  static absl::StatusOr<std::unique_ptr<SupervisedNode>> Start(const SupervisedNodeOptions& options);
  ~SupervisedNode() override;

  // Stops injecting faults, then the children (SIGTERM: workers, then memd; SIGKILL after the grace), joins the thread,
  // removes a temporary run directory unless kept. Idempotent. A memd dead at the stop (killed, restart in backoff)
  // left its host pool in /dev/shm: the stop removes it (the segment whose header names the run directory).
  absl::Status Stop() override;
  // No kill from now on (the run's requests all ended): waits (at most 2 s) until the supervision thread took it in;
  // a kill ordered before still completes, and its worker is restarted.
  void StopFaults();
  void keep_run_dir() override { owns_run_dir_ = false; }
  const std::string& run_dir() const override { return run_dir_; }
  FaultStats stats() const;

 private:
  explicit SupervisedNode(SupervisedNodeOptions options) : options_(std::move(options)) {}
  void Loop();
  struct Runtime;
  SupervisedNodeOptions options_;
  std::string run_dir_;
  bool owns_run_dir_ = false;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stop_faults_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false;    // guarded by mu_: every child ready once
  bool exited_ = false;   // guarded by mu_: the supervisor ordered kExit
  bool faults_stopped_ = false;  // guarded by mu_: the fault plan was stopped
  std::string exit_message_;  // guarded by mu_
  FaultStats stats_;      // guarded by mu_
};

}  // namespace dhs::replay
