// dtensor/ops/activations.hpp — pointwise activations of DTensors and their backwards.
//
//   auto h = ops::gelu(x);   auto dx = ops::gelu_backward(dh, x);   // tanh approximation (GPT-2)
//   auto h = ops::relu(x);   auto dx = ops::relu_backward(dh, x);
//   auto h = ops::silu(x);   auto dx = ops::silu_backward(dh, x);
//   auto e = ops::exp(x);    auto dx = ops::exp_backward(de, e);    // takes the output
//
// Sharding (rules::Unary): Shard<d> -> Shard<d>, Replicate -> Replicate. A Partial input has no
// rule: these maps are not linear, so they need the reduced value (redistribute first).
// Backward (rules::LinearInGrad on (x, dy)): the backward is linear in dy, so dy split like x
// gives the same split, and for a Replicate x a Partial<sum> dy gives a Partial<sum> gradient.
//
// No communication: every rank maps its own piece.
#pragma once

#include "dtensor/kernels/activations.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

namespace detail {

template <fixed_string Op, class X, class F>
auto unary(const X& x, F local_op) {
  detail::require_rule_hint<Op, "it is not linear, so a Partial input must be reduced first (redistribute it)",
                            rules::Unary{false}, typename X::mesh_type, typename X::layout>();
  using L = rules::unary_t<typename X::layout>;
  return make<typename X::value_type, X::rank, L>(x.mesh(), x.shape(), local_op(x.to_local()));
}

/// The gradient of a pointwise map given the saved tensor s (its input, or its output for exp).
template <fixed_string Op, class DY, class S, class F>
auto unary_backward(const DY& dy, const S& s, F local_op) {
  static_assert(std::is_same_v<typename DY::value_type, typename S::value_type> && DY::rank == S::rank,
                "a backward takes a gradient of the forward's element type and rank");
  require_same_mesh_type<DY, S>();
  require_rule<Op, rules::LinearInGrad{}, typename S::mesh_type, typename S::layout, typename DY::layout>();
  using L = rules::linear_in_grad_t<typename S::layout, typename DY::layout>;
  check(dy.shape() == s.shape(), Op.data, dy.mesh(), "gradient ", to_string(dy.shape()), " and saved tensor ",
        to_string(s.shape()), " differ");
  return make<typename DY::value_type, DY::rank, L>(dy.mesh(), dy.shape(), local_op(s.to_local(), dy.to_local()));
}

}  // namespace detail

/// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). No communication.
template <FloatDTensor X>
auto gelu(const X& x) {
  return detail::unary<"gelu">(x, [](const auto& l) { return kernels::gelu(l); });
}
template <FloatDTensor DY, FloatDTensor X>
auto gelu_backward(const DY& dy, const X& x) {
  return detail::unary_backward<"gelu_backward">(
      dy, x, [](const auto& xl, const auto& gl) { return kernels::gelu_backward(xl, gl); });
}

template <FloatDTensor X>
auto relu(const X& x) {
  return detail::unary<"relu">(x, [](const auto& l) { return kernels::relu(l); });
}
template <FloatDTensor DY, FloatDTensor X>
auto relu_backward(const DY& dy, const X& x) {
  return detail::unary_backward<"relu_backward">(
      dy, x, [](const auto& xl, const auto& gl) { return kernels::relu_backward(xl, gl); });
}

/// x * sigmoid(x).
template <FloatDTensor X>
auto silu(const X& x) {
  return detail::unary<"silu">(x, [](const auto& l) { return kernels::silu(l); });
}
template <FloatDTensor DY, FloatDTensor X>
auto silu_backward(const DY& dy, const X& x) {
  return detail::unary_backward<"silu_backward">(
      dy, x, [](const auto& xl, const auto& gl) { return kernels::silu_backward(xl, gl); });
}

template <FloatDTensor X>
auto exp(const X& x) {
  return detail::unary<"exp">(x, [](const auto& l) { return kernels::exp(l); });
}
/// The gradient of y = exp(x) given y (not x): dy * y.
template <FloatDTensor DY, FloatDTensor Y>
auto exp_backward(const DY& dy, const Y& y) {
  return detail::unary_backward<"exp_backward">(
      dy, y, [](const auto& yl, const auto& gl) { return kernels::exp_backward(yl, gl); });
}

}  // namespace dtensor::ops
