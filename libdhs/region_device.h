// libdhs/region_device.h: the device libdhs owns for an engine's worker (dhs_worker_open, issue 25). Its KV pool and
// staging arenas are parts of ONE region (RegionLayout, embedded_shape.h), so that a location dhs_resolve returns is
// one byte offset into it, and the region is host-addressable: the library writes appended rows there and an engine on
// the CPU backend reads rows at base + location.
//   - CPU backend (CpuRegionDevice): a CpuDevice; the region is the engine's memory or one pool of the device.
//   - CUDA backend (CudaRegionDevice, libdhs built with CUDA only: region_device_cuda.cc): a CudaDevice with managed
//     pools (as workerd --device cuda, while the library writes appended rows from the host); the region is the
//     engine's cudaMallocManaged block or one managed pool. memd's host pool is pinned and mapped, since the resolver
//     kernel reads host recoveries from it (workerd/kv/resolver_kernel.h), and the process's plan runner becomes the
//     CUDA kernel's (SetDevicePlanRunner), so dhs_resolve runs the fused resolver on the GPU.
//
// Thread-safety: a maker runs at open, on the opening thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "libdhs/embedded_shape.h"
#include "workerd/device/device.h"

namespace dhs::lib {

struct RegionDevice {
  std::unique_ptr<Device> device;
  uint8_t* base = nullptr;  // the region's first byte (RegionLayout::bytes bytes), host-addressable
  const char* backend = "cpu";  // the backend's name, as dhs_worker_stats_json's "device" object names it
};

// Makes the device over `region`: the engine's memory when config.engine_pool (zeroed here, as an allocated region
// starts), else allocated; the parts the store allocates next (the KV pool unless resident, then the staging arenas
// when config.staging_arenas > 0) are adopted from it. `host_pool` is memd's host-pool segment (empty in resident
// mode). Errors: RESOURCE_EXHAUSTED (allocation), the backend's (below).
using RegionDeviceMaker = absl::StatusOr<RegionDevice> (*)(const EmbeddedConfig& config, const RegionLayout& region,
                                                            std::span<uint8_t> host_pool);

// The CPU backend's maker. Errors: RESOURCE_EXHAUSTED.
absl::StatusOr<RegionDevice> CpuRegionDevice(const EmbeddedConfig& config, const RegionLayout& region,
                                             std::span<uint8_t> host_pool);

#ifdef DHS_HAVE_CUDA
// The CUDA backend's maker (CUDA ordinal config.gpu). Errors: FAILED_PRECONDITION (no such GPU), INVALID_ARGUMENT
// (config.engine_pool is not CUDA managed memory: the library writes appended rows through the host), UNAVAILABLE
// (memd's host pool cannot be pinned and mapped), RESOURCE_EXHAUSTED.
absl::StatusOr<RegionDevice> CudaRegionDevice(const EmbeddedConfig& config, const RegionLayout& region,
                                              std::span<uint8_t> host_pool);
#endif

}  // namespace dhs::lib
