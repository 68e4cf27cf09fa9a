// workerd/device/cuda_device.cc: see cuda_device.h. Host C++ (g++) against the CUDA runtime API; no kernels here.
#include "workerd/device/cuda_device.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "workerd/device/cuda_check.h"

namespace dhs {

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the (non-sticky) error
    return 0;
  }
  return n;
}

// A batch or fence: completed on the host (injected failure, failed dependency, fence, cancel) or by a cudaEvent
// recorded after the batch's copies.
class CudaDevice::State final : public EventState {
 public:
  explicit State(int device) : device_(device) {}
  ~State() override {
    if (event_ != nullptr) {
      cudaSetDevice(device_);
      cudaEventDestroy(event_);
    }
  }
  bool Done() const override {
    std::lock_guard<std::mutex> l(mu_);
    PollLocked();
    return done_;
  }
  absl::Status Status() const override {
    std::lock_guard<std::mutex> l(mu_);
    PollLocked();
    return done_ ? status_ : absl::UnavailableError("copy event pending");
  }
  absl::Status Wait() const override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_ || event_ != nullptr; });
    if (done_) return status_;
    cudaEvent_t e = event_;
    l.unlock();
    cudaSetDevice(device_);
    const cudaError_t r = cudaEventSynchronize(e);
    l.lock();
    if (!done_) {
      done_ = true;
      status_ = CudaStatus(r, "CudaDevice: copy");
    }
    return status_;
  }
  void Complete(absl::Status s) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (done_) return;
      done_ = true;
      status_ = std::move(s);
    }
    cv_.notify_all();
  }
  void Issued(cudaEvent_t e) {
    {
      std::lock_guard<std::mutex> l(mu_);
      event_ = e;
    }
    cv_.notify_all();
  }

 private:
  void PollLocked() const {
    if (done_ || event_ == nullptr) return;
    cudaSetDevice(device_);
    const cudaError_t r = cudaEventQuery(event_);
    if (r == cudaErrorNotReady) return;
    done_ = true;
    status_ = CudaStatus(r, "CudaDevice: copy");
  }

  const int device_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool done_ = false;
  mutable absl::Status status_;
  cudaEvent_t event_ = nullptr;
};

CudaDevice::CudaDevice(const CudaDeviceOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const CudaDeviceOptions& options) {
  const int n = CudaDeviceCount();
  if (n == 0) return absl::FailedPreconditionError("CudaDevice: no CUDA device (cudaGetDeviceCount found none)");
  if (options.device < 0 || options.device >= n) {
    return absl::FailedPreconditionError(absl::StrCat("CudaDevice: device ", options.device, " of ", n));
  }
  std::unique_ptr<CudaDevice> d(new CudaDevice(options));
  DHS_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  for (cudaStream_t& s : d->streams_) DHS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DHS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&d->compute_, cudaStreamNonBlocking));
  CudaDevice* raw = d.get();
  d->thread_ = std::thread([raw] { raw->Loop(); });
  return d;
}

CudaDevice::~CudaDevice() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  cudaSetDevice(options_.device);
  for (Job& j : queue_) j.state->Complete(absl::CancelledError("device destroyed"));
  for (auto& f : readers_.PendingFences()) f->Complete(absl::CancelledError("device destroyed"));
  for (auto& [id, end] : reader_ends_) cudaEventDestroy(end);
  for (cudaStream_t s : streams_) {
    if (s != nullptr) cudaStreamSynchronize(s);
  }
  if (compute_ != nullptr) cudaStreamSynchronize(compute_);
  for (auto& st : in_flight_) st->Done();  // settles their status while the context is alive
  for (const MappedPool& m : mapped_) cudaHostUnregister(const_cast<uint8_t*>(m.host));  // while still mapped
  for (Pool& p : pools_) {
    if (p.owned) cudaFree(p.ptr);
  }
  for (cudaStream_t s : streams_) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  if (compute_ != nullptr) cudaStreamDestroy(compute_);
}

void CudaDevice::UseCallerMemoryForNextPool(uint8_t* base, uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  caller_pools_.emplace_back(base, bytes);
}

