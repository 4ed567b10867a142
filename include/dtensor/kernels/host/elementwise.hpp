// dtensor/kernels/host/elementwise.hpp — arithmetic on same-shape tensors, broadcasting, and the
// reductions that are their adjoints.
//
//   auto c = add(a, b);  sub(a, b);  mul(a, b);  scale(a, 0.5);       // new tensors
//   add_(y, x, alpha);   // y += alpha * x   (axpy)
//   mul_(y, x);  scale_(y, alpha);  fill_(y, v);
//   auto y = add_bias(x, b);   add_bias_(x, b);   // x[..., n] + b[n]
//   auto db = bias_grad(dy);   bias_grad_into(db, dy, /*accumulate=*/true);  // sum of dy over rows
//   auto z = add_broadcast(x, b);   // same rank; each pair of extents equal or one of them 1
//   auto z = sub_broadcast(a, b);  mul_broadcast(a, b);
//   auto g = sum_to(dz, b.shape()); // the adjoint: sums dz over the broadcast dimensions
//
// Arithmetic runs in compute_t<T> (bfloat16 rounds once per element; its same-shape, bias and
// broadcast loops run vectorized, simd.hpp); the sums of bias_grad and sum_to accumulate in
// double in a fixed order. On a rank's intra-op threads (parallel.hpp) the
// same-shape ops and the bias add run in chunks of elements (rows), bias_grad in blocks of
// columns, each column summed over the rows in order: the same bits for any thread count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "dtensor/kernels/generic/elementwise.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/parallel.hpp"
#include "dtensor/kernels/host/simd.hpp"

