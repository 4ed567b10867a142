// dtensor/nn/mlp.hpp — the transformer MLP: fc1 -> GELU -> fc2.
//
//   nn::MLP<float, Mesh> mlp("mlp", mesh, /*dim=*/64, /*hidden=*/256, /*seed=*/5);
//   nn::MLP<float, Mesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>> tp_mlp(...);   // Megatron
//   auto [y, saved] = mlp.forward(x);                        // x [B, T, dim]
//   auto [dx, wctx] = mlp.backward_input(std::move(saved), dy);  mlp.backward_weight(std::move(wctx));
//
// fc1 [hidden, dim] and fc2 [dim, hidden] are Linears in the given styles; fc1's output layout
// must be fc2's input layout (checked at compile time). Collectives: those of the two styles
// (Megatron's pair: one all-reduce forward and one backward, or an all-gather and a
// reduce-scatter each way under sequence parallelism, and backward's re-gather of fc1's saved
// input shard). GELU is ops::gelu (no communication); with set_recompute_activation(true) GELU(h)
// is not kept but computed again from h in backward (nn/recompute.hpp: act).
#pragma once

#include <tuple>
#include <string>

#include "dtensor/nn/linear.hpp"
#include "dtensor/ops/activations.hpp"

namespace dtensor::nn {

template <kernels::host::FloatElement T, MeshType Mesh, class Fc1Style = Replicated<>, class Fc2Style = Replicated<>>
class MLP {
 public:
  using Fc1 = Linear<T, Mesh, Fc1Style>;
  using Fc2 = Linear<T, Mesh, Fc2Style>;
  static_assert(std::is_same_v<typename Fc1::OutL, typename Fc2::InL>,
                "MLP: fc1's output layout must be fc2's input layout (column-wise then row-wise, or both Replicated)");
  using In = typename Fc1::In;
  using Out = typename Fc2::Out;

  struct Saved {
    typename Fc1::Saved fc1;
    typename Fc1::Out h;  // fc1's output, for GELU's backward
    typename Fc2::Saved fc2;
    bool act_recomputed = false;  // fc2's input GELU(h) dropped: computed again from h in backward
    auto tensors() { return std::tie(fc1, h, fc2); }  // what an activation offload moves (nn/activation_offload.hpp)
  };
  using WeightCtx = std::tuple<typename Fc1::WeightCtx, typename Fc2::WeightCtx>;  // children() order

  MLP() = default;
  /// fc1 draws from seed, fc2 from seed + 1; fc2's init_std may be scaled (GPT-2: by 1/sqrt(2 layers)).
  MLP(std::string name, const Mesh& mesh, Extent dim, Extent hidden, std::uint64_t seed, double init_std = 0.02,
      double out_std = 0.02)
      : fc1_(name + ".fc1", mesh, dim, hidden, seed, {.bias = true, .init_std = init_std}),
        fc2_(name + ".fc2", mesh, hidden, dim, seed + 1, {.bias = true, .init_std = out_std}) {}

  Fwd<Out, Saved> forward(const In& x) const { return forward_impl(x); }
  /// The same for a temporary input (a block's ln2 output): fc1's saved input without a copy.
  Fwd<Out, Saved> forward(In&& x) const { return forward_impl(std::move(x)); }
  Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    if (s.act_recomputed) s.fc2.x = ops::gelu(s.h);
    auto [da, w2] = fc2_.backward_input(std::move(s.fc2), dy);
    auto dh = ops::gelu_backward(da, s.h);
    auto [dx, w1] = fc1_.backward_input(std::move(s.fc1), std::move(dh));  // dh kept for dW, not copied
    return {std::move(dx), WeightCtx{std::move(w1), std::move(w2)}};
  }
  void backward_weight(WeightCtx w) { backward_weight_children(*this, std::move(w)); }

  /// Recompute GELU(h) in backward instead of keeping it (nn/recompute.hpp: act).
  void set_recompute_activation(bool on) noexcept { recompute_act_ = on; }
  /// fc1's saved input (a block's ln2 output), dropped and restored by a block recomputing norms.
  static In& saved_input(Saved& s) noexcept { return s.fc1.x; }

  auto children() { return std::tie(fc1_, fc2_); }
  Fc1& fc1() noexcept { return fc1_; }
  Fc2& fc2() noexcept { return fc2_; }

 private:
  template <class X>
  Fwd<Out, Saved> forward_impl(X&& x) const {
    auto [h, s1] = fc1_.forward(std::forward<X>(x));
    auto [y, s2] = fc2_.forward(ops::gelu(h));
    if (recompute_act_) s2.x = {};
    return {std::move(y), Saved{std::move(s1), std::move(h), std::move(s2), recompute_act_}};
  }

  Fc1 fc1_;
  Fc2 fc2_;
  bool recompute_act_ = false;
};

}  // namespace dtensor::nn
