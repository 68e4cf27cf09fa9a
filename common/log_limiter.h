// common/log_limiter.h: rate limiting of repeated log lines (issue 12: one warning per bad frame turned a flood of bad
// frames into tens of thousands of lines). A LogRateLimiter lets at most `max_per_window` occurrences through per
// window (1 s by default); the rest are counted, and the first occurrence let through after them reports how many were
// dropped, which the caller logs as "suppressed K similar messages". DHS_LOG_LIMITED gives each call site its own
// limiter (a function-local static).
//
// Windows are fixed: one starts at the first occurrence after the previous one ended. Dropped occurrences are
// reported with the next one let through (a flood that stops is summarised by its site's next message).
//
// Thread-safety: Allow may be called from any thread (a mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>

#include "spdlog/spdlog.h"

namespace dhs {

class LogRateLimiter {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  static constexpr uint32_t kDefaultMaxPerWindow = 10;

  // `clock`: empty = std::chrono::steady_clock::now (tests inject their own). max_per_window 0 is taken as 1.
  explicit LogRateLimiter(uint32_t max_per_window = kDefaultMaxPerWindow,
                          std::chrono::steady_clock::duration window = std::chrono::seconds(1), Clock clock = {})
      : max_(max_per_window == 0 ? 1 : max_per_window), window_(window), clock_(std::move(clock)) {}

  // One occurrence. Returns whether to log it; then `*suppressed` is the number of occurrences dropped since the last
  // one let through (0: none), which the caller reports first. Returns false (and leaves `*suppressed`) when dropped.
  bool Allow(uint64_t* suppressed) {
    const auto now = clock_ ? clock_() : std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || now - window_start_ >= window_) {
      started_ = true;
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= max_) {
      ++dropped_;
      return false;
    }
    ++in_window_;
    *suppressed = dropped_;
    dropped_ = 0;
    return true;
  }

 private:
  const uint32_t max_;
  const std::chrono::steady_clock::duration window_;
  const Clock clock_;
  std::mutex mu_;
  bool started_ = false;
  std::chrono::steady_clock::time_point window_start_{};
  uint32_t in_window_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace dhs

// Logs at spdlog level `level` (e.g. spdlog::level::warn) at most LogRateLimiter::kDefaultMaxPerWindow times a second
// from this call site; after dropped ones, "suppressed K similar messages (FILE:LINE)" comes first.
#define DHS_LOG_LIMITED(level, ...)                                                                         \
  do {                                                                                                      \
    static ::dhs::LogRateLimiter dhs_log_limiter_;                                                          \
    uint64_t dhs_log_suppressed_ = 0;                                                                       \
    if (dhs_log_limiter_.Allow(&dhs_log_suppressed_)) {                                                     \
      if (dhs_log_suppressed_ != 0) {                                                                       \
        spdlog::log(level, "suppressed {} similar messages ({}:{})", dhs_log_suppressed_, __FILE__, __LINE__); \
      }                                                                                                     \
      spdlog::log(level, __VA_ARGS__);                                                                      \
    }                                                                                                       \
  } while (0)
