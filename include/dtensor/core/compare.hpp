// dtensor/core/compare.hpp — comparing tensors in tests: exactly, or within a tolerance.
//
//   REQUIRE(equal(a, b));                    // same extents, same bits per element
//   auto d = compare(a, b, {.rtol = 1e-5});  // d.ok, d.max_abs, d.max_rel, d.where
//   INFO(d.message);
#pragma once

#include <cmath>
#include <cstring>
#include <string>

#include "dtensor/core/tensor.hpp"

namespace dtensor {

struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

struct Comparison {
  bool ok = true;
  double max_abs = 0;    // largest |a - b|
  double max_rel = 0;    // largest |a - b| / max(|b|, tiny)
  Extent where = -1;     // flat index of the first element out of tolerance
  std::string message;   // says what differs, for a test's log
  explicit operator bool() const { return ok; }
};

/// Elementwise |a - b| <= atol + rtol * |b| (b is the reference), NaN equal to NaN.
template <Element T, std::size_t R, class Space>
  requires(Space::host_accessible)
Comparison compare(const Tensor<T, R, Space>& a, const Tensor<T, R, Space>& b, Tolerance tol = {}) {
  Comparison c;
  if (a.shape() != b.shape()) {
    c.ok = false;
    c.message = "extents differ: " + to_string(a.shape()) + " vs " + to_string(b.shape());
    return c;
  }
  for (Extent i = 0; i < a.numel(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    if (std::isnan(x) && std::isnan(y)) continue;
    const double d = std::abs(x - y);
    c.max_abs = std::max(c.max_abs, d);
    c.max_rel = std::max(c.max_rel, d / std::max(std::abs(y), 1e-30));
    if (!(d <= tol.atol + tol.rtol * std::abs(y)) && c.ok) {
      c.ok = false;
      c.where = i;
      c.message = detail::cat("element ", i, ": ", x, " vs ", y, " (|diff| ", d, ")");
    }
  }
  if (!c.ok) c.message += detail::cat("; max |diff| ", c.max_abs, ", max rel ", c.max_rel);
  return c;
}

/// Same extents and the same bits in every element.
template <Element T, std::size_t R, class Space>
  requires(Space::host_accessible)
bool equal(const Tensor<T, R, Space>& a, const Tensor<T, R, Space>& b) {
  return a.shape() == b.shape() && (a.bytes() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

}  // namespace dtensor
