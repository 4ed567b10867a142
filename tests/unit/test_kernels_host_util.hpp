// Helpers shared by the host-kernel tests: finite-difference gradients and error-message checks.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"

namespace kt {

using namespace dtensor;

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

/// <a, b> in double.
template <class T, std::size_t R>
double dot(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  REQUIRE(a.shape() == b.shape());
  double s = 0;
  for (Extent i = 0; i < a.numel(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

/// Analytic against numeric gradient, relative to the largest entry (entries may be ~0).
template <std::size_t R>
void check_grad(const Tensor<double, R>& analytic, const Tensor<double, R>& numeric, double rtol = 1e-6) {
  double scale = 1e-12;
  for (Extent i = 0; i < numeric.numel(); ++i) scale = std::max(scale, std::abs(numeric[i]));
  const auto c = compare(analytic, numeric, {.rtol = 0, .atol = rtol * scale});
  INFO(c.message);
  CHECK(c.ok);
}

template <class T, class S, std::size_t R>
Tensor<T, R> cast(const Tensor<S, R>& x) {
  auto y = Tensor<T, R>::uninitialized(x.shape());
  for (Extent i = 0; i < x.numel(); ++i) y[i] = T(double(x[i]));
  return y;
}

/// Runs f, expects a dtensor::Error whose message contains every fragment.
template <class F>
void require_error(F f, std::initializer_list<std::string> fragments) {
  try {
    f();
    FAIL("expected a dtensor::Error");
  } catch (const dtensor::Error& e) {
    const std::string m = e.what();
    INFO(m);
    for (const auto& frag : fragments) CHECK(m.find(frag) != std::string::npos);
  }
}

}  // namespace kt
