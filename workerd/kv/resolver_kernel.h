// workerd/kv/resolver_kernel.h: the fused resolver as one CUDA kernel over the batch (brief §5, issue 15): the plan and
// gather of resolver_plan.h (the same code the host runs and tests), one thread block per query, so the grid, and
// the copy work of host recovery with it, scales with the batch (a few to tens of blocks). Missing rows are read by
// the kernel from the pinned host pool through its mapped device address (CudaDevice::RegisterHostPool), no
// cudaMemcpy involved.
//
// Built only with the CUDA backend (nvcc; kv/meson.build's dhs_kv_cuda). The kernel runs on a device through the
// device seam (workerd/device/device.h, DeviceCompute): its queue, its memory; this header names no CUDA type, so the
// kv code that calls it (kernel_resolver.h) compiles with g++ alone.
//
// Thread-safety: stateless; launches are ordered by their queue.
#pragma once

#include <cstdint>

#include "workerd/kv/resolver_plan.h"

namespace dhs::plan {

// Bytes of scratch per query for selections of at most k_max entries and B hot slots (256-byte multiple).
inline uint64_t ScratchStride(uint32_t k_max, uint32_t hot_rows) {
  return (ScratchBytes(k_max, hot_rows) + 255) & ~uint64_t{255};
}

// Enqueues the kernel on `queue` (a cudaStream_t: DeviceCompute::ComputeQueue()): query i is planned by block i with
// `threads` threads (a multiple of 32, <= 1024). Every pointer is a device address: `g`'s arrays, d_queries [n]
// (with their selection/out/hot-index/cache arrays), d_scratch [n * scratch_stride] bytes, d_results [n] (zeroed
// here first), host_pool (mapped pinned host pool), pool (the KV pool). Preconditions as PlanAndGather (one query
// per hot cache per launch). Returns 0, or the launch's CUDA error number (LaunchErrorName names it; 0 does not mean
// the kernel has run).
int LaunchResolver(const Geometry& g, const Query* d_queries, uint32_t n, uint64_t step, void* d_scratch,
                   uint64_t scratch_stride, QueryResult* d_results, const uint8_t* host_pool, uint8_t* pool,
                   void* queue, uint32_t threads = 1024);

// The name of a LaunchResolver error (cudaGetErrorName: "cudaErrorInvalidValue").
const char* LaunchErrorName(int error);

}  // namespace dhs::plan
