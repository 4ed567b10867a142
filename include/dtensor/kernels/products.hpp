// dtensor/kernels/products.hpp — the matrix products of tensors, written once for every memory
// space over that space's GEMM.
//
//   auto c = matmul(a, b);                         // a[m,k] b[k,n] -> [m,n]
//   auto c = matmul(a, b, /*trans_a=*/true);       // a[k,m] -> a^T b
//   matmul_into(c, a, b, false, true, 1.f, 1.f);   // c = 1 * a b^T + 1 * c  (gradient accumulation)
//   auto y = bmm(a, b, false, true);               // a[bt...,m,k] b[bt...,n,k] -> [bt...,m,n]
//   matmul_rows_into(c, x, w, false, true);        // x[B,T,k] w[n,k] -> c[B,T,n]: leading extents are rows
//
//   // Linear layer, weight [out, in] as in PyTorch (Shard<0> = column parallel, Shard<1> = row parallel)
//   auto y  = linear(x, w, &b);                    // x[..., in] -> y[..., out] = x w^T + b
//   auto dx = linear_backward_input(dy, w);        // dy w
//   linear_backward_weight(x, dy, dw, &db, /*accumulate=*/true);   // dw (+)= dy^T x, db (+)= sum dy
//
// The leading dimensions of x and dy are flattened into the rows of one GEMM (no copy). The
// input and weight gradients are separate calls so that pipeline schedules can place them apart.
// kernels::host and kernels::cuda re-export these names; a space takes part by specializing
// SpaceGemm next to its GEMM (kernels/host/matmul.hpp, kernels/cuda/gemm.cuh).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>

#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels {

/// A memory space's GEMM and bias kernels, as static members:
///   gemm_batched<T>(ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch, m, n, k, lda, ldb, ldc)
///   add_bias_(y, b)            bias_grad_into(db, dy, accumulate)
/// (row-major, the arguments of kernels::host::gemm). Not defined for a space without them.
template <class Space>
struct SpaceGemm;

namespace detail {
/// Rows and columns of op(X) for a stored [r, c] matrix.
inline std::pair<Extent, Extent> op_extents(const Shape<2>& s, bool trans) {
  return trans ? std::pair{s[1], s[0]} : std::pair{s[0], s[1]};
}
using host::detail::check;
using host::detail::leading_rows;
}  // namespace detail

/// c = alpha * op(a) op(b) + beta * c where a and b are read as the matrices [their leading
/// extents flattened, their last extent] (no copy): a[..., k] is [rows, k] (with trans_a, op(a)
/// is its transpose). c holds the m x n result row-major: numel(c) == m n (its extents are the
/// caller's, e.g. [B, T, n] or, when op(b) = b^T of a b[B, T, k], [m, B, T]).
template <host::FloatElement T, std::size_t RC, std::size_t RA, std::size_t RB, MemorySpace S>
void matmul_rows_into(Tensor<T, RC, S>& c, const Tensor<T, RA, S>& a, const Tensor<T, RB, S>& b, bool trans_a = false,
                      bool trans_b = false, T alpha = T(1), T beta = T(0)) {
  const Shape<2> as{detail::leading_rows(a.shape()), a.extent(RA - 1)};
  const Shape<2> bs{detail::leading_rows(b.shape()), b.extent(RB - 1)};
  const auto [m, ka] = detail::op_extents(as, trans_a);
  const auto [kb, n] = detail::op_extents(bs, trans_b);
  detail::check(ka == kb && c.numel() == m * n && (RC != 2 || (c.extent(0) == m && c.extent(RC - 1) == n)), "matmul", "op(a) of ", to_string(a.shape()),
                trans_a ? " (transposed)" : "", " times op(b) of ", to_string(b.shape()), trans_b ? " (transposed)" : "",
                " into c of ", to_string(c.shape()), ": inner or outer extents do not match");
  SpaceGemm<S>::template gemm_batched<T>(trans_a, trans_b, alpha, a.data(), 0, b.data(), 0, beta, c.data(), 0, 1, m,
                                         n, ka, std::max<Extent>(1, as[1]), std::max<Extent>(1, bs[1]),
                                         std::max<Extent>(1, n));
}

/// c = alpha * op(a) op(b) + beta * c; c must already have extents [m, n].
template <host::FloatElement T, MemorySpace S>
void matmul_into(Tensor<T, 2, S>& c, const Tensor<T, 2, S>& a, const Tensor<T, 2, S>& b, bool trans_a = false,
                 bool trans_b = false, T alpha = T(1), T beta = T(0)) {
  matmul_rows_into(c, a, b, trans_a, trans_b, alpha, beta);
}

/// op(a)[m,k] op(b)[k,n] -> [m,n].
template <host::FloatElement T, MemorySpace S>
Tensor<T, 2, S> matmul(const Tensor<T, 2, S>& a, const Tensor<T, 2, S>& b, bool trans_a = false,
                       bool trans_b = false) {
  const Extent m = detail::op_extents(a.shape(), trans_a).first, n = detail::op_extents(b.shape(), trans_b).second;
  auto c = Tensor<T, 2, S>::uninitialized(Shape<2>{m, n});
  matmul_into(c, a, b, trans_a, trans_b);
  return c;
}

