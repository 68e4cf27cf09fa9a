// workerd/device/cpu_device.cc: see cpu_device.h.
#include "workerd/device/cpu_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dhs {

namespace {
// Set while a thread evaluates dependencies inside an asynchronous step (or WaitIdle): a Done() it calls then must not
// count as a poll (that would take the device's mutex again).
thread_local bool tl_in_async_step = false;
struct InAsyncStep {
  InAsyncStep() : was(tl_in_async_step) { tl_in_async_step = true; }
  ~InAsyncStep() { tl_in_async_step = was; }
  bool was;
};
}  // namespace

// The asynchronous mode's way from an event back to its device: a poll of a pending event is one device step. The
// device clears `device` when destroyed (events may outlive it).
class CpuDevice::AsyncLink {
 public:
  explicit AsyncLink(CpuDevice* d) : device_(d) {}
  // One step of the device; false when nothing can move by time alone (or the device is gone).
  bool Step() {
    if (tl_in_async_step) return false;
    std::lock_guard<std::mutex> l(mu_);
    return device_ != nullptr && device_->Step();
  }
  // Completes what `state` waits for at once, as a GPU synchronizing on one event: its batch and the batches it
  // depends on run, the readers of the fences among them end (only those their owner ended). False when nothing
  // could move.
  bool Force(const EventState* state) {
    if (tl_in_async_step) return false;
    std::lock_guard<std::mutex> l(mu_);
    if (device_ == nullptr) return false;
    std::lock_guard<std::mutex> dl(device_->mu_);
    return device_->ForceLocked(state, 0);
  }
  // Whether `state` waits (through its dependencies) for a reader the calling thread began and has not ended: a
  // wait on this thread can never end.
  bool WaitsForOwnOpenReader(const EventState* state) {
    std::lock_guard<std::mutex> l(mu_);
    if (device_ == nullptr) return false;
    std::lock_guard<std::mutex> dl(device_->mu_);
    return device_->WaitsForOwnOpenReaderLocked(state, std::this_thread::get_id(), 0);
  }
  std::string Describe(const EventState* state) {
    std::lock_guard<std::mutex> l(mu_);
    if (device_ == nullptr) return "the device was destroyed";
    std::lock_guard<std::mutex> dl(device_->mu_);
    return device_->DescribeWait(state);
  }
  absl::Duration stuck_after() {
    std::lock_guard<std::mutex> l(mu_);
    return device_ == nullptr ? absl::ZeroDuration() : device_->async_.stuck_after;
  }
  void Detach() {
    std::lock_guard<std::mutex> l(mu_);
    device_ = nullptr;
  }

 private:
  std::mutex mu_;
  CpuDevice* device_;
};

// Event state completed by the device (copy thread or EndReaders). Waiters block on its own condition variable.
// With the link model, a completed event is done only once its clock reaches ready_at_ (the modelled delivery).
class CpuDevice::State final : public EventState {
 public:
  State() = default;
  explicit State(std::shared_ptr<AsyncLink> async) : async_(std::move(async)) {}

  bool Done() const override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (Arrived() || async_ == nullptr) return Arrived();
    }
    async_->Step();  // asynchronous mode: a poll of a pending event is a device step
    std::lock_guard<std::mutex> l(mu_);
    return Arrived();
  }
  absl::Status Status() const override {
    std::lock_guard<std::mutex> l(mu_);
    return Arrived() ? status_ : absl::UnavailableError("copy event pending");
  }
  absl::Status Wait() const override {
    if (async_ != nullptr) return WaitAsync();
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

  // Asynchronous mode: completes what the event waits for at once (AsyncLink::Force), without moving the device's
  // time (other readers keep reading). When nothing can move (the event waits for readers their owner has not ended,
  // a held copy or another device), waits for other threads for up to stuck_after, then fails naming what it waits
  // for (a test then fails with that state, not by a hang).
  absl::Status WaitAsync() const {
    absl::Time last_progress = absl::Now();
    async_->Step();  // the wait is a poll
    for (;;) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (done_) return status_;
      }
      if (async_->Force(this)) {
        last_progress = absl::Now();
        continue;
      }
      if (async_->WaitsForOwnOpenReader(this)) {  // this thread would wait for itself: fail now, not after the bound
        return absl::DeadlineExceededError(absl::StrCat(
            "CpuDevice (asynchronous mode): a wait that can never end (it waits for a reader this thread began and "
            "has not ended): ",
            async_->Describe(this)));
      }
      std::unique_lock<std::mutex> l(mu_);
      if (done_) return status_;
      const absl::Duration bound = async_->stuck_after();
      if (bound > absl::ZeroDuration() && absl::Now() - last_progress > bound) {
        l.unlock();
        return absl::DeadlineExceededError(absl::StrCat("CpuDevice (asynchronous mode): a wait made no progress for ",
                                                        absl::FormatDuration(bound), ": ", async_->Describe(this)));
      }
      cv_.wait_for(l, std::chrono::milliseconds(1));
    }
  }

  const std::shared_ptr<AsyncLink> async_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
  const LinkClock* clock_ = nullptr;
  absl::Time ready_at_ = absl::InfinitePast();
};

