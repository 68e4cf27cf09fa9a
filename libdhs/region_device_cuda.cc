// libdhs/region_device_cuda.cc: see region_device.h (the CUDA backend; built into libdhs with CUDA only).
#include <mutex>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "libdhs/region_device.h"
#include "workerd/device/cuda_check.h"
#include "workerd/device/cuda_device.h"
#include "workerd/kv/cuda_plan_runner.h"
#include "workerd/kv/kernel_resolver.h"

namespace dhs::lib {
namespace {

// True when the engine's pool is plain device memory, false when managed or absent (the library's managed pool).
// Errors: INVALID_ARGUMENT (host memory, another GPU's memory, device memory in resident mode).
absl::StatusOr<bool> EnginePoolIsDeviceMemory(const EmbeddedConfig& config) {
  if (config.engine_pool == nullptr) return false;
  cudaPointerAttributes attributes{};
  const cudaError_t e = cudaPointerGetAttributes(&attributes, config.engine_pool);
  if (e != cudaSuccess) (void)cudaGetLastError();
  const bool device_memory = e == cudaSuccess && attributes.type == cudaMemoryTypeDevice;
  if (e != cudaSuccess || (attributes.type != cudaMemoryTypeManaged && !device_memory)) {
    return absl::InvalidArgumentError(
        "dhs_worker_config: on the CUDA backend engine_pool must be CUDA device memory (cudaMalloc) or managed "
        "memory (cudaMallocManaged) of the worker's GPU, not host memory");
  }
  if (attributes.device != static_cast<int>(config.gpu)) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: engine_pool belongs to CUDA device ",
                                                   attributes.device, ", not to gpu ", config.gpu));
  }
  if (device_memory && config.mode == WorkerMode::kResident) {
    return absl::InvalidArgumentError(
        "dhs_worker_config: resident mode on the CUDA backend needs engine_pool in managed memory "
        "(cudaMallocManaged): its store writes rows from the host");
  }
  return device_memory;
}

}  // namespace

absl::Status CheckCudaRegion(const EmbeddedConfig& config) {
  const int n = CudaDeviceCount();
  if (static_cast<int64_t>(config.gpu) >= n) {
    return absl::FailedPreconditionError(
        absl::StrCat("dhs_worker_config: gpu ", config.gpu, " is not a CUDA device of this machine (", n, " found)"));
  }
  return EnginePoolIsDeviceMemory(config).status();
}

absl::StatusOr<RegionDevice> CudaRegionDevice(const EmbeddedConfig& config, const RegionLayout& region,
                                              std::span<uint8_t> host_pool) {
  // The engine's pool decides the kind of memory: managed (rows host-visible, as the library's own region), or plain
  // device memory (only offsets and the engine's kernels read it). The pools' kind is an option of the device.
  absl::StatusOr<bool> device_memory = EnginePoolIsDeviceMemory(config);
  if (!device_memory.ok()) return device_memory.status();
  absl::StatusOr<std::unique_ptr<CudaDevice>> made =
      CudaDevice::Create(CudaDeviceOptions{static_cast<int>(config.gpu), /*managed_pools=*/!*device_memory});
  if (!made.ok()) return made.status();
  std::unique_ptr<CudaDevice> cuda = *std::move(made);
  uint8_t* base = config.engine_pool;
  if (base != nullptr) {
    // Zeroed on the GPU (a host memset would pull every managed page to the host), as an allocated region starts.
    // cudaMemset may return before it completes, and the device's copy streams do not wait for the default stream:
    // synchronised here, before the first append's copy.
    if (absl::Status s = CudaStatus(cudaMemset(base, 0, region.bytes), "libdhs: zero-fill of engine_pool"); !s.ok()) {
      return s;
    }
    if (absl::Status s = CudaStatus(cudaDeviceSynchronize(), "libdhs: zero-fill of engine_pool"); !s.ok()) return s;
  } else {
    absl::StatusOr<PoolId> whole = cuda->AllocatePool(region.bytes);  // managed, zero-filled
    if (!whole.ok()) return whole.status();
    base = cuda->DevicePointer(*whole, 0);
  }
  if (config.mode != WorkerMode::kResident) cuda->UseCallerMemoryForNextPool(base, region.kv_bytes);
  if (config.staging_arenas > 0) cuda->UseCallerMemoryForNextPool(base + region.staging_offset, region.staging_bytes);
  if (!host_pool.empty()) {
    // The resolver kernel reads host recoveries through the pool's mapped address (KernelResolver needs it).
    if (absl::StatusOr<uint8_t*> mapped = cuda->RegisterHostPool(host_pool); !mapped.ok()) return mapped.status();
  }
  // The process's resolver kernel: one stateless runner, set once (another thread's open may read it meanwhile).
  static std::once_flag runner_set;
  std::call_once(runner_set, [] { SetDevicePlanRunner(plan::CudaPlanRunner()); });
  return RegionDevice{std::move(cuda), base, "cuda"};
}

}  // namespace dhs::lib
