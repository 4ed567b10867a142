// dtensor/kernels/meta/optim.hpp — the meta twin of kernels/host/optim.hpp: adamw_update,
// sgd_update, sum_squares. FLOPs per element: AdamW 12 (moments 6, bias corrections and update
// 6), SGD 2 (+2 with weight decay, +3 with momentum), sum of squares 2.
#pragma once

#include "dtensor/kernels/host/optim.hpp"  // AdamWStep, SgdStep
#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

using host::AdamWStep;
using host::SgdStep;

inline constexpr std::int64_t adamw_flops_per_element = 12;

template <FloatElement T, FloatElement G, std::size_t R>
void adamw_update(MetaTensor<T, R>& param, const MetaTensor<G, R>& /*grad*/, MetaTensor<T, R>& /*exp_avg*/,
                  MetaTensor<T, R>& /*exp_avg_sq*/, const AdamWStep& /*s*/) {
  const Extent n = param.numel();
  detail::cost("adamw_update", adamw_flops_per_element * n, 3 * detail::bytes<T>(n) + detail::bytes<G>(n),
               3 * detail::bytes<T>(n));
}

template <FloatElement T, FloatElement G, std::size_t R>
void sgd_update(MetaTensor<T, R>& param, const MetaTensor<G, R>& /*grad*/, MetaTensor<T, R>& /*momentum_buffer*/,
                const SgdStep& s) {
  const Extent n = param.numel();
  const bool mom = s.momentum > 0;
  detail::cost("sgd_update", (2 + (s.weight_decay != 0 ? 2 : 0) + (mom ? 3 : 0)) * n,
               (mom ? 2 : 1) * detail::bytes<T>(n) + detail::bytes<G>(n), (mom ? 2 : 1) * detail::bytes<T>(n));
}

template <FloatElement T, std::size_t R>
double sum_squares(const MetaTensor<T, R>& x) {
  detail::cost("sum_squares", 2 * x.numel(), detail::bytes<T>(x.numel()), 0);
  return 0.0;
}

}  // namespace dtensor::kernels::meta
