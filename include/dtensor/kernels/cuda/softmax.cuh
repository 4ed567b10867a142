// dtensor/kernels/cuda/softmax.cuh — the twin of kernels/host/softmax.hpp on CudaTensor: softmax,
// log_softmax and their backwards over the last dimension, with the host's recipe (shift by
// the row max, exps and sums in double, probabilities as exp(x - lse)). One block per row.
#pragma once

#include "dtensor/kernels/cuda/common.cuh"

namespace dtensor::kernels::cuda {

namespace detail {

inline constexpr double neg_inf = -__builtin_huge_val();

/// lse of row x[0, n) (-inf for an empty row), every thread of the block gets it.
template <class T>
__device__ Stat row_lse(const T* x, Extent n) {
  double m = neg_inf;
  for (Extent j = threadIdx.x; j < n; j += blockDim.x) m = fmax(m, double(x[j]));
  m = block_max(m);
  if (m == neg_inf) return neg_inf;
  double s = 0;
  for (Extent j = threadIdx.x; j < n; j += blockDim.x) s += ::exp(double(x[j]) - m);
  return m + ::log(block_sum(s));
}

/// log: y = x - lse; else y = exp(x - lse).
template <class T>
__global__ void softmax_kernel(T* y, const T* x, Extent rows, Extent n, bool log) {
  const Extent r = blockIdx.x;
  if (r >= rows) return;
  const T* xr = x + r * n;
  const Stat lse = row_lse(xr, n);
  for (Extent j = threadIdx.x; j < n; j += blockDim.x)
    y[r * n + j] = T(log ? double(xr[j]) - lse : ::exp(double(xr[j]) - lse));
}

/// softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy).
template <class T>
__global__ void softmax_backward_kernel(T* dx, const T* y, const T* dy, Extent rows, Extent n, bool log) {
  const Extent r = blockIdx.x;
  if (r >= rows) return;
  const T *yr = y + r * n, *gr = dy + r * n;
  double s = 0;
  for (Extent j = threadIdx.x; j < n; j += blockDim.x) s += log ? double(gr[j]) : double(gr[j]) * double(yr[j]);
  s = block_sum(s);
  for (Extent j = threadIdx.x; j < n; j += blockDim.x)
    dx[r * n + j] = T(log ? double(gr[j]) - ::exp(double(yr[j])) * s : double(yr[j]) * (double(gr[j]) - s));
}

template <class T, std::size_t R>
CudaTensor<T, R> softmax_impl(const CudaTensor<T, R>& x, bool log) {
  auto y = CudaTensor<T, R>::uninitialized(x.shape());
  const Extent rows = leading_rows(x.shape()), n = x.extent(R - 1);
  if (rows * n == 0) return y;
  softmax_kernel<<<rows_grid(rows), block, 0, stream()>>>(y.data(), x.data(), rows, n, log);
  launched("softmax_kernel");
  return y;
}
template <class T, std::size_t R>
CudaTensor<T, R> softmax_backward_impl(const char* /*op*/, const CudaTensor<T, R>& y, const CudaTensor<T, R>& dy, bool log) {
  auto dx = CudaTensor<T, R>::uninitialized(y.shape());
  const Extent rows = leading_rows(y.shape()), n = y.extent(R - 1);
  if (rows * n == 0) return dx;
  softmax_backward_kernel<<<rows_grid(rows), block, 0, stream()>>>(dx.data(), y.data(), dy.data(), rows, n, log);
  launched("softmax_backward_kernel");
  return dx;
}

}  // namespace detail

template <FloatElement T, std::size_t R>
CudaTensor<T, R> softmax(const CudaTensor<T, R>& x) { return detail::softmax_impl(x, false); }
template <FloatElement T, std::size_t R>
CudaTensor<T, R> softmax_backward(const CudaTensor<T, R>& y, const CudaTensor<T, R>& dy) {
  return detail::softmax_backward_impl("softmax_backward", y, dy, false);
}
template <FloatElement T, std::size_t R>
CudaTensor<T, R> log_softmax(const CudaTensor<T, R>& x) { return detail::softmax_impl(x, true); }
template <FloatElement T, std::size_t R>
CudaTensor<T, R> log_softmax_backward(const CudaTensor<T, R>& y, const CudaTensor<T, R>& dy) {
  return detail::softmax_backward_impl("log_softmax_backward", y, dy, true);
}

}  // namespace dtensor::kernels::cuda
