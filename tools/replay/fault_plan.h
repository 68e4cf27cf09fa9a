// tools/replay/fault_plan.h: the decision core of dhs-replay's fault injection (issue 11): when to SIGKILL the worker
// or memd of the node the tool started, and which test-only kill point (workerd --fault-kill-at) each worker start
// gets. In the style of memd/residency_manager.h: events in (a child became ready or exited, a timer), orders out
// (kill the worker, kill memd), every event carrying the time (ms of one monotonic clock); no processes, no signals, no
// clock, so every decision is deterministic and tested (tests/tools/fault_plan_test.cc) with CheckInvariants after each
// event. The thin part that executes the orders is tools/replay/supervised_node.h.
//
// Decisions:
// - Timed kills (--kill-worker-every S, --restart-memd-every S): once the target is ready (and, for the worker, memd
//   too), its next kill is drawn: ready time + a delay from the seeded generator: exponential with mean S, or uniform
//   in [S/2, 3S/2]. When the timer fires and the target (and memd, for the worker) is ready, kKillWorker / kKillMemd is
//   ordered; a target that exited or is restarting when its time comes is not killed: its next kill is drawn when it
//   is ready again. Only one of the two children is killed at a time: a kill due while the other child is not ready
//   waits until it is.
// - Hook kills (--kill-worker-at KIND:N, repeatable): the k-th worker start gets the k-th spec as --fault-kill-at
//   (WorkerFaultForStart); starts after the list ran out get none. "random:K" expands to K specs drawn from the seed
//   (RandomHookKills).
// - Stop (the run ended): no order after it.
//
// Thread-safety: none. One loop drives it.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/fault_point.h"

namespace dhs::replay {

enum class FaultDistribution { kExponential, kUniform };

struct FaultPlanConfig {
  uint64_t seed = 1;
  int64_t kill_worker_every_ms = 0;   // 0: no timed worker kills
  int64_t restart_memd_every_ms = 0;  // 0: no timed memd kills
  FaultDistribution distribution = FaultDistribution::kExponential;
  std::vector<FaultKill> hook_kills = {};  // --fault-kill-at of the 1st, 2nd, ... worker start
};

struct FaultOrder {
  enum class Kind { kKillWorker, kKillMemd };
  Kind kind = Kind::kKillWorker;
};

// Parses --kill-worker-at values in order: "KIND:N" (ParseFaultKill) or "random:K" (K >= 1 specs from
// RandomHookKills(seed, K)). INVALID_ARGUMENT naming the value.
absl::StatusOr<std::vector<FaultKill>> ParseHookKills(const std::vector<std::string>& specs, uint64_t seed);
// K kill specs drawn from `seed` (its own stream, not the timed kills'): kinds cycle through prefill, decode, backup,
// populate in an order drawn from the seed; N uniform in [1, 4] for prefill/backup/populate and [1, 40] for decode.
std::vector<FaultKill> RandomHookKills(uint64_t seed, int count);

class FaultPlan {
 public:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  explicit FaultPlan(FaultPlanConfig config);

  // ---- events (times never decrease; an event that does not fit, e.g. ready twice, is counted and ignored) ----
  void WorkerReady(int64_t now_ms);
  void WorkerExited(int64_t now_ms);
  void MemdReady(int64_t now_ms);
  void MemdExited(int64_t now_ms);
  void Timer(int64_t now_ms);
  void Stop();

  std::vector<FaultOrder> DrainOrders();
  int64_t NextWakeupMs() const;  // kNever when no timer is pending
  // The --fault-kill-at of the next worker start (and advances to the one after it); nullopt when the list ran out.
  std::optional<FaultKill> WorkerFaultForStart();

  // ---- queries ----
  uint64_t worker_kills() const { return worker_kills_; }
  uint64_t memd_kills() const { return memd_kills_; }
  int64_t worker_kill_at() const { return worker_kill_at_; }
  int64_t memd_kill_at() const { return memd_kill_at_; }
  uint64_t ignored_events() const { return ignored_; }
  // OK or INTERNAL naming the broken invariant: a kill time only for a ready child (kNever otherwise) and never
  // before its ready time; no kill time after Stop; at most one kill order per ready period; orders only for ready
  // children.
  absl::Status CheckInvariants() const;

 private:
  int64_t Draw(int64_t mean_ms);
  void Schedule(int64_t now_ms);

  FaultPlanConfig config_;
  std::mt19937_64 rng_;
  bool worker_ready_ = false, memd_ready_ = false, stopped_ = false;
  int64_t worker_ready_at_ = 0, memd_ready_at_ = 0;
  int64_t worker_kill_at_ = kNever, memd_kill_at_ = kNever;
  bool worker_killed_ = false, memd_killed_ = false;  // killed in this ready period (no second kill order)
  size_t next_hook_ = 0;
  uint64_t worker_kills_ = 0, memd_kills_ = 0, ignored_ = 0;
  std::vector<FaultOrder> orders_;
};

}  // namespace dhs::replay