CpuDevice::CpuDevice() : CpuDevice(LinkModelConfig{}) {}

CpuDevice::CpuDevice(const LinkModelConfig& link, const LinkClock* clock)
    : CpuDevice(link, clock, AsyncDeviceConfig{}) {}

CpuDevice::CpuDevice(const AsyncDeviceConfig& async) : CpuDevice(LinkModelConfig{}, RealLinkClock(), async) {}

CpuDevice::CpuDevice(const LinkModelConfig& link, const LinkClock* clock, const AsyncDeviceConfig& async)
    : link_config_(async.enabled ? LinkModelConfig{} : link),
      clock_(clock),
      link_(async.enabled ? LinkModelConfig{} : link),
      async_(async),
      async_link_(async.enabled ? std::make_shared<AsyncLink>(this) : nullptr),
      rng_state_(async.seed),
      thread_([this] { CopyLoop(); }) {}

CpuDevice::~CpuDevice() {
  if (async_link_) async_link_->Detach();
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (Job& j : queue_) j.state->Complete(absl::CancelledError("device destroyed"));
  for (auto& f : readers_.PendingFences()) f->Complete(absl::CancelledError("device destroyed"));
}

void CpuDevice::UseCallerMemoryForNextPool(uint8_t* base, uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  caller_pools_.emplace_back(base, bytes);
}

absl::StatusOr<PoolId> CpuDevice::AllocatePool(uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  if (!caller_pools_.empty()) {
    const auto [base, held] = caller_pools_.front();
    caller_pools_.pop_front();
    if (bytes > held) {
      return absl::InvalidArgumentError("CpuDevice: the caller's pool holds " + std::to_string(held) + " bytes; " +
                                        std::to_string(bytes) + " are needed");
    }
    pools_.emplace_back(base, bytes, /*own=*/false);
    return static_cast<PoolId>(pools_.size() - 1);
  }
  void* data = ::mmap(nullptr, std::max<uint64_t>(bytes, 1), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);  // zero pages, taken when first written
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError("CpuDevice: cannot allocate a pool of " + std::to_string(bytes) + " bytes");
  }
  pools_.emplace_back(static_cast<uint8_t*>(data), bytes);
  return static_cast<PoolId>(pools_.size() - 1);
}

CpuDevice::Pool::~Pool() {
  if (data != nullptr && owned) ::munmap(data, std::max<uint64_t>(bytes, 1));
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
  auto state = async_link_ ? std::make_shared<State>(async_link_) : std::make_shared<State>();
  if (!valid) {
    state->Complete(absl::InvalidArgumentError("CpuDevice: copy range outside its device pool"));
    return CopyEvent(state);
  }
  CopyFate fate = CopyFate::kRun;
  if (hook) {
    CopyInfo info;
    info.id = id;
    info.kind = kind;
    info.device = device;
    fate = hook(info);
  }
  if (fate == CopyFate::kFail) {
    state->Complete(absl::UnavailableError("CpuDevice: copy " + std::to_string(id) + " failed (injected)"));
    return CopyEvent(state);
  }
  Job job{id, kind, std::move(ops), std::vector<CopyEvent>(after.begin(), after.end()), state,
          fate == CopyFate::kHold, {}};
  if (async_.enabled) {  // no fast path, no copy thread: the batch runs when a later step finds it due
    if (kind != CopyKind::kDeviceToHost) job.written = std::move(device);
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(std::move(job));
      StepLocked();
    }
    return CopyEvent(state);
  }
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

