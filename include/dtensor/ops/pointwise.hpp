// dtensor/ops/pointwise.hpp — elementwise arithmetic of DTensors: add, sub, mul (with
// broadcasting), scale, bias_add, and their backwards.
//
//   auto z = ops::add(x, y);                     // same rank; extents equal or 1 (broadcast)
//   auto [dx, dy] = ops::add_backward(dz, x, y); // dz summed back over broadcast dimensions
//   auto z = ops::mul(x, g);  auto [dx, dg] = ops::mul_backward(dz, x, g);
//   auto z = ops::scale(x, 0.5);  auto dx = ops::scale_backward(dz, 0.5);
//   auto y = ops::bias_add(x, b);                // x[..., C] + b[C]
//   auto [dx, db] = ops::bias_add_backward(dy);  // dx = dy, db = dy summed over the rows
//
// Sharding, per mesh dimension (rules::Binary, rules::Unary{linear}, rules::BiasAdd):
//   add/sub: (Shard<d>, Shard<d>) -> Shard<d>; (Replicate, Replicate) -> Replicate;
//            (Partial<op>, Partial<op>) -> Partial<op> for op sum or avg (linear);
//            (Shard<d>, Replicate) -> Shard<d> and (Replicate, Shard<d>) -> Shard<d> when the
//            Replicate operand broadcasts along d (its extent there is 1; checked at run time).
//   mul:     as add, but Partial only times Replicate: (Partial<op>, Replicate) -> Partial<op>
//            and (Replicate, Partial<op>); (Partial, Partial) has no rule (not linear).
//   scale:   Shard and Replicate pass; Partial<sum|avg> passes (linear); Partial<max|min> not.
//   bias_add: (Shard<d>, Replicate) -> Shard<d> for d < last; (Shard<last>, Shard<0>) -> Shard<last>;
//            (Replicate, Replicate) -> Replicate; (Partial<op>, Partial<op>) -> Partial<op>.
// Backward: the gradient of an operand that was broadcast is dz summed over the broadcast
// dimensions (rules::SumTo): where dz is split along such a dimension, Partial<sum>.
//
// No communication: every rank works on its own piece. Any memory space (kernels/dispatch.hpp).
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

template <class DA, class DB>
struct BinaryGrads {
  DA da;
  DB db;
};

template <class DX, class DB>
struct BiasAddGrads {
  DX dx;
  DB dbias;
};

namespace detail {

/// The run-time half of the broadcast rule: along a dimension split on some mesh dimension, a
/// Shard operand has the output's extent and a Replicate operand extent 1.
template <class A, class B>
void check_broadcast_layouts(const char* op, const A& a, const B& b, const Shape<A::rank>& out) {
  constexpr auto& la = A::layout::desc;
  constexpr auto& lb = B::layout::desc;
  for (std::size_t i = 0; i < A::mesh_type::ndim; ++i) {
    const auto &pa = la.placements[i], &pb = lb.placements[i];
    const int d = pa.is_shard() ? pa.dim : pb.is_shard() ? pb.dim : -1;
    if (d < 0) continue;
    const auto ud = std::size_t(d);
    const bool a_ok = pa.is_shard() ? a.extent(ud) == out[ud] : a.extent(ud) == 1;
    const bool b_ok = pb.is_shard() ? b.extent(ud) == out[ud] : b.extent(ud) == 1;
    check(a_ok && b_ok, op, a.mesh(), "a ", to_string(a.shape()), " and b ", to_string(b.shape()),
          " under layouts ", to_string(la), " and ", to_string(lb), ": dimension ", d, " is split on mesh dimension ", i,
          ", so an operand that is Replicate there must broadcast along it (extent 1) and a split one must have the "
          "full extent ", out[ud], ": redistribute one operand first");
  }
}

template <fixed_string Op, rules::Binary::Kind Kind, class A, class B, class F>
auto binary(const A& a, const B& b, F local_op) {
  using T = typename A::value_type;
  constexpr std::size_t R = A::rank;
  static_assert(std::is_same_v<T, typename B::value_type> && R == B::rank,
                "elementwise ops need operands of the same element type and rank (reshape to add leading 1s)");
  require_same_mesh_type<A, B>();
  constexpr rules::Binary rule{Kind};
  require_rule<Op, rule, typename A::mesh_type, typename A::layout, typename B::layout>();
  using L = rules::result_t<rule, typename A::layout, typename B::layout>;
  const char* op = Op.data;
  check_same_mesh(op, a, b);
  Shape<R> out{};
  for (std::size_t i = 0; i < R; ++i) {
    check(a.extent(i) == b.extent(i) || a.extent(i) == 1 || b.extent(i) == 1, op, a.mesh(), "extents ",
          to_string(a.shape()), " and ", to_string(b.shape()), " do not broadcast");
    out[i] = a.extent(i) == 1 ? b.extent(i) : a.extent(i);
  }
  check_broadcast_layouts(op, a, b, out);
  return make<T, R, L>(a.mesh(), out, local_op(a.to_local(), b.to_local()));
}

/// The gradient of an operand x broadcast to dz's extents: dz summed over those dimensions.
template <class DZ, class X>
auto sum_to(const DZ& dz, const X& x) {
  using L = rules::sum_to_t<typename DZ::layout, typename X::layout>;
  require_rule<"sum_to (the gradient of a broadcast operand)", rules::SumTo{}, typename X::mesh_type,
               typename DZ::layout, typename X::layout>();
  using T = typename DZ::value_type;
  constexpr std::size_t R = DZ::rank;
  // The local target extents: x's piece where x is not broadcast, else 1.
  const Box<R> box = local_box(L::desc, dz.mesh().shape(), dz.mesh().coordinate(), x.shape());
  auto local = box.extent == dz.to_local().shape() ? dz.to_local()
                                                    : kernels::sum_to(dz.to_local(), box.extent);
  return make<T, R, L>(dz.mesh(), x.shape(), std::move(local));
}

}  // namespace detail

