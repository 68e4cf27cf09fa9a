// dhs-node's decision core (tools/node/supervisor.h): start order, backoff that grows and caps, giving up after the
// window limit, stop order with SIGKILL after the grace; and a randomized test that drives it with random event
// sequences against a model of the processes, checking after every event: never two live processes for one child,
// workers started only while memd is ready, restart times equal to an independently computed backoff, give-up
// exactly when the model's crash count passes the limit, memd signalled only after every worker exited, one exit.
#include "tools/node/supervisor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <deque>
#include <random>

namespace dhs::node {
namespace {

using Kind = SupervisorOrder::Kind;
using ::testing::HasSubstr;

constexpr int kCrash = 1 << 8;  // wait status of exit code 1

SupervisorPolicy TestPolicy() {
  SupervisorPolicy p;
  p.backoff_initial_ms = 100;
  p.backoff_max_ms = 1000;
  p.backoff_reset_ms = 5000;
  p.max_restarts = 3;
  p.restart_window_ms = 10000;
  p.stop_grace_ms = 2000;
  p.start_timeout_ms = 4000;
  p.probe_interval_ms = 50;
  p.memd_liveness_timeout_ms = 0;    // off: the liveness watch has its own test
  p.worker_liveness_timeout_ms = 0;  // off: the liveness watch has its own test
  return p;
}

std::vector<std::string> Names(size_t workers) {
  std::vector<std::string> n = {"memd"};
  for (size_t i = 0; i < workers; ++i) n.push_back("worker gpu " + std::to_string(i));
  return n;
}

std::vector<std::pair<Kind, size_t>> KindsOf(const std::vector<SupervisorOrder>& orders) {
  std::vector<std::pair<Kind, size_t>> out;
  for (const SupervisorOrder& o : orders) {
    if (o.kind != Kind::kLog && o.kind != Kind::kLogTail) out.emplace_back(o.kind, o.child);
  }
  return out;
}

// Brings a node with `workers` workers to "node ready" at t = 0..; returns the time.
int64_t StartAll(Supervisor& s, size_t workers) {
  s.Begin(0);
  EXPECT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kStart, 0}}));
  s.Timer(50);
  EXPECT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kProbe, 0}}));
  s.ProbeResult(0, true, 50);
  std::vector<std::pair<Kind, size_t>> want;
  for (size_t c = 1; c <= workers; ++c) want.emplace_back(Kind::kStart, c);
  EXPECT_EQ(KindsOf(s.DrainOrders()), want);
  s.Timer(100);
  want.clear();
  for (size_t c = 1; c <= workers; ++c) want.emplace_back(Kind::kProbe, c);
  EXPECT_EQ(KindsOf(s.DrainOrders()), want);
  for (size_t c = 1; c <= workers; ++c) s.ProbeResult(c, true, 100);
  std::vector<SupervisorOrder> ready = s.DrainOrders();
  EXPECT_EQ(ready.size(), 1u);
  if (!ready.empty()) {
    EXPECT_EQ(ready[0].kind, Kind::kReady);
    EXPECT_THAT(ready[0].message, HasSubstr("node ready"));
  }
  return 100;
}

TEST(Supervisor, StartsMemdThenWorkersThenAnnouncesReady) {
  Supervisor s(TestPolicy(), Names(2));
  // A worker is not started while memd does not answer.
  s.Begin(0);
  s.DrainOrders();
  s.Timer(50);
  s.DrainOrders();
  s.ProbeResult(0, false, 50);
  EXPECT_TRUE(s.DrainOrders().empty());
  EXPECT_EQ(s.state(1), ChildState::kDown);
  Supervisor fresh(TestPolicy(), Names(2));
  StartAll(fresh, 2);
  for (size_t c = 0; c < 3; ++c) EXPECT_EQ(fresh.state(c), ChildState::kReady);
}

