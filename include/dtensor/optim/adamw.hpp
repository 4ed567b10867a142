// dtensor/optim/adamw.hpp — Adam with decoupled weight decay (torch.optim.AdamW).
//
//   optim::AdamW<float, 2> adam(params, {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
//   adam.step();
//
// Per element at step t (from 1), as PyTorch: p -= lr * wd * p (decoupled, only where the
// parameter decays); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps). The moments are flat buffers with
// the parameter list's structure (optim/optimizer.hpp FlatState); the update is the space's
// kernels::adamw_update, one call per parameter, reading the gradient in the type it is held
// in (a bf16 gradient shard beside fp32 values is widened per element); on a space that updates
// many parameters at once (kernels::generic::FusedAdamW: the GPU), the parameters whose gradient
// is held in T go to it in one launch, element for element the same. No communication.
#pragma once

#include "dtensor/optim/optimizer.hpp"

namespace dtensor::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

template <class T, std::size_t N, MemorySpace Space = host_space>
class AdamW : public Optimizer<T, N, Space> {
  using Base = Optimizer<T, N, Space>;

 public:
  AdamW(ParamList<T, N, Space> params, AdamWOptions o = {}) : Base("AdamW", std::move(params), o.lr), o_(o) {
    detail::check_hyper("AdamW", "beta1", o.beta1, 0, 1 - 1e-12);
    detail::check_hyper("AdamW", "beta2", o.beta2, 0, 1 - 1e-12);
    detail::check_hyper("AdamW", "eps", o.eps, 0, 1);
    detail::check_hyper("AdamW", "weight_decay", o.weight_decay, 0, 1e6);
    m_ = FlatState<T, Space>(this->params_);
    v_ = FlatState<T, Space>(this->params_);
  }

  void step() {
    detail::check_reduced("AdamW::step", this->params_);
    ++t_;
    if constexpr (kernels::generic::FusedAdamW<Space>::available) return fused_step();
    for (std::size_t k = 0; k < this->params_.size(); ++k) {
      auto value = this->value_view(k), m = m_.view(k), v = v_.view(k);
      this->with_grad_view(k, [&](const auto& grad) { kernels::adamw_update(value, grad, m, v, settings(k)); });
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
  /// This step's settings for parameter k.
  kernels::AdamWStep settings(std::size_t k) const {
    return {.lr = this->lr_,
            .beta1 = o_.beta1,
            .beta2 = o_.beta2,
            .eps = o_.eps,
            .weight_decay = this->params_[k].decay ? o_.weight_decay : 0.0,
            .step = t_};
  }
  /// step() on a space with a multi-tensor update: the parameters whose gradient is held in T in
  /// one launch (each with its weight decay), the others one by one.
  void fused_step() {
    std::vector<kernels::generic::AdamWSegment<T, T>> fused;
    for (std::size_t k = 0; k < this->params_.size(); ++k) {
      auto value = this->value_view(k), m = m_.view(k), v = v_.view(k);
      this->with_grad_view(k, [&](const auto& grad) {
        if constexpr (std::is_same_v<typename std::remove_cvref_t<decltype(grad)>::value_type, T>) {
          kernels::generic::check_adamw_update(value, grad, m, v, settings(k));
          fused.push_back({value.data(), grad.data(), m.data(), v.data(), value.numel(), settings(k).weight_decay});
        } else {
          kernels::adamw_update(value, grad, m, v, settings(k));
        }
      });
    }
    if (!fused.empty())  // the settings but the decay, which each segment carries
      kernels::generic::FusedAdamW<Space>::update(std::span<const kernels::generic::AdamWSegment<T, T>>(fused),
                                                  settings(0));
  }

  AdamWOptions o_;
  FlatState<T, Space> m_, v_;
  long t_ = 0;
};

}  // namespace dtensor::optim
