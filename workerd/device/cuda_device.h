// workerd/device/cuda_device.h: the CUDA device backend (brief §9, issue 15). Same contract as CpuDevice
// (device.h, cpu_device.h): device pools allocated once at start (cudaMalloc, zero-filled) and addressed by byte
// offset; asynchronous batched copies, each batch on the copy stream of its kind (host->device, device->host,
// device->device) and completed by a cudaEvent recorded after its last cudaMemcpyAsync; reader tracking with fences.
//
// Ordering: a batch is issued on its stream once every event in `after` is done (a submission thread waits for them,
// as the CPU backend's copy thread does), so independent batches complete out of issue order; a failed dependency
// fails the batch before any byte is written. Readers: BeginReaders/EndReaders as on the CPU backend, plus
// EndReadersAfter(reader, stream), which ends the reader when the work enqueued on `stream` so far (the kernels
// that read its locations) has completed: an event recorded there is the reader fence. Nothing may write a range
// (reuse a page or hot slot) before ReadersFence(range) is done; the resolver and the access layer make their copies
// depend on that fence (device.h).
//
// Host pool: RegisterHostPool pins memd's host segment (cudaHostRegister, mapped) so that a host->device copy from it
// is a DMA of pinned memory, and a kernel can read it directly (host recovery as a device-side read of pinned
// memory, workerd/kv/resolver_kernel.h) through the device pointer returned (MappedHostAddress).
//
// Errors: CUDA failures map to the CPU backend's codes (cuda_check.h): RESOURCE_EXHAUSTED (allocation),
// INVALID_ARGUMENT (ranges), UNAVAILABLE (a failed copy: its event reports it; bytes of a batch that failed inside
// CUDA may be partly written, unlike an injected or dependency failure), FAILED_PRECONDITION (no GPU at Create),
// CANCELLED (held or queued batches at destruction).
//
// Test seam: the CopyHook of cpu_device.h, with the same semantics (run, hold until ReleaseHeld, fail).
//
// Thread-safety: every method is thread-safe. Each method makes the device current on the calling thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "workerd/device/cpu_device.h"  // CopyKind, CopyFate, CopyInfo, CopyHook: the shared test seam
#include "workerd/device/device.h"
#include "workerd/device/device_bookkeeping.h"

namespace dhs {

struct CudaDeviceOptions {
  int device = 0;  // CUDA device ordinal
  // Pools by cudaMallocManaged instead of cudaMalloc, so that HostVisible works: needed while the model's attention
  // still runs on the CPU and reads the KV pool through HostVisible (workerd --device cuda until the model runs on
  // the GPU). Default: plain device memory, HostVisible returns nullptr.
  bool managed_pools = false;
};

// Number of CUDA devices, 0 when there is none or the driver cannot be used (never fails).
int CudaDeviceCount();

class CudaDevice final : public Device, public DeviceCompute {
 public:
  // Errors: FAILED_PRECONDITION (no such GPU, no driver), UNAVAILABLE (stream creation).
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(const CudaDeviceOptions& options = {});
  ~CudaDevice() override;  // fails held and queued batches (CANCELLED), waits for the streams, frees the pools
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  absl::StatusOr<PoolId> AllocatePool(uint64_t bytes) override;
  // The next AllocatePool adopts [base, base + bytes) instead of allocating (as CpuDevice's): memory the caller owns
  // and the device addresses (a part of another pool: libdhs's region, libdhs/region_device.h; or an engine's
  // cudaMalloc or cudaMallocManaged block). It is neither zero-filled nor freed here; AllocatePool fails
  // (INVALID_ARGUMENT) when it asks for more than `bytes`.
  void UseCallerMemoryForNextPool(uint8_t* base, uint64_t bytes);
  uint64_t PoolBytes(PoolId pool) const override;
  CopyEvent CopyHostToDevice(std::span<const HostToDeviceCopy> ops, std::span<const CopyEvent> after) override;
  CopyEvent CopyDeviceToHost(std::span<const DeviceToHostCopy> ops, std::span<const CopyEvent> after) override;
  CopyEvent CopyDeviceToDevice(std::span<const DeviceToDeviceCopy> ops,
                               std::span<const CopyEvent> after) override;
  ReaderId BeginReaders(std::span<const DeviceRange> ranges) override;
  void EndReaders(ReaderId reader) override;
  bool ReadersBusy(const DeviceRange& range) const override;
  CopyEvent ReadersFence(const DeviceRange& range) override;
  // Host pointer to pool memory with managed_pools; nullptr otherwise or out of range.
  uint8_t* HostVisible(PoolId pool, Location offset) override;

