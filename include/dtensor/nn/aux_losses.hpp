// dtensor/nn/aux_losses.hpp — auxiliary losses (an MoE's load balancing and z-loss, any
// regulariser a module computes in its forward) collected by the library, not by the model.
//
//   struct MyLayer {                                           // a module with an auxiliary loss
//     static constexpr bool auxiliary_losses = true;           // say so (the pipeline sums them over stages)
//     Fwd<Y, Saved> forward(const X& x) const {
//       ...  nn::add_auxiliary_loss(coef * balance);            // this rank's share, weighted
//     }
//     Bwd<X, W> backward_input(Saved s, const Y& dy) const {
//       ...  its gradient, times nn::auxiliary_loss_scale()    // the loss's dloss
//     }
//   };
//
// nn::Stack (a whole model, or a pipeline stage) collects what its parts add during one forward
// (nn::CollectAuxLosses): a stack holding the loss adds the sum to this rank's share of the loss,
// so the loss reported is the loss trained; a pipeline stage before the last keeps it per
// micro-batch and the executor adds it to the step's loss. In backward the stack sets the scale
// (nn::AuxLossScale: the dloss its loss is differentiated with, e.g. 1 / micro-batches), so the
// auxiliary gradients are weighted like the loss's. Nothing is collected outside a stack (a
// module run on its own adds to no loss) and nothing during a backward (an activation-checkpointed
// block's recomputed forward does not count twice). The state is per thread: one rank's
// forward on the threads backend never sees another's.
//
// nn::has_auxiliary_losses<M> is true when M or any module below it (children()) declares
// `static constexpr bool auxiliary_losses = true` — what decides, at compile time, whether a
// pipeline sums auxiliary losses over its stages (one all-reduce per step), so models without
// any issue no extra collective.
#pragma once

#include <cstddef>
#include <optional>
#include <ranges>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/nn/module.hpp"

namespace dtensor::nn {

namespace detail {
struct AuxLossState {
  double* sink = nullptr;  // the enclosing forward's sum, if any
  double scale = 1;        // the enclosing backward's weight
};
inline AuxLossState& aux_loss_state() noexcept {
  thread_local AuxLossState state;
  return state;
}
}  // namespace detail

/// During a forward inside an nn::Stack: adds `weighted` (coefficient x auxiliary loss, this
/// rank's share) to the loss. Outside one (or during a backward's recomputation): nothing.
inline void add_auxiliary_loss(double weighted) noexcept {
  if (double* sink = detail::aux_loss_state().sink) *sink += weighted;
}

/// During a backward: the weight of the auxiliary losses' gradients (the loss's dloss; 1 outside).
inline double auxiliary_loss_scale() noexcept { return detail::aux_loss_state().scale; }

/// Collects the auxiliary losses added while it lives (one forward); restores the enclosing one.
class CollectAuxLosses {
 public:
  CollectAuxLosses() noexcept : previous_(detail::aux_loss_state().sink) { detail::aux_loss_state().sink = &sum_; }
  ~CollectAuxLosses() { detail::aux_loss_state().sink = previous_; }
  CollectAuxLosses(const CollectAuxLosses&) = delete;
  CollectAuxLosses& operator=(const CollectAuxLosses&) = delete;
  double total() const noexcept { return sum_; }

 private:
  double sum_ = 0;
  double* previous_;
};

/// Sets the auxiliary gradients' weight for a backward (and collects nothing meanwhile).
class AuxLossScale {
 public:
  explicit AuxLossScale(double scale) noexcept : previous_(detail::aux_loss_state()) {
    detail::aux_loss_state() = {nullptr, scale};
  }
  ~AuxLossScale() { detail::aux_loss_state() = previous_; }
  AuxLossScale(const AuxLossScale&) = delete;
  AuxLossScale& operator=(const AuxLossScale&) = delete;

 private:
  detail::AuxLossState previous_;
};

namespace detail {
template <class C>
constexpr bool child_has_auxiliary_losses();

template <class M>
constexpr bool module_has_auxiliary_losses() {
  if constexpr (requires { M::auxiliary_losses; })
    if constexpr (M::auxiliary_losses) return true;
  if constexpr (CompositeModule<M>) {
    using Kids = decltype(std::declval<M&>().children());
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (child_has_auxiliary_losses<std::remove_cvref_t<std::tuple_element_t<I, Kids>>>() || ...);
    }(std::make_index_sequence<std::tuple_size_v<Kids>>{});
  }
  return false;
}

template <class C>
constexpr bool child_has_auxiliary_losses() {
  if constexpr (LeafModule<C> || CompositeModule<C>) return module_has_auxiliary_losses<C>();
  else if constexpr (is_optional<C>::value) return child_has_auxiliary_losses<typename C::value_type>();
  else if constexpr (std::ranges::range<C>) return child_has_auxiliary_losses<std::remove_cvref_t<std::ranges::range_value_t<C>>>();
  else return false;
}
}  // namespace detail

/// Whether module M (or a module below it) adds auxiliary losses (see the top of this file).
template <class M>
inline constexpr bool has_auxiliary_losses = detail::module_has_auxiliary_losses<M>();

}  // namespace dtensor::nn
