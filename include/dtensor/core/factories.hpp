// dtensor/core/factories.hpp — tensors filled with constants, ranges and seeded random values.
//
//   auto a = zeros<float>(Shape<2>{3, 4});
//   auto b = arange<float>(Shape<2>{3, 4});           // 0, 1, 2, ... in row-major order
//   auto w = normal<float>(Shape<2>{64, 64}, /*seed=*/7, /*mean=*/0, /*stddev=*/0.02);
//
// Random values come from std::mt19937_64 (its sequence is fixed by the standard) mapped to
// numbers by our own code (the standard distributions are not portable), so a seed gives the
// same tensor with every compiler and on every rank.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

#include "dtensor/core/tensor.hpp"

namespace dtensor {

template <Element T, std::size_t R>
Tensor<T, R> full(const Shape<R>& shape, T value) {
  auto t = Tensor<T, R>::uninitialized(shape);
  std::fill_n(t.data(), t.numel(), value);
  return t;
}

template <Element T, std::size_t R>
Tensor<T, R> zeros(const Shape<R>& shape) { return Tensor<T, R>(shape); }

template <Element T, std::size_t R>
Tensor<T, R> ones(const Shape<R>& shape) { return full<T>(shape, T(1)); }

/// start, start + step, ... in row-major order.
template <Element T, std::size_t R>
Tensor<T, R> arange(const Shape<R>& shape, double start = 0, double step = 1) {
  auto t = Tensor<T, R>::uninitialized(shape);
  for (Extent i = 0; i < t.numel(); ++i) t[i] = T(start + step * double(i));
  return t;
}

namespace detail {
inline double unit_uniform(std::mt19937_64& g) { return double(g() >> 11) * 0x1.0p-53; }  // [0, 1)
}  // namespace detail

/// Uniform in [lo, hi).
template <Element T, std::size_t R>
Tensor<T, R> uniform(const Shape<R>& shape, std::uint64_t seed, double lo = 0, double hi = 1) {
  std::mt19937_64 g(seed);
  auto t = Tensor<T, R>::uninitialized(shape);
  for (Extent i = 0; i < t.numel(); ++i) t[i] = T(lo + (hi - lo) * detail::unit_uniform(g));
  return t;
}

/// Normal with the given mean and standard deviation (Box–Muller).
template <Element T, std::size_t R>
Tensor<T, R> normal(const Shape<R>& shape, std::uint64_t seed, double mean = 0, double stddev = 1) {
  std::mt19937_64 g(seed);
  auto t = Tensor<T, R>::uninitialized(shape);
  for (Extent i = 0; i < t.numel(); i += 2) {
    const double u1 = 1.0 - detail::unit_uniform(g), u2 = detail::unit_uniform(g);
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * std::numbers::pi * u2;
    t[i] = T(mean + stddev * r * std::cos(a));
    if (i + 1 < t.numel()) t[i + 1] = T(mean + stddev * r * std::sin(a));
  }
  return t;
}

namespace detail {
/// The values of normal(shape, seed, mean, stddev) by flat index, in increasing order, without
/// the tensor: element g is the cosine (g even) or sine (g odd) of Box–Muller pair g / 2, made
/// from draws 2 (g / 2) and 2 (g / 2) + 1 of std::mt19937_64(seed); pairs not asked for are
/// skipped (discard: no memory, time linear in the skip). Bit for bit normal()'s values: the
/// same draws and the same double expressions (deferred initialisation builds a parameter's
/// shard from it, nn/flat_params.hpp).
class NormalStream {
 public:
  NormalStream(std::uint64_t seed, double mean, double stddev) : g_(seed), mean_(mean), stddev_(stddev) {}
  /// Element g (g >= every index asked for before).
  double at(std::uint64_t g) {
    const std::uint64_t pair = g / 2;
    if (!have_ || pair != pair_) {
      if (have_ && pair < pair_)
        throw Error("normal", detail::cat("element ", g, " asked for after element ", 2 * pair_, " or later: a NormalStream only goes forward"));
      const std::uint64_t next = have_ ? pair_ + 1 : 0;
      if (pair > next) g_.discard(2 * (pair - next));
      const double u1 = 1.0 - unit_uniform(g_), u2 = unit_uniform(g_);
      r_ = std::sqrt(-2.0 * std::log(u1)), a_ = 2.0 * std::numbers::pi * u2;
      pair_ = pair, have_ = true;
    }
    return g % 2 == 0 ? mean_ + stddev_ * r_ * std::cos(a_) : mean_ + stddev_ * r_ * std::sin(a_);
  }

 private:
  std::mt19937_64 g_;
  double mean_, stddev_, r_ = 0, a_ = 0;
  std::uint64_t pair_ = 0;
  bool have_ = false;
};
}  // namespace detail

/// Random integers in [lo, hi) stored as T — exact in every element type, which makes sums
/// independent of their order (the redistribution oracle tests use them).
template <Element T, std::size_t R>
Tensor<T, R> randint(const Shape<R>& shape, std::uint64_t seed, std::int64_t lo, std::int64_t hi) {
  std::mt19937_64 g(seed);
  auto t = Tensor<T, R>::uninitialized(shape);
  const auto span = std::uint64_t(hi - lo);
  for (Extent i = 0; i < t.numel(); ++i) t[i] = T(double(lo + std::int64_t(g() % span)));
  return t;
}

}  // namespace dtensor