  // --- DeviceCompute (device.h): the kv code's kernels (workerd/kv/kernel_resolver.h) run on compute_stream() ---
  DeviceCompute* Compute() override { return this; }
  uint8_t* PoolAddress(PoolId pool, Location offset) const override { return DevicePointer(pool, offset); }
  // The device address within a pool registered by RegisterHostPool (nullptr elsewhere).
  const uint8_t* MappedHostAddress(const uint8_t* host) const override;
  // cudaMallocManaged (zero-filled): the host and the device address it at one pointer. Errors: RESOURCE_EXHAUSTED.
  absl::StatusOr<void*> AllocateShared(uint64_t bytes) override;
  void FreeShared(void* block) override;
  void* ComputeQueue() const override { return compute_; }
  absl::Status Synchronize() override;  // cudaStreamSynchronize(compute_stream())

  // --- CUDA-specific ---
  // Ends `reader` once the work enqueued on `stream` up to now has completed (an event recorded on it). Unknown ids
  // are ignored. Errors: UNAVAILABLE when the event cannot be recorded (the reader is then ended at once, after a
  // cudaStreamSynchronize).
  absl::Status EndReadersAfter(ReaderId reader, cudaStream_t stream);
  // Device address of byte `offset` of `pool`; nullptr when out of range.
  uint8_t* DevicePointer(PoolId pool, Location offset) const;
  // Pins `host` (cudaHostRegister, portable + mapped) and returns its device address. Errors: INVALID_ARGUMENT
  // (empty, already registered), UNAVAILABLE.
  absl::StatusOr<uint8_t*> RegisterHostPool(std::span<uint8_t> host);
  absl::Status UnregisterHostPool(std::span<uint8_t> host);
  // The stream kernels run on (resolver, model); reader fences are events recorded on it.
  cudaStream_t compute_stream() const { return compute_; }
  int ordinal() const { return options_.device; }

  // --- test seam (as CpuDevice) ---
  void SetCopyHook(CopyHook hook);
  std::vector<uint64_t> HeldCopies() const;
  void ReleaseHeld(uint64_t id, bool fail = false);
  void ReleaseAllHeld();
  void WaitIdle();  // until no runnable batch is queued and every issued batch completed
  uint64_t CopiesIssued() const;

 private:
  class State;
  using Op = CopyOp;
  using Job = CopyJob<State>;
  struct Pool {
    uint8_t* ptr = nullptr;
    uint64_t bytes = 0;
    bool owned = true;  // false: the caller's memory (UseCallerMemoryForNextPool), never freed here
  };

  explicit CudaDevice(const CudaDeviceOptions& options);
  uint8_t* Resolve(const DeviceRange& r) const;  // nullptr when out of range; mu_ held
  CopyEvent Submit(CopyKind kind, std::vector<Op> ops, std::vector<DeviceRange> device, bool valid,
                   std::span<const CopyEvent> after);
  void Loop();
  void EndReaderLocked(ReaderId reader, std::vector<std::shared_ptr<State>>* done);  // mu_ held

  CudaDeviceOptions options_;
  cudaStream_t streams_[3] = {nullptr, nullptr, nullptr};  // by CopyKind
  cudaStream_t compute_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pool> pools_;
  std::deque<std::pair<uint8_t*, uint64_t>> caller_pools_;  // UseCallerMemoryForNextPool: (base, bytes), in order
  std::deque<Job> queue_;
  std::vector<std::shared_ptr<State>> in_flight_;  // issued on a stream, not yet seen complete
  bool stop_ = false;
  bool busy_ = false;
  uint64_t next_copy_id_ = 1;
  CopyHook hook_;
  ReaderFences<State> readers_;
  std::map<ReaderId, cudaEvent_t> reader_ends_;  // EndReadersAfter: the reader ends when its event completes
  struct MappedPool {
    const uint8_t* host = nullptr;
    uint64_t bytes = 0;
    uint8_t* device = nullptr;
  };
  std::vector<MappedPool> mapped_;  // RegisterHostPool's pools (mu_)
  std::thread thread_;  // started last, in Create
};

}  // namespace dhs
