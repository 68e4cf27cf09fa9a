// tools/node/supervisor.h: the decision core of `dhs-node` (issue 11, "The node launcher"), in the style of
// memd/residency_manager.h: events in (a child exited with a wait status, a readiness probe answered, a timer fired,
// SIGTERM/SIGINT), orders out (start child X, signal child X, probe child X, the node is ready, exit with a code),
// drained by the thin process part (tools/node/node_process.h). No processes, no signals, no clock: every event
// carries the time (milliseconds of a monotonic clock), so every decision is deterministic and testable
// (tests/tools/node_supervisor_test.cc drives it with random event sequences and checks CheckInvariants after each).
//
// Children: index 0 is memd, 1..workers the workerds (one per configured GPU, in the config's order).
// Decisions:
// - Start-up: memd first; the workers once memd is ready (its probe answered); "node ready" (kReady) once every child
//   is ready. A child not ready within start_timeout_ms is killed (SIGKILL) and counts as a crash.
// - Fail fast (issue 22): a child that exits (or cannot be started, or is killed by its start timeout) before it was
//   EVER ready fails the same way on every try (a bad flag, a bad metrics address, a pool too large for /dev/shm, a
//   live memd on the run directory): the node stops at once (below) with exit code 1, and the child's log since its
//   start is shown (kLogTail). A worker counts only when the memd it started against is still the ready one (a worker
//   that failed while memd restarted is an ordinary crash). The same log tail is shown when the node gives up.
// - A child that exits (or cannot be started) while the node runs is restarted after an exponential backoff:
//   backoff_initial_ms * 2^(k-1) for the k-th crash of a streak, at most backoff_max_ms; a child that had been ready
//   for backoff_reset_ms when it exited starts a new streak. A worker is (re)started only while memd is ready.
//   More than max_restarts crashes of one child within restart_window_ms: the node gives up (stops everything as
//   below, then kExit with code 1 and a message naming the child).
// - memd exits while the node runs: by default nothing is done to the workers: each sees memd's connection close,
//   serves on from its GPU and says its re-Hello with a report to the restarted memd (the same process goes on); one
//   that no memd answers within its --memd-reconnect-ms ends its epoch without ending its requests (exit 75) and is
//   restarted like any crash; the new memd adopted those requests (host pool + records), so the restarted worker
//   resumes them and clients re-attach.
//   A memd that is live but does not answer (hung: SIGSTOPped, deadlocked) is probed every liveness_probe_ms once it
//   is ready; when no probe has answered for memd_liveness_timeout_ms it gets SIGKILL (logged as hung), and its exit
//   is handled as any memd exit (restart with backoff; the new memd adopts the host pool and the records). 0 = off.
// - Worker liveness (issue 22): a ready worker is probed the same way (every liveness_probe_ms: it must answer a
//   WorkerStatsQuery on its serving socket, and memd, when it answers, must not hold its GPU fenced); a worker no probe
//   found alive for worker_liveness_timeout_ms (stopped, deadlocked, or fenced and not exiting) gets SIGKILL and is
//   restarted like a crash, so its GPU serves again. 0 = off.
//   With restart_workers_with_memd every live worker is stopped (SIGTERM: its requests END, "worker stopping") and
//   started again, without backoff and not counted as a crash, once the new memd is ready.
// - Terminate (SIGTERM/SIGINT) or giving up: restarts are cancelled; every live worker gets SIGTERM; memd gets
//   SIGTERM only after every worker exited; a child still alive stop_grace_ms after its SIGTERM gets SIGKILL; once
//   all exited, kExit (code 0 on Terminate, 1 on giving up). A second Terminate changes nothing.
//
// Thread-safety: none. One loop drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace dhs::node {

