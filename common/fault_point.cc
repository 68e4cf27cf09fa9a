#include "common/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace dhs {
namespace {

constexpr std::array<std::string_view, kFaultPoints> kNames = {"prefill", "decode", "backup", "populate", "reclaim",
                                                             "complete"};

std::atomic<bool> g_armed{false};
std::mutex g_mutex;
FaultCounter* g_counter = nullptr;  // guarded by g_mutex; set once by ArmFaultKill, never freed
FaultKill g_kill;

}  // namespace

std::string_view FaultPointName(FaultPoint point) { return kNames.at(static_cast<size_t>(point)); }

absl::StatusOr<FaultKill> ParseFaultKill(std::string_view spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("fault kill '", std::string(spec), "': want KIND:N (KIND one of prefill, "
                                                   "decode, backup, populate, reclaim, complete; N >= 1)"));
  }
  const std::string_view kind = spec.substr(0, colon), count = spec.substr(colon + 1);
  FaultKill kill;
  size_t k = 0;
  while (k < kNames.size() && kNames[k] != kind) ++k;
  if (k == kNames.size()) {
    return absl::InvalidArgumentError(absl::StrCat("fault kill '", std::string(spec), "': unknown kind '", std::string(kind),
                                                   "' (prefill, decode, backup, populate, reclaim, complete)"));
  }
  kill.point = static_cast<FaultPoint>(k);
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), n);
  if (count.empty() || ec != std::errc() || end != count.data() + count.size() || n == 0 || n >= (uint64_t{1} << 63)) {
    return absl::InvalidArgumentError(absl::StrCat("fault kill '", std::string(spec), "': N must be a number >= 1, got '", std::string(count),
                                                   "'"));
  }
  kill.nth = n;
  return kill;
}

std::string FormatFaultKill(const FaultKill& kill) { return absl::StrCat(std::string(FaultPointName(kill.point)), ":", kill.nth); }

bool FaultCounter::Reach(FaultPoint point) {
  const uint64_t n = ++counts_[static_cast<size_t>(point)];
  return armed_ && armed_->point == point && armed_->nth == n;
}

void ArmFaultKill(const FaultKill& kill) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_kill = kill;
  g_counter = new FaultCounter(kill);
  g_armed.store(true, std::memory_order_release);
}

bool FaultKillArmedAt(FaultPoint point) {
  if (!g_armed.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_kill.point == point;
}

void ReachFaultPoint(FaultPoint point) {
  if (!g_armed.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_counter->Reach(point)) return;
  const std::string line = absl::StrCat("fault injection: SIGKILL at ", FormatFaultKill(g_kill), "\n");
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, line.data(), line.size());
  ::raise(SIGKILL);
}

}  // namespace dhs
