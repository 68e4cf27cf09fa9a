// tools/replay/fault_plan.cc: see fault_plan.h.
#include "tools/replay/fault_plan.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dhs::replay {

absl::StatusOr<std::vector<FaultKill>> ParseHookKills(const std::vector<std::string>& specs, uint64_t seed) {
  std::vector<FaultKill> kills;
  for (const std::string& spec : specs) {
    if (absl::StartsWith(spec, "random:")) {
      const std::string_view count = std::string_view(spec).substr(7);
      int k = 0;
      const auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), k);
      if (count.empty() || ec != std::errc() || end != count.data() + count.size() || k < 1 || k > 100000) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kill-worker-at '", spec, "': random:K wants K in [1, 100000]"));
      }
      const std::vector<FaultKill> drawn = RandomHookKills(seed, k);
      kills.insert(kills.end(), drawn.begin(), drawn.end());
      continue;
    }
    absl::StatusOr<FaultKill> kill = ParseFaultKill(spec);
    if (!kill.ok()) return absl::InvalidArgumentError(absl::StrCat("--kill-worker-at: ", kill.status().message()));
    kills.push_back(*kill);
  }
  return kills;
}

std::vector<FaultKill> RandomHookKills(uint64_t seed, int count) {
  std::mt19937_64 rng(seed ^ 0x686f6f6b6b696c6cull);  // "hookkill": a stream apart from the timed kills'
  std::vector<FaultPoint> kinds = {FaultPoint::kPrefill, FaultPoint::kDecode, FaultPoint::kBackup,
                                   FaultPoint::kPopulate};
  std::vector<FaultKill> kills;
  for (int i = 0; i < count; ++i) {
    if (i % kinds.size() == 0) std::shuffle(kinds.begin(), kinds.end(), rng);
    const FaultPoint kind = kinds[i % kinds.size()];
    const uint64_t max_n = kind == FaultPoint::kDecode ? 40 : 4;
    kills.push_back(FaultKill{kind, std::uniform_int_distribution<uint64_t>(1, max_n)(rng)});
  }
  return kills;
}

FaultPlan::FaultPlan(FaultPlanConfig config) : config_(std::move(config)), rng_(config_.seed) {}

int64_t FaultPlan::Draw(int64_t mean_ms) {
  const double mean = static_cast<double>(mean_ms);
  double d = config_.distribution == FaultDistribution::kExponential
                 ? std::exponential_distribution<double>(1.0 / mean)(rng_)
                 : std::uniform_real_distribution<double>(mean / 2, mean * 3 / 2)(rng_);
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(d)));
}

// Draws the next kill of each ready child that has none (and was not killed in this ready period).
void FaultPlan::Schedule(int64_t now_ms) {
  if (stopped_) return;
  if (config_.kill_worker_every_ms > 0 && worker_ready_ && memd_ready_ && !worker_killed_ &&
      worker_kill_at_ == kNever) {
    worker_kill_at_ = now_ms + Draw(config_.kill_worker_every_ms);
  }
  if (config_.restart_memd_every_ms > 0 && memd_ready_ && !memd_killed_ && memd_kill_at_ == kNever) {
    memd_kill_at_ = now_ms + Draw(config_.restart_memd_every_ms);
  }
}

void FaultPlan::WorkerReady(int64_t now_ms) {
  if (worker_ready_) { ++ignored_; return; }
  worker_ready_ = true;
  worker_ready_at_ = now_ms;
  worker_killed_ = false;
  Schedule(now_ms);
}

void FaultPlan::WorkerExited(int64_t now_ms) {
  (void)now_ms;
  worker_ready_ = false;
  worker_killed_ = false;
  worker_kill_at_ = kNever;
}

void FaultPlan::MemdReady(int64_t now_ms) {
  if (memd_ready_) { ++ignored_; return; }
  memd_ready_ = true;
  memd_ready_at_ = now_ms;
  memd_killed_ = false;
  Schedule(now_ms);
}

void FaultPlan::MemdExited(int64_t now_ms) {
  (void)now_ms;
  memd_ready_ = false;
  memd_killed_ = false;
  memd_kill_at_ = kNever;
}

void FaultPlan::Timer(int64_t now_ms) {
  if (stopped_) return;
  const bool both_ready = worker_ready_ && memd_ready_;
  if (worker_kill_at_ <= now_ms && both_ready) {
    orders_.push_back(FaultOrder{FaultOrder::Kind::kKillWorker});
    ++worker_kills_;
    worker_killed_ = true;
    worker_kill_at_ = kNever;
  } else if (memd_kill_at_ <= now_ms && both_ready) {  // one child at a time
    orders_.push_back(FaultOrder{FaultOrder::Kind::kKillMemd});
    ++memd_kills_;
    memd_killed_ = true;
    memd_kill_at_ = kNever;
  }
  Schedule(now_ms);
}

void FaultPlan::Stop() {
  stopped_ = true;
  worker_kill_at_ = memd_kill_at_ = kNever;
}

std::vector<FaultOrder> FaultPlan::DrainOrders() { return std::exchange(orders_, {}); }

int64_t FaultPlan::NextWakeupMs() const { return std::min(worker_kill_at_, memd_kill_at_); }

std::optional<FaultKill> FaultPlan::WorkerFaultForStart() {
  if (next_hook_ >= config_.hook_kills.size()) return std::nullopt;
  return config_.hook_kills[next_hook_++];
}

absl::Status FaultPlan::CheckInvariants() const {
  auto bad = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  if (worker_kill_at_ != kNever && (!worker_ready_ || worker_kill_at_ < worker_ready_at_ || worker_killed_)) {
    return bad("worker kill at ", worker_kill_at_, " but ready ", worker_ready_, " since ", worker_ready_at_,
               ", killed ", worker_killed_);
  }
  if (memd_kill_at_ != kNever && (!memd_ready_ || memd_kill_at_ < memd_ready_at_ || memd_killed_)) {
    return bad("memd kill at ", memd_kill_at_, " but ready ", memd_ready_, " since ", memd_ready_at_, ", killed ",
               memd_killed_);
  }
  if (stopped_ && (worker_kill_at_ != kNever || memd_kill_at_ != kNever)) return bad("a kill time after Stop");
  if (config_.kill_worker_every_ms <= 0 && (worker_kills_ > 0 || worker_kill_at_ != kNever)) {
    return bad("a timed worker kill without --kill-worker-every");
  }
  if (config_.restart_memd_every_ms <= 0 && (memd_kills_ > 0 || memd_kill_at_ != kNever)) {
    return bad("a timed memd kill without --restart-memd-every");
  }
  if (next_hook_ > config_.hook_kills.size()) return bad("hook kill index past the list");
  return absl::OkStatus();
}

}  // namespace dhs::replay
