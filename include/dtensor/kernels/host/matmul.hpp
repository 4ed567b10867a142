// dtensor/kernels/host/matmul.hpp — matrix products of tensors, over gemm.hpp.
//
//   auto c = matmul(a, b);                         // a[m,k] b[k,n] -> [m,n]
//   auto c = matmul(a, b, /*trans_a=*/true);       // a[k,m] -> a^T b
//   matmul_into(c, a, b, false, true, 1.f, 1.f);   // c = 1 * a b^T + 1 * c  (gradient accumulation)
//   auto y = bmm(a, b, false, true);               // a[bt,m,k] b[bt,n,k] -> [bt,m,n]
//
//   // Linear layer, weight [out, in] as in PyTorch (Shard<0> = column parallel, Shard<1> = row parallel)
//   auto y  = linear(x, w, &b);                    // x[..., in] -> y[..., out] = x w^T + b
//   auto dx = linear_backward_input(dy, w);        // dy w
//   linear_backward_weight(x, dy, dw, &db, /*accumulate=*/true);   // dw (+)= dy^T x, db (+)= sum dy
//
// The leading dimensions of x and dy are flattened into the rows of one GEMM (no copy). The
// input and weight gradients are separate calls so that pipeline schedules can place them apart.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>

#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/elementwise.hpp"
#include "dtensor/kernels/host/gemm.hpp"

