// dtensor/kernels/cuda/activations.cuh — the twin of kernels/host/activations.hpp on CudaTensor:
// gelu (tanh form), relu, silu, exp, and their backwards (which take the forward's input, except
// exp_backward, which takes its output). Math in compute_t<T>.
#pragma once

#include "dtensor/kernels/cuda/elementwise.cuh"

namespace dtensor::kernels::cuda {

namespace detail {

inline constexpr double gelu_k = 0.79788456080286535588;  // sqrt(2 / pi)

struct Gelu {
  template <class C> __device__ C operator()(C x) const {
    const C u = C(gelu_k) * (x + C(0.044715) * x * x * x);
    return C(0.5) * x * (C(1) + ::tanh(u));
  }
};
struct GeluPrime {
  template <class C> __device__ C operator()(C x) const {
    const C k = C(gelu_k), x2 = x * x;
    const C t = ::tanh(k * (x + C(0.044715) * x2 * x));
    return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k * (C(1) + C(3 * 0.044715) * x2);
  }
};
struct Relu { template <class C> __device__ C operator()(C x) const { return x > 0 ? x : C(0); } };
struct ReluPrime { template <class C> __device__ C operator()(C x) const { return x > 0 ? C(1) : C(0); } };
struct Silu { template <class C> __device__ C operator()(C x) const { return x / (C(1) + ::exp(-x)); } };
struct SiluPrime {
  template <class C> __device__ C operator()(C x) const {
    const C s = C(1) / (C(1) + ::exp(-x));
    return s * (C(1) + x * (C(1) - s));
  }
};
struct Exp { template <class C> __device__ C operator()(C x) const { return ::exp(x); } };
struct Identity { template <class C> __device__ C operator()(C x) const { return x; } };

/// dx = dy * fprime(x) as zip's element function (zip(dx, x, dy, ...): packed where aligned).
template <class F>
struct TimesDerivative {
  F fprime;
  template <class C>
  __device__ C operator()(C x, C dy) const {
    return dy * fprime(x);
  }
};

template <class T, std::size_t R, class F>
CudaTensor<T, R> map_new(const CudaTensor<T, R>& x, F f) {
  auto y = CudaTensor<T, R>::uninitialized(x.shape());
  map(y.data(), x.data(), x.numel(), f);
  return y;
}
template <class T, std::size_t R, class F>
CudaTensor<T, R> map_backward(const char* /*op*/, const CudaTensor<T, R>& x, const CudaTensor<T, R>& dy, F fprime) {
  auto dx = CudaTensor<T, R>::uninitialized(x.shape());
  zip(dx.data(), x.data(), dy.data(), x.numel(), TimesDerivative<F>{fprime});
  return dx;
}

}  // namespace detail

template <FloatElement T, std::size_t R>
CudaTensor<T, R> gelu(const CudaTensor<T, R>& x) { return detail::map_new(x, detail::Gelu{}); }
template <FloatElement T, std::size_t R>
CudaTensor<T, R> gelu_backward(const CudaTensor<T, R>& x, const CudaTensor<T, R>& dy) {
  return detail::map_backward("gelu_backward", x, dy, detail::GeluPrime{});
}
template <FloatElement T, std::size_t R>
CudaTensor<T, R> relu(const CudaTensor<T, R>& x) { return detail::map_new(x, detail::Relu{}); }
template <FloatElement T, std::size_t R>
CudaTensor<T, R> relu_backward(const CudaTensor<T, R>& x, const CudaTensor<T, R>& dy) {
  return detail::map_backward("relu_backward", x, dy, detail::ReluPrime{});
}
template <FloatElement T, std::size_t R>
CudaTensor<T, R> silu(const CudaTensor<T, R>& x) { return detail::map_new(x, detail::Silu{}); }
template <FloatElement T, std::size_t R>
CudaTensor<T, R> silu_backward(const CudaTensor<T, R>& x, const CudaTensor<T, R>& dy) {
  return detail::map_backward("silu_backward", x, dy, detail::SiluPrime{});
}
template <FloatElement T, std::size_t R>
CudaTensor<T, R> exp(const CudaTensor<T, R>& x) { return detail::map_new(x, detail::Exp{}); }
template <FloatElement T, std::size_t R>
CudaTensor<T, R> exp_backward(const CudaTensor<T, R>& y, const CudaTensor<T, R>& dy) {
  return detail::map_backward("exp_backward", y, dy, detail::Identity{});
}

}  // namespace dtensor::kernels::cuda