TEST(Supervisor, BackoffGrowsAndCaps) {
  SupervisorPolicy p = TestPolicy();
  p.max_restarts = 100;
  p.restart_window_ms = 1000000;
  Supervisor s(p, Names(1));
  int64_t now = StartAll(s, 1);
  const std::vector<int64_t> want = {100, 200, 400, 800, 1000, 1000, 1000};
  for (int64_t delay : want) {
    now += 10;
    s.Exited(1, kCrash, now);
    EXPECT_EQ(s.restart_at_ms(1), now + delay);
    s.DrainOrders();
    s.Timer(now + delay - 1);  // not yet
    for (const SupervisorOrder& o : s.DrainOrders()) EXPECT_NE(o.kind, Kind::kStart);
    now += delay;
    s.Timer(now);
    EXPECT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kStart, 1}}));
    s.ProbeResult(1, true, now);  // ready for less than backoff_reset_ms: the streak goes on
    s.DrainOrders();
  }
  // Ready for backoff_reset_ms: the next crash starts a new streak.
  now += p.backoff_reset_ms;
  s.Exited(1, kCrash, now);
  EXPECT_EQ(s.restart_at_ms(1), now + 100);
  EXPECT_EQ(s.streak(1), 1u);
}

TEST(Supervisor, GivesUpAfterTheWindowLimitAndStopsEverything) {
  Supervisor s(TestPolicy(), Names(2));  // max_restarts 3 within 10 s
  int64_t now = StartAll(s, 2);
  // Three crashes of worker 1 (gpu 0) within the window are restarted.
  for (int i = 0; i < 3; ++i) {
    s.Exited(1, kCrash, now);
    s.DrainOrders();
    now = s.restart_at_ms(1);
    s.Timer(now);
    ASSERT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kStart, 1}}));
  }
  // The fourth gives up: worker 2 gets SIGTERM, memd nothing yet.
  s.Exited(1, SIGKILL, now + 1);
  std::vector<SupervisorOrder> orders = s.DrainOrders();
  ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 2}}));
  EXPECT_EQ(orders.back().signal, SIGTERM);
  EXPECT_THAT(orders.front().message, HasSubstr("giving up: worker gpu 0 exited 4 times within 10 s"));
  EXPECT_THAT(orders.front().message, HasSubstr("signal SIGKILL"));
  EXPECT_TRUE(s.stopping());
  s.Exited(2, 0, now + 2);
  orders = s.DrainOrders();
  ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 0}}));
  s.Exited(0, 0, now + 3);
  orders = s.DrainOrders();
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].kind, Kind::kExit);
  EXPECT_EQ(orders[0].exit_code, 1);
}

TEST(Supervisor, CrashesSpreadBeyondTheWindowAreAllRestarted) {
  Supervisor s(TestPolicy(), Names(1));
  int64_t now = StartAll(s, 1);
  for (int i = 0; i < 10; ++i) {
    now += 4000;  // 3 crashes per 10 s window at most
    s.Exited(1, kCrash, now);
    s.DrainOrders();
    EXPECT_FALSE(s.stopping()) << i;
    now = s.restart_at_ms(1);
    s.Timer(now);
    s.ProbeResult(1, true, now);
    s.DrainOrders();
  }
}

TEST(Supervisor, StopsWorkersFirstThenMemdWithSigkillAfterTheGrace) {
  Supervisor s(TestPolicy(), Names(2));
  int64_t now = StartAll(s, 2);
  s.Terminate(now);
  std::vector<SupervisorOrder> orders = s.DrainOrders();
  ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 1}, {Kind::kSignal, 2}}));
  EXPECT_EQ(orders[0].signal, SIGTERM);
  s.Terminate(now + 1);  // a second SIGTERM changes nothing
  EXPECT_TRUE(s.DrainOrders().empty());
  s.Exited(1, 0, now + 10);
  EXPECT_TRUE(KindsOf(s.DrainOrders()).empty());  // worker 2 still live: memd untouched
  EXPECT_EQ(s.NextWakeupMs(), now + 2000);
  s.Timer(now + 2000);  // worker 2 ignored SIGTERM: SIGKILL
  orders = s.DrainOrders();
  ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 2}}));
  EXPECT_EQ(orders[0].signal, SIGKILL);
  s.Exited(2, SIGKILL, now + 2001);
  orders = s.DrainOrders();
  ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 0}}));
  EXPECT_EQ(orders[0].signal, SIGTERM);
  s.Exited(0, 0, now + 2100);
  orders = s.DrainOrders();
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].kind, Kind::kExit);
  EXPECT_EQ(orders[0].exit_code, 0);
  EXPECT_TRUE(s.done());
}

