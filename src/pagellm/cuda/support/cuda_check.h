// Checks for CUDA runtime and cuBLASLt calls.
//
// Every CUDA and cuBLASLt call in the backend goes through one of these macros, so that a
// failure becomes a pagellm::Error naming the call, the file and line, and the library's
// own description of the error, rather than a bare error code or a crash much later.
// Kernel launches through launch_kernel() (pdl.cuh) check cudaLaunchKernelEx's result; a
// <<<>>> launch is checked with PAGELLM_CUDA_CHECK_LAUNCH() right after it (cudaGetLastError
// does not synchronise, so it is safe inside CUDA-graph capture).
//
// Only code under src/pagellm/cuda and tests/cuda may include this header.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "pagellm/common/check.h"

namespace pagellm::cuda {

/// cuBLAS status names (cuBLASLt has no cublasGetStatusString of its own before 11.4; the
/// cuBLAS one needs libcublas, which we link anyway, but a local table keeps it explicit).
inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

}  // namespace pagellm::cuda

/// Evaluates a CUDA runtime call; throws pagellm::Error on anything but cudaSuccess.
#define PAGELLM_CUDA_CHECK(expr)                                                           \
  do {                                                                                     \
    cudaError_t pagellm_cuda_err_ = (expr);                                                \
    if (pagellm_cuda_err_ != cudaSuccess) {                                                \
      ::pagellm::detail::Thrower("CUDA error: ")                                           \
          << cudaGetErrorName(pagellm_cuda_err_) << " (" << cudaGetErrorString(pagellm_cuda_err_) \
          << ") in " #expr " at " __FILE__ ":" << __LINE__;                                \
    }                                                                                      \
  } while (0)

/// Checks that the kernel launched just before succeeded in launching (bad configuration,
/// missing kernel image for this GPU). Errors while the kernel runs surface at the next
/// synchronising call, which is checked too.
#define PAGELLM_CUDA_CHECK_LAUNCH() PAGELLM_CUDA_CHECK(cudaGetLastError())

/// Evaluates a cuBLAS / cuBLASLt call; throws pagellm::Error on anything but success.
#define PAGELLM_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                      \
    cublasStatus_t pagellm_cublas_st_ = (expr);                                             \
    if (pagellm_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                      \
      ::pagellm::detail::Thrower("cuBLAS error: ")                                          \
          << ::pagellm::cuda::cublas_status_name(pagellm_cublas_st_) << " in " #expr " at " \
          << __FILE__ ":" << __LINE__;                                                      \
    }                                                                                       \
  } while (0)
