// workerd/device/cpu_device.cc: see cpu_device.h.
#include "workerd/device/cpu_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

namespace dhs {

// Event state completed by the device (copy thread or EndReaders). Waiters block on its own condition variable.
// With the link model, a completed event is done only once its clock reaches ready_at_ (the modelled delivery).
class CpuDevice::State final : public EventState {
 public:
  bool Done() const override {
    std::lock_guard<std::mutex> l(mu_);
    return Arrived();
  }
  absl::Status Status() const override {
    std::lock_guard<std::mutex> l(mu_);
    return Arrived() ? status_ : absl::UnavailableError("copy event pending");
  }
  absl::Status Wait() const override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_; });
    if (clock_ != nullptr) clock_->SleepUntil(ready_at_);  // sleeps (or moves a simulated clock); never spins
    return status_;
  }
  void Complete(absl::Status s) { CompleteAt(std::move(s), nullptr, absl::InfinitePast()); }
  // Completes with the outcome `s`, visible once `clock` reads `ready_at` or later (at once when clock is null).
  void CompleteAt(absl::Status s, const LinkClock* clock, absl::Time ready_at) {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
      status_ = std::move(s);
      clock_ = clock;
      ready_at_ = ready_at;
    }
    cv_.notify_all();
  }

 private:
  bool Arrived() const { return done_ && (clock_ == nullptr || clock_->Now() >= ready_at_); }

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
  const LinkClock* clock_ = nullptr;
  absl::Time ready_at_ = absl::InfinitePast();
};

CpuDevice::CpuDevice() : CpuDevice(LinkModelConfig{}) {}

CpuDevice::CpuDevice(const LinkModelConfig& link, const LinkClock* clock)
    : link_config_(link), clock_(clock), link_(link), thread_([this] { CopyLoop(); }) {}

CpuDevice::~CpuDevice() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (Job& j : queue_) j.state->Complete(absl::CancelledError("device destroyed"));
  for (auto& f : readers_.PendingFences()) f->Complete(absl::CancelledError("device destroyed"));
}

absl::StatusOr<PoolId> CpuDevice::AllocatePool(uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  void* data = ::mmap(nullptr, std::max<uint64_t>(bytes, 1), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);  // zero pages, taken when first written
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError("CpuDevice: cannot allocate a pool of " + std::to_string(bytes) + " bytes");
  }
  pools_.emplace_back(static_cast<uint8_t*>(data), bytes);
  return static_cast<PoolId>(pools_.size() - 1);
}

CpuDevice::Pool::~Pool() {
  if (data != nullptr) ::munmap(data, std::max<uint64_t>(bytes, 1));
}

uint64_t CpuDevice::PoolBytes(PoolId pool) const {
  std::lock_guard<std::mutex> l(mu_);
  return pool < pools_.size() ? pools_[pool].bytes : 0;
}

// Pools are never resized after start, so their data pointers are stable.
uint8_t* CpuDevice::Resolve(const DeviceRange& r) const {
  if (r.pool >= pools_.size() || r.offset < 0) return nullptr;
  const Pool& p = pools_[r.pool];
  if (static_cast<uint64_t>(r.offset) > p.bytes || r.bytes > p.bytes - static_cast<uint64_t>(r.offset)) {
    return nullptr;
  }
  return p.data + r.offset;
}

uint8_t* CpuDevice::HostVisible(PoolId pool, Location offset) {
  std::lock_guard<std::mutex> l(mu_);
  return Resolve(DeviceRange{pool, offset, 0});
}

