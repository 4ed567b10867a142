// dtensor/models/moe_gpt.hpp — a GPT whose blocks have mixture-of-experts feed-forwards (all of
// them, or every other one), expert parallel over an expert mesh.
//
//   using Dense = DeviceMesh<"dp", "tp">;  using EMesh = DeviceMesh<"edp", "ep", "tp">;
//   auto emesh = parallel::make_expert_mesh<EMesh>(dense, /*ep=*/2);
//   models::MoEGPT<float, Dense, EMesh> model(dense, gpt_config,
//       models::MoELayers<float, EMesh>(emesh, {.router = {.experts = 4, .topk = 2, .capacity_factor = 1.25},
//                                           .every = 2}));   // blocks 1, 3, ... are MoE
//   auto groups = nn::parameter_groups(model);                         // nn/param_groups.hpp
//   auto dense = std::get<0>(groups).params();                         // the units(): attention, norms, routers, ...
//   auto experts = std::get<1>(groups).params();                       // ParamList<float, 3>: the expert units
//   auto [loss, saved] = model.forward(ids, targets);                  // cross-entropy + the MoE blocks' aux losses
//   model.backward(std::move(saved));
//   parallel::DataParallel<Dense>(dense).all_reduce_gradients(dense);      // over "dp"
//   parallel::DataParallel<EMesh>(emesh).all_reduce_gradients(experts);    // over "edp" only
//   model.layers().stats(model.blocks()[1])                            // the last forward's routing on this rank
//
// MoEGPT is models::GPT with the Layers policy MoELayers: each block is a TransformerBlock whose
// feed-forward is a DenseOrMoE — the plan's MLP, or an nn::MoE (router on the model's mesh,
// experts on the expert mesh). Parameters on the model's mesh stay in the GPT's units (one per
// block: its norms, attention and router or MLP), so DDP over the dense mesh reduces them as
// before; the experts of block l are an extra unit "h.l.experts" on the expert mesh (the
// policy declares that mesh, parameter_meshes(); nn::parameter_groups gives the units), whose gradients are Partial<sum> on "edp" (DataParallel
// over the expert mesh reduces them, after the backward).
//
// The loss: each MoE block's auxiliary losses — aux_loss_coeff * load balancing + z_loss_coeff *
// z, this rank's shares (nn/router.hpp) — are added by its forward to the library's collector
// (nn/aux_losses.hpp), which nn::Stack adds to this rank's share of the cross-entropy, so the
// loss printed is the loss trained; their gradients are added by the MoE's backward_input with
// the weight the loss is differentiated with (backward's dloss, nn::auxiliary_loss_scale). The MoE routes whole tokens: under sequence parallelism its input
// is all-gathered on the tensor dimension first (and its output gradient in backward), every
// tensor rank runs it alike and keeps its own slice of the result.
//
// Shared experts (MoELayersConfig::shared, DeepSeek's): a MoE block's feed-forward adds one dense
// feed-forward of shared x the experts' width that every token passes through, beside its routed
// experts: y = mine(moe(whole(x))) + shared(x). It is the plan's feed-forward (Megatron's styles
// under TP: their collectives, no gather), its parameters in the block's unit on the dense mesh.
//
// Statistics: each MoE feed-forward keeps its last forward's routing statistics (load per
// expert, dropped choices, loss shares on this rank) for logging; a checkpointed block's
// recomputation writes the same ones again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "dtensor/models/gpt.hpp"
#include "dtensor/models/llama.hpp"
#include "dtensor/nn/moe_blocks.hpp"
#include "dtensor/nn/param_groups.hpp"
#include "dtensor/nn/swiglu.hpp"
#include "dtensor/ops/pointwise.hpp"
#include "dtensor/parallel/moe.hpp"

