// dtensor/kernels/optim.hpp — AdamW and SGD updates and the sum of squares, for every memory space (kernels/dispatch.hpp).
#pragma once

#include "dtensor/kernels/dispatch.hpp"
#include "dtensor/kernels/generic/optim.hpp"
#include "dtensor/kernels/host/optim.hpp"
#include "dtensor/kernels/meta/optim.hpp"
#if defined(__CUDACC__)
#include "dtensor/kernels/cuda/optim.cuh"
#endif

namespace dtensor::kernels {
using generic::AdamWStep;
using generic::SgdStep;

// The updates take their settings as a braced list ({.lr = ...}), which a forwarding front cannot
// deduce: their fronts name the settings' type.
DTENSOR_KERNEL_SELECT(adamw_update)
template <class P, class G, class M, class V>
  requires std::invocable<select::adamw_update_fn, P&, const G&, M&, V&, const AdamWStep&>
void adamw_update(P& param, const G& grad, M& exp_avg, V& exp_avg_sq, const AdamWStep& s) {
  generic::check_adamw_update(param, grad, exp_avg, exp_avg_sq, s);
  select::adamw_update_fn{}(param, grad, exp_avg, exp_avg_sq, s);
}
DTENSOR_KERNEL_SELECT(sgd_update)
template <class P, class G, class B>
  requires std::invocable<select::sgd_update_fn, P&, const G&, B&, const SgdStep&>
void sgd_update(P& param, const G& grad, B& momentum_buffer, const SgdStep& s) {
  generic::check_sgd_update(param, grad, momentum_buffer, s);
  select::sgd_update_fn{}(param, grad, momentum_buffer, s);
}
DTENSOR_KERNEL(sum_squares)
}  // namespace dtensor::kernels
