#include "tools/node/supervisor.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"

namespace dhs::node {

const char* ChildStateName(ChildState s) {
  switch (s) {
    case ChildState::kDown: return "down";
    case ChildState::kStarting: return "starting";
    case ChildState::kReady: return "ready";
    case ChildState::kBackoff: return "backoff";
    case ChildState::kStopping: return "stopping";
  }
  return "?";
}

absl::Status CheckChildTransition(ChildState from, ChildState to) {
  if (from == to) return absl::OkStatus();
  for (const auto& [f, t] : kChildTransitions) {
    if (f == from && t == to) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("child state ", ChildStateName(from), " -> ", ChildStateName(to), " is not a move"));
}

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = sigabbrev_np(sig);
    return abbrev ? absl::StrCat("signal SIG", abbrev, " (", sig, ")") : absl::StrCat("signal ", sig);
  }
  return absl::StrCat("status ", wait_status);
}

Supervisor::Supervisor(SupervisorPolicy policy, std::vector<std::string> names) : policy_(policy) {
  for (std::string& n : names) {
    children_.emplace_back();
    children_.back().name = std::move(n);
  }
}

int64_t Supervisor::BackoffMs(uint32_t k) const {
  int64_t delay = policy_.backoff_initial_ms;
  for (uint32_t i = 1; i < k && delay < policy_.backoff_max_ms; ++i) delay *= 2;
  return std::min(delay, policy_.backoff_max_ms);
}

void Supervisor::Order(SupervisorOrder::Kind kind, size_t child, std::string message, int signal, int code) {
  orders_.push_back(SupervisorOrder{kind, child, signal, code, std::move(message)});
}

std::vector<SupervisorOrder> Supervisor::DrainOrders() { return std::exchange(orders_, {}); }

void Supervisor::SetState(size_t c, ChildState to) {
  DHS_CHECK_OK(CheckChildTransition(children_[c].state, to));
  children_[c].state = to;
}

void Supervisor::Start(size_t c, int64_t now) {
  Child& ch = children_[c];
  SetState(c, ChildState::kStarting);
  ch.memd_starts_at_start = children_[kMemd].starts;
  ch.live = true;
  ch.started_at = now;
  ch.next_probe = now + policy_.probe_interval_ms;
  ch.kill_at = kNever;
  ch.kill_sent = false;
  ch.respawn_after_stop = false;
  ch.restart_at = kNever;
  ++ch.starts;
  Order(SupervisorOrder::Kind::kStart, c);
}

void Supervisor::SendTerm(size_t c, int64_t now) {
  Child& ch = children_[c];
  if (!ch.live || ch.state == ChildState::kStopping) return;
  SetState(c, ChildState::kStopping);
  if (ch.kill_sent) return;  // SIGKILL'd already (liveness, start timeout): its exit is on its way
  ch.kill_at = now + policy_.stop_grace_ms;
  Order(SupervisorOrder::Kind::kSignal, c, "", SIGTERM);
}

void Supervisor::Begin(int64_t now_ms) {
  if (phase_ != Phase::kIdle) {
    ++ignored_;
    return;
  }
  phase_ = Phase::kStarting;
  Start(kMemd, now_ms);
}

void Supervisor::Exited(size_t c, int wait_status, int64_t now) {
  if (!Valid(c) || !children_[c].live) {
    ++ignored_;
    return;
  }
  Child& ch = children_[c];
  ch.live = false;
  ch.kill_at = kNever;
  if (stopping()) {
    SetState(c, ChildState::kDown);
    AdvanceStop(now);
    return;
  }
  if (ch.respawn_after_stop) {  // stopped because memd went away: started again once memd is ready
    SetState(c, ChildState::kBackoff);
    ch.restart_at = now;
    ch.respawn_after_stop = false;
    StartDueChildren(now);
    return;
  }
  OnCrash(c, wait_status, now);
}

bool Supervisor::FailsFast(size_t c) const {
  const Child& ch = children_[c];
  if (!policy_.fail_fast || ch.ever_ready) return false;
  if (c == kMemd) return true;
  const Child& m = children_[kMemd];  // the memd this worker started against is still the ready one
  return m.state == ChildState::kReady && m.starts == ch.memd_starts_at_start;
}

