// dtensor/ops/norm.hpp — LayerNorm and RMSNorm over the last dimension of a DTensor.
//
//   auto [y, stats] = ops::layer_norm(x, w, b, 1e-5);
//   auto [dx, dw, db] = ops::layer_norm_backward(dy, x, w, stats);
//   auto [y, stats] = ops::rms_norm(x, w, 1e-6);
//   auto [dx, dw] = ops::rms_norm_backward(dy, x, w, stats);
//
// Sharding (rules::Rowwise): x Shard<d> for d < last -> Shard<d>, Replicate -> Replicate; the
// weight and bias must be Replicate (the last dimension is never split: the row moments would
// need communication). Partial x has no rule (not linear).
// Backward: dx follows rules::LinearInGrad on (x, dy); dw and db are sums over the rows of this
// rank (rules::SumRows): rows split across ranks (sequence or data parallel) give Partial<sum>,
// which the caller reduces (redistribute to Replicate, or reduce-scatter under FSDP).
//
// The statistics (mean, 1/std per row, double) are this rank's rows, kept locally for the
// backward; they are not a DTensor (rows of a [B, T, C] split on T are not one block).
//
// No communication.
#pragma once

#include <tuple>

#include "dtensor/kernels/norm.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

/// Per-row statistics of this rank's rows, saved by the forward for the backward (in x's space).
template <class Space>
struct BasicNormStats {
  Tensor<double, 1, Space> mean;  // [local rows]; empty for RMSNorm
  Tensor<double, 1, Space> rstd;  // [local rows]
  auto tensors() { return std::tie(mean, rstd); }  // what an activation offload moves (nn/activation_offload.hpp)
};
using NormStats = BasicNormStats<host_space>;

template <class Y>
struct NormResult {
  Y y;
  BasicNormStats<typename Y::space> stats;
};

template <class DX, class DW>
struct LayerNormGrads {
  DX dx;
  DW dweight;
  DW dbias;
};

template <class DX, class DW>
struct RmsNormGrads {
  DX dx;
  DW dweight;
};

namespace detail {

template <fixed_string Op, class X, class W>
void check_norm_args(const X& x, const W& w) {
  check(w.extent(0) == x.extent(X::rank - 1), Op.data, x.mesh(), "weight ", to_string(w.shape()),
        " does not match the last dimension of x ", to_string(x.shape()));
}

/// What a norm's backward checks: the forward's rule for x and the weight, dy's layout against
/// x's (at compile time), the weight's extent and the saved statistics' rows (at run time).
template <fixed_string Op, class DY, class X, class W>
void check_norm_backward(const DY& dy, const X& x, const W& weight, const BasicNormStats<typename X::space>& s, bool has_mean) {
  require_same_mesh_type<DY, X, W>();
  constexpr rules::Rowwise<2> fwd{int(X::rank)};
  require_rule<Op, fwd, typename X::mesh_type, typename X::layout, typename W::layout>();
  require_rule<Op, rules::LinearInGrad{}, typename X::mesh_type, typename X::layout, typename DY::layout>();
  check_norm_args<Op>(x, weight);
  const Extent rows = leading_rows(x.to_local().shape());
  check(dy.shape() == x.shape() && s.rstd.extent(0) == rows && (!has_mean || s.mean.extent(0) == rows), Op.data,
        x.mesh(), "dy ", to_string(dy.shape()), ", x ", to_string(x.shape()), ", saved statistics for ",
        s.rstd.extent(0), " rows (this rank holds ", rows, "): pass the statistics of this forward");
}

/// The weight-gradient layout of a norm: dy summed over this rank's rows.
template <class DY>
using norm_param_grad_layout = rules::sum_rows_t<typename DY::layout, DY::rank>;

}  // namespace detail

/// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension. No communication.
template <FloatDTensor X, FloatDTensor W, FloatDTensor B>
auto layer_norm(const X& x, const W& weight, const B& bias, double eps = 1e-5) {
  using T = typename X::value_type;
  static_assert(W::rank == 1 && B::rank == 1, "layer_norm: weight and bias are 1-D [C]");
  detail::require_same_mesh_type<X, W, B>();
  constexpr rules::Rowwise<3> rule{int(X::rank)};
  detail::require_rule_hint<"layer_norm",
                            "x's last dimension must not be split, x must not be Partial, weight and bias must be "
                            "Replicate",
                            rule, typename X::mesh_type, typename X::layout, typename W::layout, typename B::layout>();
  using L = rules::layer_norm_t<typename X::layout, typename W::layout, typename B::layout, X::rank>;
  detail::check_same_mesh("layer_norm", x, weight, bias);
  detail::check_norm_args<"layer_norm">(x, weight);
  detail::check_norm_args<"layer_norm">(x, bias);
  auto f = kernels::layer_norm(x.to_local(), weight.to_local(), bias.to_local(), eps);
  auto y = detail::make<T, X::rank, L>(x.mesh(), x.shape(), std::move(f.y));
  return NormResult<decltype(y)>{std::move(y), BasicNormStats<typename X::space>{std::move(f.mean), std::move(f.rstd)}};
}

/// {dx, dweight, dbias} of layer_norm, given the forward's x, weight and statistics.
template <FloatDTensor DY, FloatDTensor X, FloatDTensor W>
auto layer_norm_backward(const DY& dy, const X& x, const W& weight, const BasicNormStats<typename X::space>& stats) {
  using T = typename X::value_type;
  detail::check_norm_backward<"layer_norm_backward">(dy, x, weight, stats, true);
  using LX = rules::linear_in_grad_t<typename X::layout, typename DY::layout>;
  using LW = detail::norm_param_grad_layout<DY>;
  auto g = kernels::layer_norm_backward(x.to_local(), weight.to_local(), stats.mean, stats.rstd, dy.to_local());
  auto dx = detail::make<T, X::rank, LX>(x.mesh(), x.shape(), std::move(g.dx));
  auto dw = detail::make<T, 1, LW>(x.mesh(), weight.shape(), std::move(g.dweight));
  auto db = detail::make<T, 1, LW>(x.mesh(), weight.shape(), std::move(g.dbias));
  return LayerNormGrads<decltype(dx), decltype(dw)>{std::move(dx), std::move(dw), std::move(db)};
}

/// y = x / sqrt(mean(x^2) + eps) * weight over the last dimension. No communication.
template <FloatDTensor X, FloatDTensor W>
auto rms_norm(const X& x, const W& weight, double eps = 1e-6) {
  using T = typename X::value_type;
  static_assert(W::rank == 1, "rms_norm: the weight is 1-D [C]");
  detail::require_same_mesh_type<X, W>();
  constexpr rules::Rowwise<2> rule{int(X::rank)};
  detail::require_rule_hint<"rms_norm",
                            "x's last dimension must not be split, x must not be Partial, the weight must be Replicate",
                            rule, typename X::mesh_type, typename X::layout, typename W::layout>();
  using L = rules::rms_norm_t<typename X::layout, typename W::layout, X::rank>;
  detail::check_same_mesh("rms_norm", x, weight);
  detail::check_norm_args<"rms_norm">(x, weight);
  auto f = kernels::rms_norm(x.to_local(), weight.to_local(), eps);
  auto y = detail::make<T, X::rank, L>(x.mesh(), x.shape(), std::move(f.y));
  return NormResult<decltype(y)>{std::move(y), BasicNormStats<typename X::space>{{}, std::move(f.rstd)}};
}

/// {dx, dweight} of rms_norm, given the forward's x, weight and statistics.
template <FloatDTensor DY, FloatDTensor X, FloatDTensor W>
auto rms_norm_backward(const DY& dy, const X& x, const W& weight, const BasicNormStats<typename X::space>& stats) {
  using T = typename X::value_type;
  detail::check_norm_backward<"rms_norm_backward">(dy, x, weight, stats, false);
  using LX = rules::linear_in_grad_t<typename X::layout, typename DY::layout>;
  using LW = detail::norm_param_grad_layout<DY>;
  auto g = kernels::rms_norm_backward(x.to_local(), weight.to_local(), stats.rstd, dy.to_local());
  auto dx = detail::make<T, X::rank, LX>(x.mesh(), x.shape(), std::move(g.dx));
  auto dw = detail::make<T, 1, LW>(x.mesh(), weight.shape(), std::move(g.dweight));
  return RmsNormGrads<decltype(dx), decltype(dw)>{std::move(dx), std::move(dw)};
}

}  // namespace dtensor::ops
