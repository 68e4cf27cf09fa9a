// workerd/kv/cuda_plan_runner.cc: see cuda_plan_runner.h. Host C++ (g++), built with the kernel.
#include "absl/strings/str_cat.h"
#include "workerd/kv/cuda_plan_runner.h"
#include "workerd/kv/resolver_kernel.h"

namespace dhs::plan {

PlanRunner CudaPlanRunner() {
  return [](DeviceCompute& compute, const Geometry& g, const Query* queries, uint32_t n, uint64_t step, void* scratch,
            uint64_t stride, QueryResult* results, const uint8_t* host_pool, uint8_t* pool) -> absl::Status {
    const int e = LaunchResolver(g, queries, n, step, scratch, stride, results, host_pool, pool,
                                 compute.ComputeQueue());
    if (e == 0) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("resolver kernel launch: ", LaunchErrorName(e)));
  };
}

}  // namespace dhs::plan