absl::StatusOr<PoolId> CudaDevice::AllocatePool(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!caller_pools_.empty()) {
      const auto [base, held] = caller_pools_.front();
      caller_pools_.pop_front();
      if (bytes > held) {
        return absl::InvalidArgumentError(
            absl::StrCat("CudaDevice: the caller's pool holds ", held, " bytes; ", bytes, " are needed"));
      }
      pools_.push_back(Pool{base, bytes, /*owned=*/false});
      return static_cast<PoolId>(pools_.size() - 1);
    }
  }
  cudaSetDevice(options_.device);
  void* p = nullptr;
  const cudaError_t e = options_.managed_pools ? cudaMallocManaged(&p, std::max<uint64_t>(bytes, 1))
                                               : cudaMalloc(&p, std::max<uint64_t>(bytes, 1));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("CudaDevice: cannot allocate a pool of ", bytes, " bytes: ", cudaGetErrorName(e)));
  }
  // cudaMemset may return before it completes, and the copy streams (non-blocking) do not wait for the default
  // stream: synchronised before the pool is handed out.
  absl::Status zeroed = CudaStatus(cudaMemset(p, 0, bytes), "CudaDevice: zero-fill of a pool");
  if (zeroed.ok()) zeroed = CudaStatus(cudaDeviceSynchronize(), "CudaDevice: zero-fill of a pool");
  if (!zeroed.ok()) {
    cudaFree(p);
    return zeroed;
  }
  std::lock_guard<std::mutex> l(mu_);
  pools_.push_back(Pool{static_cast<uint8_t*>(p), bytes});
  return static_cast<PoolId>(pools_.size() - 1);
}

uint64_t CudaDevice::PoolBytes(PoolId pool) const {
  std::lock_guard<std::mutex> l(mu_);
  return pool < pools_.size() ? pools_[pool].bytes : 0;
}

uint8_t* CudaDevice::Resolve(const DeviceRange& r) const {
  if (r.pool >= pools_.size() || r.offset < 0) return nullptr;
  const Pool& p = pools_[r.pool];
  if (static_cast<uint64_t>(r.offset) > p.bytes || r.bytes > p.bytes - static_cast<uint64_t>(r.offset)) return nullptr;
  return p.ptr + r.offset;
}

uint8_t* CudaDevice::DevicePointer(PoolId pool, Location offset) const {
  std::lock_guard<std::mutex> l(mu_);
  return Resolve(DeviceRange{pool, offset, 0});
}

uint8_t* CudaDevice::HostVisible(PoolId pool, Location offset) {
  if (!options_.managed_pools) return nullptr;
  return DevicePointer(pool, offset);
}

absl::StatusOr<uint8_t*> CudaDevice::RegisterHostPool(std::span<uint8_t> host) {
  if (host.empty()) return absl::InvalidArgumentError("CudaDevice: empty host pool");
  cudaSetDevice(options_.device);
  if (const cudaError_t e =
          cudaHostRegister(host.data(), host.size(), cudaHostRegisterPortable | cudaHostRegisterMapped);
      e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it for the next call on this thread
    return CudaStatus(e, "CudaDevice: cudaHostRegister of the host pool");
  }
  void* dev = nullptr;
  if (absl::Status s = CudaStatus(cudaHostGetDevicePointer(&dev, host.data(), 0), "cudaHostGetDevicePointer");
      !s.ok()) {
    cudaHostUnregister(host.data());
    return s;
  }
  std::lock_guard<std::mutex> l(mu_);
  mapped_.push_back(MappedPool{host.data(), host.size(), static_cast<uint8_t*>(dev)});
  return static_cast<uint8_t*>(dev);
}

absl::Status CudaDevice::UnregisterHostPool(std::span<uint8_t> host) {
  cudaSetDevice(options_.device);
  {
    std::lock_guard<std::mutex> l(mu_);
    std::erase_if(mapped_, [&](const MappedPool& m) { return m.host == host.data(); });
  }
  return CudaStatus(cudaHostUnregister(host.data()), "cudaHostUnregister");
}

const uint8_t* CudaDevice::MappedHostAddress(const uint8_t* host) const {
  std::lock_guard<std::mutex> l(mu_);
  for (const MappedPool& m : mapped_) {
    if (host >= m.host && host < m.host + m.bytes) return m.device + (host - m.host);
  }
  return nullptr;
}

absl::StatusOr<void*> CudaDevice::AllocateShared(uint64_t bytes) {
  cudaSetDevice(options_.device);
  void* p = nullptr;
  if (absl::Status s = CudaStatus(cudaMallocManaged(&p, bytes), "CudaDevice: cudaMallocManaged"); !s.ok()) return s;
  absl::Status zeroed = CudaStatus(cudaMemset(p, 0, bytes), "CudaDevice: cudaMemset");
  if (zeroed.ok()) zeroed = CudaStatus(cudaDeviceSynchronize(), "CudaDevice: cudaMemset");  // before the host writes
  if (!zeroed.ok()) {
    cudaFree(p);
    return zeroed;
  }
  return p;
}

void CudaDevice::FreeShared(void* block) {
  cudaSetDevice(options_.device);
  cudaFree(block);
}

