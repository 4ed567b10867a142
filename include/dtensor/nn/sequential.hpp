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
//   nn::Sequential<Embed, nn::Repeated<Block>, Head> model(embed, nn::Repeated<Block>(std::move(blocks)), head);
//   // a run-time number of blocks: each element of an nn::Repeated is a unit of its own
//
// forward runs the modules in order, each between its unit's pre_forward and post_forward hooks;
// backward_input runs them last first, each after its pre_backward hook; backward_weight adds the
// weight gradients last first, announcing each unit (grads_ready); backward does both unit by unit,
// so DDP's all-reduce of the last module's buckets runs while the earlier ones compute. A module
// without parameters on the chain's mesh forms no unit and fires no hook. The saved state and
// the weight context are tuples of the modules'. No collectives but the modules' own.
//
// nn::Repeated<M> is a run-time chain of modules of one type (a model's blocks): a module on its
// own, and inside a Sequential a range whose every element is one unit with its own hooks, as
// the blocks of models::GPT are.
//
// The parameters' element type and the mesh are the last module's output's (a chain ends in
// floating-point activations on one mesh); every module's Out must be the next one's In, or the
// chain does not compile and says which link breaks.
#pragma once

#include <array>
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

/// A run-time chain of modules of one type whose output is its input (a model's blocks): each
/// element's output feeds the next. A range of its modules (so that a parent's units() gives one
/// unit per element, nn/units.hpp); Saved and WeightCtx hold one entry per element.
template <ChainModule M>
class Repeated {
  static_assert(std::is_same_v<typename M::In, typename M::Out>, "nn::Repeated: a repeated module's Out must be its In");

 public:
  using Module = M;
  using In = typename M::In;
  using Out = typename M::Out;
  using Saved = std::vector<typename M::Saved>;
  using WeightCtx = std::vector<typename M::WeightCtx>;

  Repeated() = default;
  explicit Repeated(std::vector<M> modules) : mods_(std::move(modules)) {}

  Fwd<Out, Saved> forward(const In& x) const {
    Saved s;
    Out y = x;
    for (const auto& m : mods_) {
      auto [next, saved] = m.forward(y);
      y = std::move(next);
      s.push_back(std::move(saved));
    }
    return {std::move(y), std::move(s)};
  }
  Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    WeightCtx w(mods_.size());
    In dx = dy;
    for (std::size_t k = mods_.size(); k-- > 0;) {
      auto [d, wk] = mods_[k].backward_input(std::move(s[k]), dx);
      dx = std::move(d);
      w[k] = std::move(wk);
    }
    return {std::move(dx), std::move(w)};
  }
  void backward_weight(WeightCtx w) {
    for (std::size_t k = mods_.size(); k-- > 0;) mods_[k].backward_weight(std::move(w[k]));
  }

  std::size_t size() const noexcept { return mods_.size(); }
  M& operator[](std::size_t k) noexcept { return mods_[k]; }
  const M& operator[](std::size_t k) const noexcept { return mods_[k]; }
  auto begin() noexcept { return mods_.begin(); }
  auto end() noexcept { return mods_.end(); }
  auto begin() const noexcept { return mods_.begin(); }
  auto end() const noexcept { return mods_.end(); }

 private:
  std::vector<M> mods_;
};

namespace detail {
template <class M>
struct is_repeated : std::false_type {};
template <class M>
struct is_repeated<Repeated<M>> : std::true_type {};

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