// By default a memd crash leaves the workers alone: each ends its own epoch (exit 75) when it notices, so its
// requests stay with memd's adopted pool for its successor; only memd is restarted here.
TEST(Supervisor, MemdCrashLeavesTheWorkersAloneByDefault) {
  ASSERT_FALSE(SupervisorPolicy{}.restart_workers_with_memd);
  Supervisor s(TestPolicy(), Names(1));
  int64_t now = StartAll(s, 1);
  s.Exited(0, SIGKILL, now);
  EXPECT_TRUE(KindsOf(s.DrainOrders()).empty());  // no signal to the worker
  s.Timer(now + 100);
  EXPECT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kStart, 0}}));
}

TEST(Supervisor, MemdCrashRestartsTheWorkersOnceTheNewMemdIsReady) {
  SupervisorPolicy policy = TestPolicy();
  policy.restart_workers_with_memd = true;
  Supervisor s(policy, Names(1));
  int64_t now = StartAll(s, 1);
  s.Exited(0, SIGKILL, now);
  std::vector<SupervisorOrder> orders = s.DrainOrders();
  ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 1}}));
  s.Exited(1, 0, now + 5);
  EXPECT_TRUE(KindsOf(s.DrainOrders()).empty());  // memd is not ready: the worker waits
  s.Timer(now + 100);
  EXPECT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kStart, 0}}));
  s.Timer(now + 150);
  s.DrainOrders();
  s.ProbeResult(0, true, now + 150);
  EXPECT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kStart, 1}}));
  EXPECT_EQ(s.streak(1), 0u);  // not a crash of the worker
  s.Timer(now + 200);
  s.DrainOrders();
  s.ProbeResult(1, true, now + 200);
  orders = s.DrainOrders();
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_THAT(orders[0].message, HasSubstr("node ready again"));
}

// A ready memd is probed every liveness_probe_ms; an answer resets the clock; none for memd_liveness_timeout_ms: SIGKILL
// (once), and its exit is an ordinary memd exit (restarted after the backoff, the workers left alone).
TEST(Supervisor, HungMemdIsKilledAfterTheLivenessTimeoutAndRestarted) {
  SupervisorPolicy policy = TestPolicy();
  policy.liveness_probe_ms = 100;
  policy.memd_liveness_timeout_ms = 1000;
  Supervisor s(policy, Names(1));
  StartAll(s, 1);  // memd ready (and answered) at 50: probes at 150, 250, ...
  int64_t killed_at = -1;
  for (int64_t t = 150; t <= 3000 && killed_at < 0; t += 100) {
    s.Timer(t);
    ASSERT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kProbe, 0}})) << t;
    s.ProbeResult(0, /*ready=*/t <= 650, t);  // answers until 650, then hangs
    std::vector<SupervisorOrder> orders = s.DrainOrders();
    if (!orders.empty()) {
      ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 0}})) << t;
      EXPECT_EQ(orders[0].signal, SIGKILL);
      EXPECT_THAT(orders[1].message, HasSubstr("answered no probe for 1000 ms (hung)"));
      killed_at = t;
    }
  }
  EXPECT_EQ(killed_at, 650 + 1000);  // the last answer + the timeout, on the probe grid
  s.Timer(killed_at + 500);
  EXPECT_TRUE(KindsOf(s.DrainOrders()).empty());  // killed once, no probe of a killed memd
  s.Exited(0, SIGKILL, killed_at + 510);
  EXPECT_TRUE(KindsOf(s.DrainOrders()).empty());  // the worker is left alone
  s.Timer(killed_at + 510 + s.BackoffMs(1));
  EXPECT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kStart, 0}}));
  EXPECT_EQ(s.streak(0), 1u);
}

// A restarted child (it was ready before) not ready within start_timeout_ms: SIGKILL, counted as a crash.
TEST(Supervisor, StartTimeoutKillsAndCountsAsACrash) {
  Supervisor s(TestPolicy(), Names(1));
  int64_t now = StartAll(s, 1);
  s.Exited(1, kCrash, now);
  s.DrainOrders();
  now = s.restart_at_ms(1);
  s.Timer(now);
  ASSERT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kStart, 1}}));
  s.Timer(now + 4000);
  std::vector<SupervisorOrder> orders = s.DrainOrders();
  ASSERT_FALSE(orders.empty());
  EXPECT_EQ(orders[0].kind, Kind::kSignal);
  EXPECT_EQ(orders[0].signal, SIGKILL);
  s.Exited(1, SIGKILL, now + 4001);
  EXPECT_FALSE(s.stopping());
  EXPECT_EQ(s.streak(1), 2u);
  EXPECT_EQ(s.restart_at_ms(1), now + 4001 + 200);
}

