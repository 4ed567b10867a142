// dtensor/ops/attention.hpp — causal multi-head scaled-dot-product attention of DTensors.
//
//   auto [out, stats] = ops::attention(q, k, v);          // q, k, v [B, H, T, D] -> out [B, H, T, D]
//   auto [dq, dk, dv] = ops::attention_backward(dout, q, k, v, out, stats);
//   ops::attention(q, k, v, {.causal = false, .scale = 0.125});
//
// Exact attention (softmax(scale q k^T + causal mask) v), scale = 1/sqrt(D) unless given; the
// backward recomputes the probabilities from the saved log-sum-exp (FlashAttention's recipe).
// Sharding (rules::Attention, operands (q, k, v)): all three Shard<0> (batch) -> Shard<0>, all
// Shard<1> (heads: tensor parallel) -> Shard<1>, all Replicate -> Replicate. A split sequence
// (Shard<2>) is context parallelism (ring attention, parallel/), not an op; the head dimension
// is never split.
// Backward (rules::LinearInGrad on (q, dout)): the gradients are linear in dout.
//
// The forward is fused and memory-efficient on every space (host: per-head GEMMs; cuda: one
// kernel streaming key blocks with an online softmax; neither keeps a T x T matrix beyond a
// head's scratch). Element types: float, double and bfloat16 (computed in float, rounded once).
// No communication.
#pragma once

#include <tuple>
#include <algorithm>
#include <cmath>

#include "dtensor/kernels/attention.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

struct AttentionOptions {
  bool causal = true;
  double scale = 0;  // 0: 1 / sqrt(D)
};

/// The log-sum-exp of each of this rank's query rows [B, H, T] (local, in q's space), saved for
/// the backward.
template <class Space>
struct BasicAttentionStats {
  Tensor<double, 3, Space> lse;
  auto tensors() { return std::tie(lse); }  // what an activation offload moves (nn/activation_offload.hpp)
};
using AttentionStats = BasicAttentionStats<host_space>;

template <class O>
struct AttentionResult {
  O out;
  BasicAttentionStats<typename O::space> stats;
};

template <class DQ>
struct AttentionGrads {
  DQ dq, dk, dv;
};

/// float, double and bfloat16 on every space (bf16 computes in float, kernels/host/attention.hpp).
template <class X>
concept AttentionDTensor = AnyDTensor<X> && X::rank == 4 && kernels::host::FloatElement<typename X::value_type>;

namespace detail {
template <fixed_string Op, class Q, class K, class V>
void check_attention(const Q& q, const K& k, const V& v) {
  static_assert(std::is_same_v<typename Q::value_type, typename K::value_type> &&
                    std::is_same_v<typename Q::value_type, typename V::value_type>,
                "attention: q, k, v need the same element type");
  require_same_mesh_type<Q, K, V>();
  require_rule_hint<Op, "split q, k and v alike along batch (Shard<0>) or heads (Shard<1>); a split sequence is "
                        "context parallelism (parallel/)",
                    rules::Attention{}, typename Q::mesh_type, typename Q::layout, typename K::layout,
                    typename V::layout>();
  check_same_mesh(Op.data, q, k, v);
  const auto &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  check(qs[0] == ks[0] && qs[1] == ks[1] && qs[3] == ks[3] && vs[0] == ks[0] && vs[1] == ks[1] && vs[2] == ks[2],
        Op.data, q.mesh(), "q ", to_string(qs), ", k ", to_string(ks), ", v ", to_string(vs),
        ": expected q[B, H, Tq, D], k[B, H, Tk, D], v[B, H, Tk, Dv]");
}
inline kernels::host::AttentionOptions kernel_options(const AttentionOptions& o, Extent head_dim) {
  // The scale comes from the global head dimension (never split), so every rank uses the same.
  return {.causal = o.causal, .scale = o.scale != 0 ? o.scale : 1.0 / std::sqrt(double(std::max<Extent>(1, head_dim)))};
}
}  // namespace detail

/// softmax(scale q k^T (+ causal mask)) v per batch and head. No communication.
template <AttentionDTensor Q, AttentionDTensor K, AttentionDTensor V>
auto attention(const Q& q, const K& k, const V& v, const AttentionOptions& opts = {}) {
  detail::check_attention<"attention">(q, k, v);
  using T = typename Q::value_type;
  using L = rules::attention_t<typename Q::layout, typename K::layout, typename V::layout>;
  auto f = kernels::attention(q.to_local(), k.to_local(), v.to_local(), detail::kernel_options(opts, q.extent(3)));
  const Shape<4> global{q.extent(0), q.extent(1), q.extent(2), v.extent(3)};
  auto out = detail::make<T, 4, L>(q.mesh(), global, std::move(f.out));
  return AttentionResult<decltype(out)>{std::move(out), BasicAttentionStats<typename Q::space>{std::move(f.lse)}};
}

/// {dq, dk, dv} given dout and the forward's q, k, v, out and stats. No communication.
template <AttentionDTensor DO, AttentionDTensor Q, AttentionDTensor K, AttentionDTensor V, AttentionDTensor O>
auto attention_backward(const DO& dout, const Q& q, const K& k, const V& v, const O& out,
                        const BasicAttentionStats<typename Q::space>& stats,
                        const AttentionOptions& opts = {}) {
  detail::check_attention<"attention_backward">(q, k, v);
  detail::require_same_mesh_type<DO, Q, O>();
  detail::require_rule<"attention_backward", rules::LinearInGrad{}, typename Q::mesh_type, typename Q::layout,
                       typename DO::layout>();
  using T = typename Q::value_type;
  using L = rules::linear_in_grad_t<typename Q::layout, typename DO::layout>;
  const auto& ql = q.to_local();
  detail::check(dout.shape() == out.shape() && stats.lse.shape() == Shape<3>{ql.extent(0), ql.extent(1), ql.extent(2)},
                "attention_backward", q.mesh(), "dout ", to_string(dout.shape()), ", out ", to_string(out.shape()),
                ", saved lse ", to_string(stats.lse.shape()), ": pass the output and statistics of this forward");
  auto g = kernels::attention_backward(ql, k.to_local(), v.to_local(), out.to_local(), stats.lse, dout.to_local(),
                                             detail::kernel_options(opts, q.extent(3)));
  auto dq = detail::make<T, 4, L>(q.mesh(), q.shape(), std::move(g.dq));
  auto dk = detail::make<T, 4, L>(q.mesh(), k.shape(), std::move(g.dk));
  auto dv = detail::make<T, 4, L>(q.mesh(), v.shape(), std::move(g.dv));
  return AttentionGrads<decltype(dq)>{std::move(dq), std::move(dk), std::move(dv)};
}

}  // namespace dtensor::ops
