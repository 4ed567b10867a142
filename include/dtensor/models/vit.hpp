// dtensor/models/vit.hpp — a small Vision-Transformer classifier, written against the public nn/
// and parallel/ API as a user writes their own model (docs/modules.md walks through it).
//
//   models::ViTConfig cfg{.patches = 16, .patch_dim = 48, .classes = 10, .dim = 64, .heads = 4, .layers = 2};
//   models::ViT<float, Mesh> model(mesh, cfg);                              // no tensor parallelism
//   models::ViT<float, Mesh, parallel::MegatronPlan<true>> tp(mesh, cfg);   // TP + SP (parallel/gpt_plan.hpp)
//   auto stages = pipeline::split(models::ViTParts<float, StageMesh>(stage_mesh, cfg), layout, pipeline_rank);
//   auto [loss, saved] = model.forward(patches, labels);  // patches [B, P, patch_dim], labels [B]
//   model.backward(std::move(saved));                     // gradients into the parameters
//   double value = full_tensor(loss)[0];                  // the global mean loss
//
// The model: each image is P flattened patches; a Linear embeds each patch, a learned position
// table is added, `layers` pre-norm encoder blocks (nn::TransformerBlock with non-causal
// attention: every patch sees every other) follow, then a final LayerNorm, the mean over the
// patches and a Linear classifier head; the loss is nn::ClassificationCrossEntropy.
//
// It is its parts (models::ViTParts, an nn::LayeredModel: embed, blocks, head, loss) run by nn::Stack,
// so its units (embed, h.0 .., head), hooks and their firing are the library's: DDP overlap,
// fully_shard and ZeRO / HSDP need nothing from it, and pipeline::split cuts the same parts into
// pipeline stages (parallel/pipeline/split.hpp). The blocks come from a Layers policy, the GPT's:
// models::DenseLayers, or models::MoELayers (models/moe_gpt.hpp: mixtures of experts on an expert mesh). Everything else about parallelism is chosen from outside:
// the Plan gives the styles of the blocks' Linears and the residual stream's placement on the
// tensor dimension (`between`; sequence parallelism splits the patches there); on a mesh with a
// context dimension the patches are split on it and parallel::PlanAttention picks the context
// attention core (ring, all-gather or Ulysses: cfg.context). docs/modules.md counts the lines
// that exist only for parallelism (9; "// parallel:" marks some) and walks through this file.
//
// Under context (and sequence) parallelism the mean over the patches is Partial<sum> over the
// ranks that split them; one redistribution (a reduce-scatter over the context dimension; an
// all-reduce over the tensor one under SP) gives each context rank its share of the samples
// (nn::samples), on which the head and the loss run: the head's gradients come out
// Partial<sum> there like every other parameter's. With cfg.context.load_balanced the patches
// must be given in parallel::load_balanced_order, as a GPT's tokens (non-causal attention has no
// imbalance to fix: the trainer leaves it off).
//
// Initialisation: the Linears and position table N(0, 0.02), the blocks' output projections
// N(0, 0.02 / sqrt(2 * layers)), biases 0, norms 1 and 0; each drawn whole from cfg.seed, so
// every plan and mesh starts from the same parameters.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/models/gpt.hpp"  // models::DenseLayers: the blocks policy the GPT and the ViT share
#include "dtensor/nn/block.hpp"
#include "dtensor/nn/checkpoint.hpp"
#include "dtensor/nn/classification_loss.hpp"
#include "dtensor/nn/embedding.hpp"
#include "dtensor/nn/positions.hpp"
#include "dtensor/nn/stack.hpp"
#include "dtensor/ops/reduce.hpp"
#include "dtensor/ops/shape.hpp"
#include "dtensor/parallel/context_layout.hpp"
#include "dtensor/parallel/context_parallel.hpp"

namespace dtensor::models {

struct ViTConfig {
  Extent patches = 0;    // P: patches per image (the sequence)
  Extent patch_dim = 0;  // values per flattened patch (e.g. 4 x 4 pixels x 3 channels = 48)
  Extent classes = 0;
  Extent dim = 0;  // C
  Extent heads = 1;
  Extent layers = 1;
  Extent mlp_ratio = 4;
  std::uint64_t seed = 1234;
  parallel::ContextAttentionOptions context{};  // attention on a mesh with a context dimension
  bool checkpoint = false;                       // activation checkpointing of every block
};

/// Patch embedding: a Linear over each flattened patch plus a learned position table.
/// [B, P, patch_dim] -> [B, P, C], both in the residual stream's layout (patches split like it).
template <kernels::host::FloatElement T, MeshType Mesh, Placement P = Replicate>
class PatchEmbedding {
 public:
  using Proj = nn::Linear<T, Mesh, nn::Replicated<P>>;
  using Pos = nn::Embedding<T, Mesh, nn::Replicated<P>>;
  using In = typename Proj::In;
  using Out = typename Proj::Out;
  struct Saved {
    typename Proj::Saved proj;
    typename Pos::Saved pos;
  };
  using WeightCtx = std::tuple<typename Proj::WeightCtx, typename Pos::WeightCtx>;  // children() order