struct SupervisorPolicy {
  int64_t backoff_initial_ms = 500;   // delay before the first restart of a streak, ms
  int64_t backoff_max_ms = 30000;     // cap of the delay, ms
  int64_t backoff_reset_ms = 60000;   // ready this long at its exit: the child's next crash starts a new streak, ms
  uint32_t max_restarts = 5;          // crashes of one child within restart_window_ms that are still restarted
  int64_t restart_window_ms = 300000; // ms
  int64_t stop_grace_ms = 10000;      // SIGTERM -> SIGKILL, ms
  int64_t start_timeout_ms = 120000;  // start -> ready, ms
  int64_t probe_interval_ms = 200;    // between readiness probes of a starting child, ms
  bool restart_workers_with_memd = false;
  int64_t liveness_probe_ms = 1000;          // between liveness probes of a ready memd, ms
  int64_t memd_liveness_timeout_ms = 10000;  // a ready memd no probe reached this long is hung: SIGKILL; 0 = off
  // A ready worker no liveness probe found alive (answering, its GPU not fenced) this long is hung: SIGKILL, restarted
  // like a crash; 0 = off (issue 22). ms.
  int64_t worker_liveness_timeout_ms = 10000;
  // A child that exits before it was ever ready ends the node at once (see above); false: it is restarted like any
  // crash (dhs-replay's supervised node, whose faults kill children on purpose).
  bool fail_fast = true;
};

enum class ChildState {
  kDown,      // no process: not started yet, or stopped for good
  kStarting,  // process live, readiness probes not answered yet
  kReady,     // process live and ready
  kBackoff,   // exited; started again at restart_at (a worker: and memd ready)
  kStopping,  // process live, SIGTERM sent (SIGKILL after its deadline)
};
const char* ChildStateName(ChildState s);

// The only moves of a child's state (Supervisor changes it through one validating function; a move not listed is a
// bug of the core and aborts). Staying in a state is not a move.
inline constexpr std::pair<ChildState, ChildState> kChildTransitions[] = {
    {ChildState::kDown, ChildState::kStarting},      // started (first start, or a respawn after the node's memd came)
    {ChildState::kBackoff, ChildState::kStarting},   // its restart time came (a worker: memd ready)
    {ChildState::kStarting, ChildState::kReady},     // a readiness probe answered
    {ChildState::kStarting, ChildState::kBackoff},   // exited before ready (a crash; restarted later)
    {ChildState::kReady, ChildState::kBackoff},      // exited while ready (a crash, a liveness SIGKILL)
    {ChildState::kStopping, ChildState::kBackoff},   // stopped because memd went away: respawned without backoff
    {ChildState::kStarting, ChildState::kStopping},  // SIGTERM (the node stops, or memd went away)
    {ChildState::kReady, ChildState::kStopping},     // SIGTERM
    {ChildState::kStarting, ChildState::kDown},      // exited while the node stops, or it failed fast / gave up
    {ChildState::kReady, ChildState::kDown},         // exited while the node stops (a SIGKILL'd child), or gave up
    {ChildState::kStopping, ChildState::kDown},      // exited after its SIGTERM
    {ChildState::kBackoff, ChildState::kDown},       // the node stops: its restart is cancelled
};
// OK when `from` -> `to` is in kChildTransitions or from == to; FAILED_PRECONDITION naming both otherwise.
absl::Status CheckChildTransition(ChildState from, ChildState to);

struct SupervisorOrder {
  enum class Kind {
    kStart,   // spawn child `child` (answered by Exited if the spawn fails, with an exit status 127)
    kSignal,  // send `signal` to child `child`'s live process
    kProbe,   // check whether child `child` is ready; answer with ProbeResult
    kReady,   // every child is ready: log `message`; the first one also notifies systemd (READY=1)
    kExit,    // every child exited: log `message`, exit with `exit_code`
    kLog,     // something to log (`message`, warning level)
    kLogTail, // log `message` (error level), then the last lines child `child`'s log got since its last start
  };
  Kind kind = Kind::kLog;
  size_t child = 0;
  int signal = 0;
  int exit_code = 0;
  std::string message;
};

class Supervisor {
 public:
  static constexpr size_t kMemd = 0;
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  // `names[i]` names child i in messages ("memd", "worker gpu 0"); names.size() = 1 + workers >= 2.
  Supervisor(SupervisorPolicy policy, std::vector<std::string> names);

