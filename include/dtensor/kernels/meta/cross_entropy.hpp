// dtensor/kernels/meta/cross_entropy.hpp — the meta twin of kernels/host/cross_entropy.hpp:
// cross_entropy, its backward and the vocabulary-parallel pieces. FLOPs per logit: max 1,
// sum of exps 2, forward 3 (max, exp and sum), backward 3 (exp, subtract, scale). The loss of a
// meta tensor has no value: cross_entropy returns 0.
#pragma once

#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

struct CrossEntropyForward {
  double loss = 0;          // no value on meta
  MetaTensor<Stat, 1> lse;  // [N]
};

namespace detail {
template <class T>
MetaTensor<Stat, 1> row_stat(const char* op, const MetaTensor<T, 2>& logits, std::int64_t flops_per_logit,
                             std::int64_t extra_read = 0) {
  const Extent n = logits.extent(0);
  cost(op, flops_per_logit * logits.numel(), bytes<T>(logits.numel()) + extra_read, bytes<Stat>(n));
  return result<Stat>(Shape<1>{n});
}
}  // namespace detail

template <FloatElement T>
MetaTensor<Stat, 1> vocab_parallel_ce_max(const MetaTensor<T, 2>& logits) {
  return detail::row_stat("vocab_parallel_ce_max", logits, 1);
}
template <FloatElement T>
MetaTensor<Stat, 1> vocab_parallel_ce_sum_exp(const MetaTensor<T, 2>& logits, const MetaTensor<Stat, 1>& global_max) {
  return detail::row_stat("vocab_parallel_ce_sum_exp", logits, 2, detail::bytes<Stat>(global_max.numel()));
}
template <FloatElement T, IndexElement Id>
MetaTensor<Stat, 1> vocab_parallel_ce_target_logit(const MetaTensor<T, 2>& logits, const MetaTensor<Id, 1>& /*targets*/,
                                                   Extent) {
  const Extent n = logits.extent(0);
  detail::cost("vocab_parallel_ce_target_logit", 0, detail::bytes<Id>(n) + detail::bytes<T>(n), detail::bytes<Stat>(n));
  return detail::result<Stat>(Shape<1>{n});
}
inline double vocab_parallel_ce_loss(const MetaTensor<Stat, 1>& global_max, const MetaTensor<Stat, 1>& /*global_sum*/,
                                     const MetaTensor<Stat, 1>& /*target_logit*/, Extent = -1) {
  const Extent n = global_max.extent(0);
  detail::cost("vocab_parallel_ce_loss", 3 * n, 3 * detail::bytes<Stat>(n), 0);
  return 0.0;
}
template <FloatElement T, IndexElement Id>
MetaTensor<T, 2> vocab_parallel_ce_backward(const MetaTensor<T, 2>& logits, const MetaTensor<Id, 1>& targets, Extent,
                                            const MetaTensor<Stat, 1>& /*global_max*/,
                                            const MetaTensor<Stat, 1>& /*global_sum*/, double = 1.0, Extent = -1) {
  detail::cost("vocab_parallel_ce_backward", 3 * logits.numel(),
               detail::bytes<T>(logits.numel()) + detail::bytes<Id>(targets.numel()) + 2 * detail::bytes<Stat>(logits.extent(0)),
               detail::bytes<T>(logits.numel()));
  return detail::result<T>(logits.shape());
}
template <FloatElement T, IndexElement Id>
CrossEntropyForward cross_entropy(const MetaTensor<T, 2>& logits, const MetaTensor<Id, 1>& /*targets*/, Extent = -1) {
  const Extent n = logits.extent(0);
  detail::cost("cross_entropy", 3 * logits.numel(), detail::bytes<T>(logits.numel() + n) + detail::bytes<Id>(n),
               detail::bytes<Stat>(n));
  return {0.0, detail::result<Stat>(Shape<1>{n})};
}
template <FloatElement T, IndexElement Id>
MetaTensor<T, 2> cross_entropy_backward(const MetaTensor<T, 2>& logits, const MetaTensor<Id, 1>& targets,
                                        const MetaTensor<Stat, 1>& lse, double = 1.0, Extent = -1) {
  detail::cost("cross_entropy_backward", 3 * logits.numel(),
               detail::bytes<T>(logits.numel()) + detail::bytes<Id>(targets.numel()) + detail::bytes<Stat>(lse.numel()),
               detail::bytes<T>(logits.numel()));
  return detail::result<T>(logits.shape());
}

}  // namespace dtensor::kernels::meta