namespace dtensor::kernels::host {

namespace detail {
/// Rows and columns of op(X) for a stored [r, c] matrix.
inline std::pair<Extent, Extent> op_extents(const Shape<2>& s, bool trans) {
  return trans ? std::pair{s[1], s[0]} : std::pair{s[0], s[1]};
}
}  // namespace detail

/// c = alpha * op(a) op(b) + beta * c; c must already have extents [m, n].
template <FloatElement T>
void matmul_into(HostTensor<T, 2>& c, const HostTensor<T, 2>& a, const HostTensor<T, 2>& b, bool trans_a = false,
                 bool trans_b = false, T alpha = T(1), T beta = T(0)) {
  const auto [m, ka] = detail::op_extents(a.shape(), trans_a);
  const auto [kb, n] = detail::op_extents(b.shape(), trans_b);
  detail::check(ka == kb && c.extent(0) == m && c.extent(1) == n, "matmul",
                "op(a) of ", to_string(a.shape()), trans_a ? " (transposed)" : "", " times op(b) of ",
                to_string(b.shape()), trans_b ? " (transposed)" : "", " into c of ", to_string(c.shape()),
                ": inner or outer extents do not match");
  gemm<T>(trans_a, trans_b, alpha, a.data(), b.data(), beta, c.data(), m, n, ka, std::max<Extent>(1, a.extent(1)),
          std::max<Extent>(1, b.extent(1)), std::max<Extent>(1, n));
}

/// op(a)[m,k] op(b)[k,n] -> [m,n].
template <FloatElement T>
HostTensor<T, 2> matmul(const HostTensor<T, 2>& a, const HostTensor<T, 2>& b, bool trans_a = false,
                        bool trans_b = false) {
  const Extent m = detail::op_extents(a.shape(), trans_a).first, n = detail::op_extents(b.shape(), trans_b).second;
  auto c = HostTensor<T, 2>::uninitialized(Shape<2>{m, n});
  matmul_into(c, a, b, trans_a, trans_b);
  return c;
}

/// Batched: op(a[i]) op(b[i]) for each i of the leading (batch) dimension.
template <FloatElement T>
HostTensor<T, 3> bmm(const HostTensor<T, 3>& a, const HostTensor<T, 3>& b, bool trans_a = false, bool trans_b = false) {
  const Shape<2> as{a.extent(1), a.extent(2)}, bs{b.extent(1), b.extent(2)};
  const auto [m, ka] = detail::op_extents(as, trans_a);
  const auto [kb, n] = detail::op_extents(bs, trans_b);
  detail::check(a.extent(0) == b.extent(0) && ka == kb, "bmm", "a ", to_string(a.shape()),
                trans_a ? " (transposed)" : "", " and b ", to_string(b.shape()), trans_b ? " (transposed)" : "",
                ": batch or inner extents do not match");
  auto c = HostTensor<T, 3>::uninitialized(Shape<3>{a.extent(0), m, n});
  for (Extent i = 0; i < a.extent(0); ++i)
    gemm<T>(trans_a, trans_b, T(1), a.data() + i * m * ka, b.data() + i * ka * n, T(0), c.data() + i * m * n, m, n,
            ka, std::max<Extent>(1, as[1]), std::max<Extent>(1, bs[1]), std::max<Extent>(1, n));
  return c;
}

/// y[..., out] = x[..., in] w[out, in]^T (+ bias[out]).
template <FloatElement T, std::size_t R>
HostTensor<T, R> linear(const HostTensor<T, R>& x, const HostTensor<T, 2>& w, const HostTensor<T, 1>* bias = nullptr) {
  const Extent in = x.extent(R - 1), out = w.extent(0), rows = detail::leading_rows(x.shape());
  detail::check(w.extent(1) == in, "linear", "x ", to_string(x.shape()), " and weight ", to_string(w.shape()),
                ": the weight must be [out, ", in, "]");
  Shape<R> ys = x.shape();
  ys[R - 1] = out;
  auto y = HostTensor<T, R>::uninitialized(ys);
  gemm<T>(false, true, T(1), x.data(), w.data(), T(0), y.data(), rows, out, in, std::max<Extent>(1, in),
          std::max<Extent>(1, in), std::max<Extent>(1, out));
  if (bias) add_bias_(y, *bias);
  return y;
}

/// dx[..., in] = dy[..., out] w[out, in].
template <FloatElement T, std::size_t R>
HostTensor<T, R> linear_backward_input(const HostTensor<T, R>& dy, const HostTensor<T, 2>& w) {
  const Extent out = dy.extent(R - 1), in = w.extent(1), rows = detail::leading_rows(dy.shape());
  detail::check(w.extent(0) == out, "linear_backward_input", "dy ", to_string(dy.shape()), " and weight ",
                to_string(w.shape()), ": the weight must be [", out, ", in]");
  Shape<R> xs = dy.shape();
  xs[R - 1] = in;
  auto dx = HostTensor<T, R>::uninitialized(xs);
  gemm<T>(false, false, T(1), dy.data(), w.data(), T(0), dx.data(), rows, in, out, std::max<Extent>(1, out),
          std::max<Extent>(1, in), std::max<Extent>(1, in));
  return dx;
}

/// dw[out, in] (+)= dy^T x over all leading positions; dbias (+)= sum of dy when given.
template <FloatElement T, std::size_t R>
void linear_backward_weight(const HostTensor<T, R>& x, const HostTensor<T, R>& dy, HostTensor<T, 2>& dw,
                            HostTensor<T, 1>* dbias = nullptr, bool accumulate = false) {
  const Extent in = x.extent(R - 1), out = dy.extent(R - 1), rows = detail::leading_rows(x.shape());
  detail::check(detail::leading_rows(dy.shape()) == rows && dw.extent(0) == out && dw.extent(1) == in,
                "linear_backward_weight", "x ", to_string(x.shape()), ", dy ", to_string(dy.shape()), " and dw ",
                to_string(dw.shape()), " do not match (dw must be [dy's last, x's last])");
  gemm<T>(true, false, T(1), dy.data(), x.data(), accumulate ? T(1) : T(0), dw.data(), out, in, rows,
          std::max<Extent>(1, out), std::max<Extent>(1, in), std::max<Extent>(1, in));
  if (dbias) bias_grad_into(*dbias, dy, accumulate);
}

}  // namespace dtensor::kernels::host
