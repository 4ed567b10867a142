// dtensor/kernels/host/activations.hpp — pointwise activations and their backwards.
//
//   auto y  = gelu(x);              auto dx = gelu_backward(x, dy);   // tanh approximation (GPT-2)
//   auto y  = relu(x);              auto dx = relu_backward(x, dy);
//   auto y  = silu(x);              auto dx = silu_backward(x, dy);
//   auto y  = exp(x);               auto dx = exp_backward(y, dy);    // takes the output
//
// Backwards take the forward's input (except exp, whose derivative is its output), so a caller
// saves one tensor per activation. Math runs in compute_t<T>.
#pragma once

#include <cmath>
#include <cstddef>
#include <numbers>

#include "dtensor/kernels/host/common.hpp"

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
HostTensor<T, R> map_backward(const char* op, const HostTensor<T, R>& x, const HostTensor<T, R>& dy, F fprime) {
  check_same_shape(op, "x", x.shape(), "dy", dy.shape());
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
template <class C>
C sigmoid(C x) {
  return C(1) / (C(1) + std::exp(-x));
}

}  // namespace detail

template <FloatElement T, std::size_t R>
HostTensor<T, R> gelu(const HostTensor<T, R>& x) {
  return detail::map(x, [](auto v) { return detail::gelu(v); });
}
template <FloatElement T, std::size_t R>
HostTensor<T, R> gelu_backward(const HostTensor<T, R>& x, const HostTensor<T, R>& dy) {
  return detail::map_backward("gelu_backward", x, dy, [](auto v) { return detail::gelu_prime(v); });
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
