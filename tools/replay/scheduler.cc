// tools/replay/scheduler.cc: open- and closed-loop submission (see scheduler.h).
#include "tools/replay/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dhs::replay {

absl::StatusOr<Scheduler> Scheduler::OpenLoop(const std::vector<double>& arrival_ms, double time_scale) {
  if (!std::isfinite(time_scale) || time_scale < 0) {
    return absl::InvalidArgumentError(absl::StrCat("time scale must be a number >= 0, got ", time_scale));
  }
  for (size_t i = 0; i < arrival_ms.size(); ++i) {
    if (!std::isfinite(arrival_ms[i]) || arrival_ms[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("arrival of request ", i, " must be >= 0 ms"));
    }
  }
  Scheduler s;
  s.open_loop_ = true;
  s.order_.resize(arrival_ms.size());
  std::iota(s.order_.begin(), s.order_.end(), size_t{0});
  std::stable_sort(s.order_.begin(), s.order_.end(),
                   [&](size_t a, size_t b) { return arrival_ms[a] < arrival_ms[b]; });
  s.due_ms_.reserve(s.order_.size());
  for (size_t i : s.order_) s.due_ms_.push_back(arrival_ms[i] * time_scale);
  return s;
}

absl::StatusOr<Scheduler> Scheduler::ClosedLoop(size_t num_requests, int64_t concurrency) {
  if (concurrency < 1) {
    return absl::InvalidArgumentError(absl::StrCat("concurrency must be >= 1, got ", concurrency));
  }
  Scheduler s;
  s.open_loop_ = false;
  s.concurrency_ = concurrency;
  s.order_.resize(num_requests);
  std::iota(s.order_.begin(), s.order_.end(), size_t{0});
  return s;
}

std::vector<size_t> Scheduler::Due(double now_ms, int64_t in_flight) {
  std::vector<size_t> due;
  if (open_loop_) {
    while (next_ < order_.size() && due_ms_[next_] <= now_ms) due.push_back(order_[next_++]);
  } else {
    int64_t slots = concurrency_ - std::max<int64_t>(0, in_flight);
    while (slots-- > 0 && next_ < order_.size()) due.push_back(order_[next_++]);
  }
  return due;
}

std::optional<double> Scheduler::NextDueMs() const {
  if (!open_loop_ || next_ == order_.size()) return std::nullopt;
  return due_ms_[next_];
}

}  // namespace dhs::replay
