// dtensor/kernels/cuda/elementwise.cuh — the twin of kernels/host/elementwise.hpp on CudaTensor:
// add, sub, mul, scale, add_, mul_, scale_, fill_, add_bias(_), bias_grad(_into).
// (The broadcasting ops add/sub/mul_broadcast and sum_to have no device twin yet.)
#pragma once

#include "dtensor/kernels/cuda/common.cuh"

namespace dtensor::kernels::cuda {

namespace detail {

struct Add { template <class C> __device__ C operator()(C a, C b) const { return a + b; } };
struct Sub { template <class C> __device__ C operator()(C a, C b) const { return a - b; } };
struct Mul { template <class C> __device__ C operator()(C a, C b) const { return a * b; } };
template <class C>
struct Axpy {
  C alpha;
  __device__ C operator()(C a, C b) const { return a + alpha * b; }
};

/// out[i] = f(a[i], b[i]) in compute_t<T> (out may be a).
template <class T, class F>
__global__ void zip_kernel(T* out, const T* a, const T* b, Extent n, F f) {
  using C = compute_t<T>;
  for (Extent i = gidx(); i < n; i += gstride()) out[i] = T(f(C(a[i]), C(b[i])));
}
template <class T, class F>
void zip(T* out, const T* a, const T* b, Extent n, F f) {
  if (n == 0) return;
  zip_kernel<<<grid_for(n), block, 0, stream()>>>(out, a, b, n, f);
  launched("zip_kernel");
}

/// out[i] = f(x[i]) in compute_t<T>.
template <class T, class F>
__global__ void map_kernel(T* out, const T* x, Extent n, F f) {
  using C = compute_t<T>;
  for (Extent i = gidx(); i < n; i += gstride()) out[i] = T(f(C(x[i])));
}
template <class T, class F>
void map(T* out, const T* x, Extent n, F f) {
  if (n == 0) return;
  map_kernel<<<grid_for(n), block, 0, stream()>>>(out, x, n, f);
  launched("map_kernel");
}

template <class C>
struct Scale {
  C alpha;
  __device__ C operator()(C v) const { return alpha * v; }
};

template <class T>
__global__ void add_bias_kernel(T* x, const T* b, Extent n, Extent total) {
  using C = compute_t<T>;
  for (Extent i = gidx(); i < total; i += gstride()) x[i] = T(C(x[i]) + C(b[i % n]));
}

/// db[j] (+)= sum over rows of dy[r, j], in double, rows in order (one thread per column).
template <class T>
__global__ void bias_grad_kernel(T* db, const T* dy, Extent rows, Extent n, bool accumulate) {
  for (Extent j = gidx(); j < n; j += gstride()) {
    Stat acc = 0;
    for (Extent r = 0; r < rows; ++r) acc += Stat(dy[r * n + j]);
    db[j] = T(accumulate ? Stat(db[j]) + acc : acc);
  }
}

template <class T, std::size_t R>
void check_bias(const char* op, const Shape<R>& x, const Shape<1>& b) {
  check(b[0] == x[R - 1], op, "bias ", to_string(b), " does not match the last dimension of ", to_string(x));
}

}  // namespace detail

template <Element T, std::size_t R>
CudaTensor<T, R> add(const CudaTensor<T, R>& a, const CudaTensor<T, R>& b) {
  detail::check_same_shape("add", "a", a.shape(), "b", b.shape());
  auto out = CudaTensor<T, R>::uninitialized(a.shape());
  detail::zip(out.data(), a.data(), b.data(), a.numel(), detail::Add{});
  return out;
}
template <Element T, std::size_t R>
CudaTensor<T, R> sub(const CudaTensor<T, R>& a, const CudaTensor<T, R>& b) {
  detail::check_same_shape("sub", "a", a.shape(), "b", b.shape());
  auto out = CudaTensor<T, R>::uninitialized(a.shape());
  detail::zip(out.data(), a.data(), b.data(), a.numel(), detail::Sub{});
  return out;
}
template <Element T, std::size_t R>
CudaTensor<T, R> mul(const CudaTensor<T, R>& a, const CudaTensor<T, R>& b) {
  detail::check_same_shape("mul", "a", a.shape(), "b", b.shape());
  auto out = CudaTensor<T, R>::uninitialized(a.shape());
  detail::zip(out.data(), a.data(), b.data(), a.numel(), detail::Mul{});
  return out;
}
template <Element T, std::size_t R>
CudaTensor<T, R> scale(const CudaTensor<T, R>& a, compute_t<T> alpha) {
  auto out = CudaTensor<T, R>::uninitialized(a.shape());
  detail::map(out.data(), a.data(), a.numel(), detail::Scale<compute_t<T>>{alpha});
  return out;
}
/// y += alpha * x.
template <Element T, std::size_t R>
void add_(CudaTensor<T, R>& y, const CudaTensor<T, R>& x, compute_t<T> alpha = compute_t<T>(1)) {
  detail::check_same_shape("add_", "y", y.shape(), "x", x.shape());
  detail::zip(y.data(), y.data(), x.data(), y.numel(), detail::Axpy<compute_t<T>>{alpha});
}
template <Element T, std::size_t R>
void mul_(CudaTensor<T, R>& y, const CudaTensor<T, R>& x) {
  detail::check_same_shape("mul_", "y", y.shape(), "x", x.shape());
  detail::zip(y.data(), y.data(), x.data(), y.numel(), detail::Mul{});
}
template <Element T, std::size_t R>
void scale_(CudaTensor<T, R>& y, compute_t<T> alpha) {
  detail::map(y.data(), y.data(), y.numel(), detail::Scale<compute_t<T>>{alpha});
}
template <Element T, std::size_t R>
void fill_(CudaTensor<T, R>& y, T value) {
  cuda_space::fill(y.data(), std::size_t(y.numel()), value);
}

/// x[..., n] += b[n] in place.
template <Element T, std::size_t R>
void add_bias_(CudaTensor<T, R>& x, const CudaTensor<T, 1>& b) {
  detail::check_bias<T, R>("add_bias", x.shape(), b.shape());
  if (x.numel() == 0) return;
  detail::add_bias_kernel<<<detail::grid_for(x.numel()), detail::block, 0, detail::stream()>>>(x.data(), b.data(),
                                                                                             b.extent(0), x.numel());
  detail::launched("add_bias_kernel");
}
template <Element T, std::size_t R>
CudaTensor<T, R> add_bias(CudaTensor<T, R> x, const CudaTensor<T, 1>& b) {
  add_bias_(x, b);
  return x;
}

/// db (+)= sum of dy[..., n] over every leading index.
template <FloatElement T, std::size_t R>
void bias_grad_into(CudaTensor<T, 1>& db, const CudaTensor<T, R>& dy, bool accumulate = false) {
  detail::check_bias<T, R>("bias_grad", dy.shape(), db.shape());
  const Extent n = db.extent(0);
  if (n == 0) return;
  detail::bias_grad_kernel<<<detail::grid_for(n), detail::block, 0, detail::stream()>>>(
      db.data(), dy.data(), detail::leading_rows(dy.shape()), n, accumulate);
  detail::launched("bias_grad_kernel");
}
template <FloatElement T, std::size_t R>
CudaTensor<T, 1> bias_grad(const CudaTensor<T, R>& dy) {
  CudaTensor<T, 1> db(Shape<1>{dy.extent(R - 1)});
  bias_grad_into(db, dy);
  return db;
}

}  // namespace dtensor::kernels::cuda
