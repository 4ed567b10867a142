// dtensor/kernels/cuda/common.cuh — what every CUDA kernel shares: the tensor alias, the
// cuBLAS handle and its check, launch shapes and a deterministic block sum in double.
//
//   kernels::cuda::CudaTensor<float, 2>        // Tensor<float, 2, cuda_space>
//   DTENSOR_CUBLAS_CHECK(cublasGemmEx(...));    // failure -> dtensor::Error(call, status name)
//   detail::blas()                              // this thread's handle, on the current stream
//
// The kernels are the twins of kernels/host (same names, argument order and semantics, on
// CudaTensor), so the ops layer dispatches on the tensor's space. They follow the host
// precision policy (kernels/host/common.hpp): per-element math in compute_t<T>, row sums and
// statistics in double (Stat). The sums are tree-reduced in a fixed order per launch shape, so
// a kernel gives the same bits on every call, though not the host's bits: the tests compare
// with the host twin within a stated tolerance. All work is issued on cuda::current_stream().
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dtensor/core/cuda_check.cuh"
#include "dtensor/core/cuda_space.cuh"
#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels::cuda {

using host::compute_t;
using host::FloatElement;
using host::IndexElement;
using host::Stat;

template <class T, std::size_t R>
using CudaTensor = Tensor<T, R, cuda_space>;

namespace detail {

using host::detail::around;
using host::detail::check;
using host::detail::check_dim;
using host::detail::check_same_shape;
using host::detail::leading_rows;

inline void check_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) [[unlikely]]
    throw Error(call, dtensor::detail::cat(cublasGetStatusName(s), ": ", cublasGetStatusString(s), " (at ", file, ":",
                                           line, ")"),
                Error::no_rank, int(s));
}

/// One resource per thread and device (ranks of cuda_threads are threads): made on first use,
/// made again when the thread's current device changes, destroyed when the thread ends. Each
/// caller's lambdas make it a holder of its own (the cuBLAS and cuBLASLt handles, a workspace).
template <class Make, class Destroy>
auto per_thread_device(Make make, Destroy destroy) {
  using R = decltype(make());
  struct Held {
    R r{};
    int device = -1;
    ~Held() {
      if (r) Destroy{}(r);
    }
  };
  thread_local Held held;
  int dev = 0;
  DTENSOR_CUDA_CHECK(cudaGetDevice(&dev));
  if (!held.r || held.device != dev) {
    if (held.r) destroy(held.r);
    held.r = R{};
    held.r = make();
    held.device = dev;
  }
  return held.r;
}

/// This thread's cuBLAS handle (created on first use, one per thread and device: ranks of
/// cuda_threads are threads), bound to the current stream before every call.
inline cublasHandle_t blas() {
  cublasHandle_t h = per_thread_device(
      [] {
        cublasHandle_t made = nullptr;
        check_cublas(cublasCreate(&made), "cublasCreate", __FILE__, __LINE__);
        return made;
      },
      [](cublasHandle_t old) { cublasDestroy(old); });
  check_cublas(cublasSetStream(h, dtensor::cuda::current_stream()), "cublasSetStream", __FILE__, __LINE__);
  return h;
}

inline cudaStream_t stream() { return dtensor::cuda::current_stream(); }

/// The largest power of two up to 256 that divides p's address: what a vector load (16 bytes),
/// cuBLASLt (its alignment preferences) or a packed kernel may assume of a buffer.
inline std::uint32_t alignment_of(const void* p) {
  std::uint32_t a = 256;
  while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

inline constexpr unsigned block = 256;
inline unsigned grid_for(Extent n) { return dtensor::cuda::detail::grid_for(std::size_t(n), block); }

/// Sum of v over the block (blockDim.x == block), the same tree every time; all threads get it.
__device__ inline double block_sum(double v) {
  __shared__ double buf[block];
  __syncthreads();  // the buffer may still be read by a previous call
  buf[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = block / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  return buf[0];
}

/// Max of v over the block.
__device__ inline double block_max(double v) {
  __shared__ double buf[block];
  __syncthreads();
  buf[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = block / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) buf[threadIdx.x] = fmax(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
  return buf[0];
}

/// Grid-stride loop index helpers.
__device__ inline Extent gidx() { return Extent(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline Extent gstride() { return Extent(gridDim.x) * blockDim.x; }

/// One block per row: a grid of `rows` blocks (rows may exceed 65535; x allows 2^31 - 1).
inline unsigned rows_grid(Extent rows) { return unsigned(rows > 0 ? rows : 1); }

inline void launched(const char* kernel) { DTENSOR_CUDA_CHECK_LAUNCH(kernel); }

/// Where a kernel reports the first bad value it meets (an id or a target out of range), so that
/// the host can throw the host twin's error: 0 while all is well, else 1 + the position.
class BadValueFlag {
 public:
  BadValueFlag() : flag_(Shape<1>{1}) {}
  unsigned long long* data() { return reinterpret_cast<unsigned long long*>(flag_.data()); }
  /// The position of a bad value, or -1 (waits for the kernels before it on the stream).
  Extent position() const {
    const auto h = to_space<host_space>(flag_);
    return Extent(h[0]) - 1;
  }

 private:
  CudaTensor<std::int64_t, 1> flag_;
};

__device__ inline void report_bad(unsigned long long* flag, Extent position) {
  atomicCAS(flag, 0ull, static_cast<unsigned long long>(position) + 1ull);
}

/// Extents and row-major strides of up to 8 dimensions, passed to kernels by value.
struct Dims {
  int rank = 0;
  Extent extent[8] = {}, stride[8] = {};
};
template <std::size_t R>
Dims dims_of(const Shape<R>& extents, const Shape<R>& strides) {
  Dims d;
  d.rank = int(R);
  for (std::size_t i = 0; i < R; ++i) d.extent[i] = extents[i], d.stride[i] = strides[i];
  return d;
}
/// The offset, under `from`'s strides, of the element at row-major position i of `shape`.
__device__ inline Extent offset_of(Extent i, const Dims& shape, const Dims& from) {
  Extent off = 0;
  for (int d = shape.rank - 1; d >= 0; --d) {
    const Extent e = shape.extent[d] > 0 ? shape.extent[d] : 1;
    off += (i % e) * from.stride[d];
    i /= e;
  }
  return off;
}

}  // namespace detail
}  // namespace dtensor::kernels::cuda

#define DTENSOR_CUBLAS_CHECK(call) ::dtensor::kernels::cuda::detail::check_cublas((call), #call, __FILE__, __LINE__)