namespace dtensor::kernels::host {

namespace detail {

/// Runs an element loop's body (a DTENSOR_SIMD_BODY lambda) vectorized for bfloat16 (simd.hpp:
/// widened, computed in float, rounded once per element), plain for every other type: float's
/// loops keep their bits (a vector instance may fuse a multiply and an add; for bfloat16 that
/// removes a float rounding before the one to bf16, within the one bf16 step the result has).
template <class T, class Body>
void bf16_vectorized(Body&& body) {
  if constexpr (std::is_same_v<T, bfloat16>) with_isa(body);
  else body(IsaTag<Isa::baseline>{});
}

/// out[i] = f(a[i], b[i]) in compute_t<T>.
template <class T, std::size_t R, class F>
HostTensor<T, R> zip(const char* /*op*/, const HostTensor<T, R>& a, const HostTensor<T, R>& b, F f) {
  auto out = HostTensor<T, R>::uninitialized(a.shape());
  const T* pa = a.data();
  const T* pb = b.data();
  T* po = out.data();
  parallel_for(
      a.numel(), grain_for(1),
      [&](Extent i0, Extent i1) {
        bf16_vectorized<T>([&](auto) DTENSOR_SIMD_BODY {
          for (Extent i = i0; i < i1; ++i) po[i] = T(f(compute_t<T>(pa[i]), compute_t<T>(pb[i])));
        });
      },
      64);
  return out;
}

/// y[i] = f(y[i], x[i]) in compute_t<T>.
template <class T, std::size_t R, class F>
void zip_(const char* /*op*/, HostTensor<T, R>& y, const HostTensor<T, R>& x, F f) {
  T* py = y.data();
  const T* px = x.data();
  parallel_for(
      y.numel(), grain_for(1),
      [&](Extent i0, Extent i1) {
        bf16_vectorized<T>([&](auto) DTENSOR_SIMD_BODY {
          for (Extent i = i0; i < i1; ++i) py[i] = T(f(compute_t<T>(py[i]), compute_t<T>(px[i])));
        });
      },
      64);
}

using generic::broadcast_strides;  // kernels/generic/elementwise.hpp: shared by every space

/// Calls f(flat index in x, flat index in b) for every element of x in row-major order.
template <std::size_t R, class F>
void for_each_broadcast(const Shape<R>& x, const Shape<R>& b_strides, F f) {
  const Extent n = numel(x);
  if (n == 0) return;
  Shape<R> idx{};
  Extent off = 0;
  for (Extent i = 0; i < n; ++i) {
    f(i, off);
    for (std::size_t d = R; d-- > 0;) {  // odometer over x's extents
      off += b_strides[d];
      if (++idx[d] < x[d]) break;
      off -= b_strides[d] * idx[d];
      idx[d] = 0;
    }
  }
}

}  // namespace detail

template <Element T, std::size_t R>
HostTensor<T, R> add(const HostTensor<T, R>& a, const HostTensor<T, R>& b) {
  return detail::zip("add", a, b, [](auto x, auto y) { return x + y; });
}
template <Element T, std::size_t R>
HostTensor<T, R> sub(const HostTensor<T, R>& a, const HostTensor<T, R>& b) {
  return detail::zip("sub", a, b, [](auto x, auto y) { return x - y; });
}
template <Element T, std::size_t R>
HostTensor<T, R> mul(const HostTensor<T, R>& a, const HostTensor<T, R>& b) {
  return detail::zip("mul", a, b, [](auto x, auto y) { return x * y; });
}
template <Element T, std::size_t R>
HostTensor<T, R> scale(const HostTensor<T, R>& a, compute_t<T> alpha) {
  auto out = HostTensor<T, R>::uninitialized(a.shape());
  for (Extent i = 0; i < a.numel(); ++i) out[i] = T(alpha * compute_t<T>(a[i]));
  return out;
}

/// y += alpha * x.
template <Element T, std::size_t R>
void add_(HostTensor<T, R>& y, const HostTensor<T, R>& x, compute_t<T> alpha = compute_t<T>(1)) {
  detail::zip_("add_", y, x, [alpha](auto a, auto b) { return a + alpha * b; });
}
/// y *= x elementwise.
template <Element T, std::size_t R>
void mul_(HostTensor<T, R>& y, const HostTensor<T, R>& x) {
  detail::zip_("mul_", y, x, [](auto a, auto b) { return a * b; });
}
/// y *= alpha.
template <Element T, std::size_t R>
void scale_(HostTensor<T, R>& y, compute_t<T> alpha) {
  for (Extent i = 0; i < y.numel(); ++i) y[i] = T(alpha * compute_t<T>(y[i]));
}
template <Element T, std::size_t R>
void fill_(HostTensor<T, R>& y, T value) {
  std::fill_n(y.data(), y.numel(), value);
}

/// x[..., n] += b[n] in place.
template <Element T, std::size_t R>
void add_bias_(HostTensor<T, R>& x, const HostTensor<T, 1>& b) {
  const Extent n = b.extent(0), rows = detail::leading_rows(x.shape());
  T* px = x.data();
  const T* pb = b.data();
  detail::parallel_for(rows, detail::grain_for(n), [&](Extent r0, Extent r1) {
    // float and bfloat16: vectorized for the CPU's ISA (one add per element, so the same bits on every ISA).
    auto body = [&](auto) DTENSOR_SIMD_BODY {
      for (Extent r = r0; r < r1; ++r) {
        T* row = px + r * n;
        for (Extent j = 0; j < n; ++j) row[j] = T(compute_t<T>(row[j]) + compute_t<T>(pb[j]));
      }
    };
    if constexpr (detail::float_rows<T>) detail::with_isa(body);
    else body(detail::IsaTag<Isa::baseline>{});
  });
}
/// x[..., n] + b[n].
template <Element T, std::size_t R>
HostTensor<T, R> add_bias(HostTensor<T, R> x, const HostTensor<T, 1>& b) {
  add_bias_(x, b);
  return x;
}

/// db (+)= sum of dy[..., n] over every leading index: the gradient of a last-dim bias.
template <FloatElement T, std::size_t R>
void bias_grad_into(HostTensor<T, 1>& db, const HostTensor<T, R>& dy, bool accumulate = false) {
  const Extent n = db.extent(0), rows = detail::leading_rows(dy.shape());
  std::vector<Stat> acc(std::size_t(n), 0.0);
  Stat* pacc = acc.data();
  const T* pdy = dy.data();
  detail::parallel_for(
      n, std::max<Extent>(16, detail::grain_for(rows)),
      [&](Extent c0, Extent c1) {
        // Each column summed over the rows in order; float and bfloat16 vectorized across the columns
        // (widened to double lane by lane: the same sums, so the same bits, on every ISA).
        auto body = [&](auto) DTENSOR_SIMD_BODY {
          for (Extent r = 0; r < rows; ++r) {
            const T* row = pdy + r * n;
            for (Extent j = c0; j < c1; ++j) pacc[j] += Stat(row[j]);
          }
        };
        if constexpr (detail::float_rows<T>) detail::with_isa(body);
        else body(detail::IsaTag<Isa::baseline>{});
      },
      16);
  for (Extent j = 0; j < n; ++j) db[j] = T(accumulate ? Stat(db[j]) + acc[std::size_t(j)] : acc[std::size_t(j)]);
}
template <FloatElement T, std::size_t R>
HostTensor<T, 1> bias_grad(const HostTensor<T, R>& dy) {
  HostTensor<T, 1> db(Shape<1>{dy.extent(R - 1)});
  bias_grad_into(db, dy);
  return db;
}

/// The extents of a (op) b under broadcasting (kernels/generic/elementwise.hpp).
using generic::broadcast_shape;

namespace detail {
/// out = f(a, b) over the broadcast extents; arithmetic in compute_t<T>.
template <class T, std::size_t R, class F>
HostTensor<T, R> zip_broadcast(const char* op, const HostTensor<T, R>& a, const HostTensor<T, R>& b, F f) {
  const Shape<R> s = broadcast_shape(op, a.shape(), b.shape());
  if (a.shape() == b.shape()) return zip(op, a, b, f);
  const Shape<R> sa = broadcast_strides(op, s, a.shape()), sb = broadcast_strides(op, s, b.shape());
  auto out = HostTensor<T, R>::uninitialized(s);
  const Extent n = out.numel();
  Shape<R> idx{};
  Extent ia = 0, ib = 0;
  // The trailing dimensions where neither operand broadcasts are one contiguous run in a, b and
  // out (a position table added to [B, T, C] embeddings: runs of T * C): the odometer steps once
  // per run instead of once per element, and the run's loop vectorizes. Same arithmetic per
  // element, so the same bits.
  std::size_t k = R;
  Extent inner = 1;
  while (k > 0 && a.extent(k - 1) == s[k - 1] && b.extent(k - 1) == s[k - 1]) inner *= s[--k];
  if (inner > 1 && n > 0) {
    const T* pa = a.data();
    const T* pb = b.data();
    T* po = out.data();
    for (Extent base = 0; base < n; base += inner) {
      bf16_vectorized<T>([&](auto) DTENSOR_SIMD_BODY {
        for (Extent j = 0; j < inner; ++j) po[base + j] = T(f(compute_t<T>(pa[ia + j]), compute_t<T>(pb[ib + j])));
      });
      for (std::size_t d = k; d-- > 0;) {  // odometer over the outer extents
        ia += sa[d], ib += sb[d];
        if (++idx[d] < s[d]) break;
        ia -= sa[d] * idx[d], ib -= sb[d] * idx[d];
        idx[d] = 0;
      }
    }
    return out;
  }
  for (Extent i = 0; i < n; ++i) {
    out[i] = T(f(compute_t<T>(a[ia]), compute_t<T>(b[ib])));
    for (std::size_t d = R; d-- > 0;) {  // odometer over the output's extents
      ia += sa[d], ib += sb[d];
      if (++idx[d] < s[d]) break;
      ia -= sa[d] * idx[d], ib -= sb[d] * idx[d];
      idx[d] = 0;
    }
  }
  return out;
}
}  // namespace detail

/// a + b with broadcasting (see broadcast_shape).
template <Element T, std::size_t R>
HostTensor<T, R> add_broadcast(const HostTensor<T, R>& a, const HostTensor<T, R>& b) {
  return detail::zip_broadcast("add_broadcast", a, b, [](auto x, auto y) { return x + y; });
}
template <Element T, std::size_t R>
HostTensor<T, R> sub_broadcast(const HostTensor<T, R>& a, const HostTensor<T, R>& b) {
  return detail::zip_broadcast("sub_broadcast", a, b, [](auto x, auto y) { return x - y; });
}
template <Element T, std::size_t R>
HostTensor<T, R> mul_broadcast(const HostTensor<T, R>& a, const HostTensor<T, R>& b) {
  return detail::zip_broadcast("mul_broadcast", a, b, [](auto x, auto y) { return x * y; });
}

/// The adjoint of broadcasting to dz's extents: sums dz over the dimensions where `shape` is 1.
template <FloatElement T, std::size_t R>
HostTensor<T, R> sum_to(const HostTensor<T, R>& dz, const Shape<R>& shape) {
  const Shape<R> st = detail::broadcast_strides("sum_to", dz.shape(), shape);
  std::vector<Stat> acc(std::size_t(numel(shape)), 0.0);
  detail::for_each_broadcast(dz.shape(), st, [&](Extent i, Extent j) { acc[std::size_t(j)] += Stat(dz[i]); });
  auto out = HostTensor<T, R>::uninitialized(shape);
  for (Extent j = 0; j < out.numel(); ++j) out[j] = T(acc[std::size_t(j)]);
  return out;
}

}  // namespace dtensor::kernels::host
