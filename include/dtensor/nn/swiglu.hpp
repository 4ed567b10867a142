// dtensor/nn/swiglu.hpp — the SwiGLU feed-forward of Llama: w2(silu(x w1) * (x w3)), no biases.
//
//   nn::SwiGLU<float, Mesh> ff("mlp", mesh, /*dim=*/64, /*hidden=*/172, /*seed=*/5);
//   nn::SwiGLU<float, Mesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>> tp_ff(...);  // Megatron
//   auto [y, saved] = ff.forward(x);                          // x [B, T, dim]
//   auto [dx, wctx] = ff.backward_input(std::move(saved), dy);  ff.backward_weight(std::move(wctx));
//
// w1 and w3 are one Linear "w13" [2F, C] whose rows alternate: row 2j is w1's row j (the gate),
// row 2j+1 is w3's row j (the up projection). One matmul then gives both, and under tensor
// parallelism a column-wise w13 gives every rank matching pieces of the two (rows [2j0, 2j1)
// hold w1 and w3 rows [j0, j1)), so with sequence parallelism the input is all-gathered once,
// not twice; it needs hidden % tp == 0 (checked). w2 [C, F] is row-wise. Locally: [B, T, 2F]
// -reshape-> [B, T, F, 2] -split-> gate, up [B, T, F] -> silu(gate) * up -> w2. The styles are
// MLP's (the plan's fc1 for w13, fc2 for w2), so the same plan serves GPT's MLP and this.
// Collectives: those of the two styles only (Megatron's pair). Saved: w13's and w2's saved
// states and the gate and up projections (for silu's and the product's backward).
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "dtensor/nn/linear.hpp"
#include "dtensor/ops/activations.hpp"
#include "dtensor/ops/pointwise.hpp"
#include "dtensor/ops/shape.hpp"

namespace dtensor::nn {

template <kernels::host::FloatElement T, MeshType Mesh, class Fc1Style = Replicated<>, class Fc2Style = Replicated<>>
class SwiGLU {
 public:
  using W13 = Linear<T, Mesh, Fc1Style>;
  using W2 = Linear<T, Mesh, Fc2Style>;
  static_assert(std::is_same_v<typename W13::OutL, typename W2::InL>,
                "SwiGLU: w13's output layout must be w2's input layout (column-wise then row-wise, or both Replicated)");
  using In = typename W13::In;
  using Out = typename W2::Out;
  using Hidden = typename W2::In;  // [B, T, F]

 private:
  // [B, T, F, 2]: the hidden features' split (dimension 2) stays where it is.
  static constexpr std::size_t tensor_index = tensor_dim<Mesh>;
  static constexpr bool hidden_split =
      tensor_index < Mesh::ndim && W13::OutL::desc.placements[tensor_index].is_shard();
  using PairsL = tokens<Mesh, std::conditional_t<hidden_split, Shard<2>, Replicate>>;

 public:
  struct Saved {
    typename W13::Saved w13;
    Hidden gate, up;  // x w1, x w3
    typename W2::Saved w2;
    bool act_recomputed = false;  // w2's input silu(gate)·up dropped: computed again in backward
    auto tensors() { return std::tie(w13, gate, up, w2); }  // what an activation offload moves (nn/activation_offload.hpp)
  };
  using WeightCtx = std::tuple<typename W13::WeightCtx, typename W2::WeightCtx>;  // children() order

  SwiGLU() = default;
  /// w13 draws from seed (N(0, init_std)), w2 from seed + 1 (N(0, out_std)).
  SwiGLU(std::string name, const Mesh& mesh, Extent dim, Extent hidden, std::uint64_t seed, double init_std = 0.02,
         double out_std = 0.02)
      : hidden_(hidden) {
    const int tp = tensor_size(mesh);
    detail::check(dim > 0 && hidden > 0 && (!hidden_split || hidden % tp == 0), "nn::SwiGLU", mesh, name,
                  ": dim ", dim, ", hidden ", hidden, " must be > 0", hidden_split ? " and hidden a multiple of the tensor dimension's size " : "",
                  hidden_split ? std::to_string(tp) : std::string(), " (each rank needs matching gate and up rows)");
    w13_ = W13(name + ".w13", mesh, dim, 2 * hidden, seed, {.bias = false, .init_std = init_std});
    w2_ = W2(name + ".w2", mesh, hidden, dim, seed + 1, {.bias = false, .init_std = out_std});
  }

  /// Collectives: w13's style's entry and w2's exit.
  Fwd<Out, Saved> forward(const In& x) const {
    Saved s;
    auto [h, w13_saved] = w13_.forward(x);
    s.w13 = std::move(w13_saved);
    const Extent batch = h.extent(0), len = h.extent(1);
    auto parts = ops::split<3>(ops::reshape<PairsL>(h, Shape<4>{batch, len, hidden_, 2}), {1, 1});
    s.gate = ops::reshape<typename W2::InL>(parts[0], Shape<3>{batch, len, hidden_});
    s.up = ops::reshape<typename W2::InL>(parts[1], Shape<3>{batch, len, hidden_});
    auto [y, w2_saved] = w2_.forward(ops::mul(ops::silu(s.gate), s.up));
    s.w2 = std::move(w2_saved);
    if (recompute_act_) s.w2.x = {}, s.act_recomputed = true;
    return {std::move(y), std::move(s)};
  }

  /// Collectives: the adjoints of w2's exit and of w13's entry.
  Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    if (s.act_recomputed) s.w2.x = ops::mul(ops::silu(s.gate), s.up);
    auto [dprod, w2_w] = w2_.backward_input(std::move(s.w2), dy);
    const Extent batch = dprod.extent(0), len = dprod.extent(1);
    std::vector<decltype(ops::reshape<PairsL>(dprod, Shape<4>{}))> parts;
    parts.push_back(ops::reshape<PairsL>(ops::silu_backward(ops::mul(dprod, s.up), s.gate),
                                         Shape<4>{batch, len, hidden_, 1}));  // d gate
    parts.push_back(ops::reshape<PairsL>(ops::mul(dprod, ops::silu(s.gate)), Shape<4>{batch, len, hidden_, 1}));  // d up
    auto dh = ops::reshape<typename W13::OutL>(ops::concat<3>(parts), Shape<3>{batch, len, 2 * hidden_});
    auto [dx, w13_w] = w13_.backward_input(std::move(s.w13), dh);
    return {std::move(dx), WeightCtx{std::move(w13_w), std::move(w2_w)}};
  }

  void backward_weight(WeightCtx w) { backward_weight_children(*this, std::move(w)); }

  /// Recompute silu(gate)·up in backward instead of keeping it (nn/recompute.hpp: act).
  void set_recompute_activation(bool on) noexcept { recompute_act_ = on; }
  /// w13's saved input (a block's ln2 output), dropped and restored by a block recomputing norms.
  static In& saved_input(Saved& s) noexcept { return s.w13.x; }

  auto children() { return std::tie(w13_, w2_); }
  W13& w13() noexcept { return w13_; }
  W2& w2() noexcept { return w2_; }

 private:
  Extent hidden_ = 0;
  W13 w13_;
  W2 w2_;
  bool recompute_act_ = false;
};

}  // namespace dtensor::nn
