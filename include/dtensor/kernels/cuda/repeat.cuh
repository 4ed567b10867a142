// dtensor/kernels/cuda/repeat.cuh — the twin of kernels/host/repeat.hpp on CudaTensor: one thread
// per output element; the backward sums the repeats in the host's order (0 .. repeats-1) in
// compute_t<T>, so it gives the host's bits.
#pragma once

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/host/repeat.hpp"

namespace dtensor::kernels::cuda {

namespace detail {
// x viewed as [outer, n, inner], y as [outer, n * repeats, inner].
template <class T>
__global__ void repeat_kernel(T* y, const T* x, Extent total, Extent n, Extent inner, Extent repeats) {
  for (Extent i = gidx(); i < total; i += gstride()) {
    const Extent k = i % inner, slice = (i / inner) % (n * repeats), o = i / (inner * n * repeats);
    y[i] = x[(o * n + slice / repeats) * inner + k];
  }
}
template <class T>
__global__ void repeat_backward_kernel(T* dx, const T* dy, Extent total, Extent inner, Extent repeats) {
  using C = compute_t<T>;
  for (Extent i = gidx(); i < total; i += gstride()) {
    const Extent k = i % inner, group = i / inner;  // group: (o, j) flattened
    C sum = 0;
    for (Extent r = 0; r < repeats; ++r) sum += C(dy[(group * repeats + r) * inner + k]);
    dx[i] = T(sum);
  }
}
}  // namespace detail

template <FloatElement T, std::size_t R>
CudaTensor<T, R> repeat_interleave(const CudaTensor<T, R>& x, std::size_t dim, Extent repeats) {
  const auto a = detail::around(x.shape(), dim);
  Shape<R> out = x.shape();
  out[dim] *= repeats;
  auto y = CudaTensor<T, R>::uninitialized(out);
  if (y.numel() == 0) return y;
  detail::repeat_kernel<<<detail::grid_for(y.numel()), detail::block, 0, detail::stream()>>>(
      y.data(), x.data(), y.numel(), a.n, a.inner, repeats);
  detail::launched("repeat_kernel");
  return y;
}

template <FloatElement T, std::size_t R>
CudaTensor<T, R> repeat_interleave_backward(const CudaTensor<T, R>& dy, std::size_t dim, Extent repeats) {
  Shape<R> out = dy.shape();
  out[dim] /= repeats;
  const auto a = detail::around(out, dim);
  auto dx = CudaTensor<T, R>::uninitialized(out);
  if (dx.numel() == 0) return dx;
  detail::repeat_backward_kernel<<<detail::grid_for(dx.numel()), detail::block, 0, detail::stream()>>>(
      dx.data(), dy.data(), dx.numel(), a.inner, repeats);
  detail::launched("repeat_backward_kernel");
  return dx;
}

}  // namespace dtensor::kernels::cuda
