// libdhs/region_device_cuda.cc: see region_device.h (the CUDA backend's maker; built into libdhs with CUDA only).
#include <cstring>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "libdhs/region_device.h"
#include "workerd/device/cuda_device.h"
#include "workerd/kv/cuda_plan_runner.h"
#include "workerd/kv/kernel_resolver.h"

namespace dhs::lib {

absl::StatusOr<RegionDevice> CudaRegionDevice(const EmbeddedConfig& config, const RegionLayout& region,
                                              std::span<uint8_t> host_pool) {
  absl::StatusOr<std::unique_ptr<CudaDevice>> made =
      CudaDevice::Create(CudaDeviceOptions{static_cast<int>(config.gpu), /*managed_pools=*/true});
  if (!made.ok()) return made.status();
  std::unique_ptr<CudaDevice> cuda = *std::move(made);
  uint8_t* base = config.engine_pool;
  if (base != nullptr) {
    cudaPointerAttributes attributes{};
    const cudaError_t e = cudaPointerGetAttributes(&attributes, base);
    if (e != cudaSuccess || attributes.type != cudaMemoryTypeManaged) {
      (void)cudaGetLastError();
      return absl::InvalidArgumentError(
          "dhs_worker_config: on the CUDA backend engine_pool must be CUDA managed memory (cudaMallocManaged): the "
          "library writes appended rows into it from the host");
    }
    if (attributes.device != static_cast<int>(config.gpu)) {
      return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: engine_pool belongs to CUDA device ",
                                                     attributes.device, ", not to gpu ", config.gpu));
    }
    std::memset(base, 0, region.bytes);  // as an allocated region starts (managed memory: the host may write it)
  } else {
    absl::StatusOr<PoolId> whole = cuda->AllocatePool(region.bytes);  // zero-filled
    if (!whole.ok()) return whole.status();
    base = cuda->DevicePointer(*whole, 0);
  }
  if (config.mode != WorkerMode::kResident) cuda->UseCallerMemoryForNextPool(base, region.kv_bytes);
  if (config.staging_arenas > 0) cuda->UseCallerMemoryForNextPool(base + region.staging_offset, region.staging_bytes);
  if (!host_pool.empty()) {
    // The resolver kernel reads host recoveries through the pool's mapped address (KernelResolver needs it).
    if (absl::StatusOr<uint8_t*> mapped = cuda->RegisterHostPool(host_pool); !mapped.ok()) return mapped.status();
  }
  SetDevicePlanRunner(plan::CudaPlanRunner());  // the process's resolver kernel (one per process, stateless)
  return RegionDevice{std::move(cuda), base, "cuda"};
}

}  // namespace dhs::lib