absl::Status CudaDevice::Synchronize() {
  cudaSetDevice(options_.device);
  return CudaStatus(cudaStreamSynchronize(compute_), "CudaDevice: cudaStreamSynchronize (compute)");
}

CopyEvent CudaDevice::Submit(CopyKind kind, std::vector<Op> ops, std::vector<DeviceRange> device, bool valid,
                             std::span<const CopyEvent> after) {
  auto state = std::make_shared<State>(options_.device);
  CopyInfo info;
  CopyHook hook;
  {
    std::lock_guard<std::mutex> l(mu_);
    info.id = next_copy_id_++;
    hook = hook_;
  }
  if (!valid) {
    state->Complete(absl::InvalidArgumentError("CudaDevice: copy range outside its device pool"));
    return CopyEvent(state);
  }
  info.kind = kind;
  info.device = std::move(device);
  const CopyFate fate = hook ? hook(info) : CopyFate::kRun;
  if (fate == CopyFate::kFail) {
    state->Complete(absl::UnavailableError("CudaDevice: copy " + std::to_string(info.id) + " failed (injected)"));
    return CopyEvent(state);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(Job{info.id, kind, std::move(ops), std::vector<CopyEvent>(after.begin(), after.end()), state,
                         fate == CopyFate::kHold});
  }
  cv_.notify_all();
  return CopyEvent(state);
}

CopyEvent CudaDevice::CopyHostToDevice(std::span<const HostToDeviceCopy> ops, std::span<const CopyEvent> after) {
  std::vector<Op> v;
  std::vector<DeviceRange> dev;
  bool valid = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& o : ops) {
      uint8_t* d = Resolve(o.dst);
      valid = valid && d != nullptr && o.src != nullptr;
      v.push_back(Op{d, o.src, o.dst.bytes});
      dev.push_back(o.dst);
    }
  }
  return Submit(CopyKind::kHostToDevice, std::move(v), std::move(dev), valid, after);
}

CopyEvent CudaDevice::CopyDeviceToHost(std::span<const DeviceToHostCopy> ops, std::span<const CopyEvent> after) {
  std::vector<Op> v;
  std::vector<DeviceRange> dev;
  bool valid = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& o : ops) {
      const uint8_t* s = Resolve(o.src);
      valid = valid && s != nullptr && o.dst != nullptr;
      v.push_back(Op{o.dst, s, o.src.bytes});
      dev.push_back(o.src);
    }
  }
  return Submit(CopyKind::kDeviceToHost, std::move(v), std::move(dev), valid, after);
}

CopyEvent CudaDevice::CopyDeviceToDevice(std::span<const DeviceToDeviceCopy> ops, std::span<const CopyEvent> after) {
  std::vector<Op> v;
  std::vector<DeviceRange> dev;
  bool valid = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& o : ops) {
      uint8_t* d = Resolve(o.dst);
      const uint8_t* s = Resolve(o.src);
      valid = valid && d != nullptr && s != nullptr && o.src.bytes == o.dst.bytes;
      v.push_back(Op{d, s, o.dst.bytes});
      dev.push_back(o.dst);
    }
  }
  return Submit(CopyKind::kDeviceToDevice, std::move(v), std::move(dev), valid, after);
}

void CudaDevice::Loop() {
  cudaSetDevice(options_.device);
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    // Readers ended by an event: end those whose event completed.
    std::vector<std::shared_ptr<State>> fences_done;
    for (auto it = reader_ends_.begin(); it != reader_ends_.end();) {
      const ReaderId id = it->first;
      const cudaEvent_t end = it->second;
      ++it;
      if (cudaEventQuery(end) != cudaErrorNotReady) EndReaderLocked(id, &fences_done);
    }
    std::erase_if(in_flight_, [](const std::shared_ptr<State>& s) { return s->Done(); });
    if (!fences_done.empty()) {
      l.unlock();
      for (auto& s : fences_done) s->Complete(absl::OkStatus());
      l.lock();
      cv_.notify_all();
    }
    auto it = std::find_if(queue_.begin(), queue_.end(), [](const Job& j) { return j.Runnable(); });
    if (it == queue_.end()) {
      if (stop_) return;
      const bool polling = !queue_.empty() || !in_flight_.empty() || !reader_ends_.empty();
      cv_.wait_for(l, polling ? std::chrono::microseconds(200) : std::chrono::milliseconds(100));
      continue;
    }
    Job job = std::move(*it);
    queue_.erase(it);
    busy_ = true;
    l.unlock();
    absl::Status s = DependencyStatus(job.after, "CudaDevice", job.id);
    cudaEvent_t ev = nullptr;
    if (s.ok()) {
      cudaStream_t stream = streams_[static_cast<int>(job.kind)];
      for (const Op& op : job.ops) {
        if (op.bytes == 0) continue;
        s = CudaStatus(cudaMemcpyAsync(op.dst, op.src, op.bytes, cudaMemcpyDefault, stream),
                       absl::StrCat("CudaDevice: cudaMemcpyAsync of copy ", job.id));
        if (!s.ok()) break;
      }
      if (s.ok()) s = CudaStatus(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
      if (s.ok()) {
        s = CudaStatus(cudaEventRecord(ev, stream), "cudaEventRecord");
        if (!s.ok()) cudaEventDestroy(ev);
      }
    }
    if (s.ok()) {
      job.state->Issued(ev);
    } else {
      job.state->Complete(std::move(s));
    }
    l.lock();
    if (s.ok()) in_flight_.push_back(job.state);
    busy_ = false;
    cv_.notify_all();
  }
}

