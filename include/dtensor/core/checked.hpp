// dtensor/core/checked.hpp — products of extents, sizes and byte counts that cannot wrap.
//
//   Extent n = checked_numel(shape, "Tensor");          // Error quoting the extents on overflow
//   std::size_t b = checked_bytes(n, sizeof(float), "Tensor");
//   int ranks = checked_product(mesh_shape, "DeviceMesh");  // in the type it is used as
//
// A wrapped product is the worst kind of bad input: {1<<32, 1<<32} has numel 0, a mesh of
// 2147483647 x 2147483647 ranks has an int size of 1. Every place that multiplies extents,
// mesh sizes or byte counts goes through here, and an overflow is a dtensor::Error that quotes
// the values.
#pragma once

#include <concepts>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"
#include "dtensor/core/shape.hpp"

namespace dtensor {

/// a * b, or an Error naming `op`, both values and the type's limit.
template <std::integral T>
T checked_mul(T a, T b, std::string_view op, const char* what = "product") {
  T out{};
  if (__builtin_mul_overflow(a, b, &out))
    throw Error(std::string(op), detail::cat(what, " ", +a, " x ", +b, " overflows (the largest is ",
                                             +std::numeric_limits<T>::max(), ")"));
  return out;
}

/// The product of `values` in type T (a shape's element count, a mesh's number of ranks), or an
/// Error naming `op` and quoting every value. Negative values are the caller's to reject first.
template <std::integral T, class Range>
T checked_product(const Range& values, std::string_view op, const char* what = "product") {
  T out = 1;
  for (auto v : values) {
    if (!std::in_range<T>(v) || __builtin_mul_overflow(out, T(v), &out))
      throw Error(std::string(op), detail::cat(what, " of ", to_string(values), " overflows ", sizeof(T) * 8,
                                               "-bit integers (the largest is ", +std::numeric_limits<T>::max(), ")"));
  }
  return out;
}

/// The number of elements of `s`, checked: an Error for a negative extent or an overflow.
template <std::size_t R>
Extent checked_numel(const Shape<R>& s, std::string_view op) {
  for (std::size_t d = 0; d < R; ++d)
    if (s[d] < 0)
      throw Error(std::string(op),
                  detail::cat("extent ", s[d], " of dimension ", d, " in ", to_string(s), " is negative"));
  return checked_product<Extent>(s, op, "element count");
}

/// `count` elements of `element_size` bytes, as a byte count that fits in memory (size_t), or
/// an Error naming `op`.
inline std::size_t checked_bytes(Extent count, std::size_t element_size, std::string_view op) {
  std::size_t bytes = 0;
  if (count < 0 || __builtin_mul_overflow(std::size_t(count), element_size, &bytes))
    throw Error(std::string(op),
                detail::cat(count, " elements of ", element_size, " bytes do not fit in a byte count"));
  return bytes;
}

}  // namespace dtensor
