// dtensor/kernels/generic/softmax.hpp — the argument checks of the softmax kernels, for every
// memory space (kernels/dispatch.hpp runs them before the space's kernel).
#pragma once

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

// softmax and log_softmax accept any extents (rows of the last dimension, possibly empty).
template <class Y, class DY>
void check_softmax_backward(const Y& y, const DY& dy) {
  check_same_shape("softmax_backward", "y", y.shape(), "dy", dy.shape());
}
template <class Y, class DY>
void check_log_softmax_backward(const Y& y, const DY& dy) {
  check_same_shape("log_softmax_backward", "y", y.shape(), "dy", dy.shape());
}

}  // namespace dtensor::kernels::generic