// Fail fast (issue 22): memd that exits before it was ever ready (a bad flag, exit code 2) ends the node at once:
// no restart, its log tail shown, exit code 1. Its start timeout on the first start does the same.
TEST(Supervisor, MemdNeverReadyEndsTheNodeAtOnce) {
  for (bool timeout : {false, true}) {
    SCOPED_TRACE(timeout ? "start timeout" : "exit code 2");
    Supervisor s(TestPolicy(), Names(2));
    s.Begin(0);
    s.DrainOrders();
    s.Timer(50);
    s.DrainOrders();
    s.ProbeResult(0, false, 50);
    int64_t now = 60;
    if (timeout) {
      now = 4000;
      s.Timer(now);
      std::vector<SupervisorOrder> orders = s.DrainOrders();
      ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 0}}));
      EXPECT_EQ(orders[0].signal, SIGKILL);
    }
    s.Exited(0, timeout ? SIGKILL : 2 << 8, now);
    std::vector<SupervisorOrder> orders = s.DrainOrders();
    ASSERT_EQ(orders.size(), 2u);
    EXPECT_EQ(orders[0].kind, Kind::kLogTail);
    EXPECT_EQ(orders[0].child, 0u);
    EXPECT_THAT(orders[0].message,
                HasSubstr(timeout ? "memd exited (signal SIGKILL (9)) before it was ever ready"
                                  : "memd exited (exit code 2) before it was ever ready"));
    EXPECT_EQ(orders[1].kind, Kind::kExit);
    EXPECT_EQ(orders[1].exit_code, 1);
    EXPECT_EQ(orders[1].message, orders[0].message);
    EXPECT_TRUE(s.done());
    EXPECT_EQ(s.starts(0), 1u);
    EXPECT_EQ(s.starts(1), 0u);
  }
}

// A worker that exits before it was ever ready, while the memd it started against is ready: the other workers get
// SIGTERM, then memd, then exit 1; the failed worker's log tail is shown first.
TEST(Supervisor, WorkerNeverReadyEndsTheNodeAtOnce) {
  Supervisor s(TestPolicy(), Names(2));
  s.Begin(0);
  s.DrainOrders();
  s.Timer(50);
  s.DrainOrders();
  s.ProbeResult(0, true, 50);  // memd ready: both workers start
  s.DrainOrders();
  s.Timer(100);
  s.DrainOrders();
  s.ProbeResult(2, true, 100);  // worker gpu 1 ready
  s.Exited(1, 2 << 8, 120);     // worker gpu 0: a bad flag
  std::vector<SupervisorOrder> orders = s.DrainOrders();
  ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 2}}));
  ASSERT_EQ(orders[0].kind, Kind::kLogTail);
  EXPECT_EQ(orders[0].child, 1u);
  EXPECT_THAT(orders[0].message, HasSubstr("worker gpu 0 exited (exit code 2) before it was ever ready"));
  EXPECT_EQ(s.restart_at_ms(1), Supervisor::kNever);
  s.Exited(2, 0, 130);
  ASSERT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 0}}));
  s.Exited(0, 0, 140);
  orders = s.DrainOrders();
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].exit_code, 1);
  EXPECT_EQ(s.starts(1), 1u);  // never restarted
}

// A worker that fails before it was ever ready while its memd was replaced is an ordinary crash (its failure may be
// the memd that went away), and so is any child's exit after it was ready once.
TEST(Supervisor, NeverReadyWorkerIsACrashWhenItsMemdWentAway) {
  Supervisor s(TestPolicy(), Names(1));
  s.Begin(0);
  s.DrainOrders();
  s.Timer(50);
  s.DrainOrders();
  s.ProbeResult(0, true, 50);  // memd ready: the worker starts
  s.DrainOrders();
  EXPECT_TRUE(s.ever_ready(0));
  s.Exited(0, SIGKILL, 60);  // memd dies (it had been ready: a crash)
  EXPECT_FALSE(s.stopping());
  s.Exited(1, 1 << 8, 70);  // the worker fails before ready, its memd gone
  EXPECT_FALSE(s.stopping());
  EXPECT_EQ(s.state(1), ChildState::kBackoff);
  EXPECT_EQ(s.streak(1), 1u);
  EXPECT_FALSE(s.ever_ready(1));
}

