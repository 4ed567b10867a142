// dtensor/kernels/host/activations.hpp — pointwise activations and their backwards.
//
//   auto y  = gelu(x);              auto dx = gelu_backward(x, dy);   // tanh approximation (GPT-2)
//   auto y  = relu(x);              auto dx = relu_backward(x, dy);
//   auto y  = silu(x);              auto dx = silu_backward(x, dy);
//   auto y  = exp(x);               auto dx = exp_backward(y, dy);    // takes the output
//
// Backwards take the forward's input (except exp, whose derivative is its output), so a caller
// saves one tensor per activation. Math runs in compute_t<T>.
//
// float and bfloat16 GELU (the MLP's activation, the trainer's hottest non-GEMM kernel) run
// vectorized for the CPU's instruction set (simd.hpp) with a polynomial exp for tanh: within 2e-7
// absolute of std::tanh's result, in float (bfloat16 is widened, computed in float and rounded
// once, as compute_t says; the plain loop with libm's tanh took 35 % of a bf16 step). double keeps
// the plain loop (std::tanh) — the tests' oracle. The fast GELU (forward, backward, bias + GELU)
// runs in chunks on a rank's intra-op threads (parallel.hpp; chunks of 64 elements or whole rows):
// per element, the same bits for any count.
#pragma once

#include <cmath>
#include <cstddef>
#include <numbers>
#include <type_traits>

#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/parallel.hpp"
#include "dtensor/kernels/host/simd.hpp"

