// dtensor/core/shape.hpp — extents of a tensor of static rank.
//
//   dtensor::Shape<2> s{13, 5};   numel(s) == 65;   to_string(s) == "[13, 5]"
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dtensor {

using Extent = std::int64_t;

template <std::size_t R>
using Shape = std::array<Extent, R>;

template <std::size_t R>
constexpr Extent numel(const Shape<R>& s) {
  Extent n = 1;
  for (Extent e : s) n *= e;
  return n;
}

/// Row-major strides in elements.
template <std::size_t R>
constexpr Shape<R> row_major_strides(const Shape<R>& s) {
  Shape<R> st{};
  Extent acc = 1;
  for (std::size_t i = R; i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

template <class Range>
std::string to_string(const Range& s) {
  std::string r = "[";
  bool first = true;
  for (auto e : s) {
    if (!first) r += ", ";
    r += std::to_string(e);
    first = false;
  }
  return r + "]";
}

}  // namespace dtensor
