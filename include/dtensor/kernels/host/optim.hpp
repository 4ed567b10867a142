// dtensor/kernels/host/optim.hpp — the per-element optimizer updates and the squared norm that
// gradient clipping needs, on one tensor (a parameter's local piece or a flat buffer).
//
//   adamw_update(param, grad, exp_avg, exp_avg_sq, {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95,
//                                                   .eps = 1e-8, .weight_decay = 0.1, .step = t});
//   sgd_update(param, grad, momentum_buffer, {.lr = 0.1, .momentum = 0.9, .first_step = t == 0});
//   double sq = sum_squares(grad);            // sum of g^2 in double (all-reduce it, then sqrt)
//
// The math of torch.optim.AdamW / SGD in double, stored in T (as optim/adamw.hpp, optim/sgd.hpp):
// AdamW at step t >= 1: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps). SGD: g += wd p; with momentum,
// b = g on the first step else mu b + (1 - dampening) g, and g = nesterov ? g + mu b : b; p -= lr g.
#pragma once

#include <cmath>

#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels::host {

struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  long step = 1;  // t, from 1
};

struct SgdStep {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = true;  // the momentum buffer starts as the gradient
};

namespace detail {
template <class P, class G>
void check_update(const char* op, const P& param, const G& other, const char* name) {
  check(other.shape() == param.shape(), op, name, " ", to_string(other.shape()), " does not match the parameter ",
        to_string(param.shape()));
}
inline void check_adamw(const AdamWStep& s) {
  check(s.step >= 1 && s.beta1 >= 0 && s.beta1 < 1 && s.beta2 >= 0 && s.beta2 < 1 && s.eps >= 0, "adamw_update",
        "step ", s.step, " (from 1), beta1 ", s.beta1, ", beta2 ", s.beta2, " (in [0, 1)), eps ", s.eps);
}
}  // namespace detail

template <FloatElement T, std::size_t R>
void adamw_update(HostTensor<T, R>& param, const HostTensor<T, R>& grad, HostTensor<T, R>& exp_avg,
                  HostTensor<T, R>& exp_avg_sq, const AdamWStep& s) {
  detail::check_update("adamw_update", param, grad, "gradient");
  detail::check_update("adamw_update", param, exp_avg, "exp_avg");
  detail::check_update("adamw_update", param, exp_avg_sq, "exp_avg_sq");
  detail::check_adamw(s);
  const double c1 = 1 - std::pow(s.beta1, double(s.step)), c2 = 1 - std::pow(s.beta2, double(s.step));
  const double decay = 1 - s.lr * s.weight_decay;
  T *p = param.data(), *m = exp_avg.data(), *v = exp_avg_sq.data();
  const T* g = grad.data();
  for (Extent i = 0, n = param.numel(); i < n; ++i) {
    const double gi = double(g[i]);
    const double mi = s.beta1 * double(m[i]) + (1 - s.beta1) * gi;
    const double vi = s.beta2 * double(v[i]) + (1 - s.beta2) * gi * gi;
    m[i] = T(mi);
    v[i] = T(vi);
    p[i] = T(double(p[i]) * decay - s.lr * (mi / c1) / (std::sqrt(vi / c2) + s.eps));
  }
}

/// momentum_buffer is read and written only when s.momentum > 0 (it may be empty otherwise).
template <FloatElement T, std::size_t R>
void sgd_update(HostTensor<T, R>& param, const HostTensor<T, R>& grad, HostTensor<T, R>& momentum_buffer,
                const SgdStep& s) {
  detail::check_update("sgd_update", param, grad, "gradient");
  if (s.momentum > 0) detail::check_update("sgd_update", param, momentum_buffer, "momentum buffer");
  T* p = param.data();
  T* b = momentum_buffer.data();
  const T* g = grad.data();
  for (Extent i = 0, n = param.numel(); i < n; ++i) {
    double gi = double(g[i]) + s.weight_decay * double(p[i]);
    if (s.momentum > 0) {
      const double nb = s.first_step ? gi : s.momentum * double(b[i]) + (1 - s.dampening) * gi;
      b[i] = T(nb);
      gi = s.nesterov ? gi + s.momentum * nb : nb;
    }
    p[i] = T(double(p[i]) - s.lr * gi);
  }
}

/// Sum of x^2 in double, in index order.
template <FloatElement T, std::size_t R>
double sum_squares(const HostTensor<T, R>& x) {
  double sq = 0;
  for (Extent i = 0, n = x.numel(); i < n; ++i) sq += double(x[i]) * double(x[i]);
  return sq;
}

}  // namespace dtensor::kernels::host