namespace dtensor::kernels::host {

namespace detail {

template <class T, std::size_t R, class F>
HostTensor<T, R> map(const HostTensor<T, R>& x, F f) {
  auto y = HostTensor<T, R>::uninitialized(x.shape());
  const T* px = x.data();
  T* py = y.data();
  for (Extent i = 0, n = x.numel(); i < n; ++i) py[i] = T(f(compute_t<T>(px[i])));
  return y;
}

/// dx[i] = dy[i] * f'(x[i]) where fprime(x) gives f'(x).
template <class T, std::size_t R, class F>
HostTensor<T, R> map_backward(const char* /*op*/, const HostTensor<T, R>& x, const HostTensor<T, R>& dy, F fprime) {
  auto dx = HostTensor<T, R>::uninitialized(x.shape());
  const T* px = x.data();
  const T* pg = dy.data();
  T* pd = dx.data();
  for (Extent i = 0, n = x.numel(); i < n; ++i) pd[i] = T(compute_t<T>(pg[i]) * fprime(compute_t<T>(px[i])));
  return dx;
}

// GELU, tanh form: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
template <class C>
C gelu(C x) {
  const C k = C(std::numbers::sqrt2 * std::numbers::inv_sqrtpi), u = k * (x + C(0.044715) * x * x * x);
  return C(0.5) * x * (C(1) + std::tanh(u));
}
template <class C>
C gelu_prime(C x) {
  const C k = C(std::numbers::sqrt2 * std::numbers::inv_sqrtpi), x2 = x * x;
  const C t = std::tanh(k * (x + C(0.044715) * x2 * x));
  return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k * (C(1) + C(3 * 0.044715) * x2);
}
/// GELU and its derivative on float arrays, vectorized (simd.hpp): the same formulas with
/// fast_tanh. dx may alias dy, y may alias x (elementwise).
DTENSOR_SIMD_INLINE float gelu_fast(float x) {
  constexpr float k = float(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);
  return 0.5f * x * (1.0f + fast_tanh(k * (x + 0.044715f * x * x * x)));
}
DTENSOR_SIMD_INLINE float gelu_prime_fast(float x) {
  constexpr float k = float(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);
  const float x2 = x * x, t = fast_tanh(k * (x + 0.044715f * x2 * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + float(3 * 0.044715) * x2);
}
/// Elements per chunk's worth of work of the vectorized GELU (a polynomial exp: ~30 operations).
inline constexpr Extent gelu_work = 32;
template <class T>
void gelu_fast_loop(const T* x, T* y, Extent n) {
  parallel_for(
      n, grain_for(gelu_work),
      [&](Extent i0, Extent i1) {
        with_isa([&](auto) DTENSOR_SIMD_BODY {
          for (Extent i = i0; i < i1; ++i) y[i] = T(gelu_fast(float(x[i])));
        });
      },
      64);
}
template <class T>
void gelu_backward_fast_loop(const T* x, const T* dy, T* dx, Extent n) {
  parallel_for(
      n, grain_for(gelu_work),
      [&](Extent i0, Extent i1) {
        with_isa([&](auto) DTENSOR_SIMD_BODY {
          for (Extent i = i0; i < i1; ++i) dx[i] = T(float(dy[i]) * gelu_prime_fast(float(x[i])));
        });
      },
      64);
}
/// y[r, j] = gelu(x[r, j] + bias[j]) and h = x + bias (the saved pre-activation), fused; y is
/// the GELU of h as stored (rounded to T), as the unfused pair computes it.
template <class T>
void bias_gelu_fast_loop(const T* x, const T* bias, T* h, T* y, Extent rows, Extent n) {
  parallel_for(rows, grain_for(gelu_work * n), [&](Extent r0, Extent r1) {
    with_isa([&](auto) DTENSOR_SIMD_BODY {
      for (Extent r = r0; r < r1; ++r)
        for (Extent j = 0; j < n; ++j) {
          const T v = T(float(x[r * n + j]) + float(bias[j]));
          h[r * n + j] = v;
          y[r * n + j] = T(gelu_fast(float(v)));
        }
    });
  });
}

template <class C>
C sigmoid(C x) {
  return C(1) / (C(1) + std::exp(-x));
}

}  // namespace detail

template <FloatElement T, std::size_t R>
HostTensor<T, R> gelu(const HostTensor<T, R>& x) {
  if constexpr (detail::float_rows<T>) {
    auto y = HostTensor<T, R>::uninitialized(x.shape());
    detail::gelu_fast_loop(x.data(), y.data(), x.numel());
    return y;
  } else {
    return detail::map(x, [](auto v) { return detail::gelu(v); });
  }
}
template <FloatElement T, std::size_t R>
HostTensor<T, R> gelu_backward(const HostTensor<T, R>& x, const HostTensor<T, R>& dy) {
  if constexpr (detail::float_rows<T>) {
    auto dx = HostTensor<T, R>::uninitialized(x.shape());
    detail::gelu_backward_fast_loop(x.data(), dy.data(), dx.data(), x.numel());
    return dx;
  } else {
    return detail::map_backward("gelu_backward", x, dy, [](auto v) { return detail::gelu_prime(v); });
  }
}

/// Fused bias + GELU over the last dimension: h = x + bias (what gelu_backward takes), y = gelu(h).
template <FloatElement T, std::size_t R>
struct BiasGelu {
  HostTensor<T, R> h, y;
};
template <FloatElement T, std::size_t R>
BiasGelu<T, R> bias_gelu(const HostTensor<T, R>& x, const HostTensor<T, 1>& bias) {
  detail::check(bias.extent(0) == x.extent(R - 1), "bias_gelu", "x ", to_string(x.shape()), ", bias ",
                to_string(bias.shape()), ": the bias must match the last dimension");
  BiasGelu<T, R> out{HostTensor<T, R>::uninitialized(x.shape()), HostTensor<T, R>::uninitialized(x.shape())};
  const Extent n = x.extent(R - 1), rows = detail::leading_rows(x.shape());
  if constexpr (detail::float_rows<T>) {
    detail::bias_gelu_fast_loop(x.data(), bias.data(), out.h.data(), out.y.data(), rows, n);
  } else {
    for (Extent r = 0; r < rows; ++r)
      for (Extent j = 0; j < n; ++j) {
        const auto v = compute_t<T>(x[r * n + j]) + compute_t<T>(bias[j]);
        out.h[r * n + j] = T(v);
        out.y[r * n + j] = T(detail::gelu(compute_t<T>(out.h[r * n + j])));
      }
  }
  return out;
}

template <FloatElement T, std::size_t R>
HostTensor<T, R> relu(const HostTensor<T, R>& x) {
  return detail::map(x, [](auto v) { return v > 0 ? v : decltype(v)(0); });
}
/// Subgradient 0 at x == 0, as PyTorch.
template <FloatElement T, std::size_t R>
HostTensor<T, R> relu_backward(const HostTensor<T, R>& x, const HostTensor<T, R>& dy) {
  return detail::map_backward("relu_backward", x, dy, [](auto v) { return v > 0 ? decltype(v)(1) : decltype(v)(0); });
}

template <FloatElement T, std::size_t R>
HostTensor<T, R> silu(const HostTensor<T, R>& x) {
  return detail::map(x, [](auto v) { return v * detail::sigmoid(v); });
}
template <FloatElement T, std::size_t R>
HostTensor<T, R> silu_backward(const HostTensor<T, R>& x, const HostTensor<T, R>& dy) {
  return detail::map_backward("silu_backward", x, dy, [](auto v) {
    const auto s = detail::sigmoid(v);
    return s * (decltype(v)(1) + v * (decltype(v)(1) - s));
  });
}

template <FloatElement T, std::size_t R>
HostTensor<T, R> exp(const HostTensor<T, R>& x) {
  return detail::map(x, [](auto v) { return std::exp(v); });
}
/// dx = dy * y, given the forward's output y.
template <FloatElement T, std::size_t R>
HostTensor<T, R> exp_backward(const HostTensor<T, R>& y, const HostTensor<T, R>& dy) {
  return detail::map_backward("exp_backward", y, dy, [](auto v) { return v; });
}

}  // namespace dtensor::kernels::host
