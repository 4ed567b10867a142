// dtensor/nn/block.hpp — the pre-norm transformer block, and the plan without tensor parallelism.
//
//   nn::TransformerBlock<float, Mesh> blk("h.0", mesh, {.dim = 64, .heads = 4, .seq = 32}, seed);
//   nn::TransformerBlock<float, Mesh, parallel::MegatronPlan<true>> tp_sp(...);   // parallel/gpt_plan.hpp
//   auto [y, saved] = blk.forward(x);                        // x [B, T, C]
//   auto [dx, wctx] = blk.backward_input(std::move(saved), dy);  blk.backward_weight(std::move(wctx));
//   nn::Checkpointed<decltype(blk)> ...                      // activation checkpointing (nn/checkpoint.hpp)
//
// y = h + mlp(ln2(h)), h = x + attn(ln1(x)). A plan (a type) names the style of every Linear
// and the tensor-dimension placement of the residual stream between the tensor-parallel regions
// (`between`: Replicate, or SeqSplit under sequence parallelism, where the norms and residual
// adds run on this rank's positions). The residual adds are ops::add (no communication); all
// collectives are the styles' (two entries, two exits per pass: see parallel/gpt_plan.hpp).
#pragma once

#include <string>
#include <tuple>

#include "dtensor/nn/attention.hpp"
#include "dtensor/nn/loss.hpp"
#include "dtensor/nn/mlp.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/ops/pointwise.hpp"

namespace dtensor::nn {

/// The plan without tensor parallelism: every Linear Replicated, the residual stream whole on
/// the tensor dimension, the loss ops::cross_entropy. No collectives in the model (only
/// gradient syncs).
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
  parallel::ContextAttentionOptions context{};  // attention's, on a mesh with a context dimension
};

template <kernels::host::FloatElement T, MeshType Mesh, class Plan = ReplicatedPlan>
class TransformerBlock {
 public:
  using between = typename Plan::between;
  using Norm = LayerNorm<T, Mesh, between>;
  using Attn = CausalSelfAttention<T, Mesh, typename Plan::qkv, typename Plan::proj>;
  using Mlp = MLP<T, Mesh, typename Plan::fc1, typename Plan::fc2>;
  using X = typename Norm::X;
  using In = X;
  using Out = X;
  static_assert(std::is_same_v<typename Attn::In, X> && std::is_same_v<typename Attn::Out, X> &&
                    std::is_same_v<typename Mlp::In, X> && std::is_same_v<typename Mlp::Out, X>,
                "TransformerBlock: the plan's styles must take and give the residual stream's layout "
                "(tokens<Mesh, Plan::between>)");

  struct Saved {
    typename Norm::Saved ln1;
    typename Attn::Saved attn;
    typename Norm::Saved ln2;
    typename Mlp::Saved mlp;
  };
  using WeightCtx = std::tuple<typename Norm::WeightCtx, typename Attn::WeightCtx, typename Norm::WeightCtx,
                               typename Mlp::WeightCtx>;  // children() order

  TransformerBlock() = default;
  TransformerBlock(std::string name, const Mesh& mesh, BlockConfig c, std::uint64_t seed)
      : ln1_(name + ".ln1", mesh, c.dim),
        attn_(name + ".attn", mesh, {c.dim, c.heads, c.seq, c.context}, seed, c.init_std, c.out_std),
        ln2_(name + ".ln2", mesh, c.dim),
        mlp_(name + ".mlp", mesh, c.dim, c.mlp_ratio * c.dim, seed + 2, c.init_std, c.out_std) {
    detail::check(c.mlp_ratio > 0, "nn::TransformerBlock", mesh, name, ": mlp_ratio ", c.mlp_ratio, " must be > 0");
  }

  Fwd<X, Saved> forward(const X& x) const {
    Saved s;
    auto [a, s1] = ln1_.forward(x);
    auto [b, s2] = attn_.forward(a);
    auto h = ops::add(x, b);
    auto [c, s3] = ln2_.forward(h);
    auto [d, s4] = mlp_.forward(c);
    return {ops::add(h, d), Saved{std::move(s1), std::move(s2), std::move(s3), std::move(s4)}};
  }

  Bwd<X, WeightCtx> backward_input(Saved s, const X& dy) const {
    auto [dc, w4] = mlp_.backward_input(std::move(s.mlp), dy);
    auto [dh2, w3] = ln2_.backward_input(std::move(s.ln2), dc);
    auto dh = ops::add(dy, dh2);
    auto [db, w2] = attn_.backward_input(std::move(s.attn), dh);
    auto [dx2, w1] = ln1_.backward_input(std::move(s.ln1), db);
    return {ops::add(dh, dx2), WeightCtx{std::move(w1), std::move(w2), std::move(w3), std::move(w4)}};
  }

  void backward_weight(WeightCtx w) { backward_weight_children(*this, std::move(w)); }

  auto children() { return std::tie(ln1_, attn_, ln2_, mlp_); }
  Attn& attn() noexcept { return attn_; }
  Mlp& mlp() noexcept { return mlp_; }
  Norm& ln1() noexcept { return ln1_; }
  Norm& ln2() noexcept { return ln2_; }

 private:
  Norm ln1_;
  Attn attn_;
  Norm ln2_;
  Mlp mlp_;
};

}  // namespace dtensor::nn
