// dtensor/optim/optimizer.hpp — what the optimizers share: the parameter list and its checks.
//
//   optim::SGD<float, 2>   sgd(params, {.lr = 0.1, .momentum = 0.9});
//   optim::AdamW<float, 2> adam(params, {.lr = 3e-4, .weight_decay = 0.1});
//   adam.step();   adam.zero_grad();   adam.set_lr(1e-4);
//
// Optimizers update the local pieces of the parameters from the local pieces of their gradients,
// element by element: no communication, whatever the layouts. Their state (momentum, moments)
// has the parameter's layout: one local piece per parameter, of the parameter's local extents.
// A gradient must be fully reduced before a step (no Partial placement left: run the gradient
// syncs first); step() throws otherwise, naming the parameter and its gradient's layout.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/nn/parameter.hpp"

namespace dtensor::optim {

using nn::ParamList;
using nn::ParamRef;

namespace detail {

template <class T, std::size_t N>
void check_params(const char* op, const ParamList<T, N>& ps) {
  for (const auto& p : ps) {
    if (p.value.size() != p.grad.size() || !p.grad_state || !p.has_grad)
      throw Error(op, dtensor::detail::cat("parameter ", p.name, ": local value has ", p.value.size(),
                                           " elements, gradient ", p.grad.size()));
  }
}

/// Throws unless every gradient is fully reduced.
template <class T, std::size_t N>
void check_reduced(const char* op, const ParamList<T, N>& ps) {
  for (const auto& p : ps)
    if (!nn::is_reduced(*p.grad_state))
      throw Error(op, dtensor::detail::cat("parameter ", p.name, ": gradient is ", to_string(*p.grad_state),
                                           ", still Partial; reduce it (DataParallel / sequence-parallel sync) "
                                           "before the optimizer step"));
}

inline void check_hyper(const char* op, const char* name, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi) || std::isnan(v))
    throw Error(op, dtensor::detail::cat(name, " = ", v, " is outside [", lo, ", ", hi, "]"));
}

}  // namespace detail

/// The part every optimizer has: the parameters, zero_grad, the learning rate.
template <class T, std::size_t N>
class Optimizer {
 public:
  Optimizer(const char* name, ParamList<T, N> params, double lr) : name_(name), params_(std::move(params)), lr_(lr) {
    detail::check_params(name_, params_);
    detail::check_hyper(name_, "lr", lr, 0, 1e6);
  }

  /// Zeroes every gradient and marks nothing pending.
  void zero_grad() {
    for (auto& p : params_) p.zero_grad();
  }
  double lr() const noexcept { return lr_; }
  void set_lr(double lr) {
    detail::check_hyper(name_, "lr", lr, 0, 1e6);
    lr_ = lr;
  }
  const ParamList<T, N>& params() const noexcept { return params_; }

 protected:
  const char* name_;
  ParamList<T, N> params_;
  double lr_;
};

}  // namespace dtensor::optim