namespace dtensor::models {

/// One MoE layer's routing on this rank in its last forward.
struct MoEStats {
  std::vector<std::int64_t> load;  // per expert: kept choices
  std::int64_t routed = 0;         // choices made (tokens x topk)
  std::int64_t dropped = 0;        // choices past capacity
  double aux_loss = 0, z_loss = 0; // this rank's shares (unweighted)
};

/// A block's feed-forward: the plan's dense feed-forward or a mixture of experts, chosen at
/// construction; GPT's GELU MLPs or Llama's SwiGLUs, dense and experts alike (F).
template <kernels::host::FloatElement T, MeshType Mesh, parallel::ExpertMeshType EMesh, class Plan,
          nn::ExpertFfn F = nn::ExpertFfn::gelu_mlp>
class DenseOrMoE {
 public:
  using Mlp =
      std::conditional_t<F == nn::ExpertFfn::swiglu, nn::SwiGLU<T, Mesh, typename Plan::fc1, typename Plan::fc2>,
                         nn::MLP<T, Mesh, typename Plan::fc1, typename Plan::fc2>>;
  using Moe = nn::MoE<T, Mesh, EMesh, F>;
  using In = typename Mlp::In;
  using Out = typename Mlp::Out;
  // Under sequence parallelism the block's stream is split on the sequence over the tensor
  // dimension, and the MoE routes whole tokens: the MoE branch all-gathers its input there (and,
  // in backward, the output gradient), runs on every tensor rank alike, and keeps its own part
  // of the output (and of the input gradient): a local slice.
  static constexpr bool gathers = !std::is_same_v<In, typename Moe::In>;
  static_assert(std::is_same_v<In, Out> && std::is_same_v<typename Moe::In, typename Moe::Out>,
                "models::DenseOrMoE: the feed-forward keeps its input's layout");
  /// A MoE feed-forward's state: the experts' and, with shared experts, their dense feed-forward's.
  struct MoeSaved {
    typename Moe::Saved moe;
    std::optional<typename Mlp::Saved> shared;
  };
  struct MoeWeightCtx {
    typename Moe::WeightCtx moe;
    std::optional<typename Mlp::WeightCtx> shared;
  };
  using Saved = std::variant<typename Mlp::Saved, MoeSaved>;
  using WeightCtx = std::variant<typename Mlp::WeightCtx, MoeWeightCtx>;

  DenseOrMoE() = default;
  explicit DenseOrMoE(Mlp mlp) { mlp_.push_back(std::move(mlp)); }
  /// `shared`: DeepSeek's shared experts, one dense feed-forward every token passes through beside
  /// its routed experts (the plan's tensor-parallel styles, on the block's layout: no gather).
  explicit DenseOrMoE(Moe moe, std::optional<Mlp> shared = {}) {
    moe_.push_back(std::move(moe));
    if (shared) shared_.push_back(std::move(*shared));
  }

  bool is_moe() const noexcept { return !moe_.empty(); }
  Moe& moe() { return moe_.at(0); }
  const Moe& moe() const { return moe_.at(0); }
  /// The last forward's routing on this rank (empty for a dense MLP).
  const MoEStats& stats() const noexcept { return stats_; }

  nn::Fwd<Out, Saved> forward(const In& x) const {
    if (!is_moe()) {
      auto [y, s] = mlp_.at(0).forward(x);
      return {std::move(y), Saved(std::in_place_index<0>, std::move(s))};
    }
    auto [y, s] = moe_[0].forward(whole(x));
    const auto& r = s.routing;
    stats_ = {r.load, r.tokens * r.topk, r.dropped, r.aux_loss, r.z_loss};
    Out out = mine(std::move(y));
    MoeSaved saved{std::move(s), std::nullopt};
    if (!shared_.empty()) {
      auto [ys, ss] = shared_[0].forward(x);
      out = ops::add(out, ys);
      saved.shared = std::move(ss);
    }
    return {std::move(out), Saved(std::in_place_index<1>, std::move(saved))};
  }

  nn::Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    if (!is_moe()) {
      auto [dx, w] = mlp_.at(0).backward_input(std::get<0>(std::move(s)), dy);
      return {std::move(dx), WeightCtx(std::in_place_index<0>, std::move(w))};
    }
    MoeSaved saved = std::get<1>(std::move(s));
    auto [dx, w] = moe_[0].backward_input(std::move(saved.moe), whole(dy));
    In din = mine(std::move(dx));
    MoeWeightCtx ctx{std::move(w), std::nullopt};
    if (saved.shared) {
      auto [dxs, ws] = shared_[0].backward_input(std::move(*saved.shared), dy);
      din = ops::add(din, dxs);
      ctx.shared = std::move(ws);
    }
    return {std::move(din), WeightCtx(std::in_place_index<1>, std::move(ctx))};
  }