CopyEvent CpuDevice::Submit(CopyKind kind, uint64_t id, CopyHook hook, std::vector<Op> ops,
                            std::vector<DeviceRange> device, bool valid, std::span<const CopyEvent> after) {
  auto state = std::make_shared<State>();
  if (!valid) {
    state->Complete(absl::InvalidArgumentError("CpuDevice: copy range outside its device pool"));
    return CopyEvent(state);
  }
  CopyFate fate = CopyFate::kRun;
  if (hook) {
    CopyInfo info;
    info.id = id;
    info.kind = kind;
    info.device = std::move(device);
    fate = hook(info);
  }
  if (fate == CopyFate::kFail) {
    state->Complete(absl::UnavailableError("CpuDevice: copy " + std::to_string(id) + " failed (injected)"));
    return CopyEvent(state);
  }
  Job job{id, kind, std::move(ops), std::vector<CopyEvent>(after.begin(), after.end()), state,
          fate == CopyFate::kHold};
  // Fast path (cpu_device.h): dependencies done (checked before taking mu_: Done locks the event's own mutex).
  uint64_t bytes = 0;
  for (const Op& op : job.ops) bytes += op.bytes;
  const bool ready = job.Runnable();
  std::unique_lock<std::mutex> l(mu_);
  if (ready && bytes <= inline_limit_ && !stop_ && !busy_ && !AnyRunnable()) {
    busy_ = true;
    l.unlock();
    Execute(job, l);
    busy_ = false;
    // Wake the copy thread (or WaitIdle) only when some batch is queued (this one may have been its dependency) or
    // someone waits for idle: a wake per batch would cost a thread switch per step when nothing else is going on.
    const bool wake = !queue_.empty() || idle_waiters_ > 0;
    l.unlock();
    if (wake) cv_.notify_all();
  } else {
    queue_.push_back(std::move(job));
    l.unlock();
    cv_.notify_all();
  }
  return CopyEvent(state);
}

CopyEvent CpuDevice::CopyHostToDevice(std::span<const HostToDeviceCopy> ops, std::span<const CopyEvent> after) {
  std::vector<Op> v(ops.size());
  std::vector<DeviceRange> dev;
  bool valid = true;
  uint64_t id;
  CopyHook hook;
  {
    std::lock_guard<std::mutex> l(mu_);
    id = next_copy_id_++;
    if (hook_) {
      hook = hook_;
      dev.reserve(ops.size());
      for (const auto& o : ops) dev.push_back(o.dst);
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const HostToDeviceCopy& o = ops[i];
      uint8_t* d = Resolve(o.dst);
      valid = valid && d != nullptr && o.src != nullptr;
      v[i] = Op{d, o.src, o.dst.bytes};
    }
  }
  return Submit(CopyKind::kHostToDevice, id, std::move(hook), std::move(v), std::move(dev), valid, after);
}

CopyEvent CpuDevice::CopyDeviceToHost(std::span<const DeviceToHostCopy> ops, std::span<const CopyEvent> after) {
  std::vector<Op> v(ops.size());
  std::vector<DeviceRange> dev;
  bool valid = true;
  uint64_t id;
  CopyHook hook;
  {
    std::lock_guard<std::mutex> l(mu_);
    id = next_copy_id_++;
    if (hook_) {
      hook = hook_;
      dev.reserve(ops.size());
      for (const auto& o : ops) dev.push_back(o.src);
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const DeviceToHostCopy& o = ops[i];
      const uint8_t* s = Resolve(o.src);
      valid = valid && s != nullptr && o.dst != nullptr;
      v[i] = Op{o.dst, s, o.src.bytes};
    }
  }
  return Submit(CopyKind::kDeviceToHost, id, std::move(hook), std::move(v), std::move(dev), valid, after);
}

CopyEvent CpuDevice::CopyDeviceToDevice(std::span<const DeviceToDeviceCopy> ops, std::span<const CopyEvent> after) {
  std::vector<Op> v(ops.size());
  std::vector<DeviceRange> dev;
  bool valid = true;
  uint64_t id;
  CopyHook hook;
  {
    std::lock_guard<std::mutex> l(mu_);
    id = next_copy_id_++;
    if (hook_) {
      hook = hook_;
      dev.reserve(ops.size());
      for (const auto& o : ops) dev.push_back(o.dst);
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const DeviceToDeviceCopy& o = ops[i];
      uint8_t* d = Resolve(o.dst);
      const uint8_t* s = Resolve(o.src);
      valid = valid && d != nullptr && s != nullptr && o.src.bytes == o.dst.bytes;
      v[i] = Op{d, s, o.dst.bytes};
    }
  }
  return Submit(CopyKind::kDeviceToDevice, id, std::move(hook), std::move(v), std::move(dev), valid, after);
}

bool CpuDevice::AnyRunnable() const { return dhs::AnyRunnable(queue_); }

