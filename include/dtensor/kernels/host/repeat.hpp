// dtensor/kernels/host/repeat.hpp — repeat_interleave along one dimension, and its adjoint.
//
//   auto y  = repeat_interleave(x, /*dim=*/1, /*repeats=*/4);            // [B, K, T, D] -> [B, 4K, T, D]
//   auto dx = repeat_interleave_backward(dy, /*dim=*/1, /*repeats=*/4);  // sums each group of 4 back
//
// Slice j of x along dim becomes slices [j * repeats, (j + 1) * repeats) of y (torch's
// repeat_interleave): grouped-query attention shares KV head j among the query heads of group j.
// The backward sums the repeats of each slice in a fixed order (0 .. repeats-1), in compute_t<T>.
#pragma once

#include <cstddef>

#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels::host {

template <FloatElement T, std::size_t R>
HostTensor<T, R> repeat_interleave(const HostTensor<T, R>& x, std::size_t dim, Extent repeats) {
  const auto a = detail::around(x.shape(), dim);
  Shape<R> out = x.shape();
  out[dim] *= repeats;
  auto y = HostTensor<T, R>::uninitialized(out);
  const T* px = x.data();
  T* py = y.data();
  for (Extent o = 0; o < a.outer; ++o)
    for (Extent j = 0; j < a.n; ++j)
      for (Extent r = 0; r < repeats; ++r) {
        const T* src = px + (o * a.n + j) * a.inner;
        T* dst = py + ((o * a.n + j) * repeats + r) * a.inner;
        for (Extent i = 0; i < a.inner; ++i) dst[i] = src[i];
      }
  return y;
}

template <FloatElement T, std::size_t R>
HostTensor<T, R> repeat_interleave_backward(const HostTensor<T, R>& dy, std::size_t dim, Extent repeats) {
  using C = compute_t<T>;
  Shape<R> out = dy.shape();
  out[dim] /= repeats;
  const auto a = detail::around(out, dim);
  auto dx = HostTensor<T, R>::uninitialized(out);
  const T* pg = dy.data();
  T* pd = dx.data();
  for (Extent o = 0; o < a.outer; ++o)
    for (Extent j = 0; j < a.n; ++j) {
      T* dst = pd + (o * a.n + j) * a.inner;
      for (Extent i = 0; i < a.inner; ++i) {
        C sum = 0;
        for (Extent r = 0; r < repeats; ++r) sum += C(pg[((o * a.n + j) * repeats + r) * a.inner + i]);
        dst[i] = T(sum);
      }
    }
  return dx;
}

}  // namespace dtensor::kernels::host
