// tests/gpu/bench_kernels.cu: the reference copy kernel of the GPU benchmark: a plain read of mapped pinned host
// memory into device memory, 16 bytes per thread step, over a grid of `blocks` blocks (the shape of host recovery
// without the resolver's plan around it).
#include <cstdint>

#include <cuda_runtime_api.h>

namespace dhs::gpu {
namespace {
__global__ void MappedCopyKernel(const uint4* src, uint4* dst, uint64_t n16) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n16; i += uint64_t{gridDim.x} * blockDim.x) {
    dst[i] = src[i];
  }
}
}  // namespace

// Copies `bytes` (a multiple of 16, both 16-byte aligned) from src (a device-visible address, e.g. mapped pinned
// host memory) to dst on `stream`.
cudaError_t LaunchMappedCopy(const void* src, void* dst, uint64_t bytes, uint32_t blocks, cudaStream_t stream) {
  MappedCopyKernel<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), bytes / 16);
  return cudaGetLastError();
}

}  // namespace dhs::gpu
