// dtensor/kernels/generic/optim.hpp — the settings of the optimizer-update kernels and their
// argument checks, for every memory space.
//
//   kernels::adamw_update(param, grad, exp_avg, exp_avg_sq, {.lr = 3e-4, .step = t});
//   kernels::sgd_update(param, grad, momentum_buffer, {.lr = 0.1, .momentum = 0.9});
#pragma once

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  long step = 1;  // t, from 1
};

/// One parameter of a multi-tensor AdamW update (FusedAdamW): its value, gradient and moments
/// (device pointers of one space, n elements each) and its weight decay (0 where it does not decay).
template <class T, class G>
struct AdamWSegment {
  T* param = nullptr;
  const G* grad = nullptr;
  T* exp_avg = nullptr;
  T* exp_avg_sq = nullptr;
  Extent n = 0;
  double weight_decay = 0;
};

/// Whether a memory space updates many parameters of an AdamW step in one launch: false here; a
/// space that can specializes it with `static void update(std::span<const AdamWSegment<T, G>>,
/// const AdamWStep&)`, each element as adamw_update's (kernels/cuda/optim.cuh: the GPU's, which
/// optim::AdamW then uses instead of a launch per parameter).
template <class Space>
struct FusedAdamW {
  static constexpr bool available = false;
};

struct SgdStep {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = true;  // the momentum buffer starts as the gradient
};

template <class P, class G>
void check_update(const char* op, const P& param, const G& other, const char* name) {
  check(other.shape() == param.shape(), op, name, " ", to_string(other.shape()), " does not match the parameter ",
        to_string(param.shape()));
}

inline void check_adamw(const AdamWStep& s) {
  check(s.step >= 1 && s.beta1 >= 0 && s.beta1 < 1 && s.beta2 >= 0 && s.beta2 < 1 && s.eps >= 0, "adamw_update",
        "step ", s.step, " (from 1), beta1 ", s.beta1, ", beta2 ", s.beta2, " (in [0, 1)), eps ", s.eps);
}

template <class P, class G, class M, class V>
void check_adamw_update(const P& param, const G& grad, const M& exp_avg, const V& exp_avg_sq, const AdamWStep& s) {
  check_update("adamw_update", param, grad, "gradient");
  check_update("adamw_update", param, exp_avg, "exp_avg");
  check_update("adamw_update", param, exp_avg_sq, "exp_avg_sq");
  check_adamw(s);
}

template <class P, class G, class B>
void check_sgd_update(const P& param, const G& grad, const B& momentum_buffer, const SgdStep& s) {
  check_update("sgd_update", param, grad, "gradient");
  if (s.momentum > 0) check_update("sgd_update", param, momentum_buffer, "momentum buffer");
}

}  // namespace dtensor::kernels::generic