  PatchEmbedding() = default;
  PatchEmbedding(const Mesh& mesh, const ViTConfig& c, std::uint64_t seed)
      : proj_("patch", mesh, c.patch_dim, c.dim, seed + 1), pos_("pos", mesh, c.patches, c.dim, seed + 2),
        load_balanced_(c.context.load_balanced) {}

  nn::Fwd<Out, Saved> forward(const In& x) const {
    auto [e, proj_s] = proj_.forward(x);
    // The global index of each of this rank's patches (under CP with load balancing: the original order).
    auto ids = nn::positions<nn::tokens<Mesh, P>>(
        x.mesh(), Shape<2>{x.extent(0), x.extent(1)},
        parallel::original_positions(x.mesh(), x.extent(1), load_balanced_));  // parallel:
    auto [pe, pos_s] = pos_.forward(ids);
    return {ops::add(e, pe), Saved{std::move(proj_s), std::move(pos_s)}};
  }
  nn::Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    auto [dx, proj_w] = proj_.backward_input(std::move(s.proj), dy);
    auto pos_w = pos_.backward_input(std::move(s.pos), dy).weight;
    return {std::move(dx), WeightCtx{std::move(proj_w), std::move(pos_w)}};
  }
  void backward_weight(WeightCtx w) { nn::backward_weight_children(*this, std::move(w)); }
  auto children() { return std::tie(proj_, pos_); }
  std::string name() const { return "embed"; }

 private:
  Proj proj_;
  Pos pos_;
  bool load_balanced_ = false;
};

/// The classifier: final norm, mean over the patches, Linear head. [B, P, C] -> logits [B, K],
/// the samples split as nn::samples.
template <kernels::host::FloatElement T, MeshType Mesh, Placement P = Replicate>
class PoolHead {
 public:
  using Norm = nn::LayerNorm<T, Mesh, P>;
  using Head = nn::Linear<T, Mesh, nn::PerSample>;
  using In = typename Norm::X;
  using Pooled = decltype(ops::mean<1>(std::declval<In>()));  // [B, 1, C]: Partial where the patches are split
  using Out = DTensor<T, 2, Mesh, nn::samples<Mesh>>;
  struct Saved {
    typename Norm::Saved norm;
    In normed;
    typename Head::Saved head;
    typename Head::Out logits;
  };
  using WeightCtx = std::tuple<typename Norm::WeightCtx, typename Head::WeightCtx>;  // children() order

  PoolHead() = default;
  PoolHead(const Mesh& mesh, const ViTConfig& c, std::uint64_t seed)
      : norm_("norm", mesh, c.dim), head_("head", mesh, c.dim, c.classes, seed + 3) {}

  nn::Fwd<Out, Saved> forward(const In& x) const {
    auto [h, norm_s] = norm_.forward(x);
    auto pooled = redistribute<nn::samples<Mesh>>(ops::mean<1>(h));  // parallel: each rank its samples
    auto [logits, head_s] = head_.forward(pooled);
    auto out = ops::reshape<nn::samples<Mesh>>(logits, Shape<2>{logits.extent(0), logits.extent(2)});
    return {std::move(out), Saved{std::move(norm_s), std::move(h), std::move(head_s), std::move(logits)}};
  }
  nn::Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    auto [dpooled, head_w] = head_.backward_input(std::move(s.head), ops::reshape_backward(dy, s.logits));
    auto dmean = redistribute_backward<typename Pooled::layout>(dpooled);  // parallel:
    auto [dx, norm_w] = norm_.backward_input(std::move(s.norm), ops::mean_backward<1>(dmean, s.normed));
    return {std::move(dx), WeightCtx{std::move(norm_w), std::move(head_w)}};
  }
  void backward_weight(WeightCtx w) { nn::backward_weight_children(*this, std::move(w)); }
  auto children() { return std::tie(norm_, head_); }
  std::string name() const { return "head"; }

 private:
  Norm norm_;
  Head head_;
};

