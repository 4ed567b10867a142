// dtensor/nn/block.hpp — the pre-norm transformer block, and the plans that lay it out.
//
//   nn::TransformerBlock<float, Mesh> blk("h.0", mesh, {.dim = 64, .heads = 4, .seq = 32}, seed);
//   nn::TransformerBlock<float, Mesh, parallel::MegatronPlan<true>> tp_sp(...);   // parallel/gpt_plan.hpp
//   auto y = blk.forward(x);  auto dx = blk.backward_input(dy);  blk.backward_weight();
//   blk.set_checkpoint(true);   // keep only x; backward_input recomputes the forward
//
// y = h + mlp(ln2(h)), h = x + attn(ln1(x)). A plan (a type) names the style of every Linear
// and the "tp" placement of the residual stream between the tensor-parallel regions
// (`between`: Replicate, or Shard<0> under sequence parallelism, where the norms and residual
// adds run on this rank's tokens). The residual adds are ops::add (no communication); all
// collectives are the styles' (two entries, two exits per pass: see parallel/gpt_plan.hpp).
//
// Activation checkpointing: forward keeps only the block's input and frees every activation
// its modules saved; backward_input first runs the forward again (issuing its collectives
// again: two more all-reduces, or all-gathers and reduce-scatters, per checkpointed block).
#pragma once

#include <string>

#include "dtensor/nn/attention.hpp"
#include "dtensor/nn/loss.hpp"
#include "dtensor/nn/mlp.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/ops/pointwise.hpp"

namespace dtensor::nn {

/// The plan without tensor parallelism: every Linear Replicated, the residual stream whole on
/// "tp", the loss ops::cross_entropy. No collectives in the model (only gradient syncs).
struct ReplicatedPlan {
  static constexpr std::string_view name = "replicated";
  using between = Replicate;
  using qkv = Replicated<>;
  using proj = Replicated<>;
  using fc1 = Replicated<>;
  using fc2 = Replicated<>;
  using head = Replicated<>;
  using wte = Replicated<>;
  template <class T, class Mesh, class LogitsL>
  using loss = CrossEntropyLoss<T, Mesh, LogitsL>;
};

struct BlockConfig {
  Extent dim = 0;
  Extent heads = 1;
  Extent seq = 0;
  Extent mlp_ratio = 4;
  double init_std = 0.02;
  double out_std = 0.02;  // the output projections (GPT-2 scales them by 1/sqrt(2 * layers))
};

template <kernels::host::FloatElement T, MeshType Mesh, class Plan = ReplicatedPlan>
class TransformerBlock {
 public:
  using between = typename Plan::between;
  using Norm = LayerNorm<T, Mesh, between>;
  using Attn = CausalSelfAttention<T, Mesh, typename Plan::qkv, typename Plan::proj>;
  using Mlp = MLP<T, Mesh, typename Plan::fc1, typename Plan::fc2>;
  using X = typename Norm::X;
  static_assert(std::is_same_v<typename Attn::In, X> && std::is_same_v<typename Attn::Out, X> &&
                    std::is_same_v<typename Mlp::In, X> && std::is_same_v<typename Mlp::Out, X>,
                "TransformerBlock: the plan's styles must take and give the residual stream's layout "
                "(tokens<Mesh, Plan::between>)");

  TransformerBlock() = default;
  TransformerBlock(std::string name, const Mesh& mesh, BlockConfig c, std::uint64_t seed)
      : ln1_(name + ".ln1", mesh, c.dim),
        attn_(name + ".attn", mesh, {c.dim, c.heads, c.seq}, seed, c.init_std, c.out_std),
        ln2_(name + ".ln2", mesh, c.dim),
        mlp_(name + ".mlp", mesh, c.dim, c.mlp_ratio * c.dim, seed + 2, c.init_std, c.out_std) {
    detail::check(c.mlp_ratio > 0, "nn::TransformerBlock", mesh, name, ": mlp_ratio ", c.mlp_ratio, " must be > 0");
  }

  void set_checkpoint(bool on) noexcept { checkpoint_ = on; }
  bool checkpoint() const noexcept { return checkpoint_; }

  X forward(const X& x) {
    auto h = ops::add(x, attn_.forward(ln1_.forward(x)));
    auto y = ops::add(h, mlp_.forward(ln2_.forward(h)));
    if (checkpoint_) {
      x_ = x;
      release();
    }
    return y;
  }

  X backward_input(const X& dy) {
    if (checkpoint_) {
      detail::check(x_.numel() > 0, "nn::TransformerBlock::backward_input", dy.mesh(),
                    "checkpointed block without a forward before it");
      const bool saved = checkpoint_;
      checkpoint_ = false;
      forward(x_);  // recompute: the modules keep their activations this time
      checkpoint_ = saved;
      x_ = {};
    }
    auto dh = ops::add(dy, ln2_.backward_input(mlp_.backward_input(dy)));
    return ops::add(dh, ln1_.backward_input(attn_.backward_input(dh)));
  }

  void backward_weight() {
    mlp_.backward_weight();
    ln2_.backward_weight();
    attn_.backward_weight();
    ln1_.backward_weight();
  }

  X backward(const X& dy) {
    auto dx = backward_input(dy);
    backward_weight();
    return dx;
  }

  /// Frees every saved activation (after an evaluation forward, or for checkpointing).
  void release() {
    ln1_.release();
    attn_.release();
    ln2_.release();
    mlp_.release();
  }

  template <class U>
  void collect(ParamList<U, Mesh::ndim>& out) {
    ln1_.collect(out);
    attn_.collect(out);
    ln2_.collect(out);
    mlp_.collect(out);
  }
  Attn& attn() noexcept { return attn_; }
  Mlp& mlp() noexcept { return mlp_; }
  Norm& ln1() noexcept { return ln1_; }
  Norm& ln2() noexcept { return ln2_; }

 private:
  Norm ln1_;
  Attn attn_;
  Norm ln2_;
  Mlp mlp_;
  bool checkpoint_ = false;
  X x_;
};

}  // namespace dtensor::nn
