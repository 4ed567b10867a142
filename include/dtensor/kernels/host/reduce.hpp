// dtensor/kernels/host/reduce.hpp — sum, mean and max over one dimension, and their backwards.
//
//   auto s  = sum(x, 1);                 // x[a,b,c] -> [a,1,c]  (the dimension is kept, extent 1)
//   auto m  = mean(x, 1);
//   auto [v, idx] = max(x, 1);           // values [a,1,c] and int64 indices into dimension 1
//   auto dx = sum_backward(ds, x.shape(), 1);     // broadcasts ds back over dimension 1
//   auto dx = mean_backward(dm, x.shape(), 1);
//   auto dx = max_backward(dv, idx, x.shape(), 1);  // routes dv to the (first) maximum
//   auto m  = mean(x, 1, /*divisor=*/n_global);    // this shard's sum / the global extent
//   auto dx = mean_backward(dm, x.shape(), 1, n_global);
//
// The reduced dimension is kept with extent 1 so that every rank, 1 included, works, and so that
// the result broadcasts against x; reshape to drop it. Sums accumulate in double, in index order.
// max takes the first index among equal maxima, and NaN wins (as torch.max).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtensor/kernels/generic/reduce.hpp"
#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels::host {

template <class T, std::size_t R>
struct MaxResult {
  HostTensor<T, R> values;
  HostTensor<std::int64_t, R> indices;
};

namespace detail {

using generic::reduced_shape;  // kernels/generic/reduce.hpp

/// out[o, i] = s * sum_j x[o, j, i].
template <class T, std::size_t R>
HostTensor<T, R> sum_scaled(const char* op, const HostTensor<T, R>& x, std::size_t dim, Stat s) {
  auto out = HostTensor<T, R>::uninitialized(reduced_shape(op, x.shape(), dim));
  const auto a = around(x.shape(), dim);
  std::vector<Stat> acc(std::size_t(a.inner));
  for (Extent o = 0; o < a.outer; ++o) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (Extent j = 0; j < a.n; ++j) {
      const T* row = x.data() + (o * a.n + j) * a.inner;
      for (Extent i = 0; i < a.inner; ++i) acc[std::size_t(i)] += Stat(row[i]);
    }
    for (Extent i = 0; i < a.inner; ++i) out[o * a.inner + i] = T(acc[std::size_t(i)] * s);
  }
  return out;
}

/// dx[o, j, i] = scale * dy[o, i].
template <class T, std::size_t R>
HostTensor<T, R> broadcast_back(const char* /*op*/, const HostTensor<T, R>& dy, const Shape<R>& x_shape,
                                std::size_t dim, Stat scale) {
  auto dx = HostTensor<T, R>::uninitialized(x_shape);
  const auto a = around(x_shape, dim);
  for (Extent o = 0; o < a.outer; ++o)
    for (Extent j = 0; j < a.n; ++j)
      for (Extent i = 0; i < a.inner; ++i)
        dx[(o * a.n + j) * a.inner + i] = T(compute_t<T>(dy[o * a.inner + i]) * compute_t<T>(scale));
  return dx;
}

}  // namespace detail

template <FloatElement T, std::size_t R>
HostTensor<T, R> sum(const HostTensor<T, R>& x, std::size_t dim) {
  return detail::sum_scaled("sum", x, dim, 1.0);
}
/// The sum over dim divided by `divisor` (default: the extent of dim; a shard of a split
/// dimension passes the global extent, so that the shards' results add up to the mean).
template <FloatElement T, std::size_t R>
HostTensor<T, R> mean(const HostTensor<T, R>& x, std::size_t dim, Extent divisor = -1) {
  const Extent n = divisor < 0 ? x.extent(dim) : divisor;
  return detail::sum_scaled("mean", x, dim, n > 0 ? 1.0 / Stat(n) : Stat(NAN));
}

template <FloatElement T, std::size_t R>
MaxResult<T, R> max(const HostTensor<T, R>& x, std::size_t dim) {
  const Shape<R> rs = detail::reduced_shape("max", x.shape(), dim);
  const auto a = detail::around(x.shape(), dim);
  MaxResult<T, R> r{HostTensor<T, R>::uninitialized(rs), HostTensor<std::int64_t, R>::uninitialized(rs)};
  for (Extent o = 0; o < a.outer; ++o)
    for (Extent i = 0; i < a.inner; ++i) {
      const T* p = x.data() + o * a.n * a.inner + i;
      T best = p[0];
      Extent at = 0;
      for (Extent j = 1; j < a.n && !std::isnan(float(best)); ++j) {
        const T v = p[j * a.inner];
        if (v > best || std::isnan(float(v))) best = v, at = j;
      }
      r.values[o * a.inner + i] = best;
      r.indices[o * a.inner + i] = at;
    }
  return r;
}

template <FloatElement T, std::size_t R>
HostTensor<T, R> sum_backward(const HostTensor<T, R>& dy, const Shape<R>& x_shape, std::size_t dim) {
  return detail::broadcast_back("sum_backward", dy, x_shape, dim, 1.0);
}
template <FloatElement T, std::size_t R>
HostTensor<T, R> mean_backward(const HostTensor<T, R>& dy, const Shape<R>& x_shape, std::size_t dim,
                               Extent divisor = -1) {
  return detail::broadcast_back("mean_backward", dy, x_shape, dim, 1.0 / Stat(divisor < 0 ? x_shape[dim] : divisor));
}
template <FloatElement T, std::size_t R>
HostTensor<T, R> max_backward(const HostTensor<T, R>& dy, const HostTensor<std::int64_t, R>& indices,
                              const Shape<R>& x_shape, std::size_t dim) {
  HostTensor<T, R> dx(x_shape);
  const auto a = detail::around(x_shape, dim);
  for (Extent o = 0; o < a.outer; ++o)
    for (Extent i = 0; i < a.inner; ++i) {
      const std::int64_t j = indices[o * a.inner + i];
      detail::check(j >= 0 && j < a.n, "max_backward", "index ", j, " out of range [0, ", a.n, ")");
      dx[(o * a.n + j) * a.inner + i] = dy[o * a.inner + i];
    }
  return dx;
}

/// The gradient of max over a dimension split across ranks: dy goes to this piece's first
/// maximum (indices) only where this piece's maximum (local_max) equals the maximum over all
/// ranks (global_max); ties across ranks each receive it. An empty piece gets an empty gradient.
template <FloatElement T, std::size_t R>
HostTensor<T, R> max_backward_split(const HostTensor<T, R>& dy, const HostTensor<std::int64_t, R>& indices,
                                    const HostTensor<T, R>& local_max, const HostTensor<T, R>& global_max,
                                    const Shape<R>& x_shape, std::size_t dim) {
  HostTensor<T, R> dx(x_shape);
  const auto a = detail::around(x_shape, dim);
  if (a.n == 0) return dx;
  for (Extent o = 0; o < a.outer; ++o)
    for (Extent i = 0; i < a.inner; ++i) {
      const Extent r = o * a.inner + i;
      const std::int64_t j = indices[r];
      if (j < 0 || !(local_max[r] == global_max[r])) continue;  // the maximum is on another rank
      detail::check(j < a.n, "max_backward", "index ", j, " out of range [0, ", a.n, ")");
      dx[(o * a.n + j) * a.inner + i] = dy[r];
    }
  return dx;
}

}  // namespace dtensor::kernels::host
