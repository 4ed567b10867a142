// dtensor/core/shape.hpp — extents of a tensor of static rank.
//
//   dtensor::Shape<2> s{13, 5};   numel(s) == 65;   to_string(s) == "[13, 5]"
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <type_traits>

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

namespace detail {
/// The integer of `size` bytes at `at` (1, 2, 4 or 8; signed or not as Wide is), widened.
template <class Wide>
Wide load_integer(const unsigned char* at, std::size_t size) {
  using W8 = std::conditional_t<std::is_signed_v<Wide>, std::int8_t, std::uint8_t>;
  using W16 = std::conditional_t<std::is_signed_v<Wide>, std::int16_t, std::uint16_t>;
  using W32 = std::conditional_t<std::is_signed_v<Wide>, std::int32_t, std::uint32_t>;
  const auto load = [at](auto x) {
    std::memcpy(&x, at, sizeof x);
    return Wide(x);
  };
  return size == 1 ? load(W8{}) : size == 2 ? load(W16{}) : size == 4 ? load(W32{}) : load(Wide{});
}

/// "[a, b, c]" of n integers of `size` bytes each at `data`: one body for every list of integers
/// (shapes, offsets, mesh coordinates), not one per list type. The digits are std::to_string's.
inline std::string integers_to_string(const void* data, std::size_t n, std::size_t size, bool is_signed) {
  std::string r = "[";
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    if (i != 0) r += ", ";
    const unsigned char* at = bytes + i * size;
    r += is_signed ? std::to_string(load_integer<long long>(at, size))
                   : std::to_string(load_integer<unsigned long long>(at, size));
  }
  return r + "]";
}
}  // namespace detail

// Not inlined: a call at each of its many sites (mostly error messages), the body once per type.
template <class Range>
[[gnu::noinline]] std::string to_string(const Range& s) {
  using E = std::remove_cvref_t<decltype(*std::begin(s))>;
  if constexpr (std::is_integral_v<E> && sizeof(E) <= 8 && requires { std::data(s); }) {
    return detail::integers_to_string(std::data(s), std::size(s), sizeof(E), std::is_signed_v<E>);
  } else {
    std::string r = "[";
    bool first = true;
    for (auto e : s) {
      if (!first) r += ", ";
      r += std::to_string(e);
      first = false;
    }
    return r + "]";
  }
}

}  // namespace dtensor
