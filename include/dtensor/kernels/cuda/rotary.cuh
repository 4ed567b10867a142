// dtensor/kernels/cuda/rotary.cuh — the twin of kernels/host/rotary.hpp on CudaTensor: one
// thread per (b, t, h, pair); the angle comes from the shared formula in double
// (host::detail::rotary_angle), the rotation runs in compute_t<T>.
#pragma once

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/host/rotary.hpp"

namespace dtensor::kernels::cuda {

namespace detail {
template <class T, class Id>
__global__ void rotary_kernel(T* y, const T* x, const Id* positions, Extent pairs, Extent heads, Extent half,
                              Rope rope, double sign) {
  using C = compute_t<T>;
  for (Extent i = gidx(); i < pairs; i += gstride()) {
    const Extent pair = i % half, row = i / half;  // row: (b, t, h) flattened
    const double angle = sign * host::detail::rotary_angle(double(positions[row / heads]), pair, half, rope);
    const C c = C(::cos(angle)), s = C(::sin(angle));
    const Extent lo = row * 2 * half + pair, hi = lo + half;
    const C a = C(x[lo]), b = C(x[hi]);
    y[lo] = T(a * c - b * s);
    y[hi] = T(b * c + a * s);
  }
}

template <class T, class Id>
CudaTensor<T, 4> rotate(const CudaTensor<T, 4>& x, const CudaTensor<Id, 2>& positions, Rope rope, double sign) {
  auto y = CudaTensor<T, 4>::uninitialized(x.shape());
  const Extent half = x.extent(3) / 2, pairs = x.numel() / 2;
  if (pairs == 0) return y;
  rotary_kernel<<<grid_for(pairs), block, 0, stream()>>>(y.data(), x.data(), positions.data(), pairs, x.extent(2),
                                                         half, rope, sign);
  launched("rotary_kernel");
  return y;
}
}  // namespace detail

template <FloatElement T, IndexElement Id>
CudaTensor<T, 4> rotary(const CudaTensor<T, 4>& x, const CudaTensor<Id, 2>& positions, const Rope& rope) {
  return detail::rotate(x, positions, rope, 1.0);
}
template <FloatElement T, IndexElement Id>
CudaTensor<T, 4> rotary_backward(const CudaTensor<Id, 2>& positions, const CudaTensor<T, 4>& dy, const Rope& rope) {
  return detail::rotate(dy, positions, rope, -1.0);
}

}  // namespace dtensor::kernels::cuda