  explicit Sequential(M... modules) : mods_(std::move(modules)...) {
    unit_of_ = this->make_units(*this);  // one entry per part: a module, or each element of an nn::Repeated
    std::size_t part = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((first_part_[I] = part, part += parts_of(std::get<I>(mods_))), ...);
    }(std::make_index_sequence<n>{});
  }
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
  auto backward(Saved s, const Out& dy) {
    WeightCtx w;
    return backward_from<n - 1>(s, dy, w);
  }

  auto children() {
    return std::apply([](auto&... m) { return std::tie(m...); }, mods_);
  }
  template <std::size_t I>
  auto& get() noexcept {
    return std::get<I>(mods_);
  }

 private:
  template <class Mod>
  static std::size_t parts_of(const Mod& m) {
    if constexpr (detail::is_repeated<Mod>::value) return m.size();
    else return 1;
  }
  /// The unit of part k of module I (k > 0 only inside an nn::Repeated).
  template <std::size_t I>
  std::size_t unit(std::size_t k = 0) const { return unit_of_[first_part_[I] + k]; }

  template <std::size_t I, class X>
  auto forward_from(const X& x, Saved& s) const {
    using Mod = std::tuple_element_t<I, Mods>;
    auto y = [&] {
      const auto& m = std::get<I>(mods_);
      if constexpr (detail::is_repeated<Mod>::value) {  // each element between its own unit's hooks
        auto& saved = std::get<I>(s);
        typename Mod::Out h = x;
        for (std::size_t k = 0; k < m.size(); ++k) {
          auto [next, sk] = this->forward_unit(unit<I>(k), [&] { return m[k].forward(h); });
          h = std::move(next);
          saved.push_back(std::move(sk));
        }
        return h;
      } else {
        auto [out, saved] = this->forward_unit(unit<I>(), [&] { return m.forward(x); });
        std::get<I>(s) = std::move(saved);
        return std::move(out);
      }
    }();
    if constexpr (I + 1 == n) return y;
    else return forward_from<I + 1>(y, s);
  }
  /// Module I's input gradient; with Weights its weight gradients right after each unit's input
  /// gradients (each unit announced), else its weight context kept in w. Self: a const
  /// Sequential for the input gradients alone, a mutable one with the weights.
  template <bool Weights, std::size_t I, class Self, class DY>
  static auto backward_of(Self& self, Saved& s, const DY& dy, WeightCtx& w) {
    using Mod = std::tuple_element_t<I, Mods>;
    auto& m = std::get<I>(self.mods_);
    if constexpr (detail::is_repeated<Mod>::value) {
      auto& saved = std::get<I>(s);
      auto& wctx = std::get<I>(w);
      wctx.resize(m.size());
      typename Mod::In d = dy;
      for (std::size_t k = m.size(); k-- > 0;) {
        auto [dk, wk] = self.backward_unit(self.template unit<I>(k), [&] { return m[k].backward_input(std::move(saved[k]), d); });
        d = std::move(dk);
        wctx[k] = std::move(wk);
        if constexpr (Weights) {
          m[k].backward_weight(std::move(wctx[k]));
          self.grads_ready(self.template unit<I>(k));
        }
      }
      return d;
    } else {
      auto [dx, wctx] =
          self.backward_unit(self.template unit<I>(), [&] { return m.backward_input(std::move(std::get<I>(s)), dy); });
      std::get<I>(w) = std::move(wctx);
      if constexpr (Weights) self.template weight_of<I>(std::get<I>(w));
      return std::move(dx);
    }
  }
  template <std::size_t I, class DY>
  auto backward_input_from(Saved& s, const DY& dy, WeightCtx& w) const {
    auto dx = backward_of<false, I>(*this, s, dy, w);
    if constexpr (I == 0) return dx;
    else return backward_input_from<I - 1>(s, dx, w);
  }
  template <std::size_t I, class DY>
  auto backward_from(Saved& s, const DY& dy, WeightCtx& w) {
    auto dx = backward_of<true, I>(*this, s, dy, w);
    if constexpr (I == 0) return dx;
    else return backward_from<I - 1>(s, dx, w);
  }
  template <std::size_t I, class W>
  void weight_of(W& wctx) {
    auto& m = std::get<I>(mods_);
    if constexpr (detail::is_repeated<std::tuple_element_t<I, Mods>>::value) {
      for (std::size_t k = m.size(); k-- > 0;) {
        m[k].backward_weight(std::move(wctx[k]));
        this->grads_ready(unit<I>(k));
      }
    } else {
      m.backward_weight(std::move(wctx));
      this->grads_ready(unit<I>());
    }
  }

  Mods mods_;
  std::vector<std::size_t> unit_of_;       // part -> unit index (WithUnits::no_unit: no parameters)
  std::array<std::size_t, n> first_part_{};  // module -> its first part (an nn::Repeated has one per element)
};

}  // namespace dtensor::nn
