// workerd/kv/cuda_plan_runner.h: the PlanRunner (kernel_resolver.h) of the CUDA kernel (resolver_kernel.h), built only
// with the CUDA backend (kv/meson.build: kv_cuda_dep). workerd built with CUDA sets it as the process's
// DevicePlanRunner at start, so a HierarchicalKvAccess on a CudaDevice resolves with the kernel.
//
// Thread-safety: stateless.
#pragma once

#include "workerd/kv/kernel_resolver.h"

namespace dhs::plan {

// Launches the kernel (1024 threads per query) on the compute queue of the device it is given, without waiting.
// Errors: UNAVAILABLE naming the CUDA launch error.
PlanRunner CudaPlanRunner();

}  // namespace dhs::plan
