// kiln/backend/cuda/check.cuh — turn CUDA runtime, cuBLAS(Lt) and cuDNN status codes into
// kiln::CudaError.
//
// Every message names the call as written, where it was made (file:line) and the status by its
// NAME (cudaErrorMemoryAllocation, CUBLAS_STATUS_NOT_SUPPORTED, ...), because a bare number sends
// the reader to a header to find out what went wrong.
//
//   KILN_CUDA_CHECK(cudaMemcpy(...));
//   KILN_CUBLAS_CHECK(cublasLtCreate(&handle));
//   KILN_CUDNN_CHECK(cudnnCreate(&handle));       // only when KILN_HAVE_CUDNN is defined
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string>

#include "kiln/core/error.hpp"

#if defined(KILN_HAVE_CUDNN)
#include <cudnn.h>
#endif

namespace kiln::cu {

// The enumerator's name for a cuBLAS / cuBLASLt status. cuBLAS has cublasGetStatusName, but it
// needs libcublas at link time; this switch keeps check.cuh usable by code that links only
// cublasLt (or nothing at all).
inline const char* cublas_status_name(cublasStatus_t status) noexcept {
  switch (status) {
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
  }
  return "CUBLAS_STATUS_<unknown>";
}

namespace detail {

// Out of line from the macros so that each check site stays one compare and one call.
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                          int line) {
  // A failed runtime call also records itself as the thread's "last error". Clear it, so a later
  // KILN_CUDA_CHECK(cudaGetLastError()) after a kernel launch does not report this old failure.
  // (Sticky errors — a kernel fault — cannot be cleared; those need a process restart anyway.)
  (void)cudaGetLastError();
  throw CudaError(::kiln::detail::concat("kiln: CUDA call `", call, "` failed at ", file, ":", line,
                                         ": ", cudaGetErrorName(status), " (",
                                         cudaGetErrorString(status), ")"));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  throw CudaError(::kiln::detail::concat("kiln: cuBLAS call `", call, "` failed at ", file, ":",
                                         line, ": ", cublas_status_name(status), " (",
                                         static_cast<int>(status), ")"));
}

#if defined(KILN_HAVE_CUDNN)
[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file,
                                           int line) {
  throw CudaError(::kiln::detail::concat("kiln: cuDNN call `", call, "` failed at ", file, ":",
                                         line, ": ", cudnnGetErrorString(status), " (",
                                         static_cast<int>(status), ")"));
}
#endif

}  // namespace detail
}  // namespace kiln::cu

// Evaluates `call` once; throws kiln::CudaError unless it returned cudaSuccess.
#define KILN_CUDA_CHECK(call)                                                             \
  do {                                                                                    \
    const cudaError_t kiln_cuda_status_ = (call);                                         \
    if (kiln_cuda_status_ != cudaSuccess)                                                 \
      ::kiln::cu::detail::throw_cuda_error(kiln_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

// Evaluates `call` once; throws kiln::CudaError unless it returned CUBLAS_STATUS_SUCCESS.
#define KILN_CUBLAS_CHECK(call)                                                               \
  do {                                                                                        \
    const cublasStatus_t kiln_cublas_status_ = (call);                                        \
    if (kiln_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::kiln::cu::detail::throw_cublas_error(kiln_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)

#if defined(KILN_HAVE_CUDNN)
// Evaluates `call` once; throws kiln::CudaError unless it returned CUDNN_STATUS_SUCCESS.
#define KILN_CUDNN_CHECK(call)                                                              \
  do {                                                                                      \
    const cudnnStatus_t kiln_cudnn_status_ = (call);                                        \
    if (kiln_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                         \
      ::kiln::cu::detail::throw_cudnn_error(kiln_cudnn_status_, #call, __FILE__, __LINE__); \
  } while (0)
#endif
