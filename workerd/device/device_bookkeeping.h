// workerd/device/device_bookkeeping.h: the host-side bookkeeping CpuDevice and CudaDevice share (brief §9).
//
// CopyJob: one issued batch waiting in a device's queue (its ops, dependencies, event state, and whether the copy
// hook holds it); the held-copies helpers (HeldCopyIds, ReleaseHeldCopy, ReleaseAllHeldCopies) are the test seam's
// queue side. ReaderFences: the readers (BeginReaders ids and their ranges) and the fences waiting for them
// (ReadersFence), completed when their last reader ends.
//
// Ownership: ReaderFences owns the reader ranges and the pending fences' event states; a job owns its ops and state.
// The event State is the device's own (`State` must have Complete(absl::Status)); how a batch executes (memmove,
// link model, CUDA streams and events, readers ended by events) stays in each device.
//
// Thread-safety: none of its own. Every call must be made under the owning device's mutex; fence states returned
// for completion are completed by the caller after it drops that mutex.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "workerd/device/device.h"

namespace dhs {

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

struct CopyOp {
  uint8_t* dst;
  const uint8_t* src;
  uint64_t bytes;
};

template <class State>
struct CopyJob {
  uint64_t id;
  CopyKind kind;
  std::vector<CopyOp> ops;
  std::vector<CopyEvent> after;
  std::shared_ptr<State> state;
  bool held = false;
  std::vector<DeviceRange> written;  // the device ranges it writes (CpuDevice's asynchronous mode only)

  // Not held and every dependency done.
  bool Runnable() const {
    return !held && std::all_of(after.begin(), after.end(), [](const CopyEvent& e) { return e.Done(); });
  }
};

// Ids of the held jobs of `queue`, in queue (issue) order.
// Whether a queued batch could run now (CopyJob::Runnable). Under the device's mu_.
template <class State>
bool AnyRunnable(const std::deque<CopyJob<State>>& queue) {
  return std::any_of(queue.begin(), queue.end(), [](const CopyJob<State>& j) { return j.Runnable(); });
}

// OK when every dependency of copy `id` succeeded, else UNAVAILABLE naming the first failed one
// ("<device>: a dependency of copy <id> failed: <its message>"). Called once all of them are done.
inline absl::Status DependencyStatus(const std::vector<CopyEvent>& after, absl::string_view device, uint64_t id) {
  for (const CopyEvent& e : after) {
    if (absl::Status s = e.Status(); !s.ok()) {
      return absl::UnavailableError(absl::StrCat(device, ": a dependency of copy ", id, " failed: ", s.message()));
    }
  }
  return absl::OkStatus();
}

template <class State>
std::vector<uint64_t> HeldCopyIds(const std::deque<CopyJob<State>>& queue) {
  std::vector<uint64_t> ids;
  for (const CopyJob<State>& j : queue) {
    if (j.held) ids.push_back(j.id);
  }
  return ids;
}

// Lets held job `id` run, or with `fail` removes it and returns its state for the caller to fail (outside the
// lock); nullptr otherwise (also when `id` is not held).
template <class State>
std::shared_ptr<State> ReleaseHeldCopy(std::deque<CopyJob<State>>& queue, uint64_t id, bool fail) {
  for (auto it = queue.begin(); it != queue.end(); ++it) {
    if (it->id != id || !it->held) continue;
    if (!fail) {
      it->held = false;
      return nullptr;
    }
    std::shared_ptr<State> failed = it->state;
    queue.erase(it);
    return failed;
  }
  return nullptr;
}

template <class State>
void ReleaseAllHeldCopies(std::deque<CopyJob<State>>& queue) {
  for (CopyJob<State>& j : queue) j.held = false;
}

template <class State>
class ReaderFences {
 public:
  ReaderId Begin(std::span<const DeviceRange> ranges) {
    const ReaderId id = next_reader_++;
    readers_.emplace(id, std::vector<DeviceRange>(ranges.begin(), ranges.end()));
    return id;
  }

  bool Known(ReaderId reader) const { return readers_.contains(reader); }

  // Ends `reader` (false when unknown); the fences it was the last reader of are removed and their states appended
  // to `done`, for the caller to complete (OK) after dropping its lock.
  bool End(ReaderId reader, std::vector<std::shared_ptr<State>>* done) {
    if (readers_.erase(reader) == 0) return false;
    for (auto it = fences_.begin(); it != fences_.end();) {
      std::erase(it->readers, reader);
      if (it->readers.empty()) {
        done->push_back(it->state);
        it = fences_.erase(it);
      } else {
        ++it;
      }
    }
    return true;
  }

  // The readers (with their first range overlapping `range`) that read some byte of it, in reader order.
  std::vector<std::pair<ReaderId, DeviceRange>> Overlapping(const DeviceRange& range) const {
    std::vector<std::pair<ReaderId, DeviceRange>> v;
    for (const auto& [id, ranges] : readers_) {
      for (const auto& r : ranges) {
        if (Overlaps(r, range)) {
          v.emplace_back(id, r);
          break;
        }
      }
    }
    return v;
  }

  // The readers the pending fence with state `state` waits for (empty when it is not a pending fence).
  std::vector<ReaderId> FenceReaders(const EventState* state) const {
    for (const Fence& f : fences_) {
      if (static_cast<const EventState*>(f.state.get()) == state) return f.readers;
    }
    return {};
  }

  // Some reader's range overlaps `range`.
  bool Busy(const DeviceRange& range) const {
    for (const auto& [id, ranges] : readers_) {
      for (const auto& r : ranges) {
        if (Overlaps(r, range)) return true;
      }
    }
    return false;
  }

  // Makes `state` the fence of the readers overlapping `range` now; false when there is none (the fence is not
  // kept: the caller completes it at once).
  bool AddFence(const DeviceRange& range, std::shared_ptr<State> state) {
    Fence f{{}, std::move(state)};
    for (const auto& [id, ranges] : readers_) {
      if (std::any_of(ranges.begin(), ranges.end(), [&](const DeviceRange& r) { return Overlaps(r, range); })) {
        f.readers.push_back(id);
      }
    }
    if (f.readers.empty()) return false;
    fences_.push_back(std::move(f));
    return true;
  }

  // The pending fences' states, in creation order (the device cancels them when destroyed).
  std::vector<std::shared_ptr<State>> PendingFences() const {
    std::vector<std::shared_ptr<State>> v;
    for (const Fence& f : fences_) v.push_back(f.state);
    return v;
  }

 private:
  struct Fence {
    std::vector<ReaderId> readers;
    std::shared_ptr<State> state;
  };

  ReaderId next_reader_ = 1;
  std::map<ReaderId, std::vector<DeviceRange>> readers_;
  std::vector<Fence> fences_;
};

}  // namespace dhs
