// libdhs/region_device.h: the device libdhs owns for an engine's worker (dhs_worker_open, issue 25). Its KV pool and
// staging arenas are parts of ONE region (RegionLayout, embedded_shape.h), so that a location dhs_resolve returns is
// one byte offset into it.
//   - CPU backend (kCpuRegion): a CpuDevice; the region is the engine's memory or one pool of the device.
//   - CUDA backend (kCudaRegion, libdhs built with CUDA only: region_device_cuda.cc): a CudaDevice; the region is one
//     managed pool of the library's (host-visible, as workerd --device cuda's pools), or the engine's block: managed
//     (cudaMallocManaged) or plain device memory (cudaMalloc, e.g. a framework's CUDA tensor; not in resident mode).
//     Over device memory the pools are not host-visible: appends, backups and recoveries are the device's copies and
//     the kernel's reads, and locations are offsets of device addresses. memd's host pool is pinned and mapped, since
//     the resolver kernel reads host recoveries from it (workerd/kv/resolver_kernel.h), and the process's plan runner
//     is the CUDA kernel's (SetDevicePlanRunner, once per process), so dhs_resolve runs the fused resolver on the GPU.
//
// Thread-safety: a backend's functions run at open, on the opening thread; several opens may run at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libdhs/embedded_shape.h"
#include "workerd/device/device.h"

namespace dhs::lib {

struct RegionDevice {
  std::unique_ptr<Device> device;
  uint8_t* base = nullptr;      // the region's first byte: a host address, or a device address (CUDA device memory)
  const char* backend = "cpu";  // the backend's name, as dhs_worker_stats_json's "device" object names it
};

struct RegionBackend {
  // Checks what the backend needs of `config` (its GPU, the engine pool's kind) before memd is contacted; nullptr:
  // nothing to check. Errors: the backend's (below).
  absl::Status (*check)(const EmbeddedConfig& config) = nullptr;
  // Makes the device over `region`: the engine's memory when config.engine_pool (zeroed here, as an allocated region
  // starts), else allocated; the parts the store allocates next (the KV pool unless resident, then the staging arenas
  // when config.staging_arenas > 0) are adopted from it. `host_pool` is memd's host-pool segment (empty in resident
  // mode). Errors: RESOURCE_EXHAUSTED (allocation), the backend's (below).
  absl::StatusOr<RegionDevice> (*make)(const EmbeddedConfig& config, const RegionLayout& region,
                                       std::span<uint8_t> host_pool) = nullptr;
};

// The CPU backend. Errors: RESOURCE_EXHAUSTED.
absl::StatusOr<RegionDevice> CpuRegionDevice(const EmbeddedConfig& config, const RegionLayout& region,
                                             std::span<uint8_t> host_pool);
inline constexpr RegionBackend kCpuRegion{nullptr, CpuRegionDevice};

#ifdef DHS_HAVE_CUDA
// The CUDA backend (CUDA ordinal config.gpu). Errors: FAILED_PRECONDITION (no such GPU), INVALID_ARGUMENT
// (config.engine_pool is host memory or another GPU's; device memory in resident mode), UNAVAILABLE (memd's host pool
// cannot be pinned and mapped; a CUDA failure), RESOURCE_EXHAUSTED.
absl::Status CheckCudaRegion(const EmbeddedConfig& config);
absl::StatusOr<RegionDevice> CudaRegionDevice(const EmbeddedConfig& config, const RegionLayout& region,
                                              std::span<uint8_t> host_pool);
inline constexpr RegionBackend kCudaRegion{CheckCudaRegion, CudaRegionDevice};
#endif

}  // namespace dhs::lib
