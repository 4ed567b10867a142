// dtensor/nn/checkpoint.hpp — activation checkpointing as a module wrapper.
//
//   nn::Checkpointed<nn::TransformerBlock<float, Mesh>> blk(/*enabled=*/true, "h.0", mesh, cfg, seed);
//   auto [y, saved] = blk.forward(x);       // saved holds only x when enabled
//   auto [dx, wctx] = blk.backward_input(std::move(saved), dy);   // runs the forward again first
//   blk.set_enabled(false);                 // per block, at run time
//
// Enabled, the saved state is the module's input alone; backward_input recomputes the forward
// (issuing its collectives again) and runs the inner backward on the fresh saved state.
// Disabled, it is the inner module's saved state, unchanged. The weight context is the inner
// module's either way, so a schedule can still defer weight gradients.
#pragma once

#include <tuple>
#include <utility>
#include <variant>

#include "dtensor/nn/module.hpp"

namespace dtensor::nn {

template <class M>
class Checkpointed {
 public:
  using Inner = M;
  using In = typename M::In;
  using Out = typename M::Out;
  using Saved = std::variant<typename M::Saved, In>;  // the inner state, or the input to recompute from
  using WeightCtx = typename M::WeightCtx;

  Checkpointed() = default;
  template <class... Args>
  explicit Checkpointed(bool enabled, Args&&... args) : inner_(std::forward<Args>(args)...), enabled_(enabled) {}

  void set_enabled(bool on) noexcept { enabled_ = on; }
  bool enabled() const noexcept { return enabled_; }

  Fwd<Out, Saved> forward(const In& x) const {
    auto [y, s] = inner_.forward(x);
    if (enabled_) return {std::move(y), Saved(std::in_place_index<1>, x)};
    return {std::move(y), Saved(std::in_place_index<0>, std::move(s))};
  }

  auto backward_input(Saved s, const Out& dy) const {
    if (auto* x = std::get_if<1>(&s)) {
      auto [y, inner_saved] = inner_.forward(*x);  // recompute
      return inner_.backward_input(std::move(inner_saved), dy);
    }
    return inner_.backward_input(std::get<0>(std::move(s)), dy);
  }

  void backward_weight(WeightCtx w) { inner_.backward_weight(std::move(w)); }

  auto children() { return std::tie(inner_); }
  /// The inner module's name, where it has one (what names a model's unit of it).
  decltype(auto) name() const
    requires requires(const M& m) { m.name(); }
  {
    return inner_.name();
  }
  M& inner() noexcept { return inner_; }
  const M& inner() const noexcept { return inner_; }

 private:
  M inner_;
  bool enabled_ = false;
};

}  // namespace dtensor::nn