template <class Copy, class DeviceSide, class ToOp>
CopyEvent CpuDevice::Enqueue(CopyKind kind, std::span<const Copy> ops, DeviceSide device_side, ToOp to_op,
                             std::span<const CopyEvent> after) {
  std::vector<Op> v(ops.size());
  std::vector<DeviceRange> dev;
  bool valid = true;
  uint64_t id;
  CopyHook hook;
  {
    std::lock_guard<std::mutex> l(mu_);
    id = next_copy_id_++;
    if (hook_ || async_.enabled) {
      hook = hook_;
      dev.reserve(ops.size());
      for (const Copy& o : ops) dev.push_back(device_side(o));
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      v[i] = to_op(ops[i]);
      valid = valid && v[i].dst != nullptr && v[i].src != nullptr;
    }
  }
  return Submit(kind, id, std::move(hook), std::move(v), std::move(dev), valid, after);
}

CopyEvent CpuDevice::CopyHostToDevice(std::span<const HostToDeviceCopy> ops, std::span<const CopyEvent> after) {
  return Enqueue(
      CopyKind::kHostToDevice, ops, [](const HostToDeviceCopy& o) { return o.dst; },
      [this](const HostToDeviceCopy& o) { return Op{Resolve(o.dst), o.src, o.dst.bytes}; }, after);
}

CopyEvent CpuDevice::CopyDeviceToHost(std::span<const DeviceToHostCopy> ops, std::span<const CopyEvent> after) {
  return Enqueue(
      CopyKind::kDeviceToHost, ops, [](const DeviceToHostCopy& o) { return o.src; },
      [this](const DeviceToHostCopy& o) { return Op{o.dst, Resolve(o.src), o.src.bytes}; }, after);
}

CopyEvent CpuDevice::CopyDeviceToDevice(std::span<const DeviceToDeviceCopy> ops, std::span<const CopyEvent> after) {
  // Unequal lengths make the batch invalid: its src is dropped so that the check in Enqueue fails.
  return Enqueue(
      CopyKind::kDeviceToDevice, ops, [](const DeviceToDeviceCopy& o) { return o.dst; },
      [this](const DeviceToDeviceCopy& o) {
        const uint8_t* s = o.src.bytes == o.dst.bytes ? Resolve(o.src) : nullptr;
        return Op{Resolve(o.dst), s, o.dst.bytes};
      },
      after);
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
  if (async_.enabled) {  // every batch runs in a step (StepLocked)
    cv_.wait(l, [&] { return stop_; });
    return;
  }
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
  const ReaderId id = readers_.Begin(ranges);
  if (async_.enabled) {
    reader_begun_[id] = step_ + 1;
    reader_thread_[id] = std::this_thread::get_id();
    StepLocked();
  }
  return id;
}

void CpuDevice::EndReaders(ReaderId reader) {
  std::vector<std::shared_ptr<State>> done;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (async_.enabled) {  // the reads end later than this call, as a kernel's after its launch
      if (!readers_.Known(reader) ||
          std::any_of(ending_.begin(), ending_.end(), [&](const Ending& e) { return e.reader == reader; })) {
        return;
      }
      ending_.push_back(Ending{reader, step_ + 1, step_ + 1 + Draw(async_.reader_steps_min, async_.reader_steps_max)});
      StepLocked();
      return;
    }
    if (!readers_.End(reader, &done)) return;
  }
  // Issue 27: most readers end with no fence waiting on them (a decode step ends one reader per layer group). Waking
  // the copy thread then bought nothing and, on a loaded CPU, cost the worker its time slice; a copy becomes runnable
  // only when one of its fences completes here, and the copy loop polls its queue besides.
  if (done.empty()) return;
  for (auto& s : done) s->Complete(absl::OkStatus());
  cv_.notify_all();  // copies waiting on these fences may run now
}

bool CpuDevice::ReadersBusy(const DeviceRange& range) const {
  std::lock_guard<std::mutex> l(mu_);
  return readers_.Busy(range);
}

