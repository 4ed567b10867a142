// dtensor/kernels/meta/activations.hpp — the meta twin of kernels/host/activations.hpp: gelu, relu,
// silu, exp and their backwards. A forward counts one FLOP per element; a backward two (the
// derivative and the product with dy).
#pragma once

#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

namespace detail {
template <class T, std::size_t R>
MetaTensor<T, R> map(const char* op, const MetaTensor<T, R>& x) {
  pointwise_cost<T>(op, x.numel(), 1);
  return result<T>(x.shape());
}
template <class T, std::size_t R>
MetaTensor<T, R> map_backward(const char* op, const MetaTensor<T, R>& x, const MetaTensor<T, R>& /*dy*/) {
  pointwise_cost<T>(op, x.numel(), 2, 2);
  return result<T>(x.shape());
}
}  // namespace detail

template <FloatElement T, std::size_t R>
MetaTensor<T, R> gelu(const MetaTensor<T, R>& x) { return detail::map("gelu", x); }
template <FloatElement T, std::size_t R>
MetaTensor<T, R> gelu_backward(const MetaTensor<T, R>& x, const MetaTensor<T, R>& dy) {
  return detail::map_backward("gelu_backward", x, dy);
}
template <FloatElement T, std::size_t R>
MetaTensor<T, R> relu(const MetaTensor<T, R>& x) { return detail::map("relu", x); }
template <FloatElement T, std::size_t R>
MetaTensor<T, R> relu_backward(const MetaTensor<T, R>& x, const MetaTensor<T, R>& dy) {
  return detail::map_backward("relu_backward", x, dy);
}
template <FloatElement T, std::size_t R>
MetaTensor<T, R> silu(const MetaTensor<T, R>& x) { return detail::map("silu", x); }
template <FloatElement T, std::size_t R>
MetaTensor<T, R> silu_backward(const MetaTensor<T, R>& x, const MetaTensor<T, R>& dy) {
  return detail::map_backward("silu_backward", x, dy);
}
template <FloatElement T, std::size_t R>
MetaTensor<T, R> exp(const MetaTensor<T, R>& x) { return detail::map("exp", x); }
template <FloatElement T, std::size_t R>
MetaTensor<T, R> exp_backward(const MetaTensor<T, R>& y, const MetaTensor<T, R>& dy) {
  return detail::map_backward("exp_backward", y, dy);
}

}  // namespace dtensor::kernels::meta
