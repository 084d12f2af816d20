// Error checks for CUDA runtime and cuBLAS calls inside the CUDA backend (not for the CPU side:
// this header includes CUDA's). A failing call throws slope::Error naming the call, the error
// and the place, so a bad launch or an out-of-memory is a message at the CLI, not a crash.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "slope/core/error.h"

namespace slope::cuda::detail {

[[noreturn]] inline void cuda_fail(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA error in ", what, " (", file, ":", line, "): ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

[[noreturn]] inline void cublas_fail(cublasStatus_t s, const char* what, const char* file, int line) {
  fail("cuBLAS error in ", what, " (", file, ":", line, "): ", cublasGetStatusName(s), ": ",
       cublasGetStatusString(s));
}

}  // namespace slope::cuda::detail

#define SLOPE_CUDA_CHECK(call)                                                        \
  do {                                                                                \
    const cudaError_t slope_err_ = (call);                                            \
    if (slope_err_ != cudaSuccess) ::slope::cuda::detail::cuda_fail(slope_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, faults at the next sync.
#define SLOPE_CUDA_CHECK_LAUNCH(name) SLOPE_CUDA_CHECK(cudaGetLastError())

#define SLOPE_CUBLAS_CHECK(call)                                                      \
  do {                                                                                \
    const cublasStatus_t slope_st_ = (call);                                          \
    if (slope_st_ != CUBLAS_STATUS_SUCCESS) ::slope::cuda::detail::cublas_fail(slope_st_, #call, __FILE__, __LINE__); \
  } while (0)
