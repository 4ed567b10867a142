// Helpers shared by the host-kernel tests: finite-difference gradients and error-message checks.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "support/gradcheck.hpp"

namespace kt {

using namespace dtensor;

using dtensor::testing::dot;
using dtensor::testing::fd_grad;

/// Analytic against numeric gradient, relative to the largest entry (entries may be ~0).
template <std::size_t R>
void check_grad(const Tensor<double, R>& analytic, const Tensor<double, R>& numeric, double rtol = 1e-6) {
  const auto c = dtensor::testing::grad_compare(analytic, numeric, rtol);
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
