// dtensor/models/gpt_stage.hpp — one pipeline stage of a GPT: a run of its blocks,
// with the embeddings on the first stage and the final norm, head and loss on the last.
//
//   auto layers = pipeline::stage_layers(cfg.layers, /*stages=*/4);    // [first, end) per stage
//   pipeline::GptStage<double, StageMesh> stage(stage_mesh, cfg, /*stage=*/1, /*stages=*/4);
//   auto y = stage.forward(mb, std::move(x), ids, targets);          // x: empty on the first stage
//   auto dx = stage.backward_input(mb, std::move(dy), 1.0 / M);      // dy: empty on the last stage
//   stage.backward_weight(mb);                                       // or backward(mb, dy, dloss): both
//
// The modules are built with nn::GPT's own factories (same names, seeds and initialisation), so
// the stages of a pipeline together start from the parameters of the one-rank nn::GPT; blocks
// are divided as evenly as possible, the first `layers % stages` stages taking one more. The
// stage's mesh is the sub-mesh of its pipeline coordinate (no pipeline dimension: the modules
// reject one). What a backward needs is kept per micro-batch (a map from micro-batch to saved
// state, and one to weight contexts between I and W), so a schedule may hold several
// micro-batches and run their backwards in any order. forward on the last stage returns no
// activation: it keeps the micro-batch's loss (take_loss). No communication here but the
// modules' own collectives on the stage mesh (the plan's, for tensor parallelism).
//
// MoE blocks (Layers = nn::MoELayers): the experts of the stage's MoE blocks are units on the
// expert mesh (layers().expert_params()). The blocks' auxiliary losses: the last stage adds its
// own to the micro-batch's loss, the others keep theirs (take_auxiliary_loss, which the executor
// adds to the step's loss); their gradients are weighted with the backward's dloss, like the
// loss's (nn::MoE::set_loss_scale).
//
// Units (FSDP inside a stage): like nn::GPT, the stage keeps its parameters in flat groups, one
// per unit — "embed" (first stage), "h.l" for each of its blocks (the global layer index),
// "head" (last stage) — listed by units() in forward order, and fires set_hooks' UnitHooks
// around each: pre_forward / post_forward around a unit's forward, pre_backward before its
// backward_input, grads_ready after its backward_weight, once per micro-batch. So
// parallel::fully_shard(stage, stage_mesh, ...) shards a stage as it shards a whole GPT.
#pragma once

#include <cstddef>
#include <map>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/models/gpt.hpp"

namespace dtensor::parallel::pipeline {

/// The blocks [first, end) of each of `stages` stages of a model with `layers` blocks. More
/// stages than layers is an error: every stage holds at least one block.
inline std::vector<std::pair<Extent, Extent>> stage_layers(Extent layers, int stages) {
  if (stages < 1 || layers < stages)
    throw Error("pipeline::stage_layers",
                dtensor::detail::cat("cannot split ", layers, " layers into ", stages,
                                     " pipeline stages: every stage needs at least one layer (use fewer stages, or "
                                     "fewer stages per rank)"));
  std::vector<std::pair<Extent, Extent>> result;
  Extent first = 0;
  for (int stage = 0; stage < stages; ++stage) {
    const Extent count = layers / stages + (stage < layers % stages ? 1 : 0);
    result.emplace_back(first, first + count);
    first += count;
  }
  return result;
}

template <kernels::host::FloatElement T, MeshType Mesh, class Plan = nn::ReplicatedPlan, class Id = std::int32_t,
          class Layers = nn::DenseLayers>
class GptStage : public nn::WithUnits<T, Mesh> {
  using Model = nn::GPT<T, Mesh, Plan, Id, Layers>;  // Layers: e.g. nn::LlamaLayers (models/llama.hpp)

 public:
  using X = typename Model::X;  // the residual stream [B, T, C]: what crosses stages
  using Ids = typename Model::Ids;
  using Loss = typename Model::Loss;
  using Block = typename Model::Block;
  using Unit = typename nn::WithUnits<T, Mesh>::Unit;
  /// Whether the blocks add auxiliary losses to the loss (MoE).
  static constexpr bool has_auxiliary_loss = requires(const Layers& l, const std::vector<Block>& b) { l.auxiliary_loss(b); };

