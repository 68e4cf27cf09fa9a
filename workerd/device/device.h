// workerd/device/device.h: the device backend the worker uses (brief §3, §9).
//
// Owns nothing by itself; a Device implementation owns the device pools (allocated once at start and addressed by
// byte offset, a `Location`), the copy queues (host->device, device->host, device->device) and reader tracking.
// Every copy is asynchronous: it returns a CopyEvent, and nothing may assume the bytes moved before the event is done.
// A copy may wait for other events first (`after`), like a CUDA stream waiting on events. Reader tracking: an
// attention pass that reads a set of ranges is a reader (BeginReaders/EndReaders); ReadersFence(range) gives an event
// that completes once every reader overlapping the range at the time of the call has ended.
//
// Implementations: CpuDevice (cpu_device.h, pools in host arenas, a copy thread); CudaDevice (cuda_device.h: pools by
// cudaMalloc, host memory by cudaHostRegister, queues on streams, events by cudaEvent_t), which also has a compute
// side (DeviceCompute) on which the kv code runs its resolver kernel (workerd/kv/kernel_resolver.h).
//
// Thread-safety: all Device methods may be called from any thread. CopyEvent is a cheap shared handle; its methods
// are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs {

using PoolId = uint32_t;    // index of a device pool, in allocation order
using ReaderId = uint64_t;  // one reader (attention pass), 0 is never used

// `bytes` bytes at byte offset `offset` of device pool `pool`.
struct DeviceRange {
  PoolId pool = 0;
  Location offset = 0;
  uint64_t bytes = 0;
};

// True when the two ranges share at least one byte.
inline bool Overlaps(const DeviceRange& a, const DeviceRange& b) {
  return a.pool == b.pool && a.offset < b.offset + static_cast<int64_t>(b.bytes) &&
         b.offset < a.offset + static_cast<int64_t>(a.bytes);
}

struct HostToDeviceCopy {
  DeviceRange dst;
  const uint8_t* src = nullptr;  // dst.bytes bytes; must stay valid until the event is done
};
struct DeviceToHostCopy {
  uint8_t* dst = nullptr;  // src.bytes bytes; must stay valid until the event is done
  DeviceRange src;
};
struct DeviceToDeviceCopy {
  DeviceRange dst;
  DeviceRange src;  // src.bytes must equal dst.bytes
};

// The completion state behind a CopyEvent; implemented by each backend.
class EventState {
 public:
  virtual ~EventState() = default;
  virtual bool Done() const = 0;              // completed or failed
  virtual absl::Status Status() const = 0;    // OK once completed; the error once failed; UNAVAILABLE while pending
  virtual absl::Status Wait() const = 0;      // blocks until done; returns Status()
};

// A device-side completion event (a batch of copies, or a reader fence). A default-constructed CopyEvent is
// already complete (nothing to wait for).
class CopyEvent {
 public:
  CopyEvent() = default;
  explicit CopyEvent(std::shared_ptr<const EventState> state) : state_(std::move(state)) {}

  bool Done() const { return state_ == nullptr || state_->Done(); }
  bool Failed() const { return state_ != nullptr && state_->Done() && !state_->Status().ok(); }
  // Blocks until done. OK, or the copy's error (bytes of a failed copy are not written).
  absl::Status Wait() const { return state_ == nullptr ? absl::OkStatus() : state_->Wait(); }
  absl::Status Status() const { return state_ == nullptr ? absl::OkStatus() : state_->Status(); }
  // The state behind the event (nullptr: complete); for a device to recognise its own events (CpuDevice's
  // asynchronous mode names what a stuck wait waits for).
  const EventState* state() const { return state_.get(); }

 private:
  std::shared_ptr<const EventState> state_;
};

