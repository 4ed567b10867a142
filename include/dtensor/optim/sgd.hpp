// dtensor/optim/sgd.hpp — stochastic gradient descent with momentum (PyTorch's torch.optim.SGD).
//
//   optim::SGD<float, 2> sgd(params, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
//   sgd.step();
//
// Per element, as PyTorch: g += wd * p (L2, coupled; only where the parameter decays);
// b = momentum * b + (1 - dampening) * g (b = g on the first step); g = nesterov ? g + momentum * b
// : b; p -= lr * g. Local pieces only: no communication.
#pragma once

#include "dtensor/optim/optimizer.hpp"

namespace dtensor::optim {

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

template <class T, std::size_t N, MemorySpace Space = host_space>
class SGD : public Optimizer<T, N, Space> {
  using Base = Optimizer<T, N, Space>;

 public:
  SGD(ParamList<T, N, Space> params, SGDOptions o = {}) : Base("SGD", std::move(params), o.lr), o_(o) {
    detail::check_hyper("SGD", "momentum", o.momentum, 0, 1);
    detail::check_hyper("SGD", "dampening", o.dampening, 0, 1);
    detail::check_hyper("SGD", "weight_decay", o.weight_decay, 0, 1e6);
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
      throw Error("SGD", "nesterov needs momentum > 0 and dampening 0");
    if (o.momentum > 0) buf_ = FlatState<T, Space>(this->params_);
  }

  void step() {
    detail::check_reduced("SGD::step", this->params_);
    for (std::size_t k = 0; k < this->params_.size(); ++k) {
      auto value = this->value_view(k);
      auto momentum = o_.momentum > 0 ? buf_.view(k) : Tensor<T, 1, Space>();
      this->with_grad_view(k, [&](const auto& grad) {
        kernels::sgd_update(value, grad, momentum,
                            {.lr = this->lr_, .momentum = o_.momentum, .dampening = o_.dampening,
                             .weight_decay = this->params_[k].decay ? o_.weight_decay : 0.0,
                             .nesterov = o_.nesterov, .first_step = steps_ == 0});
      });
    }
    ++steps_;
  }

  /// The momentum buffers, flat like the parameter list (empty without momentum): a checkpoint's
  /// optimizer state, with steps() (the first step sets b = g instead of decaying it).
  FlatState<T, Space>& momentum_buffer() noexcept { return buf_; }
  long steps() const noexcept { return steps_; }
  void set_steps(long s) {
    if (s < 0) throw Error("SGD", dtensor::detail::cat("step count ", s, " < 0"));
    steps_ = s;
  }

 private:
  SGDOptions o_;
  FlatState<T, Space> buf_;  // momentum, flat like the parameter list
  long steps_ = 0;
};

}  // namespace dtensor::optim
