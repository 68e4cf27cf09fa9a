// tools/replay/scheduler.h: when the replay submits each request: open loop by the trace's arrival times
// (scaled), or closed loop at a fixed concurrency. Pure: it is fed the current time and the number of requests
// in flight, so tests drive it with a fake clock.
//
// Thread-safety: not thread-safe; one owner (the ReplayDriver) calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"

namespace dhs::replay {

class Scheduler {
 public:
  // Open loop: request i becomes due at arrival_ms[i] * time_scale ms after the run started, regardless of how
  // many are in flight. Requests with equal due times go in index order; arrivals need not be sorted.
  // InvalidArgument when time_scale is not finite and >= 0 or an arrival is negative or not finite.
  static absl::StatusOr<Scheduler> OpenLoop(const std::vector<double>& arrival_ms, double time_scale);

  // Closed loop: keeps `concurrency` requests in flight, submitting in index order as others end.
  // InvalidArgument when concurrency < 1.
  static absl::StatusOr<Scheduler> ClosedLoop(size_t num_requests, int64_t concurrency);

  // The requests to submit now, in submission order, as indices into the trace; they count as submitted from
  // here on. now_ms: ms since the run started; in_flight: submitted requests not yet ended (>= 0).
  std::vector<size_t> Due(double now_ms, int64_t in_flight);

  // Open loop: the time (ms since the start) at which the next request becomes due; nullopt when all are
  // submitted, and always nullopt in closed loop (there the next submission waits for an end, not for a time).
  std::optional<double> NextDueMs() const;

  bool all_submitted() const { return next_ == order_.size(); }
  size_t submitted() const { return next_; }
  size_t size() const { return order_.size(); }
  bool open_loop() const { return open_loop_; }

 private:
  Scheduler() = default;

  bool open_loop_ = false;
  int64_t concurrency_ = 0;          // closed loop
  std::vector<size_t> order_;        // submission order (indices)
  std::vector<double> due_ms_;       // open loop: due time of order_[k]
  size_t next_ = 0;                  // order_[next_] is the next to submit
};

}  // namespace dhs::replay
