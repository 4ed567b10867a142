// dtensor/kernels/host/softmax.hpp — softmax and log-softmax over the last dimension, and the
// row routines that cross-entropy and attention share.
//
//   auto y  = softmax(x);        auto dx = softmax_backward(y, dy);       // take the output
//   auto l  = log_softmax(x);    auto dx = log_softmax_backward(l, dy);
//
//   detail::row_max(x, n)                 // max of a row (-inf when empty)
//   detail::row_sum_exp(x, n, shift)      // sum of exp(x - shift)
//   detail::lse_of(max, sum)              // max + log(sum), -inf for an empty row
//   detail::row_softmax(x, y, n, lse)     // y = exp(x - lse)
//
// One numeric recipe for the whole softmax family (softmax, log-softmax, cross-entropy and its
// vocabulary-parallel pieces, attention): shift by the row max, exps and sums in double, and
// probabilities formed as exp(x - lse). A row split across ranks (vocabulary-parallel
// cross-entropy, blocks of ring attention) then gives the same probabilities as the whole row up
// to double rounding. For float rows the exps run vectorized in float (simd.hpp fast_exp, a few
// ulp; the argument x - shift still formed in double) with the sums in double over fixed lanes,
// so a position's probability does not depend on where the row was split; double and bfloat16
// rows keep the plain double loops (the tests' oracle).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/simd.hpp"

namespace dtensor::kernels::host {

namespace detail {

inline constexpr Stat neg_inf = -std::numeric_limits<Stat>::infinity();

template <class T>
Stat row_max(const T* x, Extent n) {
  if constexpr (std::is_same_v<T, float>) {
    float m = 0;
    with_isa([&](auto) DTENSOR_SIMD_BODY { m = lane_max(x, n); });
    return Stat(m);
  } else {
    Stat m = neg_inf;
    for (Extent j = 0; j < n; ++j) m = std::max(m, Stat(x[j]));
    return m;
  }
}

/// exp(x - shift) in float, the difference formed in double (shift may be an lse, not a float).
DTENSOR_SIMD_INLINE float shifted_exp(float x, Stat shift) { return fast_exp(float(Stat(x) - shift)); }

/// Sum of exp(x[j] - shift); 0 when shift is -inf (an empty or fully masked row). float rows:
/// the exps of a chunk into a stack buffer (a plain vectorizable loop), then their lane sum.
template <class T>
Stat row_sum_exp(const T* x, Extent n, Stat shift) {
  if (shift == neg_inf) return 0;
  if constexpr (std::is_same_v<T, float>) {
    Stat s = 0;
    with_isa([&](auto) DTENSOR_SIMD_BODY {
      constexpr Extent chunk = 256;  // a multiple of kLanes: the lanes see the same elements for any n
      alignas(64) float e[chunk];
      for (Extent j0 = 0; j0 < n; j0 += chunk) {
        const Extent c = std::min(chunk, n - j0);
        for (Extent j = 0; j < c; ++j) e[j] = shifted_exp(x[j0 + j], shift);
        s += lane_dot(e, static_cast<const float*>(nullptr), c);
      }
    });
    return s;
  } else {
    Stat s = 0;
    for (Extent j = 0; j < n; ++j) s += std::exp(Stat(x[j]) - shift);
    return s;
  }
}

inline Stat lse_of(Stat max, Stat sum) { return max == neg_inf ? neg_inf : max + std::log(sum); }

template <class T>
Stat row_logsumexp(const T* x, Extent n) {
  const Stat m = row_max(x, n);
  return lse_of(m, row_sum_exp(x, n, m));
}

/// y[j] = exp(x[j] - lse).
template <class T>
void row_softmax(const T* x, T* y, Extent n, Stat lse) {
  if constexpr (std::is_same_v<T, float>) {
    with_isa([&](auto) DTENSOR_SIMD_BODY {
      for (Extent j = 0; j < n; ++j) y[j] = shifted_exp(x[j], lse);
    });
  } else {
    for (Extent j = 0; j < n; ++j) y[j] = T(std::exp(Stat(x[j]) - lse));
  }
}

}  // namespace detail

template <FloatElement T, std::size_t R>
HostTensor<T, R> softmax(const HostTensor<T, R>& x) {
  auto y = HostTensor<T, R>::uninitialized(x.shape());
  const Extent n = x.extent(R - 1), rows = detail::leading_rows(x.shape());
  for (Extent r = 0; r < rows; ++r) {
    const T* xr = x.data() + r * n;
    detail::row_softmax(xr, y.data() + r * n, n, detail::row_logsumexp(xr, n));
  }
  return y;
}

/// dx = y * (dy - sum(dy * y)) per row, given the forward's output y.
template <FloatElement T, std::size_t R>
HostTensor<T, R> softmax_backward(const HostTensor<T, R>& y, const HostTensor<T, R>& dy) {
  auto dx = HostTensor<T, R>::uninitialized(y.shape());
  const Extent n = y.extent(R - 1), rows = detail::leading_rows(y.shape());
  for (Extent r = 0; r < rows; ++r) {
    const T* yr = y.data() + r * n;
    const T* gr = dy.data() + r * n;
    Stat dot = 0;
    for (Extent j = 0; j < n; ++j) dot += Stat(gr[j]) * Stat(yr[j]);
    for (Extent j = 0; j < n; ++j) dx[r * n + j] = T(Stat(yr[j]) * (Stat(gr[j]) - dot));
  }
  return dx;
}

template <FloatElement T, std::size_t R>
HostTensor<T, R> log_softmax(const HostTensor<T, R>& x) {
  auto y = HostTensor<T, R>::uninitialized(x.shape());
  const Extent n = x.extent(R - 1), rows = detail::leading_rows(x.shape());
  for (Extent r = 0; r < rows; ++r) {
    const T* xr = x.data() + r * n;
    const Stat lse = detail::row_logsumexp(xr, n);
    for (Extent j = 0; j < n; ++j) y[r * n + j] = T(Stat(xr[j]) - lse);
  }
  return y;
}

/// dx = dy - exp(y) * sum(dy) per row, given the forward's output y.
template <FloatElement T, std::size_t R>
HostTensor<T, R> log_softmax_backward(const HostTensor<T, R>& y, const HostTensor<T, R>& dy) {
  auto dx = HostTensor<T, R>::uninitialized(y.shape());
  const Extent n = y.extent(R - 1), rows = detail::leading_rows(y.shape());
  for (Extent r = 0; r < rows; ++r) {
    const T* yr = y.data() + r * n;
    const T* gr = dy.data() + r * n;
    Stat s = 0;
    for (Extent j = 0; j < n; ++j) s += Stat(gr[j]);
    for (Extent j = 0; j < n; ++j) dx[r * n + j] = T(Stat(gr[j]) - std::exp(Stat(yr[j])) * s);
  }
  return dx;
}

}  // namespace dtensor::kernels::host
