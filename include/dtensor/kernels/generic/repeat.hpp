// dtensor/kernels/generic/repeat.hpp — the argument checks of repeat_interleave (grouped-query
// attention's key/value heads), for every memory space.
#pragma once

#include <cstddef>

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

template <std::size_t R>
void check_repeat(const char* op, const Shape<R>& s, std::size_t dim, Extent repeats, bool backward) {
  check_dim(op, dim, s);
  check(repeats > 0 && (!backward || s[dim] % repeats == 0), op, "tensor ", to_string(s), ", dimension ", dim,
        ", repeats ", repeats, ": repeats must be > 0", backward ? " and divide the extent of the dimension" : "");
}

template <class X>
void check_repeat_interleave(const X& x, std::size_t dim, Extent repeats) {
  check_repeat("repeat_interleave", x.shape(), dim, repeats, false);
}
template <class DY>
void check_repeat_interleave_backward(const DY& dy, std::size_t dim, Extent repeats) {
  check_repeat("repeat_interleave_backward", dy.shape(), dim, repeats, true);
}

}  // namespace dtensor::kernels::generic
