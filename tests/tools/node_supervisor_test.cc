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
    if (o.kind != Kind::kLog) out.emplace_back(o.kind, o.child);
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

TEST(Supervisor, MemdCrashRestartsTheWorkersOnceTheNewMemdIsReady) {
  Supervisor s(TestPolicy(), Names(1));
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

TEST(Supervisor, StartTimeoutKillsAndCountsAsACrash) {
  Supervisor s(TestPolicy(), Names(1));
  s.Begin(0);
  s.DrainOrders();
  s.Timer(4000);
  std::vector<SupervisorOrder> orders = s.DrainOrders();
  ASSERT_FALSE(orders.empty());
  EXPECT_EQ(orders[0].kind, Kind::kSignal);
  EXPECT_EQ(orders[0].signal, SIGKILL);
  s.Exited(0, SIGKILL, 4001);
  EXPECT_EQ(s.streak(0), 1u);
  EXPECT_EQ(s.restart_at_ms(0), 4101);
}

// ---- randomized ----

struct Model {  // what the test knows independently of the supervisor
  std::vector<bool> live, termed, killed;
  std::vector<int64_t> ready_at, restart_at;
  std::vector<bool> was_ready;
  std::vector<uint32_t> streak;
  std::vector<std::deque<int64_t>> crashes;
  bool terminated = false, gave_up = false, exited = false;
};

struct Coverage {  // how much the random runs exercised, summed over seeds
  uint64_t starts = 0, readies = 0, memd_restarts = 0, gave_up = 0, clean_stops = 0, sigkills = 0;
};

void RunRandom(uint64_t seed, size_t workers, const SupervisorPolicy& p, Coverage& cov) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ", workers " + std::to_string(workers));
  std::mt19937_64 rng(seed);
  auto chance = [&](double q) { return std::uniform_real_distribution<double>(0, 1)(rng) < q; };
  const size_t n = workers + 1;
  Supervisor s(p, Names(workers));
  Model m{std::vector<bool>(n), std::vector<bool>(n), std::vector<bool>(n), std::vector<int64_t>(n),
          std::vector<int64_t>(n, 0), std::vector<bool>(n), std::vector<uint32_t>(n),
          std::vector<std::deque<int64_t>>(n)};
  int64_t now = 0;
  std::function<void()> apply = [&] {
    std::vector<SupervisorOrder> orders = s.DrainOrders();
    std::vector<std::pair<size_t, bool>> probes;
    for (const SupervisorOrder& o : orders) {
      ASSERT_FALSE(m.exited) << "an order after kExit";
      switch (o.kind) {
        case Kind::kStart:
          ASSERT_FALSE(m.live[o.child]) << "two live processes for child " << o.child;
          ASSERT_FALSE(m.terminated || m.gave_up) << "a start while stopping";
          ASSERT_GE(now, m.restart_at[o.child]) << "restarted before its backoff";
          if (o.child != 0) {
            ASSERT_EQ(s.state(0), ChildState::kReady) << "a worker started without a ready memd";
          }
          m.live[o.child] = true;
          ++cov.starts;
          if (o.child == 0 && s.starts(0) > 1) ++cov.memd_restarts;
          m.termed[o.child] = m.killed[o.child] = m.was_ready[o.child] = false;
          break;
        case Kind::kSignal:
          ASSERT_TRUE(m.live[o.child]) << "a signal to a child with no process";
          if (o.child == 0 && (m.terminated || m.gave_up)) {
            for (size_t c = 1; c < n; ++c) ASSERT_FALSE(m.live[c]) << "memd signalled while worker " << c << " lives";
          }
          (o.signal == SIGKILL ? m.killed : m.termed)[o.child] = true;
          cov.sigkills += o.signal == SIGKILL;
          break;
        case Kind::kProbe: probes.emplace_back(o.child, chance(0.6)); break;
        case Kind::kExit:
          for (size_t c = 0; c < n; ++c) ASSERT_FALSE(m.live[c]);
          ASSERT_EQ(o.exit_code, m.gave_up ? 1 : 0);
          m.exited = true;
          ++(m.gave_up ? cov.gave_up : cov.clean_stops);
          break;
        case Kind::kReady:
          for (size_t c = 0; c < n; ++c) ASSERT_EQ(s.state(c), ChildState::kReady);
          ++cov.readies;
          break;
        case Kind::kLog: break;
      }
    }
    for (auto [c, ready] : probes) {
      s.ProbeResult(c, ready, now);
      if (ready && s.state(c) == ChildState::kReady && !m.was_ready[c]) {
        m.was_ready[c] = true;
        m.ready_at[c] = now;
      }
    }
    if (!probes.empty()) apply();
  };
  auto exit_child = [&](size_t c, int status) {
    const bool stopping = m.terminated || m.gave_up;
    const bool crash = !stopping && !m.termed[c];
    m.live[c] = false;
    if (crash) {
      m.crashes[c].push_back(now);
      while (m.crashes[c].front() <= now - p.restart_window_ms) m.crashes[c].pop_front();
      if (m.crashes[c].size() > p.max_restarts) {
        m.gave_up = true;
      } else {
        if (m.was_ready[c] && now - m.ready_at[c] >= p.backoff_reset_ms) m.streak[c] = 0;
        ++m.streak[c];
        int64_t delay = p.backoff_initial_ms;
        for (uint32_t i = 1; i < m.streak[c]; ++i) delay = std::min(delay * 2, p.backoff_max_ms);
        m.restart_at[c] = now + std::min(delay, p.backoff_max_ms);
      }
    }
    if (c == 0 && crash && p.restart_workers_with_memd) {
      for (size_t w = 1; w < n; ++w) m.termed[w] = m.termed[w] || m.live[w];  // the core sends them SIGTERM now
    }
    s.Exited(c, status, now);
    if (crash && !m.gave_up) {
      ASSERT_EQ(s.restart_at_ms(c), m.restart_at[c]);
      ASSERT_EQ(s.streak(c), m.streak[c]);
    }
    ASSERT_EQ(s.stopping(), m.terminated || m.gave_up);
  };
  s.Begin(now);
  apply();
  for (int step = 0; step < 4000 && !m.exited; ++step) {
    now += std::uniform_int_distribution<int64_t>(0, step < 3000 ? 700 : 3000)(rng);
    const double r = std::uniform_real_distribution<double>(0, 1)(rng);
    std::vector<size_t> live;
    for (size_t c = 0; c < n; ++c) {
      if (m.live[c]) live.push_back(c);
    }
    if ((step == 3000 || r < 0.005) && !m.terminated) {
      m.terminated = !m.gave_up;  // a SIGTERM while giving up changes nothing
      s.Terminate(now);
    } else if (r < 0.04 && !live.empty()) {  // a crash (or an exit after a signal)
      const size_t c = live[rng() % live.size()];
      exit_child(c, m.killed[c] ? SIGKILL : (chance(0.5) ? kCrash : SIGSEGV));
    } else if (r < 0.25) {  // signalled children obey (SIGKILL always, SIGTERM mostly)
      for (size_t c : live) {
        if (m.killed[c] || (m.termed[c] && chance(0.7))) exit_child(c, m.killed[c] ? SIGKILL : 0);
      }
    } else if (r < 0.27) {  // events that do not fit: ignored
      const uint64_t before = s.ignored_events();
      for (size_t c = 0; c < n; ++c) {
        if (!m.live[c]) s.Exited(c, kCrash, now);
      }
      s.ProbeResult(n + 3, true, now);
      ASSERT_GT(s.ignored_events(), before);
    } else {
      s.Timer(now);
    }
    apply();
    ASSERT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
    for (size_t c = 0; c < n; ++c) {  // a starting child is probed within one interval
      if (s.state(c) == ChildState::kStarting && !m.killed[c]) {
        ASSERT_LE(s.NextWakeupMs(), now + p.probe_interval_ms);
      }
    }
  }
  // A stopping node ends once its children obey.
  for (int i = 0; i < 100 && !m.exited; ++i) {
    now += p.stop_grace_ms;
    s.Timer(now);
    apply();
    for (size_t c = 0; c < n; ++c) {
      if (m.live[c] && m.killed[c]) exit_child(c, SIGKILL);
    }
    apply();
  }
  ASSERT_TRUE(m.exited) << "the node never exited";
  ASSERT_TRUE(s.done());
}