// Worker liveness (issue 22): a ready worker is probed every liveness_probe_ms; an answer resets the clock; none for
// worker_liveness_timeout_ms: SIGKILL (once), and its exit is an ordinary crash (restarted after the backoff, memd and
// the other workers left alone). memd's own watch is separate (off here).
TEST(Supervisor, HungWorkerIsKilledAfterTheLivenessTimeoutAndRestarted) {
  SupervisorPolicy policy = TestPolicy();
  policy.liveness_probe_ms = 100;
  policy.worker_liveness_timeout_ms = 1000;
  Supervisor s(policy, Names(2));
  StartAll(s, 2);  // workers ready (and answered) at 100: probes at 200, 300, ...
  int64_t killed_at = -1;
  for (int64_t t = 200; t <= 3000 && killed_at < 0; t += 100) {
    s.Timer(t);
    ASSERT_EQ(KindsOf(s.DrainOrders()), (std::vector<std::pair<Kind, size_t>>{{Kind::kProbe, 1}, {Kind::kProbe, 2}}))
        << t;
    s.ProbeResult(1, true, t);
    s.ProbeResult(2, /*ready=*/t <= 700, t);  // worker gpu 1 answers until 700, then hangs (or is fenced)
    std::vector<SupervisorOrder> orders = s.DrainOrders();
    if (!orders.empty()) {
      ASSERT_EQ(KindsOf(orders), (std::vector<std::pair<Kind, size_t>>{{Kind::kSignal, 2}})) << t;
      EXPECT_EQ(orders[0].signal, SIGKILL);
      EXPECT_THAT(orders[1].message, HasSubstr("worker gpu 1 answered no probe (or memd held its GPU fenced) for "
                                               "1000 ms (hung)"));
      killed_at = t;
    }
  }
  EXPECT_EQ(killed_at, 700 + 1000);  // the last answer + the timeout, on the probe grid
  s.Timer(killed_at + 50);
  EXPECT_TRUE(KindsOf(s.DrainOrders()).empty());  // killed once; worker gpu 0's next probe is at killed_at + 100
  s.Exited(2, SIGKILL, killed_at + 60);
  EXPECT_FALSE(s.stopping());
  EXPECT_EQ(s.state(2), ChildState::kBackoff);
  s.Timer(killed_at + 60 + s.BackoffMs(1));
  std::vector<std::pair<Kind, size_t>> kinds = KindsOf(s.DrainOrders());
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), std::pair<Kind, size_t>{Kind::kStart, 2}), kinds.end());
  EXPECT_EQ(s.starts(0), 1u);  // memd untouched
  EXPECT_EQ(s.starts(1), 1u);  // worker gpu 0 untouched
}

// Liveness off (0): a ready worker is never probed.
TEST(Supervisor, WorkerLivenessOffProbesNothing) {
  Supervisor s(TestPolicy(), Names(1));
  StartAll(s, 1);
  for (int64_t t = 200; t <= 5000; t += 100) {
    s.Timer(t);
    EXPECT_TRUE(KindsOf(s.DrainOrders()).empty()) << t;
  }
  EXPECT_EQ(s.NextWakeupMs(), Supervisor::kNever);
}

