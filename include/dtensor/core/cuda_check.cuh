// dtensor/core/cuda_check.cuh — every CUDA runtime call goes through one check.
//
//   DTENSOR_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s));
//   // on failure: dtensor::Error "dtensor: cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s):
//   //   cudaErrorInvalidValue: invalid argument (at file:line) (backend code 1)"
//   dtensor::detail::check_cuda(e, "cudaFreeAsync", rank);   // the same, with a rank
//
// The Error's op is the call as written, its backend_code() the cudaError_t, and the text
// carries cudaGetErrorName and cudaGetErrorString. Destructors cannot throw: they report a
// failed free on stderr through cuda_report (a leak is better than std::terminate).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#include "dtensor/core/error.hpp"

namespace dtensor::detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line,
                                    int rank = Error::no_rank) {
  throw Error(call, cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e), " (at ", file, ":", line, ")"), rank,
              int(e));
}

inline void check_cuda(cudaError_t e, const char* call, const char* file, int line, int rank = Error::no_rank) {
  if (e != cudaSuccess) [[unlikely]]
    throw_cuda(e, call, file, line, rank);
}

/// For noexcept paths (destructors): prints the failure instead of throwing.
inline void cuda_report(cudaError_t e, const char* call) noexcept {
  if (e != cudaSuccess) std::fprintf(stderr, "dtensor: %s failed: %s: %s\n", call, cudaGetErrorName(e), cudaGetErrorString(e));
}

}  // namespace dtensor::detail

#define DTENSOR_CUDA_CHECK(call) ::dtensor::detail::check_cuda((call), #call, __FILE__, __LINE__)
/// After a kernel launch: a bad configuration shows up in cudaGetLastError, not in the launch.
#define DTENSOR_CUDA_CHECK_LAUNCH(what) ::dtensor::detail::check_cuda(cudaGetLastError(), what, __FILE__, __LINE__)