CopyEvent CpuDevice::ReadersFence(const DeviceRange& range) {
  auto state = async_link_ ? std::make_shared<State>(async_link_) : std::make_shared<State>();
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
  if (async_.enabled) {  // time moves on until nothing waits for it (held copies and open readers stay)
    while (StepLocked()) {
    }
    return;
  }
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

namespace dhs {

// ---- asynchronous mode ----

uint32_t CpuDevice::Draw(uint32_t lo, uint32_t hi) {
  // splitmix64: small, seeded, the same sequence on every platform.
  uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  if (hi <= lo) return lo;
  return lo + static_cast<uint32_t>(z % (uint64_t{hi} - lo + 1));
}

bool CpuDevice::Step() {
  std::lock_guard<std::mutex> l(mu_);
  return StepLocked();
}

bool CpuDevice::StepLocked() {
  InAsyncStep guard;
  ++step_;
  bool moved = false;
  std::vector<std::shared_ptr<State>> fences;
  for (auto it = ending_.begin(); it != ending_.end();) {
    if (it->due > step_) {
      ++it;
      continue;
    }
    readers_.End(it->reader, &fences);
    reader_begun_.erase(it->reader);
    reader_thread_.erase(it->reader);
    it = ending_.erase(it);
    moved = true;
  }
  for (auto& f : fences) f->Complete(absl::OkStatus());  // State's mutex is a leaf: completing under mu_ is safe
  // Batches: the first step that finds one runnable draws its delay; it executes once that many steps passed. A
  // batch completed here may make a later one runnable in the same step (a join of events, a dependent copy).
  for (bool again = true; again;) {
    again = false;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (!it->Runnable()) {
        ++it;
        continue;
      }
      auto [due, fresh] = job_due_.try_emplace(it->id, 0);
      if (fresh) due->second = step_ + Draw(1, std::max<uint32_t>(1, async_.copy_steps_max));
      if (due->second > step_) {
        ++it;
        continue;
      }
      Job job = std::move(*it);
      it = queue_.erase(it);
      job_due_.erase(job.id);
      ExecuteAsync(job);
      moved = again = true;
    }
  }
  return moved || !ending_.empty() || !job_due_.empty();
}

void CpuDevice::ExecuteAsync(Job& job) {
  absl::Status s = DependencyStatus(job.after, "CpuDevice", job.id);
  if (s.ok()) {
    CheckWrite(job);
    for (const Op& op : job.ops) {
      if (op.bytes > 0) std::memmove(op.dst, op.src, op.bytes);
    }
  }
  job.state->Complete(std::move(s));
}

bool CpuDevice::EndNowLocked(ReaderId r) {
  auto e = std::find_if(ending_.begin(), ending_.end(), [&](const Ending& x) { return x.reader == r; });
  if (e == ending_.end()) return false;  // not ended by its owner: it cannot be forced
  std::vector<std::shared_ptr<State>> fences;
  readers_.End(r, &fences);
  reader_begun_.erase(r);
  reader_thread_.erase(r);
  ending_.erase(e);
  for (auto& f : fences) f->Complete(absl::OkStatus());
  return true;
}

bool CpuDevice::WaitsForOwnOpenReaderLocked(const EventState* state, std::thread::id self, int depth) const {
  if (depth > 256) return false;
  InAsyncStep guard;
  for (ReaderId r : readers_.FenceReaders(state)) {
    const bool open = std::none_of(ending_.begin(), ending_.end(), [&](const Ending& e) { return e.reader == r; });
    auto t = reader_thread_.find(r);
    if (open && t != reader_thread_.end() && t->second == self) return true;
  }
  for (const Job& j : queue_) {
    if (static_cast<const EventState*>(j.state.get()) != state) continue;
    for (const CopyEvent& e : j.after) {
      if (e.state() != nullptr && !e.state()->Done() && WaitsForOwnOpenReaderLocked(e.state(), self, depth + 1)) {
        return true;
      }
    }
  }
  return false;
}

bool CpuDevice::ForceLocked(const EventState* state, int depth) {
  if (depth > 256) return false;
  InAsyncStep guard;
  bool moved = false;
  for (ReaderId r : readers_.FenceReaders(state)) moved = EndNowLocked(r) || moved;
  auto find = [&](const EventState* s) {
    return std::find_if(queue_.begin(), queue_.end(),
                        [&](const Job& j) { return static_cast<const EventState*>(j.state.get()) == s; });
  };
  auto it = find(state);
  if (it == queue_.end() || it->held) return moved;
  const std::vector<CopyEvent> after = it->after;  // the queue may change below
  for (const CopyEvent& e : after) {
    if (e.state() != nullptr && !e.state()->Done()) moved = ForceLocked(e.state(), depth + 1) || moved;
  }
  it = find(state);
  if (it == queue_.end() || !it->Runnable()) return moved;
  Job job = std::move(*it);
  queue_.erase(it);
  job_due_.erase(job.id);
  ExecuteAsync(job);
  return true;
}

std::string CpuDevice::DescribeReader(ReaderId r) const {
  auto begun = reader_begun_.find(r);
  std::string out = absl::StrCat("reader ", r, " (begun at step ", begun == reader_begun_.end() ? 0 : begun->second);
  auto e = std::find_if(ending_.begin(), ending_.end(), [&](const Ending& x) { return x.reader == r; });
  if (e == ending_.end()) {
    absl::StrAppend(&out, ", not ended by its owner)");
  } else {
    absl::StrAppend(&out, ", ended by its owner at step ", e->ended_at, ", reading until step ", e->due, ")");
  }
  return out;
}

void CpuDevice::CheckWrite(const Job& job) {
  static constexpr const char* kKind[] = {"host->device", "device->host", "device->device"};
  for (const DeviceRange& w : job.written) {
    for (const auto& [reader, r] : readers_.Overlapping(w)) {
      Hazard(absl::StrCat("copy ", job.id, " (", kKind[static_cast<int>(job.kind)], ") wrote pool ", w.pool,
                          " bytes [", w.offset, ", ", w.offset + static_cast<int64_t>(w.bytes), ") at step ", step_,
                          " while ", DescribeReader(reader), " still read [", r.offset, ", ",
                          r.offset + static_cast<int64_t>(r.bytes),
                          "): the write did not wait for that reader's fence, so on a GPU the reader returns foreign "
                          "bytes"));
    }
  }
}

void CpuDevice::Hazard(std::string what) {
  ++hazard_count_;
  if (hazards_.size() < 8) hazards_.push_back(what);
  if (async_.fatal_hazards) {
    std::fprintf(stderr, "CpuDevice (asynchronous mode): read hazard: %s\n", what.c_str());
    std::fflush(stderr);
    std::abort();
  }
}

void CpuDevice::Freed(const DeviceRange& range) {
  if (!async_.enabled) return;
  std::lock_guard<std::mutex> l(mu_);
  // Freed memory is garbage until its next owner writes it: a later read through a stale mapping returns foreign
  // bytes. Readers still in flight over it are read hazards.
  if (uint8_t* p = Resolve(range)) std::memset(p, kPoisonByte, range.bytes);
  std::vector<std::pair<ReaderId, DeviceRange>> readers = readers_.Overlapping(range);
  for (const auto& [reader, r] : readers) {
    Hazard(absl::StrCat("pool ", range.pool, " bytes [", range.offset, ", ",
                        range.offset + static_cast<int64_t>(range.bytes), ") were freed at step ", step_, " while ",
                        DescribeReader(reader), " still read [", r.offset, ", ", r.offset + static_cast<int64_t>(r.bytes),
                        "): freed before its readers ended (poisoned with 0xDB), so a read after reuse returns "
                        "foreign bytes"));
  }
}

absl::Status CpuDevice::ReadHazards() const {
  std::lock_guard<std::mutex> l(mu_);
  if (hazard_count_ == 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("CpuDevice (asynchronous mode): ", hazard_count_, " read hazard(s); first: ",
                                          hazards_.front()));
}

uint64_t CpuDevice::AsyncSteps() const {
  std::lock_guard<std::mutex> l(mu_);
  return step_;
}

std::string CpuDevice::DescribeWait(const EventState* state) const {
  // The batch behind `state`, or the fence, and what each of its pending dependencies waits for.
  InAsyncStep guard;  // the Done() below must not count as polls
  auto describe_event = [&](const EventState* s) -> std::string {
    for (const Job& j : queue_) {
      if (static_cast<const EventState*>(j.state.get()) != s) continue;
      return absl::StrCat("copy ", j.id, j.held ? " (held by the copy hook)" : "");
    }
    std::vector<ReaderId> rs = readers_.FenceReaders(s);
    if (!rs.empty()) {
      std::vector<std::string> parts;
      for (ReaderId r : rs) parts.push_back(DescribeReader(r));
      return absl::StrCat("the fence of ", absl::StrJoin(parts, ", "));
    }
    return "an event of another device";
  };
  std::string out = absl::StrCat("at step ", step_, ", ", describe_event(state));
  for (const Job& j : queue_) {
    if (static_cast<const EventState*>(j.state.get()) != state) continue;
    std::vector<std::string> deps;
    for (const CopyEvent& e : j.after) {
      if (!e.state() || e.state()->Done()) continue;
      deps.push_back(describe_event(e.state()));
    }
    if (!deps.empty()) absl::StrAppend(&out, " waits for ", absl::StrJoin(deps, "; "));
  }
  return out;
}

}  // namespace dhs
