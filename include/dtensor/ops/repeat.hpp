// dtensor/ops/repeat.hpp — repeat_interleave of a DTensor along one dimension, and its adjoint.
//
//   auto kv_h = ops::repeat_interleave<1>(k, heads / kv_heads);        // [B, K, T, D] -> [B, H, T, D]
//   auto dk   = ops::repeat_interleave_backward<1>(dkv_h, heads / kv_heads);   // sums each group
//
// Slice j along Dim becomes slices [j * n, (j + 1) * n) (torch.repeat_interleave): grouped-query
// attention's KV heads repeated for their query heads, so the attention op and its kernels stay
// those of multi-head attention. The backward sums the n copies of each slice.
//
// Sharding (rules::Unary, linear): every placement carries over, Partial<sum> included. Where
// Dim itself is split, the pieces stay aligned (this rank's K/p slices give exactly its H/p of
// the output) only if the mesh dimensions that split it divide its extent evenly: checked at
// run time (tensor-parallel GQA needs kv_heads % tp == 0).
//
// No communication.
#pragma once

#include "dtensor/kernels/repeat.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

namespace detail {
template <fixed_string Op, int Dim, class X>
void check_repeat_args(const X& x, Extent repeats, Extent split_extent) {
  static_assert(Dim >= 0 && Dim < int(X::rank), "repeat_interleave: Dim out of range");
  require_rule_hint<Op, "it is linear: every placement carries over", rules::Unary{true}, typename X::mesh_type,
                    typename X::layout>();
  Extent parts = 1;
  const auto& desc = X::layout::desc;
  for (std::size_t i = 0; i < X::mesh_type::ndim; ++i)
    if (desc.placements[i].is_shard(Dim)) parts *= x.mesh().shape()[i];
  check(repeats > 0 && split_extent % parts == 0, Op.data, x.mesh(), "x ", to_string(x.shape()), ", layout ",
        to_string(desc), ", repeats ", repeats, ": repeats must be > 0 and the ", parts,
        " pieces of dimension ", Dim, " must be even (", split_extent, " is not a multiple of ", parts, ")");
}
}  // namespace detail

/// Each slice along Dim repeated `repeats` times in place. No communication.
template <int Dim, FloatDTensor X>
auto repeat_interleave(const X& x, Extent repeats) {
  detail::check_repeat_args<"repeat_interleave", Dim>(x, repeats, x.extent(Dim));
  Shape<X::rank> global = x.shape();
  global[Dim] *= repeats;
  return detail::make<typename X::value_type, X::rank, typename X::layout>(
      x.mesh(), global, kernels::repeat_interleave(x.to_local(), std::size_t(Dim), repeats));
}

/// The adjoint of repeat_interleave: the sum of each group of `repeats` slices. No communication.
template <int Dim, FloatDTensor DY>
auto repeat_interleave_backward(const DY& dy, Extent repeats) {
  detail::check(repeats > 0 && dy.extent(Dim) % repeats == 0, "repeat_interleave_backward", dy.mesh(), "dy ",
                to_string(dy.shape()), ": dimension ", Dim, " is not a multiple of repeats ", repeats);
  detail::check_repeat_args<"repeat_interleave_backward", Dim>(dy, repeats, dy.extent(Dim) / repeats);
  Shape<DY::rank> global = dy.shape();
  global[Dim] /= repeats;
  return detail::make<typename DY::value_type, DY::rank, typename DY::layout>(
      dy.mesh(), global, kernels::repeat_interleave_backward(dy.to_local(), std::size_t(Dim), repeats));
}

}  // namespace dtensor::ops