/// Batched: op(a[i...]) op(b[i...]) for each index i... of the leading (batch) dimensions;
/// a[batch..., m, k] (trans_a: [batch..., k, m]), b likewise -> [batch..., m, n].
template <host::FloatElement T, std::size_t R, MemorySpace S>
  requires(R >= 3)
Tensor<T, R, S> bmm(const Tensor<T, R, S>& a, const Tensor<T, R, S>& b, bool trans_a = false, bool trans_b = false) {
  const Shape<2> as{a.extent(R - 2), a.extent(R - 1)}, bs{b.extent(R - 2), b.extent(R - 1)};
  const auto [m, ka] = detail::op_extents(as, trans_a);
  const auto [kb, n] = detail::op_extents(bs, trans_b);
  bool same_batch = true;
  Extent batch = 1;
  for (std::size_t i = 0; i + 2 < R; ++i) same_batch = same_batch && a.extent(i) == b.extent(i), batch *= a.extent(i);
  detail::check(same_batch && ka == kb, "bmm", "a ", to_string(a.shape()), trans_a ? " (transposed)" : "", " and b ",
                to_string(b.shape()), trans_b ? " (transposed)" : "", ": batch or inner extents do not match");
  Shape<R> cs = a.shape();
  cs[R - 2] = m;
  cs[R - 1] = n;
  auto c = Tensor<T, R, S>::uninitialized(cs);
  SpaceGemm<S>::template gemm_batched<T>(trans_a, trans_b, T(1), a.data(), m * ka, b.data(), ka * n, T(0), c.data(),
                                         m * n, batch, m, n, ka, std::max<Extent>(1, as[1]),
                                         std::max<Extent>(1, bs[1]), std::max<Extent>(1, n));
  return c;
}

/// y[..., out] = x[..., in] w[out, in]^T (+ bias[out]).
template <host::FloatElement T, std::size_t R, MemorySpace S>
Tensor<T, R, S> linear(const Tensor<T, R, S>& x, const Tensor<T, 2, S>& w, const Tensor<T, 1, S>* bias = nullptr) {
  const Extent in = x.extent(R - 1), out = w.extent(0), rows = detail::leading_rows(x.shape());
  detail::check(w.extent(1) == in, "linear", "x ", to_string(x.shape()), " and weight ", to_string(w.shape()),
                ": the weight must be [out, ", in, "]");
  Shape<R> ys = x.shape();
  ys[R - 1] = out;
  auto y = Tensor<T, R, S>::uninitialized(ys);
  SpaceGemm<S>::template gemm_batched<T>(false, true, T(1), x.data(), 0, w.data(), 0, T(0), y.data(), 0, 1, rows, out,
                                         in, std::max<Extent>(1, in), std::max<Extent>(1, in),
                                         std::max<Extent>(1, out));
  if (bias) SpaceGemm<S>::add_bias_(y, *bias);
  return y;
}

/// dx[..., in] = dy[..., out] w[out, in].
template <host::FloatElement T, std::size_t R, MemorySpace S>
Tensor<T, R, S> linear_backward_input(const Tensor<T, R, S>& dy, const Tensor<T, 2, S>& w) {
  const Extent out = dy.extent(R - 1), in = w.extent(1), rows = detail::leading_rows(dy.shape());
  detail::check(w.extent(0) == out, "linear_backward_input", "dy ", to_string(dy.shape()), " and weight ",
                to_string(w.shape()), ": the weight must be [", out, ", in]");
  Shape<R> xs = dy.shape();
  xs[R - 1] = in;
  auto dx = Tensor<T, R, S>::uninitialized(xs);
  SpaceGemm<S>::template gemm_batched<T>(false, false, T(1), dy.data(), 0, w.data(), 0, T(0), dx.data(), 0, 1, rows,
                                         in, out, std::max<Extent>(1, out), std::max<Extent>(1, in),
                                         std::max<Extent>(1, in));
  return dx;
}

/// dw[out, in] (+)= dy^T x over all leading positions; dbias (+)= sum of dy when given.
template <host::FloatElement T, std::size_t R, MemorySpace S>
void linear_backward_weight(const Tensor<T, R, S>& x, const Tensor<T, R, S>& dy, Tensor<T, 2, S>& dw,
                            Tensor<T, 1, S>* dbias = nullptr, bool accumulate = false) {
  const Extent in = x.extent(R - 1), out = dy.extent(R - 1), rows = detail::leading_rows(x.shape());
  detail::check(detail::leading_rows(dy.shape()) == rows && dw.extent(0) == out && dw.extent(1) == in,
                "linear_backward_weight", "x ", to_string(x.shape()), ", dy ", to_string(dy.shape()), " and dw ",
                to_string(dw.shape()), " do not match (dw must be [dy's last, x's last])");
  SpaceGemm<S>::template gemm_batched<T>(true, false, T(1), dy.data(), 0, x.data(), 0, accumulate ? T(1) : T(0),
                                         dw.data(), 0, 1, out, in, rows, std::max<Extent>(1, out),
                                         std::max<Extent>(1, in), std::max<Extent>(1, in));
  if (dbias) SpaceGemm<S>::bias_grad_into(*dbias, dy, accumulate);
}

}  // namespace dtensor::kernels
