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

template <class T, std::size_t N>
class SGD : public Optimizer<T, N> {
  using Base = Optimizer<T, N>;

 public:
  SGD(ParamList<T, N> params, SGDOptions o = {}) : Base("SGD", std::move(params), o.lr), o_(o) {
    detail::check_hyper("SGD", "momentum", o.momentum, 0, 1);
    detail::check_hyper("SGD", "dampening", o.dampening, 0, 1);
    detail::check_hyper("SGD", "weight_decay", o.weight_decay, 0, 1e6);
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
      throw Error("SGD", "nesterov needs momentum > 0 and dampening 0");
    if (o.momentum > 0) buf_ = FlatState<T>(this->params_);
  }

  void step() {
    detail::check_reduced("SGD::step", this->params_);
    const double lr = this->lr_, mu = o_.momentum;
    for (std::size_t k = 0; k < this->params_.size(); ++k) {
      auto& p = this->params_[k];
      const double wd = p.decay ? o_.weight_decay : 0.0;
      for (std::size_t i = 0; i < p.value.size(); ++i) {
        double g = double(p.grad[i]) + wd * double(p.value[i]);
        if (mu > 0) {
          T& b = buf_.of(k)[i];
          const double nb = steps_ == 0 ? g : mu * double(b) + (1 - o_.dampening) * g;
          b = T(nb);
          g = o_.nesterov ? g + mu * nb : nb;
        }
        p.value[i] = T(double(p.value[i]) - lr * g);
      }
    }
    ++steps_;
  }

 private:
  SGDOptions o_;
  FlatState<T> buf_;  // momentum, flat like the parameter list
  long steps_ = 0;
};

}  // namespace dtensor::optim
