// dtensor/kernels/generic/checks.hpp — the argument checks and extent arithmetic that every
// memory space's kernels share (the kernels/generic layer: Thrust's system/detail/generic).
//
//   generic::check(ok, "layer_norm", "x ", to_string(x.shape()), " vs weight ", ...);
//   generic::check_same_shape("softmax_backward", "y", y.shape(), "dy", dy.shape());
//   generic::check_dim("sum", dim, x.shape());
//   generic::leading_rows(x.shape())        // product of the extents before the last one
//   generic::around(x.shape(), dim)         // extents as [outer, n, inner] around dim
//
// They read extents only, never elements, so one check serves host, cuda and meta tensors (and
// any space added later): the per-kernel checks in kernels/generic/<family>.hpp are built from
// these, and kernels::<name> (kernels/dispatch.hpp) runs them before the space's kernel.
#pragma once

#include <cstddef>

#include "dtensor/core/error.hpp"
#include "dtensor/core/shape.hpp"

namespace dtensor::kernels::generic {

using dtensor::detail::check;

/// Product of the extents before the last one (the "rows" of a last-dimension kernel).
template <std::size_t R>
constexpr Extent leading_rows(const Shape<R>& s) {
  Extent n = 1;
  for (std::size_t i = 0; i + 1 < R; ++i) n *= s[i];
  return n;
}

/// Extents as [outer, n, inner] around dimension dim.
template <std::size_t R>
struct Around {
  Extent outer = 1, n = 1, inner = 1;
};
template <std::size_t R>
constexpr Around<R> around(const Shape<R>& s, std::size_t dim) {
  Around<R> a;
  for (std::size_t i = 0; i < R; ++i) {
    if (i < dim) a.outer *= s[i];
    else if (i == dim) a.n = s[i];
    else a.inner *= s[i];
  }
  return a;
}

template <std::size_t R>
inline void check_same_shape(const char* op, const char* a_name, const Shape<R>& a, const char* b_name,
                             const Shape<R>& b) {
  check(a == b, op, a_name, " ", to_string(a), " and ", b_name, " ", to_string(b), " must have the same extents");
}

template <std::size_t R>
inline void check_dim(const char* op, std::size_t dim, const Shape<R>& s) {
  check(dim < R, op, "dimension ", dim, " out of range for a tensor of extents ", to_string(s));
}

}  // namespace dtensor::kernels::generic
