// dtensor/kernels/meta/repeat.hpp — the meta twin of kernels/host/repeat.hpp: repeat_interleave
// (a copy: no FLOPs, reads x, writes repeats * x) and its backward (repeats - 1 adds per output
// element).
#pragma once

#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

template <FloatElement T, std::size_t R>
MetaTensor<T, R> repeat_interleave(const MetaTensor<T, R>& x, std::size_t dim, Extent repeats) {
  Shape<R> out = x.shape();
  out[dim] *= repeats;
  detail::cost("repeat_interleave", 0, detail::bytes<T>(x.numel()), detail::bytes<T>(x.numel() * repeats));
  return detail::result<T>(out);
}

template <FloatElement T, std::size_t R>
MetaTensor<T, R> repeat_interleave_backward(const MetaTensor<T, R>& dy, std::size_t dim, Extent repeats) {
  Shape<R> out = dy.shape();
  out[dim] /= repeats;
  const Extent n = dy.numel() / repeats;
  detail::cost("repeat_interleave_backward", (repeats - 1) * n, detail::bytes<T>(dy.numel()), detail::bytes<T>(n));
  return detail::result<T>(out);
}

}  // namespace dtensor::kernels::meta