  void backward_weight(WeightCtx w) {
    if (!is_moe()) return mlp_.at(0).backward_weight(std::get<0>(std::move(w)));
    MoeWeightCtx ctx = std::get<1>(std::move(w));
    moe_[0].backward_weight(std::move(ctx.moe));
    if (ctx.shared) shared_[0].backward_weight(std::move(*ctx.shared));
  }

  /// Recompute the activation (nn/recompute.hpp: act): the dense feed-forward's activation is
  /// dropped and recomputed; an MoE's experts keep none in any case (parallel/experts.hpp
  /// recomputes it in backward), so there it is already so.
  void set_recompute_activation(bool on) {
    if (!is_moe()) mlp_.at(0).set_recompute_activation(on);
    for (auto& s : shared_) s.set_recompute_activation(on);
  }

  auto children() { return std::tie(mlp_, moe_, shared_); }  // mlp_ or moe_ holds the module

 private:
  /// The whole tokens the MoE takes (SP: an all-gather on the tensor dimension).
  static typename Moe::In whole(const In& x) {
    if constexpr (gathers) return redistribute<typename Moe::In::layout>(x);
    else return x;
  }
  /// This rank's part of a whole-token tensor (SP: a local slice, no communication).
  static In mine(typename Moe::Out y) {
    if constexpr (gathers) return redistribute<typename In::layout>(y);
    else return y;
  }

  std::vector<Mlp> mlp_;  // 0 or 1: a range, so that the parameter walks see whichever there is
  std::vector<Moe> moe_;
  std::vector<Mlp> shared_;  // 0 or 1: a MoE's shared experts
  mutable MoEStats stats_;
};

/// Which blocks get a mixture of experts, and its configuration.
struct MoELayersConfig {
  nn::RouterConfig router;  // experts, topk, capacity factor, loss coefficients
  Extent hidden = 0;        // each expert's width; 0: the dense feed-forward's (ffn, or mlp_ratio x dim)
  Extent every = 1;      // block l is MoE when (l + 1) % every == 0: 1 all, 2 every other (1, 3, ...)
  Extent dense_first = 0;  // and l >= dense_first: the first blocks dense (DeepSeek-V3: 3 of 61)
  Extent shared = 0;  // shared experts (DeepSeek's): one dense feed-forward of shared x hidden beside the routed ones
  int node_size = 0;  // > 0: the node-level dispatch over nodes of node_size "ep" ranks (nn::MoEConfig::node_size)
};

/// models::GPT's Layers policy for MoE blocks (see the top of this file) in the blocks of a dense
/// policy: DenseLayers (GPT: LayerNorm, GELU MLP experts, learned positions) or LlamaLayers
/// (RMSNorm, SwiGLU experts and dense feed-forwards, rotary positions, no biases: Mixtral's and
/// DeepSeek's blocks, models::LlamaMoE).
template <kernels::host::FloatElement T, parallel::ExpertMeshType EMesh, class Dense = DenseLayers>
class MoELayers {
 public:
  using ExpertMesh = EMesh;
  static constexpr nn::ExpertFfn expert_ffn = detail::layers_expert_ffn<Dense>();
  static constexpr bool learned_positions = detail::layers_learned_positions<Dense>();
  template <class T2, class Mesh, class P>
  using norm = typename detail::layers_norm<Dense, T2, Mesh, P>::type;
  template <class, class Mesh, class Plan>
  using block = nn::TransformerBlock<T, Mesh, Plan, DenseOrMoE<T, Mesh, EMesh, Plan, expert_ffn>,
                                     norm<T, Mesh, typename Plan::between>,
                                     typename detail::layers_attention<Dense, T, Mesh, Plan>::type>;

  MoELayers() = default;
  MoELayers(EMesh emesh, MoELayersConfig c) : emesh_(std::move(emesh)), c_(c) {
    nn::check_router_config(c.router, "models::MoELayers", emesh_.rank());
    if (c.every < 1 || c.hidden < 0 || c.shared < 0 || c.dense_first < 0)
      throw Error("models::MoELayers",
                  dtensor::detail::cat("every ", c.every, " must be >= 1, hidden ", c.hidden, ", shared ", c.shared,
                                       " and dense_first ", c.dense_first, " >= 0"),
                  emesh_.rank());
    // The node-level dispatch's two sub-groups of "ep", split once for every MoE block (collective).
    if (c.node_size > 0) nodes_ = parallel::split_into_nodes(parallel::expert_group(emesh_), c.node_size);
  }

