// dtensor/nn/block.hpp — the pre-norm transformer block, and the plan without tensor parallelism.
//
//   nn::TransformerBlock<float, Mesh> blk("h.0", mesh, {.dim = 64, .heads = 4, .seq = 32}, seed);
//   nn::TransformerBlock<float, Mesh, parallel::MegatronPlan<true>> tp_sp(...);   // parallel/gpt_plan.hpp
//   auto [y, saved] = blk.forward(x);                        // x [B, T, C]
//   auto [dx, wctx] = blk.backward_input(std::move(saved), dy);  blk.backward_weight(std::move(wctx));
//   nn::Checkpointed<decltype(blk)> ...                      // activation checkpointing (nn/checkpoint.hpp)
//
// y = h + mlp(ln2(h)), h = x + attn(ln1(x)); "mlp" is the FeedForward template parameter, the
// plan's MLP unless the caller builds another (nn::MoE, models/moe_gpt.hpp). A plan (a type) names
// the style of every Linear and the tensor-dimension placement of the residual stream between the tensor-parallel regions
// (`between`: Replicate, or SeqSplit under sequence parallelism, where the norms and residual
// adds run on this rank's positions). The residual adds are ops::add (no communication); all
// collectives are the styles' (two entries, two exits per pass: see parallel/gpt_plan.hpp).
// Per-module recomputation (BlockConfig::recompute, set_recompute; nn/recompute.hpp): the block
// drops what the named modules saved after its forward and recomputes it at the start of the
// matching backward — the attention core and the MLP activation inside those modules, the
// norms' outputs (the inputs the Linears after them keep: SelfAttention/MLP/SwiGLU::saved_input)
// and the whole feed-forward here. Full recomputation is nn::Checkpointed around the block.
#pragma once

#include <concepts>
#include <string>
#include <tuple>

#include "dtensor/nn/attention.hpp"
#include "dtensor/nn/loss.hpp"
#include "dtensor/nn/mlp.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/nn/recompute.hpp"
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
  ContextAttentionOptions context{};  // attention's, on a mesh with a context dimension
  Extent kv_heads = 0;     // attention's KV heads (0: heads; fewer: grouped-query, nn/attention.hpp)
  Extent ffn = 0;          // the feed-forward's width (0: mlp_ratio * dim)
  double rope_theta = 0;   // > 0: rotary positions in attention with this base
  bool bias = true;        // biases in the attention projections (GPT's MLP always has them, SwiGLU none)
  double norm_eps = 1e-5;  // the norms' epsilon
  bool causal = true;      // attention's mask: causal (decoder) or none (an encoder block)
  Recompute recompute{};   // per-module recomputation (full is nn::Checkpointed's, not the block's)
  RopeScaling rope_scaling{};  // attention's rotary scaling (llama3; off by default)
  LatentAttentionConfig mla{};  // multi-head latent attention's shape (nn/latent_attention.hpp; the Llama blocks')
};

/// FeedForward: the plan's MLP by default; any module from and to the residual stream's layout
/// otherwise (models/moe_gpt.hpp: a mixture of experts, built by the caller; models/llama.hpp: SwiGLU).
/// NormType: LayerNorm by default (models/llama.hpp: RMSNorm); built as (name, mesh, dim, eps).
/// Attention: nn::SelfAttention with the plan's projections and the local core by default; any
/// attention built as (name, mesh, AttentionConfig, seed, init_std, out_std) otherwise — on a
/// mesh with a context dimension the context-parallel core (parallel::attention_core_for<Mesh>,
/// which the models pass).
template <kernels::host::FloatElement T, MeshType Mesh, class Plan = ReplicatedPlan,
          class FeedForward = MLP<T, Mesh, typename Plan::fc1, typename Plan::fc2>,
          class NormType = LayerNorm<T, Mesh, typename Plan::between>,
          class Attention = SelfAttention<T, Mesh, typename Plan::qkv, typename Plan::proj>>
