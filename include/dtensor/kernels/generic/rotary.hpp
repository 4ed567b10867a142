// dtensor/kernels/generic/rotary.hpp — the argument checks of the rotary position embedding,
// for every memory space.
#pragma once

#include "dtensor/core/rope.hpp"
#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

inline void check_rotary_extents(const char* op, const Shape<4>& x, const Shape<2>& positions, const Rope& rope) {
  check(x[3] % 2 == 0 && positions[0] == x[0] && positions[1] == x[1] && rope.theta > 0 && rope.scaling.valid(), op,
        "x ", to_string(x), " must be [B, T, H, D] with D even, positions ", to_string(positions),
        " [B, T] of the same B and T, theta ", rope.theta, " > 0, llama3 scaling (factor ", rope.scaling.factor,
        ") off or with high_freq_factor > low_freq_factor > 0");
}

template <class X, class P>
void check_rotary(const X& x, const P& positions, const Rope& rope) {
  check_rotary_extents("rotary", x.shape(), positions.shape(), rope);
}
template <class P, class DY>
void check_rotary_backward(const P& positions, const DY& dy, const Rope& rope) {
  check_rotary_extents("rotary_backward", dy.shape(), positions.shape(), rope);
}

}  // namespace dtensor::kernels::generic