void Supervisor::OnCrash(size_t c, int wait_status, int64_t now) {
  Child& ch = children_[c];
  const bool was_ready = ch.state == ChildState::kReady;
  if (phase_ == Phase::kRunning) phase_ = Phase::kStarting;  // "node ready" again once it recovered
  if (FailsFast(c)) {
    SetState(c, ChildState::kDown);
    std::string message = absl::StrFormat(
        "dhs-node: %s exited (%s) before it was ever ready: it would fail the same way again; stopping the node "
        "(its log follows)", ch.name, DescribeExit(wait_status));
    Order(SupervisorOrder::Kind::kLogTail, c, message);
    BeginStop(now, 1, std::move(message), /*log=*/false);
    return;
  }
  ch.crashes.push_back(now);
  while (!ch.crashes.empty() && ch.crashes.front() <= now - policy_.restart_window_ms) ch.crashes.pop_front();
  if (ch.crashes.size() > policy_.max_restarts) {
    SetState(c, ChildState::kDown);
    std::string message =
        absl::StrFormat("dhs-node: giving up: %s exited %d times within %d s (last: %s); stopping the node",
                        ch.name, ch.crashes.size(), policy_.restart_window_ms / 1000, DescribeExit(wait_status));
    Order(SupervisorOrder::Kind::kLogTail, c, message);
    BeginStop(now, 1, std::move(message), /*log=*/false);
    return;
  }
  if (was_ready && now - ch.ready_at >= policy_.backoff_reset_ms) ch.streak = 0;
  ++ch.streak;
  const int64_t delay = BackoffMs(ch.streak);
  SetState(c, ChildState::kBackoff);
  ch.restart_at = now + delay;
  Order(SupervisorOrder::Kind::kLog, c,
        absl::StrFormat("dhs-node: %s exited (%s); restart %d of %d in this window, in %d ms", ch.name,
                        DescribeExit(wait_status), ch.crashes.size(), policy_.max_restarts, delay));
  if (c == kMemd) OnMemdGone(now);
}

void Supervisor::OnMemdGone(int64_t now) {
  if (!policy_.restart_workers_with_memd) return;
  for (size_t c = 1; c < children_.size(); ++c) {
    if (children_[c].live) {
      children_[c].respawn_after_stop = true;
      SendTerm(c, now);
    }
  }
}

void Supervisor::StartDueChildren(int64_t now) {
  if (stopping()) return;
  for (size_t c = 0; c < children_.size(); ++c) {
    Child& ch = children_[c];
    const bool due = ch.state == ChildState::kBackoff && ch.restart_at <= now;
    const bool first = ch.state == ChildState::kDown && IsWorker(c);
    if (!due && !first) continue;
    if (IsWorker(c) && children_[kMemd].state != ChildState::kReady) continue;
    Start(c, now);
  }
}

int64_t Supervisor::LivenessTimeoutMs(size_t c) const {
  return c == kMemd ? policy_.memd_liveness_timeout_ms : policy_.worker_liveness_timeout_ms;
}

bool Supervisor::Watches(size_t c) const {
  const Child& ch = children_[c];
  // Not while the node stops: memd stays ready until every worker exited, and its SIGTERM/SIGKILL are the stop's.
  return LivenessTimeoutMs(c) > 0 && phase_ != Phase::kStopping && phase_ != Phase::kDone &&
         ch.state == ChildState::kReady && !ch.kill_sent;
}

// A liveness probe of a ready child answered (or not): none found it alive for its liveness timeout: SIGKILL (once);
// its exit is then an ordinary crash (restarted after its backoff).
void Supervisor::OnLiveness(size_t c, bool answered, int64_t now) {
  Child& ch = children_[c];
  if (answered) {
    ch.answered_at = now;
    return;
  }
  if (now - ch.answered_at < LivenessTimeoutMs(c)) return;
  ch.kill_sent = true;
  Order(SupervisorOrder::Kind::kSignal, c, "", SIGKILL);
  Order(SupervisorOrder::Kind::kLog, c,
        absl::StrFormat("dhs-node: %s answered no probe%s for %d ms (hung): SIGKILL; it is restarted like a crash",
                        ch.name, c == kMemd ? "" : " (or memd held its GPU fenced)", now - ch.answered_at));
}

void Supervisor::ProbeResult(size_t c, bool ready, int64_t now) {
  if (Valid(c) && Watches(c)) {
    OnLiveness(c, ready, now);
    return;
  }
  if (!Valid(c) || children_[c].state != ChildState::kStarting || children_[c].kill_sent) {
    ++ignored_;
    return;
  }
  if (!ready) return;  // probed again at next_probe
  Child& ch = children_[c];
  SetState(c, ChildState::kReady);
  ch.ever_ready = true;
  ch.ready_at = now;
  ch.answered_at = now;
  ch.next_probe = now + policy_.liveness_probe_ms;  // the liveness watch (Watches)
  if (c == kMemd) StartDueChildren(now);
  MaybeAnnounceReady();
}

void Supervisor::MaybeAnnounceReady() {
  if (phase_ != Phase::kStarting) return;
  for (const Child& ch : children_) {
    if (ch.state != ChildState::kReady) return;
  }
  phase_ = Phase::kRunning;
  Order(SupervisorOrder::Kind::kReady, kMemd,
        absl::StrCat("dhs-node: node ready", announced_ ? " again" : "", " (", children_.size() - 1, " workers)"));
  announced_ = true;
}

