// dtensor/mesh/fixed_string.hpp — a string usable as a template argument: DeviceMesh<"dp", "tp">.
#pragma once

#include <cstddef>
#include <string_view>

namespace dtensor {

template <std::size_t N>
struct fixed_string {
  char data[N]{};
  constexpr fixed_string(const char (&s)[N]) {  // NOLINT: implicit, so "tp" converts
    for (std::size_t i = 0; i < N; ++i) data[i] = s[i];
  }
  constexpr std::string_view view() const { return {data, N - 1}; }
  template <std::size_t M>
  constexpr bool operator==(const fixed_string<M>& o) const {
    return view() == o.view();
  }
};

}  // namespace dtensor
