// libdhs/region_device.cc: see region_device.h (the CPU backend; the CUDA one is region_device_cuda.cc).
#include "libdhs/region_device.h"

#include <cstring>

#include "workerd/device/cpu_device.h"

namespace dhs::lib {

absl::StatusOr<RegionDevice> CpuRegionDevice(const EmbeddedConfig& config, const RegionLayout& region,
                                             std::span<uint8_t> /*host_pool: host memory the CPU reads as it is*/) {
  auto cpu = std::make_unique<CpuDevice>();
  uint8_t* base = config.engine_pool;
  if (base != nullptr) {
    std::memset(base, 0, region.bytes);  // as the library's own mapping starts
  } else {
    absl::StatusOr<PoolId> whole = cpu->AllocatePool(region.bytes);
    if (!whole.ok()) return whole.status();
    base = cpu->HostVisible(*whole, 0);
  }
  if (config.mode != WorkerMode::kResident) cpu->UseCallerMemoryForNextPool(base, region.kv_bytes);
  if (config.staging_arenas > 0) cpu->UseCallerMemoryForNextPool(base + region.staging_offset, region.staging_bytes);
  return RegionDevice{std::move(cpu), base, "cpu"};
}

}  // namespace dhs::lib
