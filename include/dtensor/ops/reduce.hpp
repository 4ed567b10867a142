// dtensor/ops/reduce.hpp — sum, mean and max of a DTensor over one dimension (kept, extent 1).
//
//   auto s = ops::sum<1>(x);     auto dx = ops::sum_backward<1>(ds, x);
//   auto m = ops::mean<1>(x);    auto dx = ops::mean_backward<1>(dm, x);
//   auto [v, idx] = ops::max<1>(x);
//   auto dx = ops::max_backward<1>(dv, x, saved);                 // the dimension is not split
//   auto dx = ops::max_backward<1>(dv, x, saved, global_values);  // it is: pass the reduced maxima
//
// Sharding (rules::Reduce), per mesh dimension:
//   x Shard<dim>     -> sum, mean: Partial<sum>; max: Partial<max>
//   x Shard<d != dim> -> Shard<d>;  Replicate -> Replicate
//   x Partial<sum|avg> -> the same Partial (sum and mean are linear); x Partial<max> -> max: Partial<max>
// mean of a split dimension is each rank's sum divided by the GLOBAL extent, summed over ranks:
// Partial<sum>, exact for uneven chunks (Partial<avg> of local means would weight them wrongly).
// A rank that holds no element of the split dimension gives 0 (sum, mean) or -inf (max): the
// identities of the reductions.
// Backward (rules::ReduceBackward on (x, dy)): dy broadcast back over dim; where x was split
// along dim, dy (the gradient of a Partial) is Replicate and each rank takes its chunk. max
// routes dy to the first maximum of each rank's piece; when dim is split, the caller passes the
// reduced maxima (the values redistributed to Replicate: communication is not the op's) and
// every rank whose piece holds the maximum receives dy (ties across ranks each get it; without
// ties, as the single-device gradient).
//
// No communication.
#pragma once

#include <cstdint>


#include "dtensor/kernels/reduce.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

template <class V, std::size_t R>
struct MaxResult {
  V values;                            // the maxima (Partial<max> where dim is split)
  Tensor<std::int64_t, R, typename V::space> indices;  // local: positions in this rank's piece, -1 for an empty piece
};

namespace detail {

template <int Dim, class X>
constexpr void check_dim() {
  static_assert(Dim >= 0 && Dim < int(X::rank), "reduce: the dimension must be one of x's dimensions");
}

template <class X>
Shape<X::rank> reduced(const X& x, int dim) {
  auto s = x.shape();
  s[std::size_t(dim)] = 1;
  return s;
}

template <int Dim, fixed_string Op, rules::Reduce::Kind Kind, class X, class F>
auto reduce(const X& x, F local_op) {
  check_dim<Dim, X>();
  constexpr rules::Reduce rule{Kind, Dim};
  require_rule_hint<Op, "a Partial input commutes only with the matching reduction (sum, mean: Partial<sum|avg>; max: "
                        "Partial<max>)",
                    rule, typename X::mesh_type, typename X::layout>();
  using L = rules::result_t<rule, typename X::layout>;
  return make<typename X::value_type, X::rank, L>(x.mesh(), reduced(x, Dim), local_op(x.to_local()));
}

template <int Dim, fixed_string Op, class DY, class X, class F>
auto reduce_backward(const DY& dy, const X& x, F local_op) {
  check_dim<Dim, X>();
  require_same_mesh_type<DY, X>();
  require_rule<Op, rules::ReduceBackward{Dim}, typename X::mesh_type, typename X::layout, typename DY::layout>();
  using L = rules::reduce_backward_t<typename X::layout, typename DY::layout, Dim>;
  check(dy.shape() == reduced(x, Dim), Op.data, x.mesh(), "gradient ", to_string(dy.shape()),
        " is not the reduction over dimension ", Dim, " of ", to_string(x.shape()));
  return make<typename X::value_type, X::rank, L>(x.mesh(), x.shape(), local_op(dy.to_local(), x.to_local()));
}

}  // namespace detail

