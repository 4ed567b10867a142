// dtensor/ops/softmax.hpp — softmax and log-softmax over the last dimension of a DTensor.
//
//   auto p = ops::softmax(x);       auto dx = ops::softmax_backward(dp, p);       // take the output
//   auto l = ops::log_softmax(x);   auto dx = ops::log_softmax_backward(dl, l);
//
// Sharding (rules::Rowwise): Shard<d> for d < last -> Shard<d>; Replicate -> Replicate. The last
// dimension must not be split (the row statistics would need communication: a vocabulary-split
// log-softmax is the loss-parallel building block of parallel/) and Partial is not allowed.
// Backward (rules::LinearInGrad on (y, dy)): linear in dy.
//
// No communication.
#pragma once

#include "dtensor/kernels/softmax.hpp"
#include "dtensor/ops/activations.hpp"

namespace dtensor::ops {

namespace detail {
template <fixed_string Op, class X>
constexpr void require_rowwise() {
  constexpr rules::Rowwise<1> rule{int(X::rank)};
  require_rule_hint<Op, "it normalizes over the last dimension, which must not be split, and is not linear (no Partial)",
                    rule, typename X::mesh_type, typename X::layout>();
}

template <fixed_string Op, class X, class F>
auto rowwise(const X& x, F local_op) {
  require_rowwise<Op, X>();
  using L = rules::softmax_t<typename X::layout, X::rank>;
  return make<typename X::value_type, X::rank, L>(x.mesh(), x.shape(), local_op(x.to_local()));
}
}  // namespace detail

/// exp(x - logsumexp(x)) along the last dimension. No communication.
template <FloatDTensor X>
auto softmax(const X& x) {
  return detail::rowwise<"softmax">(x, [](const auto& l) { return kernels::softmax(l); });
}

/// x - logsumexp(x) along the last dimension. No communication.
template <FloatDTensor X>
auto log_softmax(const X& x) {
  return detail::rowwise<"log_softmax">(x, [](const auto& l) { return kernels::log_softmax(l); });
}

/// The gradient of y = softmax(x) given y: y * (dy - sum(dy * y)).
template <FloatDTensor DY, FloatDTensor Y>
auto softmax_backward(const DY& dy, const Y& y) {
  detail::require_rowwise<"softmax_backward", Y>();
  return detail::unary_backward<"softmax_backward">(
      dy, y, [](const auto& yl, const auto& gl) { return kernels::softmax_backward(yl, gl); });
}

/// The gradient of y = log_softmax(x) given y: dy - exp(y) * sum(dy).
template <FloatDTensor DY, FloatDTensor Y>
auto log_softmax_backward(const DY& dy, const Y& y) {
  detail::require_rowwise<"log_softmax_backward", Y>();
  return detail::unary_backward<"log_softmax_backward">(
      dy, y, [](const auto& yl, const auto& gl) { return kernels::log_softmax_backward(yl, gl); });
}

}  // namespace dtensor::ops