void Supervisor::Timer(int64_t now) {
  if (phase_ == Phase::kIdle || phase_ == Phase::kDone) return;
  for (size_t c = 0; c < children_.size(); ++c) {
    Child& ch = children_[c];
    if (ch.live && !ch.kill_sent && ch.kill_at <= now) {
      ch.kill_sent = true;
      Order(SupervisorOrder::Kind::kSignal, c, "", SIGKILL);
      Order(SupervisorOrder::Kind::kLog, c, absl::StrFormat("dhs-node: %s did not stop within %d ms: SIGKILL", ch.name,
                                                            policy_.stop_grace_ms));
    } else if (ch.state == ChildState::kStarting && !ch.kill_sent && now - ch.started_at >= policy_.start_timeout_ms) {
      ch.kill_sent = true;
      Order(SupervisorOrder::Kind::kSignal, c, "", SIGKILL);
      Order(SupervisorOrder::Kind::kLog, c, absl::StrFormat("dhs-node: %s not ready within %d ms: SIGKILL", ch.name,
                                                            policy_.start_timeout_ms));
    } else if (ch.state == ChildState::kStarting && !ch.kill_sent && ch.next_probe <= now) {
      ch.next_probe = now + policy_.probe_interval_ms;
      Order(SupervisorOrder::Kind::kProbe, c);
    } else if (Watches(c) && ch.next_probe <= now) {
      ch.next_probe = now + policy_.liveness_probe_ms;
      Order(SupervisorOrder::Kind::kProbe, c);
    }
  }
  StartDueChildren(now);
}

int64_t Supervisor::NextWakeupMs() const {
  if (phase_ == Phase::kIdle || phase_ == Phase::kDone) return kNever;
  int64_t next = kNever;
  for (size_t c = 0; c < children_.size(); ++c) {
    const Child& ch = children_[c];
    if (ch.live && !ch.kill_sent) next = std::min(next, ch.kill_at);
    if (ch.state == ChildState::kStarting && !ch.kill_sent) {
      next = std::min({next, ch.next_probe, ch.started_at + policy_.start_timeout_ms});
    }
    if (Watches(c)) next = std::min(next, ch.next_probe);
    const bool can_start = !IsWorker(c) || children_[kMemd].state == ChildState::kReady;
    if (ch.state == ChildState::kBackoff && can_start) next = std::min(next, ch.restart_at);
  }
  return next;
}

void Supervisor::Terminate(int64_t now) {
  if (stopping() || phase_ == Phase::kIdle) {
    ++ignored_;
    if (phase_ == Phase::kIdle) {
      phase_ = Phase::kDone;
      Order(SupervisorOrder::Kind::kExit, kMemd, "dhs-node: stopped before start", 0, 0);
    }
    return;
  }
  BeginStop(now, 0, "dhs-node: stopped cleanly");
}

void Supervisor::BeginStop(int64_t now, int code, std::string message, bool log) {
  phase_ = Phase::kStopping;
  exit_code_ = code;
  exit_message_ = std::move(message);
  if (code != 0 && log) Order(SupervisorOrder::Kind::kLog, kMemd, exit_message_);
  for (size_t c = 0; c < children_.size(); ++c) {
    Child& ch = children_[c];
    ch.respawn_after_stop = false;
    ch.restart_at = kNever;
    if (!ch.live) SetState(c, ChildState::kDown);
  }
  AdvanceStop(now);
}

// Workers first (SIGTERM), memd once no worker is left, kExit once nothing is left.
void Supervisor::AdvanceStop(int64_t now) {
  bool worker_live = false;
  for (size_t c = 1; c < children_.size(); ++c) {
    if (children_[c].live) {
      worker_live = true;
      SendTerm(c, now);
    }
  }
  if (worker_live) return;
  if (children_[kMemd].live) {
    SendTerm(kMemd, now);
    return;
  }
  phase_ = Phase::kDone;
  Order(SupervisorOrder::Kind::kExit, kMemd, exit_message_, 0, exit_code_);
}

absl::Status Supervisor::CheckInvariants() const {
  for (size_t c = 0; c < children_.size(); ++c) {
    const Child& ch = children_[c];
    const bool process_state = ch.state == ChildState::kStarting || ch.state == ChildState::kReady ||
                               ch.state == ChildState::kStopping;
    auto fail = [&](absl::string_view what) {
      return absl::InternalError(absl::StrCat(ch.name, " (", ChildStateName(ch.state), "): ", what));
    };
    if (ch.live != process_state) return fail("live does not match the state");
    if (stopping() && ch.state == ChildState::kBackoff) return fail("a restart pending while stopping");
    if (ch.crashes.size() > policy_.max_restarts + 1) return fail("more crashes kept than max_restarts + 1");
    if (ch.state == ChildState::kBackoff && ch.restart_at == kNever) return fail("backoff without a restart time");
    if (phase_ == Phase::kDone && ch.live) return fail("live after the node exited");
    if (IsWorker(c) && (ch.state == ChildState::kStarting || ch.state == ChildState::kReady) &&
        !children_[kMemd].live && policy_.restart_workers_with_memd) {
      return fail("a worker starting or ready without memd");
    }
    if (ch.streak > 0 && (BackoffMs(ch.streak) < std::min(policy_.backoff_initial_ms, policy_.backoff_max_ms) ||
                          BackoffMs(ch.streak) > policy_.backoff_max_ms)) {
      return fail("backoff out of [initial, max]");
    }
  }
  return absl::OkStatus();
}

}  // namespace dhs::node