TEST(Supervisor, ChildTransitionsAreOnlyThoseOfTheTable) {
  const ChildState all[] = {ChildState::kDown, ChildState::kStarting, ChildState::kReady, ChildState::kBackoff,
                            ChildState::kStopping};
  size_t allowed = 0;
  for (ChildState from : all) {
    for (ChildState to : all) {
      const absl::Status st = CheckChildTransition(from, to);
      if (st.ok()) {
        allowed += from != to;
      } else {
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_THAT(std::string(st.message()), HasSubstr(std::string(ChildStateName(from)) + " -> "));
      }
    }
  }
  EXPECT_EQ(allowed, std::size(kChildTransitions));
  EXPECT_FALSE(CheckChildTransition(ChildState::kDown, ChildState::kReady).ok());      // ready without a start
  EXPECT_FALSE(CheckChildTransition(ChildState::kBackoff, ChildState::kReady).ok());   // ready without a start
  EXPECT_FALSE(CheckChildTransition(ChildState::kStopping, ChildState::kReady).ok());  // a stop is not undone
  EXPECT_FALSE(CheckChildTransition(ChildState::kDown, ChildState::kBackoff).ok());    // no restart of a stopped child
}

// ---- randomized ----

struct Coverage {  // how much the random runs exercised, summed over seeds
  uint64_t starts = 0, readies = 0, memd_restarts = 0, gave_up = 0, clean_stops = 0, sigkills = 0, failed_fast = 0,
           liveness_kills = 0;
};

// One random run: a model of the processes (what the test knows independently of the supervisor) and the checks of
// every order against it. ASSERTs abort the current method; the caller stops on HasFatalFailure().
class RandomRun {
 public:
  RandomRun(uint64_t seed, size_t workers, const SupervisorPolicy& p, Coverage& cov)
      : rng_(seed), p_(p), n_(workers + 1), s_(p, Names(workers)), cov_(cov), live_(n_), termed_(n_), killed_(n_),
        was_ready_(n_), ever_ready_(n_), ready_at_(n_), restart_at_(n_), alive_at_(n_), memd_starts_at_start_(n_),
        streak_(n_), crashes_(n_) {}

  void Run() {
    s_.Begin(now_);
    Apply();
    for (int step = 0; step < 4000 && !exited_ && !::testing::Test::HasFatalFailure(); ++step) {
      now_ += std::uniform_int_distribution<int64_t>(0, step < 3000 ? 700 : 3000)(rng_);
      Step(step);
      Apply();
      ASSERT_TRUE(s_.CheckInvariants().ok()) << s_.CheckInvariants();
      for (size_t c = 0; c < n_; ++c) {  // a starting child is probed within one interval
        if (s_.state(c) == ChildState::kStarting && !killed_[c]) {
          ASSERT_LE(s_.NextWakeupMs(), now_ + p_.probe_interval_ms);
        }
      }
    }
    for (int i = 0; i < 100 && !exited_; ++i) {  // a stopping node ends once its children obey
      now_ += p_.stop_grace_ms;
      s_.Timer(now_);
      Apply();
      for (size_t c = 0; c < n_; ++c) {
        if (live_[c] && killed_[c]) ExitChild(c, SIGKILL);
      }
      Apply();
    }
    ASSERT_TRUE(exited_) << "the node never exited";
    ASSERT_TRUE(s_.done());
  }

 private:
  bool Chance(double q) { return std::uniform_real_distribution<double>(0, 1)(rng_) < q; }
  bool Stopping() const { return terminated_ || gave_up_; }

  void Step(int step) {
    const double r = std::uniform_real_distribution<double>(0, 1)(rng_);
    std::vector<size_t> live;
    for (size_t c = 0; c < n_; ++c) {
      if (live_[c]) live.push_back(c);
    }
    if ((step == 3000 || r < 0.005) && !terminated_) {
      terminated_ = !gave_up_;  // a SIGTERM while giving up changes nothing
      s_.Terminate(now_);
    } else if (r < 0.04 && !live.empty()) {  // a crash (or an exit after a signal)
      const size_t c = live[rng_() % live.size()];
      ExitChild(c, killed_[c] ? SIGKILL : (Chance(0.5) ? kCrash : SIGSEGV));
    } else if (r < 0.25) {  // signalled children obey (SIGKILL always, SIGTERM mostly)
      // Those signalled before this step (an exit here may make the core signal others; those orders are not
      // drained yet, so their children cannot have obeyed them).
      std::vector<std::pair<size_t, int>> obey;
      for (size_t c : live) {
        if (killed_[c] || (termed_[c] && Chance(0.7))) obey.emplace_back(c, killed_[c] ? SIGKILL : 0);
      }
      for (auto [c, status] : obey) {  // one event at a time, its orders checked before the next
        ExitChild(c, status);
        Apply();
        if (::testing::Test::HasFatalFailure()) return;
      }
    } else if (r < 0.27) {  // events that do not fit: ignored
      const uint64_t before = s_.ignored_events();
      for (size_t c = 0; c < n_; ++c) {
        if (!live_[c]) s_.Exited(c, kCrash, now_);
      }
      s_.ProbeResult(n_ + 3, true, now_);
      ASSERT_GT(s_.ignored_events(), before);
    } else {
      s_.Timer(now_);
    }
  }