// The compute side of a device (issue 23): what the kv code needs to run its own kernels (the fused resolver's,
// workerd/kv/resolver_kernel.h, behind workerd/kv/kernel_resolver.h) on this device's memory, without naming the
// backend. Device::Compute() returns it for a backend that runs kernels (CudaDevice); nullptr otherwise (CpuDevice:
// the kv code keeps its CPU path). Addresses returned are the device's (kernel arguments); the shared blocks are
// addressed at the same pointer by the host and the device.
//
// Thread-safety: as Device; the host may read or write a shared block only while no kernel using it runs (after
// Synchronize).
class DeviceCompute {
 public:
  virtual ~DeviceCompute() = default;
  // Device address of byte `offset` of `pool`; nullptr when out of range.
  virtual uint8_t* PoolAddress(PoolId pool, Location offset) const = 0;
  // Device address of host byte `host` inside a host pool registered for device reads (CudaDevice::RegisterHostPool:
  // pinned, mapped); nullptr when `host` lies in no registered pool.
  virtual const uint8_t* MappedHostAddress(const uint8_t* host) const = 0;
  // A block of `bytes` bytes (zero-filled) that the host and the device address at the returned pointer; freed by
  // FreeShared. Errors: RESOURCE_EXHAUSTED.
  virtual absl::StatusOr<void*> AllocateShared(uint64_t bytes) = 0;
  virtual void FreeShared(void* block) = 0;
  // The queue kernels are enqueued on (a cudaStream_t for CudaDevice: its compute stream), opaque here; work on it
  // runs in enqueue order.
  virtual void* ComputeQueue() const = 0;
  // Blocks until the work enqueued on ComputeQueue() so far has completed. Errors: UNAVAILABLE (a kernel failed).
  virtual absl::Status Synchronize() = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // Allocates a device pool of `bytes` bytes (zero-filled on the CPU backend). Call at start only.
  // Errors: RESOURCE_EXHAUSTED.
  virtual absl::StatusOr<PoolId> AllocatePool(uint64_t bytes) = 0;
  virtual uint64_t PoolBytes(PoolId pool) const = 0;

  // Async batched copies; the batch completes (or fails) as one event after every event in `after` completed. A
  // failed dependency fails the batch. Out-of-range device ranges give an already-failed event (INVALID_ARGUMENT).
  virtual CopyEvent CopyHostToDevice(std::span<const HostToDeviceCopy> ops,
                                     std::span<const CopyEvent> after = {}) = 0;
  virtual CopyEvent CopyDeviceToHost(std::span<const DeviceToHostCopy> ops,
                                     std::span<const CopyEvent> after = {}) = 0;
  virtual CopyEvent CopyDeviceToDevice(std::span<const DeviceToDeviceCopy> ops,
                                       std::span<const CopyEvent> after = {}) = 0;

  // Reader tracking (brief §4: "every reader that could still read it has finished").
  virtual ReaderId BeginReaders(std::span<const DeviceRange> ranges) = 0;
  virtual void EndReaders(ReaderId reader) = 0;  // unknown ids are ignored
  virtual bool ReadersBusy(const DeviceRange& range) const = 0;
  // Completes when every reader overlapping `range` now has ended (already complete when none).
  virtual CopyEvent ReadersFence(const DeviceRange& range) = 0;

  // Host pointer to the byte at `offset` of `pool`, for backends whose device memory the CPU can read
  // (CpuDevice); nullptr otherwise or when out of range.
  virtual uint8_t* HostVisible(PoolId pool, Location offset) = 0;

  // Issue 28: the owner freed `range` early (memd retired a page still mapped or read). A backend that models reads
  // ending after the call that ended them (CpuDevice's asynchronous mode) poisons the range (a later read through a
  // stale mapping returns foreign bytes) and records a read hazard for each reader still reading it (ReadHazards);
  // elsewhere nothing happens.
  virtual void Freed(const DeviceRange& range) {}
  // OK, or DATA_LOSS naming the first read hazard seen (a byte written, or a range freed, while a reader still read
  // it: on a GPU that reader returns foreign bytes) and how many there were. Only CpuDevice's asynchronous mode
  // detects them; other backends and modes always answer OK.
  virtual absl::Status ReadHazards() const { return absl::OkStatus(); }
  // Issue 23: the device's compute side (DeviceCompute above), or nullptr when it runs no kernels (CpuDevice).
  virtual DeviceCompute* Compute() { return nullptr; }
};

}  // namespace dhs
