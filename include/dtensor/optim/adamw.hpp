// dtensor/optim/adamw.hpp — Adam with decoupled weight decay (torch.optim.AdamW).
//
//   optim::AdamW<float, 2> adam(params, {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
//   adam.step();
//
// Per element at step t (from 1), as PyTorch: p -= lr * wd * p (decoupled, only where the
// parameter decays); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps). The moments are flat buffers with
// the parameter list's structure (optim/optimizer.hpp FlatState); arithmetic in double, stored in
// T. No communication.
#pragma once

#include <cmath>

#include "dtensor/optim/optimizer.hpp"

namespace dtensor::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

template <class T, std::size_t N>
class AdamW : public Optimizer<T, N> {
  using Base = Optimizer<T, N>;

 public:
  AdamW(ParamList<T, N> params, AdamWOptions o = {}) : Base("AdamW", std::move(params), o.lr), o_(o) {
    detail::check_hyper("AdamW", "beta1", o.beta1, 0, 1 - 1e-12);
    detail::check_hyper("AdamW", "beta2", o.beta2, 0, 1 - 1e-12);
    detail::check_hyper("AdamW", "eps", o.eps, 0, 1);
    detail::check_hyper("AdamW", "weight_decay", o.weight_decay, 0, 1e6);
    m_ = FlatState<T>(this->params_);
    v_ = FlatState<T>(this->params_);
  }

  void step() {
    detail::check_reduced("AdamW::step", this->params_);
    ++t_;
    const double lr = this->lr_, b1 = o_.beta1, b2 = o_.beta2;
    const double c1 = 1 - std::pow(b1, double(t_)), c2 = 1 - std::pow(b2, double(t_));
    for (std::size_t k = 0; k < this->params_.size(); ++k) {
      auto& p = this->params_[k];
      auto mk = m_.of(k), vk = v_.of(k);
      const double decay = 1 - lr * (p.decay ? o_.weight_decay : 0.0);
      for (std::size_t i = 0; i < p.value.size(); ++i) {
        const double g = double(p.grad[i]);
        const double m = b1 * double(mk[i]) + (1 - b1) * g;
        const double v = b2 * double(vk[i]) + (1 - b2) * g * g;
        mk[i] = T(m);
        vk[i] = T(v);
        const double x = double(p.value[i]) * decay;
        p.value[i] = T(x - lr * (m / c1) / (std::sqrt(v / c2) + o_.eps));
      }
    }
  }

  long steps() const noexcept { return t_; }
  /// The first and second moments of parameter k (local pieces).
  std::span<const T> exp_avg(std::size_t k) const { return m_.of(k); }
  std::span<const T> exp_avg_sq(std::size_t k) const { return v_.of(k); }
  /// The same, writable, and the step count: what a checkpoint restores (checkpoint/training_state.hpp).
  std::span<T> exp_avg(std::size_t k) { return m_.of(k); }
  std::span<T> exp_avg_sq(std::size_t k) { return v_.of(k); }
  void set_steps(long t) {
    if (t < 0) throw Error("AdamW::set_steps", dtensor::detail::cat("step count ", t, " is negative"));
    t_ = t;
  }

 private:
  AdamWOptions o_;
  FlatState<T> m_, v_;
  long t_ = 0;
};

}  // namespace dtensor::optim