/// a + b with broadcasting. No communication.
template <FloatDTensor A, FloatDTensor B>
auto add(const A& a, const B& b) {
  return detail::binary<"add", rules::Binary::add>(
      a, b, [](const auto& x, const auto& y) { return kernels::add_broadcast(x, y); });
}

/// a - b with broadcasting. No communication.
template <FloatDTensor A, FloatDTensor B>
auto sub(const A& a, const B& b) {
  return detail::binary<"sub", rules::Binary::add>(
      a, b, [](const auto& x, const auto& y) { return kernels::sub_broadcast(x, y); });
}

/// a * b elementwise with broadcasting. No communication.
template <FloatDTensor A, FloatDTensor B>
auto mul(const A& a, const B& b) {
  return detail::binary<"mul", rules::Binary::mul>(
      a, b, [](const auto& x, const auto& y) { return kernels::mul_broadcast(x, y); });
}

/// {da, db} of z = add(a, b): dz summed over the dimensions each operand was broadcast along.
template <FloatDTensor DZ, FloatDTensor A, FloatDTensor B>
auto add_backward(const DZ& dz, const A& a, const B& b) {
  auto da = detail::sum_to(dz, a);
  auto db = detail::sum_to(dz, b);
  return BinaryGrads<decltype(da), decltype(db)>{std::move(da), std::move(db)};
}

/// {da, db} of z = sub(a, b).
template <FloatDTensor DZ, FloatDTensor A, FloatDTensor B>
auto sub_backward(const DZ& dz, const A& a, const B& b) {
  auto da = detail::sum_to(dz, a);
  auto db = detail::sum_to(dz, b);
  kernels::scale_(db.local(), kernels::host::compute_t<typename DZ::value_type>(-1));
  return BinaryGrads<decltype(da), decltype(db)>{std::move(da), std::move(db)};
}

/// {da, db} of z = mul(a, b): da = sum_to(dz * b), db = sum_to(dz * a).
template <FloatDTensor DZ, FloatDTensor A, FloatDTensor B>
auto mul_backward(const DZ& dz, const A& a, const B& b) {
  auto da = detail::sum_to(mul(dz, b), a);
  auto db = detail::sum_to(mul(dz, a), b);
  return BinaryGrads<decltype(da), decltype(db)>{std::move(da), std::move(db)};
}

/// alpha * x. Partial<sum|avg> stays Partial (linear). No communication.
template <FloatDTensor X>
auto scale(const X& x, double alpha) {
  constexpr rules::Unary rule{true};
  detail::require_rule_hint<"scale", "a Partial<max|min> does not commute with scaling: redistribute first", rule,
                            typename X::mesh_type, typename X::layout>();
  using L = rules::linear_unary_t<typename X::layout>;
  using T = typename X::value_type;
  return detail::make<T, X::rank, L>(
      x.mesh(), x.shape(), kernels::scale(x.to_local(), kernels::host::compute_t<T>(alpha)));
}

/// The gradient of scale(x, alpha): alpha * dy.
template <FloatDTensor DY>
auto scale_backward(const DY& dy, double alpha) {
  return scale(dy, alpha);
}

/// x[..., C] + bias[C]. No communication. A temporary x is added to in place (its storage is
/// the result's), an lvalue is copied.
template <class XRef, FloatDTensor B>
  requires FloatDTensor<std::remove_cvref_t<XRef>>
auto bias_add(XRef&& x, const B& bias) {
  using X = std::remove_cvref_t<XRef>;
  using T = typename X::value_type;
  constexpr std::size_t R = X::rank;
  static_assert(B::rank == 1 && std::is_same_v<T, typename B::value_type>,
                "bias_add: the bias is a 1-D tensor of x's element type");
  detail::require_same_mesh_type<X, B>();
  constexpr rules::BiasAdd rule{int(R)};
  detail::require_rule_hint<"bias_add", "the bias must be Replicate, or split like x's last dimension", rule,
                            typename X::mesh_type, typename X::layout, typename B::layout>();
  using L = rules::bias_add_t<typename X::layout, typename B::layout, R>;
  detail::check_same_mesh("bias_add", x, bias);
  detail::check(bias.extent(0) == x.extent(R - 1), "bias_add", x.mesh(), "bias ", to_string(bias.shape()),
                " does not match the last dimension of x ", to_string(x.shape()));
  const auto global = x.shape();
  auto local = kernels::add_bias(std::forward<XRef>(x).to_local(), bias.to_local());
  return detail::make<T, R, L>(bias.mesh(), global, std::move(local));
}

/// The gradient of bias_add's bias alone: dy summed over every dimension but the last.
template <FloatDTensor DY>
auto bias_grad(const DY& dy) {
  using T = typename DY::value_type;
  constexpr std::size_t R = DY::rank;
  constexpr rules::SumRows rule{int(R)};
  detail::require_rule<"bias_grad", rule, typename DY::mesh_type, typename DY::layout>();
  using L = rules::sum_rows_t<typename DY::layout, R>;
  return detail::make<T, 1, L>(dy.mesh(), Shape<1>{dy.extent(R - 1)}, kernels::bias_grad(dy.to_local()));
}

/// {dx, dbias} of y = bias_add(x, bias): dx = dy (a copy), dbias = bias_grad(dy).
template <FloatDTensor DY>
auto bias_add_backward(const DY& dy) {
  auto db = bias_grad(dy);
  return BiasAddGrads<DY, decltype(db)>{dy, std::move(db)};
}

}  // namespace dtensor::ops