  // ---- events (times: ms of one monotonic clock, never decreasing; a bad child index or an event that does not fit
  // the child's state, e.g. an exit of a child with no process, is ignored and counted in ignored_events()) ----
  void Begin(int64_t now_ms);  // starts memd; once
  // Child `child`'s process ended with waitpid status `wait_status` (or its spawn failed: exit status 127).
  void Exited(size_t child, int wait_status, int64_t now_ms);
  void ProbeResult(size_t child, bool ready, int64_t now_ms);
  void Timer(int64_t now_ms);
  void Terminate(int64_t now_ms);

  std::vector<SupervisorOrder> DrainOrders();
  // The earliest time at which Timer has something to do; kNever when nothing is pending.
  int64_t NextWakeupMs() const;

  // ---- queries ----
  size_t children() const { return children_.size(); }
  ChildState state(size_t child) const { return children_.at(child).state; }
  bool live(size_t child) const { return children_.at(child).live; }
  uint32_t streak(size_t child) const { return children_.at(child).streak; }
  int64_t restart_at_ms(size_t child) const { return children_.at(child).restart_at; }
  uint64_t starts(size_t child) const { return children_.at(child).starts; }
  // Whether child `child` was ready at least once since Begin (a child never ready fails fast).
  bool ever_ready(size_t child) const { return children_.at(child).ever_ready; }
  bool stopping() const { return phase_ == Phase::kStopping || phase_ == Phase::kDone; }
  bool done() const { return phase_ == Phase::kDone; }
  uint64_t ignored_events() const { return ignored_; }
  // The restart delay of the k-th crash of a streak (k >= 1), ms.
  int64_t BackoffMs(uint32_t k) const;

  // OK or INTERNAL naming the first broken invariant: live <=> a process state; no backoff while stopping; at most
  // max_restarts + 1 crash times kept per child; a worker starting or ready only while memd is live (or stopping);
  // every delay within [initial, max].
  absl::Status CheckInvariants() const;

 private:
  enum class Phase { kIdle, kStarting, kRunning, kStopping, kDone };
  struct Child {
    std::string name;
    ChildState state = ChildState::kDown;
    bool live = false;
    int64_t started_at = 0, ready_at = 0, next_probe = 0;
    int64_t answered_at = 0;   // the last probe that found it ready or alive (liveness), ms
    int64_t kill_at = kNever;  // SIGKILL time of a live child signalled with SIGTERM (or a start timeout)
    bool kill_sent = false;
    bool respawn_after_stop = false;  // stopped because memd went away: start again, no backoff, not a crash
    int64_t restart_at = kNever;
    uint32_t streak = 0;
    std::deque<int64_t> crashes;  // crash times within the window
    uint64_t starts = 0;
    bool ever_ready = false;          // ready at least once since Begin
    uint64_t memd_starts_at_start = 0;  // a worker: memd's `starts` when it was last started
  };

  bool IsWorker(size_t c) const { return c != kMemd; }
  bool Valid(size_t c) const { return c < children_.size(); }
  void Order(SupervisorOrder::Kind kind, size_t child, std::string message = "", int signal = 0, int code = 0);
  void Start(size_t c, int64_t now);
  void SendTerm(size_t c, int64_t now);
  void OnCrash(size_t c, int wait_status, int64_t now);
  void OnMemdGone(int64_t now);
  void SetState(size_t c, ChildState to);  // through CheckChildTransition
  void OnLiveness(size_t c, bool answered, int64_t now);
  int64_t LivenessTimeoutMs(size_t c) const;
  bool Watches(size_t c) const;  // a liveness watch runs on child c (ready, not killed, the node not stopping)
  bool FailsFast(size_t c) const;  // child c's exit now ends the node (never ready, see the header)
  void StartDueChildren(int64_t now);
  void MaybeAnnounceReady();
  void BeginStop(int64_t now, int code, std::string message, bool log = true);  // log: a kLog of `message` now
  void AdvanceStop(int64_t now);

  SupervisorPolicy policy_;
  std::vector<Child> children_;
  Phase phase_ = Phase::kIdle;
  bool announced_ = false;
  int exit_code_ = 0;
  std::string exit_message_;
  uint64_t ignored_ = 0;
  std::vector<SupervisorOrder> orders_;
};

// How a child ended, from a waitpid status: "exit code N", "signal SIGNAME (N)" or "status N".
std::string DescribeExit(int wait_status);

}  // namespace dhs::node