/// The sum over Dim (kept with extent 1). No communication.
template <int Dim, FloatDTensor X>
auto sum(const X& x) {
  return detail::reduce<Dim, "sum", rules::Reduce::sum>(x, [](const auto& l) { return kernels::sum(l, Dim); });
}

/// The mean over Dim: this rank's sum divided by the global extent. No communication.
template <int Dim, FloatDTensor X>
auto mean(const X& x) {
  const Extent n = x.extent(std::size_t(Dim));
  return detail::reduce<Dim, "mean", rules::Reduce::mean>(
      x, [n](const auto& l) { return kernels::mean(l, Dim, n); });
}

/// The maximum over Dim and the local position of the first maximum. No communication.
template <int Dim, FloatDTensor X>
auto max(const X& x) {
  using T = typename X::value_type;
  constexpr std::size_t R = X::rank;
  using S = typename X::space;
  Tensor<std::int64_t, R, S> idx;
  auto v = detail::reduce<Dim, "max", rules::Reduce::max>(x, [&](const auto& l) {
    if (l.extent(std::size_t(Dim)) == 0) {  // an empty chunk of a split dimension: the identity
      auto s = l.shape();
      s[std::size_t(Dim)] = 1;
      idx = detail::filled<std::int64_t, R, S>(s, -1);
      return detail::filled<T, R, S>(s, reduction_identity<T>(ReduceOp::max));
    }
    auto r = kernels::max(l, Dim);
    idx = std::move(r.indices);
    return std::move(r.values);
  });
  return MaxResult<decltype(v), R>{std::move(v), std::move(idx)};
}

/// The gradient of sum<Dim>: dy broadcast back over Dim. No communication.
template <int Dim, FloatDTensor DY, FloatDTensor X>
auto sum_backward(const DY& dy, const X& x) {
  return detail::reduce_backward<Dim, "sum_backward">(
      dy, x, [](const auto& g, const auto& xl) { return kernels::sum_backward(g, xl.shape(), Dim); });
}

/// The gradient of mean<Dim>: dy / n broadcast back over Dim (n the global extent).
template <int Dim, FloatDTensor DY, FloatDTensor X>
auto mean_backward(const DY& dy, const X& x) {
  const Extent n = x.extent(std::size_t(Dim));
  return detail::reduce_backward<Dim, "mean_backward">(
      dy, x, [n](const auto& g, const auto& xl) { return kernels::mean_backward(g, xl.shape(), Dim, n); });
}

/// The gradient of max<Dim> when Dim is not split: dy at the saved positions.
template <int Dim, FloatDTensor DY, FloatDTensor X, class V, std::size_t R>
auto max_backward(const DY& dy, const X& x, const MaxResult<V, R>& saved) {
  static_assert(!detail::shards_any<typename X::layout>(1u << Dim),
                "max_backward: dimension Dim is split across ranks; pass the reduced maxima as a fourth argument");
  return detail::reduce_backward<Dim, "max_backward">(dy, x, [&](const auto& g, const auto& xl) {
    return kernels::max_backward(g, saved.indices, xl.shape(), Dim);
  });
}

/// The gradient of max<Dim> when Dim is split: `global` holds the maxima over all ranks in dy's
/// layout (saved.values redistributed); each rank whose piece holds the maximum routes dy to its
/// first occurrence.
template <int Dim, FloatDTensor DY, FloatDTensor X, class V, std::size_t R>
auto max_backward(const DY& dy, const X& x, const MaxResult<V, R>& saved, const DY& global) {
  detail::check(global.shape() == dy.shape(), "max_backward", x.mesh(), "global maxima ", to_string(global.shape()),
                " and gradient ", to_string(dy.shape()), " differ");
  return detail::reduce_backward<Dim, "max_backward">(dy, x, [&](const auto& g, const auto& xl) {
    return kernels::max_backward_split(g, saved.indices, saved.values.to_local(), global.to_local(), xl.shape(),
                                       std::size_t(Dim));
  });
}

}  // namespace dtensor::ops