/// The ViT as ordered parts (nn/stack.hpp's LayeredModel): patch embedding, encoder blocks, pooled
/// head, classification loss. models::ViT is all of them; a pipeline stage (parallel/pipeline/split.hpp:
/// pipeline::split(ViTParts(...), layout, rank)) a run of them. Layers chooses the blocks' MLP:
/// models::DenseLayers (the plan's MLP) or models::MoELayers (models/moe_gpt.hpp: mixtures of experts on an
/// expert mesh); the blocks' attention is the plan's, non-causal.
template <kernels::host::FloatElement T, MeshType Mesh, class Plan = nn::ReplicatedPlan, class Layers = DenseLayers>
class ViTParts {
 public:
  using Embed = PatchEmbedding<T, Mesh, typename Plan::between>;
  using Block =
      nn::Checkpointed<typename Layers::template block<T, Mesh, Plan>>;  // cfg.checkpoint: recompute in backward
  using Head = PoolHead<T, Mesh, typename Plan::between>;
  using LossFn = nn::ClassificationCrossEntropy<T, Mesh>;
  using Images = typename Embed::In;  // [B, P, patch_dim]
  using Target = typename LossFn::Labels;

  ViTParts(const Mesh& mesh, const ViTConfig& c, Layers layers = {}) : mesh_(mesh), c_(c), layers_(std::move(layers)) {
    dtensor::detail::check(c.patches > 0 && c.patch_dim > 0 && c.classes > 0 && c.dim > 0 && c.heads > 0 &&
                               c.layers > 0 && c.dim % c.heads == 0,
                           "models::ViT", mesh, "config patches ", c.patches, ", patch_dim ", c.patch_dim, ", classes ",
                           c.classes, ", dim ", c.dim, ", heads ", c.heads, ", layers ", c.layers,
                           ": all must be > 0 and dim a multiple of heads");
  }

  const Mesh& mesh() const noexcept { return mesh_; }
  const ViTConfig& config() const noexcept { return c_; }
  Layers& layers() noexcept { return layers_; }
  const Layers& layers() const noexcept { return layers_; }
  Extent block_count() const noexcept { return c_.layers; }

  // Each part drawn whole from cfg.seed and its own offset: any run of them starts from the whole model's parameters.
  Embed make_prologue() const { return Embed(mesh_, c_, c_.seed * 1000); }
  Block make_block(Extent l) const {
    return Block(c_.checkpoint, layers_.template make_block<typename Block::Inner>(
                                    l, "h." + std::to_string(l), mesh_,
                                    nn::BlockConfig{.dim = c_.dim,
                                                    .heads = c_.heads,
                                                    .seq = c_.patches,
                                                    .mlp_ratio = c_.mlp_ratio,
                                                    .out_std = 0.02 / std::sqrt(2.0 * double(c_.layers)),
                                                    .context = c_.context,
                                                    .causal = false},
                                    c_.seed * 1000 + 10 * std::uint64_t(l + 1)));
  }
  Head make_epilogue() const { return Head(mesh_, c_, c_.seed * 1000); }
  LossFn make_loss() const { return LossFn{}; }
  /// The residual stream [B, P, C] of a micro-batch of these images (what crosses pipeline stages).
  Shape<3> activation_shape(const Images& x) const { return {x.extent(0), x.extent(1), c_.dim}; }

 private:
  Mesh mesh_;
  ViTConfig c_;
  Layers layers_;
};

/// The whole ViT: its parts run by nn::Stack (units embed, h.0 .., head and their hooks).
template <kernels::host::FloatElement T, MeshType Mesh, class Plan = nn::ReplicatedPlan, class Layers = DenseLayers>
class ViT : public nn::Stack<ViTParts<T, Mesh, Plan, Layers>> {
  using Base = nn::Stack<ViTParts<T, Mesh, Plan, Layers>>;

 public:
  using Parts = ViTParts<T, Mesh, Plan, Layers>;
  using Images = typename Parts::Images;
  using Labels = typename Parts::Target;
  using Loss = typename Base::Loss;
  using Saved = typename Base::Saved;

  ViT(const Mesh& mesh, const ViTConfig& c, Layers layers = {}) : Base(Parts(mesh, c, std::move(layers)), {true, 0, c.layers, true}) {}

  /// The mean loss over the batch (this rank's share; MoE: plus the auxiliary losses) and the saved state.
  nn::Fwd<Loss, Saved> forward(const Images& x, const Labels& labels) const {
    auto [out, s] = Base::forward(std::nullopt, x, labels);
    return {std::move(*out.loss), std::move(s)};
  }
  /// The gradients of dloss * loss, unit by unit (head first).
  void backward(Saved s, double dloss = 1.0) { Base::backward(std::move(s), std::nullopt, dloss); }
  /// The loss alone (validation).
  Loss evaluate(const Images& x, const Labels& labels) const { return forward(x, labels).y; }
  const ViTConfig& config() const noexcept { return this->model().config(); }
};

}  // namespace dtensor::models

// The names these models had before models/ became their namespace (nn::GPT and so on): kept,
// so that code written against them compiles as before.
namespace dtensor::nn {
using models::PatchEmbedding;
using models::PoolHead;
using models::ViT;
using models::ViTConfig;
using models::ViTParts;
}  // namespace dtensor::nn
