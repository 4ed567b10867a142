// tests/support/gradcheck.hpp — finite differences and inner products for gradient and adjoint
// tests (no test framework: the MPI suites use it too).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/tensor.hpp"

namespace dtensor::testing {

/// d/dx of the scalar loss(x), by central differences (double; x is perturbed in place).
template <std::size_t R, class Loss>
Tensor<double, R> fd_grad(Tensor<double, R> x, Loss loss, double h = 1e-6) {
  Tensor<double, R> g(x.shape());
  for (Extent i = 0; i < x.numel(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

/// <a, b>, accumulated in double.
template <class T, std::size_t R>
double dot(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  double s = 0;
  for (Extent i = 0; i < a.numel(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

/// Analytic against numeric gradient, with a tolerance relative to the largest numeric entry
/// (entries may be ~0, where a relative test per entry means nothing).
template <std::size_t R>
auto grad_compare(const Tensor<double, R>& analytic, const Tensor<double, R>& numeric, double rtol = 1e-6) {
  double scale = 1e-12;
  for (Extent i = 0; i < numeric.numel(); ++i) scale = std::max(scale, std::abs(numeric[i]));
  return compare(analytic, numeric, {.rtol = 0, .atol = rtol * scale});
}

}  // namespace dtensor::testing