class TransformerBlock {
 public:
  using between = typename Plan::between;
  using Norm = NormType;
  using Attn = Attention;
  using Mlp = FeedForward;
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
    bool norms_dropped = false, mlp_dropped = false;  // recomputed in backward (set_recompute)
    auto tensors() { return std::tie(ln1, attn, ln2, mlp); }  // what an activation offload moves (nn/activation_offload.hpp)
  };
  using WeightCtx = std::tuple<typename Norm::WeightCtx, typename Attn::WeightCtx, typename Norm::WeightCtx,
                               typename Mlp::WeightCtx>;  // children() order

  TransformerBlock() = default;
  TransformerBlock(std::string name, const Mesh& mesh, BlockConfig c, std::uint64_t seed)
      : TransformerBlock(name, mesh, c, seed,
                         Mlp(name + ".mlp", mesh, c.dim, mlp_hidden(name, mesh, c), seed + 2, c.init_std, c.out_std)) {}
  /// With a feed-forward the caller built (mlp_ratio unused).
  TransformerBlock(std::string name, const Mesh& mesh, BlockConfig c, std::uint64_t seed, Mlp feed_forward)
      : name_(name),
        ln1_(name + ".ln1", mesh, c.dim, c.norm_eps),
        attn_(name + ".attn", mesh,
              {c.dim, c.heads, c.seq, c.context, c.kv_heads, c.rope_theta, c.bias, c.causal, c.rope_scaling, c.mla,
               c.norm_eps},
              seed, c.init_std, c.out_std),
        ln2_(name + ".ln2", mesh, c.dim, c.norm_eps),
        mlp_(std::move(feed_forward)) {
    set_recompute(c.recompute);
  }

  /// Which modules' saved activations this block recomputes in backward (nn/recompute.hpp;
  /// `full` is ignored here: it is nn::Checkpointed's). A module that cannot (an MoE has no
  /// separate activation or saved input to drop) is an error naming it; `mlp` covers experts.
  void set_recompute(const Recompute& r) {
    auto refuse = [&](const char* what, const char* why) {
      throw Error("nn::TransformerBlock::set_recompute",
                  name_ + ": recompute " + what + ": " + why + " (recompute mlp recomputes the whole feed-forward)");
    };
    if constexpr (requires(Attn& a) { a.set_recompute_core(true); }) attn_.set_recompute_core(r.core_attn);
    else if (r.core_attn) refuse("core_attn", "this attention module has no separable core");
    if constexpr (requires(Mlp& m) { m.set_recompute_activation(true); }) mlp_.set_recompute_activation(r.act && !r.mlp);
    else if (r.act && !r.mlp) refuse("act", "this feed-forward has no activation kept apart");
    if (r.norm && !(has_saved_input<Attn> && (r.mlp || has_saved_input<Mlp>)))
      refuse("norm", "the module after a norm does not expose the input it saves (saved_input)");
    recompute_ = r;
    recompute_.full = false;
  }
  const Recompute& recompute() const noexcept { return recompute_; }

  /// Inference with the attention's KV cache (nn::SelfAttention::forward_cached; Cache is the
  /// attention's KvCache): x holds the positions after the cached ones. Nothing is saved.
  template <class Cache>
  X forward_cached(const X& x, Cache& cache) const {
    auto h = ops::add(x, attn_.forward_cached(ln1_.forward(x).y, cache));
    return ops::add(h, mlp_.forward(ln2_.forward(h).y).y);
  }

  Fwd<X, Saved> forward(const X& x) const {
    auto [a, s1] = ln1_.forward(x);
    auto [b, s2] = attn_.forward(std::move(a));  // a and c become the projections' saved inputs, not copies
    auto h = ops::add(x, b);
    auto [c, s3] = ln2_.forward(h);
    auto [d, s4] = mlp_.forward(std::move(c));
    Saved s{std::move(s1), std::move(s2), std::move(s3), std::move(s4), false, false};
    if constexpr (has_saved_input<Attn>)
      if (recompute_.norm) Attn::saved_input(s.attn) = {}, s.norms_dropped = true;
    if constexpr (has_saved_input<Mlp>)
      if (recompute_.norm && !recompute_.mlp) Mlp::saved_input(s.mlp) = {};
    if (recompute_.mlp) s.mlp = {}, s.mlp_dropped = true;
    return {ops::add(h, d), std::move(s)};
  }

  Bwd<X, WeightCtx> backward_input(Saved s, const X& dy) const {
    // Recompute what forward dropped, in the order backward needs it: ln2's output (and the
    // feed-forward from it), then ln1's.
    if (s.mlp_dropped) s.mlp = mlp_.forward(ln2_.forward(s.ln2.x).y).saved;
    if constexpr (has_saved_input<Mlp>)
      if (s.norms_dropped && !s.mlp_dropped) Mlp::saved_input(s.mlp) = ln2_.forward(s.ln2.x).y;
    auto [dc, w4] = mlp_.backward_input(std::move(s.mlp), dy);
    auto [dh2, w3] = ln2_.backward_input(std::move(s.ln2), dc);
    auto dh = ops::add(dy, dh2);
    if constexpr (has_saved_input<Attn>)
      if (s.norms_dropped) Attn::saved_input(s.attn) = ln1_.forward(s.ln1.x).y;
    auto [db, w2] = attn_.backward_input(std::move(s.attn), dh);
    auto [dx2, w1] = ln1_.backward_input(std::move(s.ln1), db);
    return {ops::add(dh, dx2), WeightCtx{std::move(w1), std::move(w2), std::move(w3), std::move(w4)}};
  }

  void backward_weight(WeightCtx w) { backward_weight_children(*this, std::move(w)); }

  auto children() { return std::tie(ln1_, attn_, ln2_, mlp_); }
  /// The block's name (a model's unit of it is named so: nn/units.hpp).
  const std::string& name() const noexcept { return name_; }
  Attn& attn() noexcept { return attn_; }
  Mlp& mlp() noexcept { return mlp_; }
  const Mlp& mlp() const noexcept { return mlp_; }
  Norm& ln1() noexcept { return ln1_; }
  Norm& ln2() noexcept { return ln2_; }

 private:
  static Extent mlp_hidden(const std::string& name, const Mesh& mesh, const BlockConfig& c) {
    detail::check(c.mlp_ratio > 0 && c.ffn >= 0, "nn::TransformerBlock", mesh, name, ": mlp_ratio ", c.mlp_ratio,
                  " must be > 0 and ffn ", c.ffn, " >= 0");
    return c.ffn > 0 ? c.ffn : c.mlp_ratio * c.dim;
  }

  template <class M>
  static constexpr bool has_saved_input = requires(typename M::Saved& s) {
    { M::saved_input(s) } -> std::same_as<X&>;
  };

  std::string name_;
  Norm ln1_;
  Attn attn_;
  Norm ln2_;
  Mlp mlp_;
  Recompute recompute_{};
};

}  // namespace dtensor::nn
