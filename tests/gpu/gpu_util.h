// tests/gpu/gpu_util.h: shared pieces of the GPU tests and benchmark: the skip rule (exit 77 with a clear message when
// no GPU is found; meson counts it as SKIP, never as a pass), device buffers, and a resolver batch mirrored on the
// device (the same inputs the host plan runs on: tests/workerd/resolver_plan_scenario.h).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "workerd/device/cuda_device.h"
#include "workerd/kv/resolver_kernel.h"
#include "workerd/kv/resolver_plan_host.h"

namespace dhs::gpu {

inline constexpr int kSkipExitCode = 77;  // meson: skipped

// Exits 77 with a message on stderr when no CUDA device can be used.
inline void ExitUnlessGpu(const char* what) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::fprintf(stderr, "SKIP %s: no CUDA GPU found (cudaGetDeviceCount: %s, %d devices); not run, not passed\n",
                 what, e == cudaSuccess ? "ok" : cudaGetErrorName(e), n);
    std::exit(kSkipExitCode);
  }
}

#define GPU_CHECK(call)                                                                                   \
  do {                                                                                                    \
    const cudaError_t gpu_check_e_ = (call);                                                              \
    if (gpu_check_e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(gpu_check_e_)); \
      std::abort();                                                                                       \
    }                                                                                                     \
  } while (0)

// A cudaMalloc'd array of T (freed at destruction).
template <class T>
class DevArray {
 public:
  DevArray() = default;
  explicit DevArray(size_t n) : n_(n) { GPU_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DevArray(std::span<const T> host) : DevArray(host.size()) { Upload(host); }
  ~DevArray() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DevArray(DevArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  DevArray& operator=(DevArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  void Upload(std::span<const T> host) {
    if (!host.empty()) GPU_CHECK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> Download() const {
    std::vector<T> v(n_);
    if (n_) GPU_CHECK(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// The Geometry of a GeometryStorage with its arrays on the device.
struct DeviceGeometry {
  DevArray<uint64_t> slot_src, in_page, row_bytes;
  plan::Geometry g;
  explicit DeviceGeometry(const plan::GeometryStorage& h)
      : slot_src(std::span<const uint64_t>(h.slot_src)), in_page(std::span<const uint64_t>(h.in_page)),
        row_bytes(std::span<const uint64_t>(h.row_bytes)), g(h.g) {
    g.slot_src = slot_src.get();
    g.in_page = in_page.get();
    g.row_bytes = row_bytes.get();
  }
};

// Hot caches of a HotSlotsStorage on the device (same layout).
struct DeviceHotSlots {
  uint32_t b;
  DevArray<int64_t> pos, last_use, clock;
  DevArray<uint64_t> stamp;
  explicit DeviceHotSlots(const plan::HotSlotsStorage& h)
      : b(h.b), pos(std::span<const int64_t>(h.pos)), last_use(std::span<const int64_t>(h.last_use)),
        clock(std::span<const int64_t>(h.clock)), stamp(std::span<const uint64_t>(h.stamp)) {}
  plan::HotSlots View(uint32_t slot) const {
    return plan::HotSlots{pos.get() + size_t{slot} * b, last_use.get() + size_t{slot} * b,
                          stamp.get() + size_t{slot} * b, clock.get() + slot};
  }
};

// One request's hot index on the device (ready_page, host_ready, host_page).
struct DeviceRequest {
  DevArray<int32_t> ready_page;
  DevArray<uint8_t> host_ready;
  DevArray<int64_t> host_page;
  DeviceRequest(const RequestKv& kv, const std::vector<int64_t>& host_pages)
      : ready_page(std::span<const int32_t>(kv.ready_page)), host_ready(std::span<const uint8_t>(kv.host_ready)),
        host_page(std::span<const int64_t>(host_pages)) {}
};

// A batch of queries for the kernel: host Query structs re-pointed at device arrays.
struct DeviceBatch {
  std::vector<plan::Query> queries;  // device pointers inside
  DevArray<plan::Query> d_queries;
  DevArray<int64_t> selections, outs;
  DevArray<uint8_t> scratch;
  DevArray<plan::QueryResult> results;
  uint64_t stride = 0;
  uint32_t k = 0, ns = 0;

  // host_queries: as plan::MakeQuery builds them (their selection/out on the host); requests[i] mirrors query i's
  // request (several queries may share one); caches: the device hot caches of the group.
  DeviceBatch(const plan::Geometry& g, std::span<const plan::Query> host_queries,
              std::span<const DeviceRequest* const> requests, const DeviceHotSlots& caches) {
    const size_t n = host_queries.size();
    k = n ? host_queries[0].k : 0;
    ns = g.num_sources;
    std::vector<int64_t> sel(n * k);
    for (size_t i = 0; i < n; ++i) std::memcpy(&sel[i * k], host_queries[i].selection, k * sizeof(int64_t));
    selections = DevArray<int64_t>(std::span<const int64_t>(sel));
    outs = DevArray<int64_t>(n * ns * k);
    stride = plan::ScratchStride(k, g.hot_rows);
    scratch = DevArray<uint8_t>(n * stride);
    results = DevArray<plan::QueryResult>(n);
    for (size_t i = 0; i < n; ++i) {
      plan::Query q = host_queries[i];
      q.ready_page = requests[i]->ready_page.get();
      q.host_ready = requests[i]->host_ready.get();
      q.host_page = requests[i]->host_page.get();
      q.selection = selections.get() + i * k;
      q.out = outs.get() + i * ns * k;
      q.cache = caches.View(q.slot);
      queries.push_back(q);
    }
    d_queries = DevArray<plan::Query>(std::span<const plan::Query>(queries));
  }
  cudaError_t Launch(const plan::Geometry& dg, uint64_t step, const uint8_t* host_pool_dev, uint8_t* pool,
                     cudaStream_t stream, uint32_t threads = 1024) {
    return static_cast<cudaError_t>(plan::LaunchResolver(dg, d_queries.get(), static_cast<uint32_t>(queries.size()),
                                                         step, scratch.get(), stride, results.get(), host_pool_dev,
                                                         pool, stream, threads));
  }
};

}  // namespace dhs::gpu
