// dtensor/nn/sequential.hpp — a chain of modules: each one's output is the next one's input, and
// each module is one unit (nn/units.hpp), so DDP overlap and FSDP need nothing more.
//
//   using Lin = nn::Linear<float, Mesh, nn::Replicated<>>;
//   nn::Sequential<Lin, nn::LayerNorm<float, Mesh>, Lin> net(Lin("fc1", mesh, 8, 32, 1),
//                                                            nn::LayerNorm<float, Mesh>("ln", mesh, 32),
//                                                            Lin("fc2", mesh, 32, 8, 2));
//   parallel::fully_shard(net, mesh, {.stage = 3});      // or: DataParallel<Mesh> ddp(mesh); ddp.attach(net);
//   auto [y, saved] = net.forward(x);
//   auto dx = net.backward(std::move(saved), dy);         // unit by unit: grads_ready as each finishes
//   // or split: auto [dx, wctx] = net.backward_input(std::move(saved), dy); net.backward_weight(std::move(wctx));
//
// forward runs the modules in order, each between its unit's pre_forward and post_forward hooks;
// backward_input runs them last first, each after its pre_backward hook; backward_weight adds the
// weight gradients last first, announcing each unit (grads_ready); backward does both unit by unit,
// so DDP's all-reduce of the last module's buckets runs while the earlier ones compute. A module
// without parameters on the chain's mesh forms no unit and fires no hook. The saved state and
// the weight context are tuples of the modules'. No collectives but the modules' own.
//
// The parameters' element type and the mesh are the last module's output's (a chain ends in
// floating-point activations on one mesh); every module's Out must be the next one's In, or the
// chain does not compile and says which link breaks.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/nn/units.hpp"

namespace dtensor::nn {

/// What a module in a chain must provide (nn/module.hpp's protocol): In, Out, Saved, WeightCtx,
/// forward, backward_input and backward_weight.
template <class M>
concept ChainModule = requires {
  typename M::In;
  typename M::Out;
  typename M::Saved;
  typename M::WeightCtx;
} && requires(const M& cm, M& m, const typename M::In& x, typename M::Saved s, const typename M::Out& dy,
              typename M::WeightCtx w) {
  cm.forward(x);
  cm.backward_input(std::move(s), dy);
  m.backward_weight(std::move(w));
};

namespace detail {
template <class... M>
using last_t = std::tuple_element_t<sizeof...(M) - 1, std::tuple<M...>>;

/// Checked one requirement at a time, so that the error names the member a module lacks.
template <class M>
constexpr bool require_chain_module() {
  static_assert(requires { typename M::In; typename M::Out; },
                "nn::Sequential: a module needs `In` and `Out` (its input and output DTensor types)");
  static_assert(requires { typename M::Saved; typename M::WeightCtx; },
                "nn::Sequential: a module needs `Saved` and `WeightCtx` (what forward saves, what backward_weight takes)");
  static_assert(ChainModule<M>, "nn::Sequential: a module needs forward(x) -> {y, saved}, backward_input(saved, dy) -> "
                                "{dx, weight_ctx} and backward_weight(weight_ctx) (nn/module.hpp)");
  return ChainModule<M>;
}

template <class... M>
constexpr bool chain_links() {
  using Mods = std::tuple<M...>;
  if constexpr (!(ChainModule<M> && ...)) return true;  // reported by require_chain_module
  else return []<std::size_t... I>(std::index_sequence<I...>) {
    return (std::is_same_v<typename std::tuple_element_t<I, Mods>::Out,
                           typename std::tuple_element_t<I + 1, Mods>::In> && ...);
  }(std::make_index_sequence<sizeof...(M) - 1>{});
}
}  // namespace detail

template <class... M>
class Sequential : public WithUnits<typename detail::last_t<M...>::Out::value_type,
                                    typename detail::last_t<M...>::Out::mesh_type> {
  static_assert(sizeof...(M) > 0, "nn::Sequential needs at least one module");
  static_assert((detail::require_chain_module<M>() && ...));
  static_assert(detail::chain_links<M...>(), "nn::Sequential: a module's Out is not the next module's In");

  using Mods = std::tuple<M...>;
  static constexpr std::size_t n = sizeof...(M);
  using Base = WithUnits<typename detail::last_t<M...>::Out::value_type, typename detail::last_t<M...>::Out::mesh_type>;

 public:
  using In = typename std::tuple_element_t<0, Mods>::In;
  using Out = typename detail::last_t<M...>::Out;
  using Saved = std::tuple<typename M::Saved...>;
  using WeightCtx = std::tuple<typename M::WeightCtx...>;  // children() order

  explicit Sequential(M... modules) : mods_(std::move(modules)...) { unit_of_ = this->make_units(*this); }
  Sequential(Sequential&&) = default;
  Sequential& operator=(Sequential&&) = default;

  Fwd<Out, Saved> forward(const In& x) const {
    Saved s;
    auto y = forward_from<0>(x, s);
    return {std::move(y), std::move(s)};
  }

  /// The input gradient (what the first module's backward_input returns) and the weight context.
  auto backward_input(Saved s, const Out& dy) const {
    WeightCtx w;
    auto dx = backward_input_from<n - 1>(s, dy, w);
    return Bwd<decltype(dx), WeightCtx>{std::move(dx), std::move(w)};
  }

  /// The weight gradients, last module first, each unit announced as it completes.
  void backward_weight(WeightCtx w) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (weight_of<n - 1 - I>(std::get<n - 1 - I>(w)), ...);
    }(std::make_index_sequence<n>{});
  }

  /// The whole backward unit by unit (each module's weight gradients right after its input
  /// gradient); returns the input gradient.
  auto backward(Saved s, const Out& dy) { return backward_from<n - 1>(s, dy); }

  auto children() {
    return std::apply([](auto&... m) { return std::tie(m...); }, mods_);
  }
  template <std::size_t I>
  auto& get() noexcept {
    return std::get<I>(mods_);
  }

 private:
  template <std::size_t I, class X>
  auto forward_from(const X& x, Saved& s) const {
    auto [y, saved] = this->forward_unit(unit_of_[I], [&] { return std::get<I>(mods_).forward(x); });
    std::get<I>(s) = std::move(saved);
    if constexpr (I + 1 == n) return std::move(y);
    else return forward_from<I + 1>(y, s);
  }
  template <std::size_t I, class DY>
  auto backward_input_from(Saved& s, const DY& dy, WeightCtx& w) const {
    auto [dx, wctx] =
        this->backward_unit(unit_of_[I], [&] { return std::get<I>(mods_).backward_input(std::move(std::get<I>(s)), dy); });
    std::get<I>(w) = std::move(wctx);
    if constexpr (I == 0) return std::move(dx);
    else return backward_input_from<I - 1>(s, dx, w);
  }
  template <std::size_t I, class DY>
  auto backward_from(Saved& s, const DY& dy) {
    auto [dx, wctx] =
        this->backward_unit(unit_of_[I], [&] { return std::get<I>(mods_).backward_input(std::move(std::get<I>(s)), dy); });
    weight_of<I>(wctx);
    if constexpr (I == 0) return std::move(dx);
    else return backward_from<I - 1>(s, dx);
  }
  template <std::size_t I, class W>
  void weight_of(W& wctx) {
    std::get<I>(mods_).backward_weight(std::move(wctx));
    this->grads_ready(unit_of_[I]);
  }

  Mods mods_;
  std::vector<std::size_t> unit_of_;  // module -> unit index (WithUnits::no_unit: no parameters)
};

}  // namespace dtensor::nn
