// workerd/kv/resolver_kernel.cu: see resolver_kernel.h (nvcc only).
#include "workerd/kv/resolver_kernel.h"

#include <cuda_runtime_api.h>

namespace dhs::plan {
namespace {

// The lanes of one thread block (resolver_plan.h). Host-callable signatures so that the __host__ __device__ plan
// template instantiates cleanly; the bodies exist only in device code.
struct DeviceLanes {
  __host__ __device__ uint32_t lane() const {
#ifdef __CUDA_ARCH__
    return threadIdx.x;
#else
    return 0;
#endif
  }
  __host__ __device__ uint32_t lanes() const {
#ifdef __CUDA_ARCH__
    return blockDim.x;
#else
    return 1;
#endif
  }
  __host__ __device__ void sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
  __host__ __device__ unsigned long long add(unsigned long long* p, unsigned long long v) const {
#ifdef __CUDA_ARCH__
    return atomicAdd(p, v);
#else
    return 0;
#endif
  }
  __host__ __device__ int64_t cas(int64_t* p, int64_t expected, int64_t v) const {
#ifdef __CUDA_ARCH__
    return static_cast<int64_t>(atomicCAS(reinterpret_cast<unsigned long long*>(p),
                                          static_cast<unsigned long long>(expected),
                                          static_cast<unsigned long long>(v)));
#else
    return 0;
#endif
  }
  __host__ __device__ void min32(int32_t* p, int32_t v) const {
#ifdef __CUDA_ARCH__
    atomicMin(p, v);
#endif
  }
  __host__ __device__ void max64(int64_t* p, int64_t v) const {
#ifdef __CUDA_ARCH__
    atomicMax(reinterpret_cast<long long*>(p), static_cast<long long>(v));
#endif
  }
  __host__ __device__ void store_i32(int32_t* p, int32_t v) const {
#ifdef __CUDA_ARCH__
    atomicExch(p, v);
#endif
  }
  // n <= 16 bytes; one 16-byte access when aligned (the common case: rows of 16-byte multiples).
  __host__ __device__ void load16(const uint8_t* src, uint32_t n, Chunk16* c) const {
#ifdef __CUDA_ARCH__
    if (n == 16 && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
      *reinterpret_cast<uint4*>(c) = *reinterpret_cast<const uint4*>(src);
      return;
    }
    for (uint32_t i = 0; i < n; ++i) c->b[i] = src[i];
#endif
  }
  __host__ __device__ void store16(uint8_t* dst, uint32_t n, const Chunk16& c) const {
#ifdef __CUDA_ARCH__
    if (n == 16 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&c);
      return;
    }
    for (uint32_t i = 0; i < n; ++i) dst[i] = c.b[i];
#endif
  }
};

__global__ void __launch_bounds__(1024) ResolverKernel(Geometry g, const Query* queries, uint64_t step, uint8_t* scratch, uint64_t stride,
                               QueryResult* results, const uint8_t* host_pool, uint8_t* pool) {
  const Query q = queries[blockIdx.x];
  const Scratch s = CarveScratch(scratch + blockIdx.x * stride, q.k, g.hot_rows);
  PlanAndGather(DeviceLanes{}, g, q, step, s, &results[blockIdx.x], host_pool, pool);
}

}  // namespace

int LaunchResolver(const Geometry& g, const Query* d_queries, uint32_t n, uint64_t step, void* d_scratch,
                   uint64_t scratch_stride, QueryResult* d_results, const uint8_t* host_pool, uint8_t* pool,
                   void* queue, uint32_t threads) {
  if (n == 0) return cudaSuccess;
  const auto stream = static_cast<cudaStream_t>(queue);
  cudaGetLastError();  // clears an earlier call's error: a launch error must not be confused with it
  cudaError_t e = cudaMemsetAsync(d_results, 0, sizeof(QueryResult) * n, stream);
  if (e != cudaSuccess) return e;
  ResolverKernel<<<n, threads, 0, stream>>>(g, d_queries, step, static_cast<uint8_t*>(d_scratch), scratch_stride,
                                            d_results, host_pool, pool);
  return cudaGetLastError();
}

const char* LaunchErrorName(int error) { return cudaGetErrorName(static_cast<cudaError_t>(error)); }

}  // namespace dhs::plan