void CpuDevice::Execute(Job& job, std::unique_lock<std::mutex>& l) {
  absl::Status s = DependencyStatus(job.after, "CpuDevice", job.id);
  uint64_t bytes = 0;
  if (s.ok()) {
    for (const Op& op : job.ops) {
      if (op.bytes > 0) std::memmove(op.dst, op.src, op.bytes);
      bytes += op.bytes;
    }
  }
  if (s.ok() && link_config_.enabled && job.kind != CopyKind::kDeviceToDevice) {
    // The link model (link_model.h): the batch may start now, its dependencies having arrived.
    const absl::Time ready = link_.Schedule(
        job.kind == CopyKind::kHostToDevice ? LinkDirection::kHostToDevice : LinkDirection::kDeviceToHost, bytes,
        clock_->Now());
    job.state->CompleteAt(std::move(s), clock_, ready);
    l.lock();
    link_pending_.push_back(ready);
    std::push_heap(link_pending_.begin(), link_pending_.end(), std::greater<>());
  } else {
    job.state->Complete(std::move(s));
    l.lock();
  }
}

void CpuDevice::CopyLoop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (busy_) {  // an issuing thread is executing a batch (fast path); it notifies when done
      cv_.wait(l);
      continue;
    }
    // First queued job that is not held and whose dependencies are all done.
    auto it = std::find_if(queue_.begin(), queue_.end(), [](const Job& j) { return j.Runnable(); });
    if (it == queue_.end()) {
      if (stop_) return;
      // Dependencies may complete on other devices' threads; poll them at a short interval as well. A dependency
      // may also be a modelled link transfer still in flight: wake when the next one arrives, if sooner.
      std::chrono::nanoseconds wait = std::chrono::milliseconds(queue_.empty() ? 100 : 1);
      if (!queue_.empty() && !link_pending_.empty()) {
        const absl::Time now = clock_->Now();
        while (!link_pending_.empty() && link_pending_.front() <= now) {
          std::pop_heap(link_pending_.begin(), link_pending_.end(), std::greater<>());
          link_pending_.pop_back();
        }
        if (!link_pending_.empty()) {
          wait = std::min(wait, absl::ToChronoNanoseconds(link_pending_.front() - now));
        }
      }
      cv_.wait_for(l, wait);
      continue;
    }
    Job job = std::move(*it);
    queue_.erase(it);
    busy_ = true;
    l.unlock();
    Execute(job, l);
    busy_ = false;
    cv_.notify_all();
  }
}

ReaderId CpuDevice::BeginReaders(std::span<const DeviceRange> ranges) {
  std::lock_guard<std::mutex> l(mu_);
  return readers_.Begin(ranges);
}

void CpuDevice::EndReaders(ReaderId reader) {
  std::vector<std::shared_ptr<State>> done;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!readers_.End(reader, &done)) return;
  }
  for (auto& s : done) s->Complete(absl::OkStatus());
  cv_.notify_all();  // copies waiting on these fences may run now
}

bool CpuDevice::ReadersBusy(const DeviceRange& range) const {
  std::lock_guard<std::mutex> l(mu_);
  return readers_.Busy(range);
}

CopyEvent CpuDevice::ReadersFence(const DeviceRange& range) {
  auto state = std::make_shared<State>();
  std::lock_guard<std::mutex> l(mu_);
  if (!readers_.AddFence(range, state)) state->Complete(absl::OkStatus());
  return CopyEvent(state);
}

void CpuDevice::SetCopyHook(CopyHook hook) {
  std::lock_guard<std::mutex> l(mu_);
  hook_ = std::move(hook);
}

std::vector<uint64_t> CpuDevice::HeldCopies() const {
  std::lock_guard<std::mutex> l(mu_);
  return HeldCopyIds(queue_);
}

void CpuDevice::ReleaseHeld(uint64_t id, bool fail) {
  std::shared_ptr<State> failed;
  {
    std::lock_guard<std::mutex> l(mu_);
    failed = ReleaseHeldCopy(queue_, id, fail);
  }
  if (failed) failed->Complete(absl::UnavailableError("CpuDevice: copy " + std::to_string(id) + " failed (injected)"));
  cv_.notify_all();
}

void CpuDevice::ReleaseAllHeld() {
  {
    std::lock_guard<std::mutex> l(mu_);
    ReleaseAllHeldCopies(queue_);
  }
  cv_.notify_all();
}

void CpuDevice::WaitIdle() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    const bool runnable = AnyRunnable();
    if (!runnable && !busy_) return;
    ++idle_waiters_;
    cv_.wait_for(l, std::chrono::milliseconds(1));
    --idle_waiters_;
  }
}

void CpuDevice::SetInlineLimit(uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  inline_limit_ = bytes;
}

uint64_t CpuDevice::CopiesIssued() const {
  std::lock_guard<std::mutex> l(mu_);
  return next_copy_id_ - 1;
}

}  // namespace dhs