  // Drains the orders, checks each against the model, answers the probes (and checks what they cause).
  void Apply() {
    std::vector<std::pair<size_t, bool>> probes;
    for (const SupervisorOrder& o : s_.DrainOrders()) {
      ASSERT_FALSE(exited_) << "an order after kExit";
      if (o.kind == Kind::kProbe) probes.emplace_back(o.child, Chance(0.6));
      CheckOrder(o);
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (auto [c, ready] : probes) {
      s_.ProbeResult(c, ready, now_);
      if (ready && s_.state(c) == ChildState::kReady) {
        alive_at_[c] = now_;  // a liveness answer, or the readiness one
        if (!was_ready_[c]) {
          was_ready_[c] = ever_ready_[c] = true;
          ready_at_[c] = now_;
        }
      }
    }
    if (!probes.empty()) Apply();
  }

  void CheckOrder(const SupervisorOrder& o) {
    switch (o.kind) {
      case Kind::kStart:
        ASSERT_FALSE(live_[o.child]) << "two live processes for child " << o.child;
        ASSERT_FALSE(Stopping()) << "a start while stopping";
        ASSERT_GE(now_, restart_at_[o.child]) << "restarted before its backoff";
        if (o.child != 0) {
          ASSERT_EQ(s_.state(0), ChildState::kReady) << "a worker started without a ready memd";
        }
        live_[o.child] = true;
        termed_[o.child] = killed_[o.child] = was_ready_[o.child] = false;
        ++cov_.starts;
        if (o.child == 0) ++memd_starts_;
        memd_starts_at_start_[o.child] = memd_starts_;
        if (o.child == 0 && s_.starts(0) > 1) ++cov_.memd_restarts;
        break;
      case Kind::kSignal:
        ASSERT_TRUE(live_[o.child]) << "a signal to a child with no process: child " << o.child << " signal "
                                    << o.signal << " state " << ChildStateName(s_.state(o.child)) << " at " << now_;
        if (o.child == 0 && Stopping()) {
          for (size_t c = 1; c < n_; ++c) ASSERT_FALSE(live_[c]) << "memd signalled while worker " << c << " lives";
        }
        if (o.signal == SIGKILL && !Stopping() && !termed_[o.child] && was_ready_[o.child]) {
          // Only the liveness watch kills a ready child outside a stop: after its timeout without an answer.
          const int64_t timeout = o.child == 0 ? p_.memd_liveness_timeout_ms : p_.worker_liveness_timeout_ms;
          ASSERT_GT(timeout, 0) << "a ready child killed with its liveness watch off";
          ASSERT_GE(now_ - alive_at_[o.child], timeout) << "a liveness SIGKILL before the timeout";
          ++cov_.liveness_kills;
        }
        (o.signal == SIGKILL ? killed_ : termed_)[o.child] = true;
        cov_.sigkills += o.signal == SIGKILL;
        break;
      case Kind::kExit:
        for (size_t c = 0; c < n_; ++c) ASSERT_FALSE(live_[c]);
        ASSERT_EQ(o.exit_code, gave_up_ ? 1 : 0);
        exited_ = true;
        ++(gave_up_ ? cov_.gave_up : cov_.clean_stops);
        break;
      case Kind::kReady:
        for (size_t c = 0; c < n_; ++c) ASSERT_EQ(s_.state(c), ChildState::kReady);
        ++cov_.readies;
        break;
      case Kind::kProbe:
      case Kind::kLog: break;
    }
  }

  // Child `c` exits with `status`: the model decides whether it is a crash, its backoff and whether the node gives
  // up, then the supervisor is told and must agree.
  void ExitChild(size_t c, int status) {
    const bool crash = !Stopping() && !termed_[c];
    live_[c] = false;
    if (crash) ModelCrash(c);
    if (c == 0 && crash && p_.restart_workers_with_memd) {
      for (size_t w = 1; w < n_; ++w) termed_[w] = termed_[w] || live_[w];  // the core sends them SIGTERM now
    }
    s_.Exited(c, status, now_);
    if (crash && !gave_up_) {
      ASSERT_EQ(s_.restart_at_ms(c), restart_at_[c]);
      ASSERT_EQ(s_.streak(c), streak_[c]);
    }
    ASSERT_EQ(s_.stopping(), Stopping());
  }

  void ModelCrash(size_t c) {
    // Fail fast: never ready since the node began, and (a worker) its memd is the ready one it started against.
    const bool memd_ready = live_[0] && was_ready_[0];
    if (p_.fail_fast && !ever_ready_[c] &&
        (c == 0 || (memd_ready && memd_starts_at_start_[c] == memd_starts_))) {
      gave_up_ = true;
      ++cov_.failed_fast;
      return;
    }
    crashes_[c].push_back(now_);
    while (crashes_[c].front() <= now_ - p_.restart_window_ms) crashes_[c].pop_front();
    if (crashes_[c].size() > p_.max_restarts) {
      gave_up_ = true;
      return;
    }
    if (was_ready_[c] && now_ - ready_at_[c] >= p_.backoff_reset_ms) streak_[c] = 0;
    ++streak_[c];
    int64_t delay = p_.backoff_initial_ms;
    for (uint32_t i = 1; i < streak_[c]; ++i) delay = std::min(delay * 2, p_.backoff_max_ms);
    restart_at_[c] = now_ + std::min(delay, p_.backoff_max_ms);
  }

  std::mt19937_64 rng_;
  SupervisorPolicy p_;
  size_t n_;
  Supervisor s_;
  Coverage& cov_;
  int64_t now_ = 0;
  std::vector<bool> live_, termed_, killed_, was_ready_, ever_ready_;
  std::vector<int64_t> ready_at_, restart_at_, alive_at_;
  std::vector<uint64_t> memd_starts_at_start_;
  uint64_t memd_starts_ = 0;
  std::vector<uint32_t> streak_;
  std::vector<std::deque<int64_t>> crashes_;
  bool terminated_ = false, gave_up_ = false, exited_ = false;
};

TEST(SupervisorRandom, InvariantsHoldForRandomEventSequences) {
  SupervisorPolicy p = TestPolicy();
  Coverage cov;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    p.restart_workers_with_memd = seed % 3 != 0;
    p.max_restarts = static_cast<uint32_t>(seed % 6);
    p.fail_fast = seed % 5 != 0;
    p.liveness_probe_ms = 100;
    p.memd_liveness_timeout_ms = seed % 4 == 0 ? 300 : 0;
    p.worker_liveness_timeout_ms = seed % 2 == 0 ? 300 : 0;
    SCOPED_TRACE("seed " + std::to_string(seed));
    RandomRun(seed, 1 + seed % 4, p, cov).Run();
    if (HasFatalFailure()) return;
  }
  std::printf("random runs: %llu starts, %llu node-ready, %llu memd restarts, %llu SIGKILLs (%llu by liveness), %llu "
              "gave up (%llu failed fast), %llu clean stops\n", (unsigned long long)cov.starts,
              (unsigned long long)cov.readies, (unsigned long long)cov.memd_restarts,
              (unsigned long long)cov.sigkills, (unsigned long long)cov.liveness_kills,
              (unsigned long long)cov.gave_up, (unsigned long long)cov.failed_fast,
              (unsigned long long)cov.clean_stops);
  // Every outcome was reached: the checks above ran on each kind of path.
  EXPECT_GT(cov.readies, 0u);
  EXPECT_GT(cov.memd_restarts, 0u);
  EXPECT_GT(cov.sigkills, 0u);
  EXPECT_GT(cov.gave_up, 0u);
  EXPECT_GT(cov.failed_fast, 0u);
  EXPECT_GT(cov.liveness_kills, 0u);
  EXPECT_GT(cov.clean_stops, 0u);
  EXPECT_EQ(cov.gave_up + cov.clean_stops, 300u);
}

}  // namespace
}  // namespace dhs::node
