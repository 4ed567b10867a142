// dtensor/ops/matmul.hpp — matrix products of DTensors: matmul (rows may be several leading
// dimensions, flattened) and bmm (leading dimensions are a batch), with compile-time transposes.
//
//   auto y = ops::matmul<false, true>(x, w);                   // Linear: x[B, T, in] w[out, in]^T -> [B, T, out]
//   auto [dx, dw] = ops::matmul_backward<false, true>(dy, x, w);
//   auto dx = ops::matmul_backward_a<false, true>(dy, w);      // the input gradient alone,
//   auto dw = ops::matmul_backward_b<false, true>(dy, x);      // the weight gradient alone (zero-bubble)
//   auto s = ops::bmm<false, true>(q, k);                      // [B, H, T, D] x [B, H, T, D]^T -> [B, H, T, T]
//
// matmul<TA, TB>(a, b): a of rank RA is the matrix [lead_a..., last_a] (the leading dimensions
// flattened into rows) and op(a) = a, or a^T with TA; likewise b. The output is [rows of op(a)...,
// columns of op(b)...]; its rank is rules::matmul_rank<RA, RB, TA, TB>. The contracted groups
// must have the same number of dimensions (so x^T dy of two [B, T, *] tensors contracts B and T,
// which is the weight gradient of a Linear).
//
// Sharding (rules::Matmul, per mesh dimension; m, k, n are the roles of op(a)[m, k] op(b)[k, n]):
//   (Shard<m>, Replicate)  -> Shard<m>          (Replicate, Shard<n>) -> Shard<n>
//   (Shard<k>, Shard<k>)   -> Partial<sum>      (Replicate, Replicate) -> Replicate
//   (Partial<sum|avg>, Replicate) -> Partial    (Replicate, Partial<sum|avg>) -> Partial
// bmm adds (Shard<batch>, Shard<batch>) -> Shard<batch>. Anything else does not compile.
//
// Backward: the gradients are matmuls themselves, so their layouts follow from the same rules:
// C = op(A) op(B): dA = dC op(B)^T (or its transpose), dB = op(A)^T dC. The gradient of a
// Replicate operand whose output was split comes out Partial<sum>; of a Partial operand,
// Replicate (dC of a Partial output is Replicate).
//
// No communication: each rank multiplies its pieces through kernels/products.hpp, whose GEMM is
// the operands' memory space's: CBLAS (host, when DTENSOR_HAS_CBLAS), cuBLAS (cuda), FLOP
// counting (meta).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>

#include "dtensor/kernels/matmul.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

template <class DA, class DB>
struct MatmulGrads {
  DA da;
  DB db;
};

namespace detail {

/// The output extents of matmul<TA, TB> (local or global, the same formula), after checking
/// that the contracted groups agree.
template <bool TA, bool TB, std::size_t RA, std::size_t RB, class Mesh>
auto matmul_shape(const char* op, const Mesh& mesh, const Shape<RA>& a, const Shape<RB>& b) {
  constexpr rules::Matmul mm{int(RA), int(RB), TA, TB};
  constexpr std::size_t RO = std::size_t(mm.out_rank());
  // Contracted groups: a's leading dims (TA) or its last; b's last (TB) or its leading dims.
  constexpr std::size_t kc = std::size_t(mm.a_contracted());
  bool ok = true;
  for (std::size_t p = 0; p < kc; ++p) {
    const Extent ka = TA ? a[p] : a[RA - 1];
    const Extent kb = TB ? b[RB - 1] : b[p];
    ok = ok && ka == kb;
  }
  check(ok, op, mesh, "contracted extents differ: a ", to_string(a), TA ? " (transposed)" : "", ", b ", to_string(b),
        TB ? " (transposed)" : "");
  Shape<RO> out{};
  std::size_t o = 0;
  if (TA) out[o++] = a[RA - 1];
  else
    for (std::size_t i = 0; i + 1 < RA; ++i) out[o++] = a[i];
  if (TB)
    for (std::size_t i = 0; i + 1 < RB; ++i) out[o++] = b[i];
  else out[o++] = b[RB - 1];
  return out;
}

/// What every form of matmul checks (the element types, the contracted groups, the layout rule,
/// the mesh, the extents) and the shapes it computes: {the global result's, this rank's piece's}.
template <fixed_string Op, bool TA, bool TB, FloatDTensor A, FloatDTensor B>
auto matmul_shapes(const A& a, const B& b) {
  constexpr std::size_t RA = A::rank, RB = B::rank;
  constexpr rules::Matmul mm{int(RA), int(RB), TA, TB};
  static_assert(std::is_same_v<typename A::value_type, typename B::value_type>,
                "matmul: the operands must have the same element type");
  static_assert(mm.valid(),
                "matmul: the contracted groups of op(a) and op(b) must have the same number of "
                "dimensions (a rank-2 b contracts one dimension of a: use TA = false for a of rank > 2)");
  require_same_mesh_type<A, B>();
  require_rule<Op, mm, typename A::mesh_type, typename A::layout, typename B::layout>();
  check_same_mesh(Op.data, a, b);
  return std::pair{matmul_shape<TA, TB>(Op.data, a.mesh(), a.shape(), b.shape()),
                   matmul_shape<TA, TB>(Op.data, a.mesh(), a.to_local().shape(), b.to_local().shape())};
}

}  // namespace detail

