// dtensor/ops/cross_entropy.hpp — mean cross-entropy of logits against integer targets.
//
//   auto [loss, stats] = ops::cross_entropy(logits, targets);   // logits[N, V], targets[N] -> loss[1] (double)
//   double l = full_tensor(loss)[0];                              // (a redistribution: communicates)
//   auto dlogits = ops::cross_entropy_backward(logits, targets, stats, /*dloss=*/1.0);
//
// loss = mean over the N rows of logsumexp(logits[i]) - logits[i, targets[i]].
// Sharding (rules::CrossEntropy, operands (logits, targets)):
//   (Shard<0>, Shard<0>)   -> Partial<sum>   rows split: each rank's sum over its rows divided by
//                                            the GLOBAL N, so the pieces add up to the mean
//   (Replicate, Replicate) -> Replicate
// A split vocabulary (Shard<1>) needs the global row max and sum of exps: that is loss-parallel
// cross-entropy, a parallel/ building block (it communicates). Its local pieces are in
// kernels/cross_entropy.hpp (every space): vocab_parallel_ce_max / _sum_exp / _target_logit / _loss /
// _backward (with v0 = logits.local_box().offset[1] and mean_over = the global N).
// Backward: dlogits = (softmax - onehot) * dloss / N in logits' layout; dloss is the gradient of
// the loss's logical value, the same on every rank (Replicate).
//
// No communication.
#pragma once

#include "dtensor/kernels/cross_entropy.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

/// The log-sum-exp of each of this rank's rows, saved for the backward (in the logits' space).
template <class Space>
struct BasicCrossEntropyStats {
  Tensor<double, 1, Space> lse;
};
using CrossEntropyStats = BasicCrossEntropyStats<host_space>;

template <class Loss>
struct CrossEntropyResult {
  Loss loss;  // DTensor<double, 1, Mesh, ...> of extent [1]
  BasicCrossEntropyStats<typename Loss::space> stats;
};

namespace detail {
template <fixed_string Op, class L, class Tg>
void check_ce(const L& logits, const Tg& targets) {
  static_assert(L::rank == 2 && Tg::rank == 1, "cross_entropy: logits [N, V], targets [N]");
  require_same_mesh_type<L, Tg>();
  require_rule_hint<Op, "split the rows of logits and targets alike; a split vocabulary is loss parallelism (parallel/)",
                    rules::CrossEntropy{}, typename L::mesh_type, typename L::layout, typename Tg::layout>();
  check_same_mesh(Op.data, logits, targets);
  check(targets.extent(0) == logits.extent(0), Op.data, logits.mesh(), "logits ", to_string(logits.shape()),
        " and targets ", to_string(targets.shape()), ": one target per row");
  const auto readable = detail::readable(targets.to_local());  // none on meta
  if (!readable) return;
  const Tensor<typename Tg::value_type, 1>& t = *readable;
  for (Extent i = 0; i < t.numel(); ++i)
    check(t[i] >= 0 && Extent(t[i]) < logits.extent(1), Op.data, logits.mesh(), "target ", Extent(t[i]),
          " at local row ", i, " is outside [0, ", logits.extent(1), ")");
}
}  // namespace detail

/// The mean cross-entropy as a [1] DTensor of double (Partial<sum> where rows are split).
/// No communication.
template <FloatDTensor L, IndexDTensor Tg>
auto cross_entropy(const L& logits, const Tg& targets) {
  detail::check_ce<"cross_entropy">(logits, targets);
  using LL = rules::cross_entropy_t<typename L::layout, typename Tg::layout>;
  auto f = kernels::cross_entropy(logits.to_local(), targets.to_local(), logits.extent(0));
  using S = typename L::space;
  auto l = detail::make<double, 1, LL>(logits.mesh(), Shape<1>{1}, detail::filled<double, 1, S>(Shape<1>{1}, f.loss));
  return CrossEntropyResult<decltype(l)>{std::move(l), BasicCrossEntropyStats<S>{std::move(f.lse)}};
}

/// d(dloss * loss)/d(logits), in logits' layout. No communication.
template <FloatDTensor L, IndexDTensor Tg>
L cross_entropy_backward(const L& logits, const Tg& targets, const BasicCrossEntropyStats<typename L::space>& stats,
                         double dloss = 1.0) {
  detail::check_ce<"cross_entropy_backward">(logits, targets);
  detail::check(stats.lse.extent(0) == logits.to_local().extent(0), "cross_entropy_backward", logits.mesh(),
                "saved statistics for ", stats.lse.extent(0), " rows, this rank holds ", logits.to_local().extent(0),
                ": pass the statistics of this forward");
  return L(logits.mesh(), logits.shape(),
           kernels::cross_entropy_backward(logits.to_local(), targets.to_local(), stats.lse, dloss,
                                                 logits.extent(0)));
}

}  // namespace dtensor::ops
