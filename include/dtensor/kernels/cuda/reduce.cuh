// dtensor/kernels/cuda/reduce.cuh — the twin of kernels/host/reduce.hpp on CudaTensor: sum, mean,
// max over one dimension (kept, extent 1) and their backwards, max_backward_split. One thread
// per output element walks the reduced dimension in index order with a double accumulator, so
// the result is deterministic and follows the host's order (the host sums in the same order).
#pragma once

#include <cmath>
#include <cstdint>

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/host/reduce.hpp"  // reduced_shape

namespace dtensor::kernels::cuda {

template <class T, std::size_t R>
struct MaxResult {
  CudaTensor<T, R> values;
  CudaTensor<std::int64_t, R> indices;
};

namespace detail {

template <class T>
__global__ void sum_dim_kernel(T* out, const T* x, Extent outer, Extent n, Extent inner, double scale) {
  for (Extent o = gidx(); o < outer * inner; o += gstride()) {
    const Extent a = o / inner, i = o % inner;
    double acc = 0;
    for (Extent j = 0; j < n; ++j) acc += double(x[(a * n + j) * inner + i]);
    out[o] = T(acc * scale);
  }
}

template <class T>
__global__ void max_dim_kernel(T* out, std::int64_t* idx, const T* x, Extent outer, Extent n, Extent inner) {
  for (Extent o = gidx(); o < outer * inner; o += gstride()) {
    const Extent a = o / inner, i = o % inner;
    const T* p = x + a * n * inner + i;
    using C = compute_t<T>;
    T best = p[0];
    Extent at = 0;
    for (Extent j = 1; j < n && !isnan(C(best)); ++j) {
      const T v = p[j * inner];
      if (C(v) > C(best) || isnan(C(v))) best = v, at = j;  // NaN wins, the first maximum is kept
    }
    out[o] = best;
    idx[o] = at;
  }
}

template <class T>
__global__ void broadcast_back_kernel(T* dx, const T* dy, Extent outer, Extent n, Extent inner, double scale) {
  for (Extent e = gidx(); e < outer * n * inner; e += gstride()) {
    const Extent a = e / (n * inner), i = e % inner;
    dx[e] = T(compute_t<T>(dy[a * inner + i]) * compute_t<T>(scale));
  }
}

/// dx[o, idx, i] = dy[o, i] where the row's maximum is this piece's (local == global) or always.
template <class T>
__global__ void max_scatter_kernel(T* dx, const T* dy, const std::int64_t* idx, const T* local, const T* global,
                                   Extent outer, Extent n, Extent inner, unsigned long long* bad) {
  for (Extent o = gidx(); o < outer * inner; o += gstride()) {
    const std::int64_t j = idx[o];
    if (local && (j < 0 || !(local[o] == global[o]))) continue;
    if (j < 0 || j >= n) {
      report_bad(bad, o);
      continue;
    }
    const Extent a = o / inner, i = o % inner;
    dx[(a * n + j) * inner + i] = dy[o];
  }
}

using generic::reduced_shape;

template <class T, std::size_t R>
CudaTensor<T, R> sum_scaled(const char* op, const CudaTensor<T, R>& x, std::size_t dim, double scale) {
  auto out = CudaTensor<T, R>::uninitialized(reduced_shape(op, x.shape(), dim));
  const auto a = around(x.shape(), dim);
  if (out.numel() == 0) return out;
  sum_dim_kernel<<<grid_for(out.numel()), block, 0, stream()>>>(out.data(), x.data(), a.outer, a.n, a.inner, scale);
  launched("sum_dim_kernel");
  return out;
}

template <class T, std::size_t R>
CudaTensor<T, R> broadcast_back(const char* /*op*/, const CudaTensor<T, R>& dy, const Shape<R>& x_shape, std::size_t dim,
                                double scale) {
  auto dx = CudaTensor<T, R>::uninitialized(x_shape);
  const auto a = around(x_shape, dim);
  if (dx.numel() == 0) return dx;
  broadcast_back_kernel<<<grid_for(dx.numel()), block, 0, stream()>>>(dx.data(), dy.data(), a.outer, a.n, a.inner,
                                                                      scale);
  launched("broadcast_back_kernel");
  return dx;
}

template <class T, std::size_t R>
CudaTensor<T, R> max_scatter(const CudaTensor<T, R>& dy, const CudaTensor<std::int64_t, R>& indices,
                             const CudaTensor<T, R>* local, const CudaTensor<T, R>* global, const Shape<R>& x_shape,
                             std::size_t dim) {
  CudaTensor<T, R> dx(x_shape);
  const auto a = around(x_shape, dim);
  if (dy.numel() == 0 || a.n == 0) return dx;
  BadValueFlag bad;
  max_scatter_kernel<<<grid_for(dy.numel()), block, 0, stream()>>>(dx.data(), dy.data(), indices.data(),
                                                                   local ? local->data() : nullptr,
                                                                   global ? global->data() : nullptr, a.outer, a.n,
                                                                   a.inner, bad.data());
  launched("max_scatter_kernel");
  const Extent at = bad.position();
  check(at < 0, "max_backward", "index at reduced position ", at, " out of range [0, ", a.n, ")");
  return dx;
}

}  // namespace detail

template <FloatElement T, std::size_t R>
CudaTensor<T, R> sum(const CudaTensor<T, R>& x, std::size_t dim) {
  return detail::sum_scaled("sum", x, dim, 1.0);
}
template <FloatElement T, std::size_t R>
CudaTensor<T, R> mean(const CudaTensor<T, R>& x, std::size_t dim, Extent divisor = -1) {
  const Extent n = divisor < 0 ? x.extent(dim) : divisor;
  return detail::sum_scaled("mean", x, dim, n > 0 ? 1.0 / double(n) : double(NAN));
}
template <FloatElement T, std::size_t R>
MaxResult<T, R> max(const CudaTensor<T, R>& x, std::size_t dim) {
  const Shape<R> rs = detail::reduced_shape("max", x.shape(), dim);
  const auto a = detail::around(x.shape(), dim);
  MaxResult<T, R> r{CudaTensor<T, R>::uninitialized(rs), CudaTensor<std::int64_t, R>::uninitialized(rs)};
  if (r.values.numel() == 0) return r;
  detail::max_dim_kernel<<<detail::grid_for(r.values.numel()), detail::block, 0, detail::stream()>>>(
      r.values.data(), r.indices.data(), x.data(), a.outer, a.n, a.inner);
  detail::launched("max_dim_kernel");
  return r;
}
template <FloatElement T, std::size_t R>
CudaTensor<T, R> sum_backward(const CudaTensor<T, R>& dy, const Shape<R>& x_shape, std::size_t dim) {
  return detail::broadcast_back("sum_backward", dy, x_shape, dim, 1.0);
}
template <FloatElement T, std::size_t R>
CudaTensor<T, R> mean_backward(const CudaTensor<T, R>& dy, const Shape<R>& x_shape, std::size_t dim,
                               Extent divisor = -1) {
  return detail::broadcast_back("mean_backward", dy, x_shape, dim, 1.0 / double(divisor < 0 ? x_shape[dim] : divisor));
}
template <FloatElement T, std::size_t R>
CudaTensor<T, R> max_backward(const CudaTensor<T, R>& dy, const CudaTensor<std::int64_t, R>& indices,
                              const Shape<R>& x_shape, std::size_t dim) {
  return detail::max_scatter<T, R>(dy, indices, nullptr, nullptr, x_shape, dim);
}
template <FloatElement T, std::size_t R>
CudaTensor<T, R> max_backward_split(const CudaTensor<T, R>& dy, const CudaTensor<std::int64_t, R>& indices,
                                    const CudaTensor<T, R>& local_max, const CudaTensor<T, R>& global_max,
                                    const Shape<R>& x_shape, std::size_t dim) {
  return detail::max_scatter(dy, indices, &local_max, &global_max, x_shape, dim);
}

}  // namespace dtensor::kernels::cuda