  bool is_moe(Extent layer) const { return nn::is_moe_block(layer, c_.every, c_.dense_first); }

  template <class Block, class Mesh>
  Block make_block(Extent layer, std::string name, const Mesh& mesh, const nn::BlockConfig& given,
                   std::uint64_t seed) const {
    using FF = typename Block::Mlp;
    const nn::BlockConfig c = detail::layers_block_config<Dense>(given);  // Llama: no biases, its rope base
    // The dense feed-forward's width, as nn::TransformerBlock's: ffn, or mlp_ratio x dim.
    const Extent dense_hidden = c.ffn > 0 ? c.ffn : c.mlp_ratio * c.dim;
    // The feed-forward's seeds are the dense MLP's (seed + 2, + 3): the MoE's router, its experts.
    if (!is_moe(layer))
      return Block(name, mesh, c, seed,
                   FF(typename FF::Mlp(name + ".mlp", mesh, c.dim, dense_hidden, seed + 2, c.init_std, c.out_std)));
    const nn::MoEConfig mc{.dim = c.dim,
                           .hidden = c_.hidden > 0 ? c_.hidden : dense_hidden,
                           .router = c_.router,
                           .init_std = c.init_std,
                           .out_std = c.out_std,
                           .node_size = c_.node_size};
    // Seeds: the router's seed + 2, the experts' + 3 onwards (one per weight), the shared experts' + 6.
    std::optional<typename FF::Mlp> shared;
    if (c_.shared > 0)
      shared.emplace(name + ".moe.shared", mesh, c.dim, c_.shared * mc.hidden, seed + 6, c.init_std, c.out_std);
    return Block(name, mesh, c, seed,
                 FF(typename FF::Moe(name + ".moe", mesh, emesh_, mc, seed + 2, nodes_), std::move(shared)));
  }

  /// The mesh the experts live on, declared (nn/param_groups.hpp): nn::Stack makes each MoE
  /// block's experts a unit "h.l.experts" on it, found by their mesh type.
  std::tuple<nn::OnMesh<EMesh>> parameter_meshes() const { return {nn::on_mesh("experts", emesh_)}; }

  /// The last forward's routing statistics of a block (empty for a dense one).
  template <class Block>
  static const MoEStats& stats(const Block& block) {
    return block.inner().mlp().stats();
  }

  const EMesh& expert_mesh() const noexcept { return emesh_; }
  const MoELayersConfig& config() const noexcept { return c_; }

 private:
  EMesh emesh_;
  std::optional<parallel::ExpertNodes> nodes_;  // c_.node_size > 0: shared by the MoE blocks
  MoELayersConfig c_;
};

/// A GPT with MoE blocks (models::GPT with the MoELayers policy).
template <kernels::host::FloatElement T, MeshType Mesh, parallel::ExpertMeshType EMesh, class Plan = nn::ReplicatedPlan,
          class Id = std::int32_t>
using MoEGPT = GPT<T, Mesh, Plan, Id, MoELayers<T, EMesh>>;

/// A Llama with MoE blocks: SwiGLU experts (Mixtral's and DeepSeek's), RMSNorm, rotary grouped-query
/// attention (models::GPT with MoELayers over LlamaLayers).
template <kernels::host::FloatElement T, MeshType Mesh, parallel::ExpertMeshType EMesh, class Plan = nn::ReplicatedPlan,
          class Id = std::int32_t>
using LlamaMoE = GPT<T, Mesh, Plan, Id, MoELayers<T, EMesh, LlamaLayers>>;

}  // namespace dtensor::models

// The names these models had before models/ became their namespace (nn::GPT and so on): kept,
// so that code written against them compiles as before.
namespace dtensor::nn {
using models::DenseOrMoE;
using models::LlamaMoE;
using models::MoEGPT;
using models::MoELayers;
using models::MoELayersConfig;
using models::MoEStats;
}  // namespace dtensor::nn
