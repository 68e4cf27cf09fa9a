// workerd/device/cuda_check.h: CUDA runtime errors as absl::Status, with the codes the CPU backend reports for the
// same failures (cpu_device.h): an allocation failure is RESOURCE_EXHAUSTED, a bad argument or range
// INVALID_ARGUMENT, no usable GPU FAILED_PRECONDITION, anything else (a failed copy, a lost device) UNAVAILABLE.
// The message names the call, the CUDA error's name and its text.
//
// Thread-safety: stateless.
#pragma once

#include "absl/strings/string_view.h"

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dhs {

inline absl::StatusCode CudaErrorCode(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return absl::StatusCode::kOk;
    case cudaErrorMemoryAllocation: return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered: return absl::StatusCode::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice: return absl::StatusCode::kFailedPrecondition;
    default: return absl::StatusCode::kUnavailable;
  }
}

// OK for cudaSuccess; otherwise "<what>: <cudaErrorName> (<text>)" with CudaErrorCode(e).
inline absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::Status(CudaErrorCode(e), absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

}  // namespace dhs

// Returns from the enclosing function (absl::Status or StatusOr) when the CUDA call fails.
#define DHS_CUDA_RETURN_IF_ERROR(call)                                       \
  do {                                                                       \
    const cudaError_t dhs_cuda_err_ = (call);                                \
    if (dhs_cuda_err_ != cudaSuccess) return ::dhs::CudaStatus(dhs_cuda_err_, #call); \
  } while (0)