  struct Saved {
    std::optional<typename Model::Wte::Saved> wte;
    std::optional<typename Model::Wpe::Saved> wpe;
    std::vector<typename Block::Saved> blocks;
    std::optional<typename Model::Norm::Saved> ln_f;
    std::optional<typename Model::Head::Saved> head;
    std::optional<typename Model::LossFn::Saved> loss;
  };
  struct WeightCtx {
    std::optional<typename Model::Wte::WeightCtx> wte;
    std::optional<typename Model::Wpe::WeightCtx> wpe;
    std::vector<typename Block::WeightCtx> blocks;  // in block order
    std::optional<typename Model::Norm::WeightCtx> ln_f;
    std::optional<typename Model::Head::WeightCtx> head;
  };

  /// `layers`: nn::GPT's Layers policy (nn::MoELayers for MoE blocks; see the note on MoE below).
  GptStage(const Mesh& mesh, const nn::GPTConfig& cfg, int stage, int stages, Layers layers = {})
      : mesh_(mesh), cfg_(cfg), stage_(stage), stages_(stages), layers_(std::move(layers)) {
    constexpr const char* op = "pipeline::GptStage";
    Model::check_config(op, mesh, cfg);
    if (stage < 0 || stage >= stages)
      mesh.comm().fail(op, dtensor::detail::cat("stage ", stage, " is not in [0, ", stages, ")"));
    const auto [first, end] = stage_layers(cfg.layers, stages)[std::size_t(stage)];
    first_layer_ = first;
    if (is_first()) {
      wte_ = Model::make_wte(mesh, cfg);
      wpe_.emplace();  // an empty table unless the model has learned positions
      if constexpr (Model::learned_positions) wpe_ = Model::make_wpe(mesh, cfg);
    }
    for (Extent layer = first; layer < end; ++layer) blocks_.push_back(Model::make_block(mesh, cfg, layer, layers_));
    if (is_last()) {
      ln_f_ = Model::make_ln_f(mesh, cfg);
      head_ = Model::make_head(mesh, cfg);
    }
    this->make_units(*this);  // embed, the blocks, head (as nn::GPT, with the global layer index)
    layers_.add_units(blocks_, first);  // MoE: the experts of each MoE block, a unit on the expert mesh
  }
  GptStage(GptStage&&) = default;
  GptStage& operator=(GptStage&&) = default;

  bool is_first() const noexcept { return stage_ == 0; }
  bool is_last() const noexcept { return stage_ == stages_ - 1; }
  int index() const noexcept { return stage_; }
  const Mesh& mesh() const noexcept { return mesh_; }
  Extent first_layer() const noexcept { return first_layer_; }
  std::size_t layers() const noexcept { return blocks_.size(); }

  /// The forward of micro-batch `mb`: from the ids on the first stage, else from `x` (the
  /// previous stage's output); returns the output, or nothing on the last stage, which keeps the
  /// loss instead. `targets` are read on the last stage only.
  std::optional<X> forward(int mb, std::optional<X> x, const Ids& ids, const Ids& targets) {
    constexpr const char* op = "pipeline::GptStage::forward";
    if (saved_.contains(mb) || losses_.contains(mb))
      mesh_.comm().fail(op, dtensor::detail::cat("stage ", stage_, " already holds micro-batch ", mb, " (forward twice)"));
    if (is_first() == x.has_value())
      mesh_.comm().fail(op, dtensor::detail::cat("stage ", stage_, is_first() ? " takes ids, not an activation"
                                                                             : " needs the previous stage's activation"));
    Saved s;
    if (is_first()) {
      x = this->forward_unit(embed_unit(), [&] {
        return Model::embed(mesh_, cfg_, *wte_, *wpe_, ids, s.wte.emplace(), s.wpe.emplace());
      });
    }
    s.blocks.reserve(blocks_.size());
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      auto [y, block_s] = this->forward_unit(block_unit(l), [&] { return blocks_[l].forward(*x); });
      x = std::move(y);
      s.blocks.push_back(std::move(block_s));
    }
    if (is_last()) {
      auto [ln_s, logits, head_s] = this->forward_unit(head_unit(), [&] {
        auto [normed, ln_saved] = ln_f_->forward(*x);
        auto [out, head_saved] = head_->forward(normed);
        return std::tuple(std::move(ln_saved), std::move(out), std::move(head_saved));
      });
      auto [loss, loss_s] = loss_.forward(logits, targets);
      layers_.add_losses(loss, blocks_);  // MoE: this stage's auxiliary losses
      s.ln_f = std::move(ln_s);
      s.head = std::move(head_s);
      s.loss = std::move(loss_s);
      losses_.emplace(mb, std::move(loss));
      x.reset();
    } else if constexpr (has_auxiliary_loss) {
      auxiliary_losses_[mb] = layers_.auxiliary_loss(blocks_);
    }
    saved_.emplace(mb, std::move(s));
    return x;
  }

