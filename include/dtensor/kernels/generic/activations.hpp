// dtensor/kernels/generic/activations.hpp — the argument checks of the pointwise activation
// backwards, for every memory space (the forwards accept any extents).
#pragma once

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

template <class X, class DY>
void check_gelu_backward(const X& x, const DY& dy) {
  check_same_shape("gelu_backward", "x", x.shape(), "dy", dy.shape());
}
template <class X, class DY>
void check_relu_backward(const X& x, const DY& dy) {
  check_same_shape("relu_backward", "x", x.shape(), "dy", dy.shape());
}
template <class X, class DY>
void check_silu_backward(const X& x, const DY& dy) {
  check_same_shape("silu_backward", "x", x.shape(), "dy", dy.shape());
}
template <class Y, class DY>
void check_exp_backward(const Y& y, const DY& dy) {
  check_same_shape("exp_backward", "x", y.shape(), "dy", dy.shape());
}

}  // namespace dtensor::kernels::generic