ReaderId CudaDevice::BeginReaders(std::span<const DeviceRange> ranges) {
  std::lock_guard<std::mutex> l(mu_);
  return readers_.Begin(ranges);
}

void CudaDevice::EndReaderLocked(ReaderId reader, std::vector<std::shared_ptr<State>>* done) {
  if (auto e = reader_ends_.find(reader); e != reader_ends_.end()) {
    cudaEventDestroy(e->second);
    reader_ends_.erase(e);
  }
  readers_.End(reader, done);
}

void CudaDevice::EndReaders(ReaderId reader) {
  std::vector<std::shared_ptr<State>> done;
  {
    std::lock_guard<std::mutex> l(mu_);
    cudaSetDevice(options_.device);
    EndReaderLocked(reader, &done);
  }
  for (auto& s : done) s->Complete(absl::OkStatus());
  cv_.notify_all();
}

absl::Status CudaDevice::EndReadersAfter(ReaderId reader, cudaStream_t stream) {
  cudaSetDevice(options_.device);
  cudaEvent_t ev = nullptr;
  absl::Status s = CudaStatus(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  if (s.ok()) {
    s = CudaStatus(cudaEventRecord(ev, stream), "cudaEventRecord (reader fence)");
    if (!s.ok()) cudaEventDestroy(ev);
  }
  if (!s.ok()) {
    cudaStreamSynchronize(stream);
    EndReaders(reader);
    return s;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!readers_.Known(reader) || reader_ends_.contains(reader)) {
      cudaEventDestroy(ev);
      return absl::OkStatus();
    }
    reader_ends_.emplace(reader, ev);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

bool CudaDevice::ReadersBusy(const DeviceRange& range) const {
  std::lock_guard<std::mutex> l(mu_);
  return readers_.Busy(range);
}

CopyEvent CudaDevice::ReadersFence(const DeviceRange& range) {
  auto state = std::make_shared<State>(options_.device);
  std::lock_guard<std::mutex> l(mu_);
  if (!readers_.AddFence(range, state)) state->Complete(absl::OkStatus());
  return CopyEvent(state);
}

void CudaDevice::SetCopyHook(CopyHook hook) {
  std::lock_guard<std::mutex> l(mu_);
  hook_ = std::move(hook);
}

std::vector<uint64_t> CudaDevice::HeldCopies() const {
  std::lock_guard<std::mutex> l(mu_);
  return HeldCopyIds(queue_);
}

void CudaDevice::ReleaseHeld(uint64_t id, bool fail) {
  std::shared_ptr<State> failed;
  {
    std::lock_guard<std::mutex> l(mu_);
    failed = ReleaseHeldCopy(queue_, id, fail);
  }
  if (failed) failed->Complete(absl::UnavailableError("CudaDevice: copy " + std::to_string(id) + " failed (injected)"));
  cv_.notify_all();
}

void CudaDevice::ReleaseAllHeld() {
  {
    std::lock_guard<std::mutex> l(mu_);
    ReleaseAllHeldCopies(queue_);
  }
  cv_.notify_all();
}

void CudaDevice::WaitIdle() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    const bool runnable = AnyRunnable(queue_);
    const bool copying = std::any_of(in_flight_.begin(), in_flight_.end(),
                                     [](const std::shared_ptr<State>& s) { return !s->Done(); });
    if (!runnable && !busy_ && !copying) return;
    cv_.wait_for(l, std::chrono::microseconds(200));
  }
}

uint64_t CudaDevice::CopiesIssued() const {
  std::lock_guard<std::mutex> l(mu_);
  return next_copy_id_ - 1;
}

}  // namespace dhs
