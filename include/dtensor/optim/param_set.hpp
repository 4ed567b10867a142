// dtensor/optim/param_set.hpp — one optimizer and one gradient clip over every parameter of a
// model, whatever mesh each lives on (nn::ParamSet: dense parameters and MoE experts alike).
//
//   auto all = nn::param_set(nn::on(mesh, dense), nn::on(emesh, experts));
//   auto opt = optim::make_adamw(all, {.lr = 3e-4});    // optim::Joint<AdamW<T, 2>, AdamW<T, 3>>
//   double norm = optim::clip_grad_norm(all, 1.0);      // one norm: one all-reduce per list's mesh
//   opt.step();  opt.zero_grad();  opt.set_lr(1e-4);
//
// The optimizers update local pieces element by element (optimizer.hpp), so one optimizer over
// several lists is one of the same kind per list, stepped together with one learning rate and
// one step count: what a checkpoint saves of it is each part's state (part<I>()). The norm of
// the gradients of every list is the square root of the sum of the lists' squared norms, each
// over its own mesh (grad_norm: one all-reduce of one double per list), and every list is scaled
// by the same factor, as PyTorch's clip_grad_norm_ over one parameter list would.
#pragma once

#include <cmath>
#include <cstddef>
#include <tuple>
#include <utility>

#include "dtensor/nn/param_set.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/check_finite.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/optim/sgd.hpp"

namespace dtensor::optim {

/// Optimizers of one kind over the lists of a ParamSet, as one.
template <class... Opt>
class Joint {
 public:
  explicit Joint(Opt... parts) : parts_(std::move(parts)...) {}

  void step() {
    std::apply([](auto&... o) { (o.step(), ...); }, parts_);
  }
  void zero_grad() {
    std::apply([](auto&... o) { (o.zero_grad(), ...); }, parts_);
  }
  double lr() const { return std::get<0>(parts_).lr(); }
  void set_lr(double lr) {
    std::apply([&](auto&... o) { (o.set_lr(lr), ...); }, parts_);
  }
  long steps() const
    requires requires(const Opt&... o) { (o.steps(), ...); }
  {
    return std::get<0>(parts_).steps();
  }
  void set_steps(long t)
    requires requires(Opt&... o) { (o.set_steps(t), ...); }
  {
    std::apply([&](auto&... o) { (o.set_steps(t), ...); }, parts_);
  }
  static constexpr std::size_t parts = sizeof...(Opt);
  /// The optimizer of the set's list I (a checkpoint reads and restores its state).
  template <std::size_t I>
  auto& part() noexcept {
    return std::get<I>(parts_);
  }

 private:
  std::tuple<Opt...> parts_;
};

namespace detail {
template <class List>
struct list_traits;
template <class T, std::size_t N, class Space>
struct list_traits<nn::ParamList<T, N, Space>> {
  using adamw = AdamW<T, N, Space>;
  using sgd = SGD<T, N, Space>;
};
}  // namespace detail

/// One AdamW over every list of the set (each list's own moments; one learning rate and step count).
template <class... Parts>
auto make_adamw(nn::ParamSet<Parts...>& set, AdamWOptions o = {}) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return Joint<typename detail::list_traits<typename Parts::list_type>::adamw...>(
        typename detail::list_traits<typename Parts::list_type>::adamw(set.template list<I>(), o)...);
  }(std::index_sequence_for<Parts...>{});
}

/// One SGD over every list of the set.
template <class... Parts>
auto make_sgd(nn::ParamSet<Parts...>& set, SGDOptions o = {}) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return Joint<typename detail::list_traits<typename Parts::list_type>::sgd...>(
        typename detail::list_traits<typename Parts::list_type>::sgd(set.template list<I>(), o)...);
  }(std::index_sequence_for<Parts...>{});
}

/// The sum of the squared gradient norms of every list, each over its own mesh.
template <class... Parts>
double grad_squares(const nn::ParamSet<Parts...>& set) {
  double sq = 0;
  set.for_each([&](const auto& list, const auto& mesh) {
    const double n = grad_norm(list, mesh);
    sq += n * n;
  });
  return sq;
}

/// Scales every gradient of the set so that their norm `norm` becomes at most max_norm.
template <class... Parts>
void scale_grads_to(nn::ParamSet<Parts...>& set, double norm, double max_norm) {
  set.for_each([&](const auto& list, const auto&) { optim::scale_grads_to(list, norm, max_norm); });
}

/// Clips every gradient of the set by their one global norm; returns the norm before.
template <class... Parts>
double clip_grad_norm(nn::ParamSet<Parts...>& set, double max_norm) {
  detail::check_max_norm(max_norm, set.template mesh<0>().rank());
  const double norm = std::sqrt(grad_squares(set));
  scale_grads_to(set, norm, max_norm);
  return norm;
}

/// Throws unless every parameter (or, with grads, every gradient) of the set is finite
/// (check_finite.hpp, list by list).
template <class... Parts>
void check_finite(const nn::ParamSet<Parts...>& set, long long step, const char* what, int rank = Error::no_rank,
                  bool grads = false) {
  set.for_each([&](const auto& list, const auto&) { optim::check_finite(list, step, what, rank, grads); });
}

}  // namespace dtensor::optim
