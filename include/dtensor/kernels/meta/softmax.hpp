// dtensor/kernels/meta/softmax.hpp — the meta twin of kernels/host/softmax.hpp: softmax,
// log_softmax and their backwards over the last dimension. Three FLOPs per element each way
// (forward: max, exp and sum, normalise; backward: product, row sum, update).
#pragma once

#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

inline constexpr std::int64_t softmax_flops_per_element = 3;

namespace detail {
template <class T, std::size_t R>
MetaTensor<T, R> rowwise(const char* op, const MetaTensor<T, R>& x) {
  pointwise_cost<T>(op, x.numel(), 1, softmax_flops_per_element);
  return result<T>(x.shape());
}
template <class T, std::size_t R>
MetaTensor<T, R> rowwise_backward(const char* op, const MetaTensor<T, R>& y, const MetaTensor<T, R>& /*dy*/) {
  pointwise_cost<T>(op, y.numel(), 2, softmax_flops_per_element);
  return result<T>(y.shape());
}
}  // namespace detail

template <FloatElement T, std::size_t R>
MetaTensor<T, R> softmax(const MetaTensor<T, R>& x) { return detail::rowwise("softmax", x); }
template <FloatElement T, std::size_t R>
MetaTensor<T, R> log_softmax(const MetaTensor<T, R>& x) { return detail::rowwise("log_softmax", x); }
template <FloatElement T, std::size_t R>
MetaTensor<T, R> softmax_backward(const MetaTensor<T, R>& y, const MetaTensor<T, R>& dy) {
  return detail::rowwise_backward("softmax_backward", y, dy);
}
template <FloatElement T, std::size_t R>
MetaTensor<T, R> log_softmax_backward(const MetaTensor<T, R>& y, const MetaTensor<T, R>& dy) {
  return detail::rowwise_backward("log_softmax_backward", y, dy);
}

}  // namespace dtensor::kernels::meta