/// op(a) op(b) with leading dimensions flattened into rows (see the synopsis). No communication.
template <bool TA = false, bool TB = false, FloatDTensor A, FloatDTensor B>
auto matmul(const A& a, const B& b) {
  using T = typename A::value_type;
  constexpr std::size_t RA = A::rank, RB = B::rank;
  using L = rules::matmul_t<typename A::layout, typename B::layout, TA, TB, RA, RB>;
  constexpr std::size_t RO = rules::matmul_rank<RA, RB, TA, TB>;
  const auto [global, local_shape] = detail::matmul_shapes<"matmul", TA, TB>(a, b);
  // Each operand is the matrix [its leading extents flattened, its last extent] (no copy).
  auto c = Tensor<T, RO, typename A::space>::uninitialized(local_shape);
  kernels::matmul_rows_into(c, a.to_local(), b.to_local(), TA, TB);
  return detail::make<T, RO, L>(a.mesh(), global, std::move(c));
}

/// The gradient of a in c = matmul<TA, TB>(a, b), given dc. No communication.
template <bool TA = false, bool TB = false, FloatDTensor DC, FloatDTensor B>
auto matmul_backward_a(const DC& dc, const B& b) {
  if constexpr (!TA) return matmul<false, !TB>(dc, b);  // dA = dC op(B)^T
  else return matmul<TB, true>(b, dc);                  // dA = (dC op(B)^T)^T = op(B) dC^T
}

/// The gradient of b in c = matmul<TA, TB>(a, b), given dc. No communication.
template <bool TA = false, bool TB = false, FloatDTensor DC, FloatDTensor A>
auto matmul_backward_b(const DC& dc, const A& a) {
  if constexpr (!TB) return matmul<!TA, false>(a, dc);  // dB = op(A)^T dC
  else return matmul<true, TA>(dc, a);                  // dB = (op(A)^T dC)^T = dC^T op(A)
}

/// Both gradients of c = matmul<TA, TB>(a, b): {da, db}. No communication.
template <bool TA = false, bool TB = false, FloatDTensor DC, FloatDTensor A, FloatDTensor B>
auto matmul_backward(const DC& dc, const A& a, const B& b) {
  auto da = matmul_backward_a<TA, TB>(dc, b);
  auto db = matmul_backward_b<TA, TB>(dc, a);
  return MatmulGrads<decltype(da), decltype(db)>{std::move(da), std::move(db)};
}

/// Batched: op(a[i...]) op(b[i...]) for every index i... of the leading (batch) dimensions;
/// a[batch..., m, k] (TA: [batch..., k, m]), b[batch..., k, n] (TB: [batch..., n, k]). No communication.
template <bool TA = false, bool TB = false, FloatDTensor A, FloatDTensor B>
auto bmm(const A& a, const B& b) {
  using T = typename A::value_type;
  constexpr std::size_t R = A::rank;
  static_assert(R >= 3 && R == B::rank, "bmm: both operands need the same rank >= 3 ([batch..., rows, cols])");
  static_assert(std::is_same_v<T, typename B::value_type>, "bmm: the operands must have the same element type");
  detail::require_same_mesh_type<A, B>();
  constexpr rules::Bmm rule{int(R), TA, TB};
  detail::require_rule<"bmm", rule, typename A::mesh_type, typename A::layout, typename B::layout>();
  using L = rules::bmm_t<typename A::layout, typename B::layout, TA, TB, R>;

  detail::check_same_mesh("bmm", a, b);
  auto out_shape = [&](const Shape<R>& as, const Shape<R>& bs) {
    bool ok = true;
    for (std::size_t i = 0; i + 2 < R; ++i) ok = ok && as[i] == bs[i];
    const Extent ka = TA ? as[R - 2] : as[R - 1], kb = TB ? bs[R - 1] : bs[R - 2];
    detail::check(ok && ka == kb, "bmm", a.mesh(), "a ", to_string(as), TA ? " (transposed)" : "", " and b ",
                  to_string(bs), TB ? " (transposed)" : "", ": batch or contracted extents differ");
    Shape<R> o = as;
    o[R - 2] = TA ? as[R - 1] : as[R - 2];
    o[R - 1] = TB ? bs[R - 2] : bs[R - 1];
    return o;
  };
  const Shape<R> global = out_shape(a.shape(), b.shape());
  const auto& al = a.to_local();
  const auto& bl = b.to_local();
  const Shape<R> ls = out_shape(al.shape(), bl.shape());
  auto c = kernels::bmm(al, bl, TA, TB);
  detail::check(c.shape() == ls, "bmm", a.mesh(), "local result ", to_string(c.shape()), " is not ", to_string(ls));
  return detail::make<T, R, L>(a.mesh(), global, std::move(c));
}

/// Both gradients of c = bmm<TA, TB>(a, b): {da, db}. No communication.
template <bool TA = false, bool TB = false, FloatDTensor DC, FloatDTensor A, FloatDTensor B>
auto bmm_backward(const DC& dc, const A& a, const B& b) {
  auto da = [&] {
    if constexpr (!TA) return bmm<false, !TB>(dc, b);
    else return bmm<TB, true>(b, dc);
  }();
  auto db = [&] {
    if constexpr (!TB) return bmm<!TA, false>(a, dc);
    else return bmm<true, TA>(dc, a);
  }();
  return MatmulGrads<decltype(da), decltype(db)>{std::move(da), std::move(db)};
}

}  // namespace dtensor::ops