  /// The input gradients of micro-batch `mb` (of dloss * loss on the last stage, else from `dy`,
  /// the next stage's input gradient); returns the gradient of this stage's input, nothing on the
  /// first stage. The weight gradients wait for backward_weight(mb).
  std::optional<X> backward_input(int mb, std::optional<X> dy, double dloss) {
    constexpr const char* op = "pipeline::GptStage::backward_input";
    auto found = saved_.find(mb);
    if (found == saved_.end())
      mesh_.comm().fail(op, dtensor::detail::cat("stage ", stage_, " holds no forward of micro-batch ", mb));
    if (is_last() == dy.has_value())
      mesh_.comm().fail(op, dtensor::detail::cat("stage ", stage_, is_last() ? " starts from the loss, not a gradient"
                                                                            : " needs the next stage's input gradient"));
    Saved s = std::move(found->second);
    saved_.erase(found);
    layers_.set_loss_scale(blocks_, dloss);  // MoE: the auxiliary losses weighted like the loss
    WeightCtx w;
    if (is_last()) {
      dy = this->backward_unit(head_unit(), [&] {
        auto dlogits = loss_.backward(std::move(*s.loss), dloss);
        auto [dh, head_w] = head_->backward_input(std::move(*s.head), dlogits);
        auto [dx, ln_w] = ln_f_->backward_input(std::move(*s.ln_f), dh);
        w.head = std::move(head_w);
        w.ln_f = std::move(ln_w);
        return std::move(dx);
      });
    }
    w.blocks.resize(blocks_.size());
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      auto [dx, block_w] = this->backward_unit(block_unit(l), [&] { return blocks_[l].backward_input(std::move(s.blocks[l]), *dy); });
      dy = std::move(dx);
      w.blocks[l] = std::move(block_w);
    }
    if (is_first()) {
      this->backward_unit(embed_unit(), [&] {
        w.wte = wte_->backward_input(std::move(*s.wte), *dy).weight;
        if constexpr (Model::learned_positions) w.wpe = wpe_->backward_input(std::move(*s.wpe), *dy).weight;
      });
      dy.reset();
    }
    weight_ctx_.emplace(mb, std::move(w));
    return dy;
  }

  /// Adds the weight gradients of micro-batch `mb` (after its backward_input): head, blocks last
  /// first, embeddings — the order nn::GPT::backward_weight adds them.
  void backward_weight(int mb) {
    auto found = weight_ctx_.find(mb);
    if (found == weight_ctx_.end())
      mesh_.comm().fail("pipeline::GptStage::backward_weight",
                        dtensor::detail::cat("stage ", stage_, " has no backward_input of micro-batch ", mb));
    WeightCtx w = std::move(found->second);
    weight_ctx_.erase(found);
    if (is_last()) {
      head_->backward_weight(std::move(*w.head));
      ln_f_->backward_weight(std::move(*w.ln_f));
      this->grads_ready(head_unit());
    }
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      blocks_[l].backward_weight(std::move(w.blocks[l]));
      this->grads_ready(block_unit(l));
    }
    if (is_first()) {
      wte_->backward_weight(std::move(*w.wte));
      if constexpr (Model::learned_positions) wpe_->backward_weight(std::move(*w.wpe));
      this->grads_ready(embed_unit());
    }
  }

  /// The full backward of micro-batch `mb`: backward_input, then backward_weight.
  std::optional<X> backward(int mb, std::optional<X> dy, double dloss) {
    auto dx = backward_input(mb, std::move(dy), dloss);
    backward_weight(mb);
    return dx;
  }

  /// The loss of micro-batch `mb` (last stage, after its forward), this rank's share as nn::GPT
  /// gives it; removed from the stage.
  Loss take_loss(int mb) {
    auto found = losses_.find(mb);
    if (found == losses_.end())
      mesh_.comm().fail("pipeline::GptStage::take_loss",
                        dtensor::detail::cat("stage ", stage_, is_last() ? " has no loss of micro-batch " : " is not the last stage, micro-batch ", mb));
    Loss loss = std::move(found->second);
    losses_.erase(found);
    return loss;
  }

  /// MoE: the weighted auxiliary losses of micro-batch `mb`'s forward on a stage other than the
  /// last (this rank's share; the last stage's are in its loss); removed from the stage.
  double take_auxiliary_loss(int mb)
    requires has_auxiliary_loss
  {
    auto found = auxiliary_losses_.find(mb);
    if (found == auxiliary_losses_.end()) return 0;
    const double value = found->second;
    auxiliary_losses_.erase(found);
    return value;
  }

  /// The extents of the activation (and its gradient) that crosses stages for a micro-batch of these ids.
  Shape<3> activation_shape(const Ids& ids) const { return {ids.extent(0), ids.extent(1), cfg_.dim}; }

  /// Micro-batches whose forward ran and whose backward_input has not (activations held).
  std::size_t saved_count() const noexcept { return saved_.size(); }
  /// Micro-batches whose backward_input ran and whose backward_weight has not.
  std::size_t weight_pending_count() const noexcept { return weight_ctx_.size(); }

  /// Activation checkpointing of every block of this stage.
  void set_checkpoint(bool on) {
    for (auto& block : blocks_) block.set_enabled(on);
  }

  // units(), set_hooks, hooks() (nn::WithUnits): embed (first stage), h.l per block, head (last stage).

  Layers& layers() noexcept { return layers_; }
  const std::vector<Block>& blocks() const noexcept { return blocks_; }
  /// The parameters in order, grouped into the units (an absent optional forms none).
  auto children() {
    using Embed = nn::UnitOf<typename Model::Wte, typename Model::Wpe>;
    using Head = nn::UnitOf<typename Model::Norm, typename Model::Head>;
    std::optional<Embed> embed;
    if (is_first()) embed.emplace(nn::unit("embed", *wte_, *wpe_));
    std::optional<Head> head;
    if (is_last()) head.emplace(nn::unit("head", *ln_f_, *head_));
    return nn::children(std::move(embed), blocks_, std::move(head));
  }

 private:
  std::size_t embed_unit() const noexcept { return 0; }
  std::size_t block_unit(std::size_t l) const noexcept { return l + (is_first() ? 1 : 0); }
  std::size_t head_unit() const noexcept { return this->units().size() - 1; }

  Mesh mesh_;
  nn::GPTConfig cfg_;
  int stage_ = 0;
  int stages_ = 1;
  Extent first_layer_ = 0;
  Layers layers_;
  std::optional<typename Model::Wte> wte_;
  std::optional<typename Model::Wpe> wpe_;
  std::vector<Block> blocks_;
  std::optional<typename Model::Norm> ln_f_;
  std::optional<typename Model::Head> head_;
  typename Model::LossFn loss_;
  std::map<int, Saved> saved_;
  std::map<int, WeightCtx> weight_ctx_;
  std::map<int, Loss> losses_;
  std::map<int, double> auxiliary_losses_;  // MoE, stages other than the last
};

}  // namespace dtensor::parallel::pipeline