TEST(SupervisorRandom, InvariantsHoldForRandomEventSequences) {
  SupervisorPolicy p = TestPolicy();
  Coverage cov;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    p.restart_workers_with_memd = seed % 3 != 0;
    p.max_restarts = static_cast<uint32_t>(seed % 6);
    RunRandom(seed, 1 + seed % 4, p, cov);
    if (HasFatalFailure()) return;
  }
  std::printf("random runs: %llu starts, %llu node-ready, %llu memd restarts, %llu SIGKILLs, %llu gave up, %llu clean "
              "stops\n", (unsigned long long)cov.starts, (unsigned long long)cov.readies,
              (unsigned long long)cov.memd_restarts, (unsigned long long)cov.sigkills,
              (unsigned long long)cov.gave_up, (unsigned long long)cov.clean_stops);
  // Every outcome was reached: the checks above ran on each kind of path.
  EXPECT_GT(cov.readies, 0u);
  EXPECT_GT(cov.memd_restarts, 0u);
  EXPECT_GT(cov.sigkills, 0u);
  EXPECT_GT(cov.gave_up, 0u);
  EXPECT_GT(cov.clean_stops, 0u);
  EXPECT_EQ(cov.gave_up + cov.clean_stops, 300u);
}

}  // namespace
}  // namespace dhs::node
