// dtensor/kernels/generic/cast.hpp — the argument check of cast_into, for every memory space.
#pragma once

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

template <class Dst, class Src>
void check_cast_into(const Dst& dst, const Src& src) {
  check_same_shape("cast_into", "dst", dst.shape(), "src", src.shape());
}

}  // namespace dtensor::kernels::generic
