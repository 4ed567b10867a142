// dtensor/optim/optimizer.hpp — what the optimizers share: the parameter list and its checks.
//
//   optim::SGD<float, 2>   sgd(params, {.lr = 0.1, .momentum = 0.9});
//   optim::AdamW<float, 2> adam(params, {.lr = 3e-4, .weight_decay = 0.1});
//   adam.step();   adam.zero_grad();   adam.set_lr(1e-4);
//
// Optimizers update the local pieces of the parameters from the local pieces of their gradients,
// element by element: no communication, whatever the layouts. Their state (momentum, moments) is
// flat: one buffer per kind of state with the structure of the parameter list (FlatState), so for
// the parameters of a flat group (nn/flat_params.hpp) it mirrors the group's buffers exactly, and
// FSDP/ZeRO can shard it the same way.
// Parameters, gradients and state live in the memory space of the parameter list (its meshes');
// the updates are the space's kernels (kernels/optim.hpp: adamw_update, sgd_update), one call per
// parameter on views of the flat buffers.
// A gradient must be fully reduced before a step (no Partial placement left: run the gradient
// syncs first); step() throws otherwise, naming the parameter and its gradient's layout.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/kernels/optim.hpp"
#include "dtensor/nn/parameter.hpp"

namespace dtensor::optim {

using nn::ParamList;
using nn::ParamRef;

namespace detail {

/// A parameter whose group fully_shard has taken over (a list collected from the model, not
/// from fully_shard(...).params()): its views may dangle, and a step would update values that
/// the next all-gather overwrites.
template <class T, std::size_t N, class Space>
void check_not_sharded(const char* op, const ParamRef<T, N, Space>& p) {
  if (p.sharded && *p.sharded)
    throw Error(op, dtensor::detail::cat("parameter ", p.name, " belongs to a unit that fully_shard has sharded: ",
                                         "this list was collected from the model, whose views FSDP replaced. Build the "
                                         "optimizer over fully_shard(...).params() (collect after fully_shard, from it)"));
}

template <class T, std::size_t N, class Space>
void check_params(const char* op, const ParamList<T, N, Space>& ps) {
  for (const auto& p : ps) {
    check_not_sharded(op, p);
    if (!p.grad_state || !p.has_grad)
      throw Error(op, dtensor::detail::cat("parameter ", p.name, ": no gradient state (a ParamRef not made by collect)"));
    if (p.value.size() != p.grad_size())
      throw Error(op, dtensor::detail::cat("parameter ", p.name, ": local value has ", p.value.size(),
                                           " elements, gradient ", p.grad_size()));
  }
}

/// Throws unless every gradient is fully reduced.
template <class T, std::size_t N, class Space>
void check_reduced(const char* op, const ParamList<T, N, Space>& ps) {
  for (const auto& p : ps) {
    check_not_sharded(op, p);  // fully_shard may have come after the optimizer was built
    if (!nn::is_reduced(*p.grad_state))
      throw Error(op, dtensor::detail::cat("parameter ", p.name, ": gradient is ", to_string(*p.grad_state),
                                           ", still Partial; reduce it (DataParallel, fully_shard's "
                                           "finish_gradient_sync, sequence-parallel sync) before the optimizer step"));
  }
}

inline void check_hyper(const char* op, const char* name, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi) || std::isnan(v))
    throw Error(op, dtensor::detail::cat(name, " = ", v, " is outside [", lo, ", ", hi, "]"));
}

}  // namespace detail

/// One flat buffer with the structure of a parameter list: parameter k's elements at offset(k),
/// zero at first, in memory space Space (counted by the ledger as optimizer state).
template <class T, MemorySpace Space = host_space>
class FlatState {
 public:
  FlatState() = default;
  template <class List>
  explicit FlatState(const List& ps) {
    std::size_t total = 0;
    for (const auto& p : ps) {
      offsets_.push_back(total);
      total += p.value.size();
    }
    MemoryTagScope tag(MemoryTag::optimizer_state);
    data_ = Tensor<T, 1, Space>(Shape<1>{Extent(total)});
  }
  std::span<T> of(std::size_t k) {
    const std::size_t end = k + 1 < offsets_.size() ? offsets_[k + 1] : std::size_t(data_.numel());
    return all().subspan(offsets_.at(k), end - offsets_[k]);
  }
  std::span<const T> of(std::size_t k) const { return const_cast<FlatState*>(this)->of(k); }
  /// Parameter k's state as a tensor of the space (a view), for the kernels.
  Tensor<T, 1, Space> view(std::size_t k) { return nn::detail::flat_view<Space>(of(k)); }
  std::span<T> all() noexcept { return data_.span(); }

 private:
  Tensor<T, 1, Space> data_;
  std::vector<std::size_t> offsets_;
};

/// The part every optimizer has: the parameters, zero_grad, the learning rate.
template <class T, std::size_t N, MemorySpace Space = host_space>
class Optimizer {
 public:
  using space = Space;
  Optimizer(const char* name, ParamList<T, N, Space> params, double lr) : name_(name), params_(std::move(params)), lr_(lr) {
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
  const ParamList<T, N, Space>& params() const noexcept { return params_; }

 protected:
  /// Parameter k's value and gradient as tensors of the space (views), for the kernels.
  Tensor<T, 1, Space> value_view(std::size_t k) const { return nn::detail::flat_view<Space>(params_[k].value); }
  /// Calls f with parameter k's gradient as a tensor of the space (a view) in the type it is
  /// held in: T, or a narrower one (ParamRef::narrow_grad), which the kernels widen per element.
  template <class F>
  void with_grad_view(std::size_t k, F&& f) const {
    params_[k].visit_grad([&](auto g) { f(nn::detail::flat_view<Space>(std::span<const typename decltype(g)::element_type>(g))); });
  }

  const char* name_;
  ParamList<T, N, Space> params_;
  double lr_;
};

}  // namespace dtensor::optim
