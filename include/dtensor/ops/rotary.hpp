// dtensor/ops/rotary.hpp — rotary position embeddings (RoPE) of a DTensor [B, T, H, D].
//
//   auto pos = nn::positions<tokens<Mesh>>(mesh, {B, T});   // global positions [B, T] (nn/positions.hpp)
//   auto qr  = ops::rotary(q, pos, 500000.0);                         // q [B, T, H, D]
//   auto dq  = ops::rotary_backward(pos, dqr, 500000.0);
//
// Each head's feature pairs (i, i + D/2) turn by position * theta^(-2i/D) (kernels/host/rotary.hpp);
// the third argument is a Rope (core/rope.hpp): theta, and optionally Llama 3.1's scaling.
// The positions are an operand: the global index of each stored row in its sequence, so a rank
// holding a piece of the sequence (sequence or context parallelism, load-balanced order) turns
// its rows by where they are in the whole sequence.
//
// Sharding (rules::Rotary, operands (x, positions)): x Shard<0> or Shard<1> (batch, sequence)
// needs the positions split the same way; x Shard<2> (heads, tensor parallel) or Replicate needs
// them Replicate; the output keeps x's layout. x Shard<3> has no rule (a pair would straddle
// ranks). The map is linear in x, so a Partial<sum> x gives a Partial<sum> output. Backward:
// the rotation by the opposite angle, the same rule on (dy, positions).
//
// No communication.
#pragma once

#include "dtensor/kernels/rotary.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

namespace rules {
/// RoPE on one mesh dimension: operands (x [B, T, H, D], positions [B, T]).
struct Rotary {
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &x = p[0], &pos = p[1];
    if ((x.is_shard(0) || x.is_shard(1)) && pos == x) return yields(x, 0);
    if (x.is_shard(2) && pos.is_replicate()) return yields(x, 0);
    if (x.is_replicate() && pos.is_replicate()) return yields(R);
    if (is_linear_partial(x) && pos.is_replicate()) return yields(x);
    return no_rule();
  }
};
}  // namespace rules

namespace detail {
template <fixed_string Op, class X, class P>
void check_rotary_args(const X& x, const P& positions, const Rope& rope) {
  static_assert(X::rank == 4 && P::rank == 2, "rotary: x is [B, T, H, D] and positions [B, T]");
  require_same_mesh_type<X, P>();
  require_rule_hint<Op,
                    "the positions must be split like x's batch and sequence and Replicate where x splits heads; "
                    "x's last dimension must not be split",
                    rules::Rotary{}, typename X::mesh_type, typename X::layout, typename P::layout>();
  check_same_mesh(Op.data, x, positions);
  check(positions.extent(0) == x.extent(0) && positions.extent(1) == x.extent(1) && x.extent(3) % 2 == 0 && rope.theta > 0 &&
            rope.scaling.valid(),
        Op.data, x.mesh(), "x ", to_string(x.shape()), " must be [B, T, H, D] with D even, positions ",
        to_string(positions.shape()), " [B, T] of the same B and T, theta ", rope.theta, " > 0, llama3 scaling (factor ",
        rope.scaling.factor, ") off or with high_freq_factor > low_freq_factor > 0");
}
}  // namespace detail

/// x with each head's feature pairs turned by its position's angles. No communication.
template <FloatDTensor X, IndexDTensor P>
auto rotary(const X& x, const P& positions, const Rope& rope) {
  detail::check_rotary_args<"rotary">(x, positions, rope);
  using L = rules::result_t<rules::Rotary{}, typename X::layout, typename P::layout>;
  return detail::make<typename X::value_type, 4, L>(x.mesh(), x.shape(),
                                                    kernels::rotary(x.to_local(), positions.to_local(), rope));
}

/// The gradient of rotary: dy turned back. No communication.
template <IndexDTensor P, FloatDTensor DY>
auto rotary_backward(const P& positions, const DY& dy, const Rope& rope) {
  detail::check_rotary_args<"rotary_backward">(dy, positions, rope);
  using L = rules::result_t<rules::Rotary{}, typename DY::layout, typename P::layout>;
  return detail::make<typename DY::value_type, 4, L>(
      dy.mesh(), dy.shape(), kernels::rotary_backward(positions.to_local(), dy.to_local(), rope));
}

}  // namespace dtensor::ops
