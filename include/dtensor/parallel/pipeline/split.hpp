// dtensor/parallel/pipeline/split.hpp — pipeline stages cut from any layered model (PyTorch's
// PipelineStage over a module, torchtitan's pipeline_module_split).
//
//   models::GptParts<double, StageMesh> gpt(stage_mesh, cfg);                 // or any nn::LayeredModel
//   auto layout = pipeline::StageLayout::looped(pp, 2);                  // 2 stages per rank
//   std::vector<pipeline::Stage<decltype(gpt)>> stages = pipeline::split(gpt, layout, pipeline_rank);
//   pipeline::Executor exec(mesh, schedule, std::move(stages));
//
// A model gives its ordered parts through nn::LayeredModel (nn/stack.hpp: prologue, blocks,
// epilogue and loss, each built by a factory) and, for a pipeline, activation_shape(input): the
// extents of the activation for an input (what a receiving stage allocates). split builds, on
// this pipeline rank, only the parts of its stages (the blocks divided as stage_layers says, or
// as the caller lists them), so the stages of all ranks together start from the parameters of
// the whole model and no rank holds more than its share.
//
// A pipeline::Stage is an nn::Stack (the one forward/backward loop a whole model runs too) that
// keeps the saved state and the weight contexts per micro-batch, so a schedule holds several in
// flight and runs their backwards in any order, with the input / weight split (I, W) of the
// zero-bubble schedules; the last stage keeps each micro-batch's loss (take_loss). It is the stage
// protocol of stage.hpp. Its units are the Stack's (prologue, each block, epilogue), so
// parallel::fully_shard(stage, stage_mesh, ...) shards a stage as it shards a whole model; the
// parameters on other meshes form groups of their own (nn::parameter_groups: MoE experts). The
// auxiliary losses (nn/aux_losses.hpp) of a stage other than the last are kept per micro-batch (take_auxiliary_loss: the executor adds them
// to the step's loss); the last stage's are in its loss.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/nn/stack.hpp"
#include "dtensor/parallel/pipeline/stage.hpp"
#include "dtensor/parallel/pipeline/stage_layout.hpp"

namespace dtensor::parallel::pipeline {

/// The blocks [first, end) of each of `stages` stages of a model with `layers` blocks, as evenly
/// as possible (the first `layers % stages` stages take one more). More stages than layers is an
/// error: every stage holds at least one block.
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

/// The blocks [first, end) of each stage from the number each holds: `counts` has one entry per
/// stage, summing to the model's `layers`; a stage in the middle holds at least one block (the
/// first and the last may hold none beside their prologue or epilogue).
inline std::vector<std::pair<Extent, Extent>> stage_layers(Extent layers, const std::vector<Extent>& counts) {
  constexpr const char* op = "pipeline::stage_layers";
  Extent first = 0;
  std::vector<std::pair<Extent, Extent>> result;
  for (std::size_t s = 0; s < counts.size(); ++s) {
    const bool edge = s == 0 || s + 1 == counts.size();
    if (counts[s] < (edge ? 0 : 1))
      throw Error(op, dtensor::detail::cat("stage ", s, " of ", counts.size(), " holds ", counts[s],
                                           " blocks: a stage between the first and the last needs at least one"));
    result.emplace_back(first, first + counts[s]);
    first += counts[s];
  }
  if (counts.empty() || first != layers)
    throw Error(op, dtensor::detail::cat("the blocks per stage sum to ", first, " over ", counts.size(),
                                         " stages; the model has ", layers));
  return result;
}

/// What split needs of a model beyond nn::LayeredModel: the activation's extents for an input.
template <class M>
concept SplittableModel = nn::LayeredModel<M> && requires(const M& m, const typename nn::Stack<M>::Input& input) {
  m.activation_shape(input);
};

template <class M>
constexpr bool require_splittable_model() {
  static_assert(nn::require_layered_model<M>());
  static_assert(requires(const M& m, const typename nn::Stack<M>::Input& input) { m.activation_shape(input); },
                "pipeline::split needs `activation_shape(input)` const on the model: the extents of the activation "
                "between blocks for this input (what a receiving stage allocates)");
  return SplittableModel<M>;
}

/// One stage of a layered model: a run of its blocks, with the prologue on the first stage and
/// the epilogue and loss on the last, its saved state kept per micro-batch (see the top of this file).
template <class M>
class Stage : public nn::Stack<M> {
  using Base = nn::Stack<M>;

 public:
  using X = typename Base::X;
  using Input = typename Base::Input;
  using Target = typename Base::Target;
  using Loss = typename Base::Loss;
  using Saved = typename Base::Saved;
  using WeightCtx = typename Base::WeightCtx;

  /// Stage `stage` of `stages`, holding blocks [blocks.first, blocks.second).
  Stage(M model, int stage, int stages, std::pair<Extent, Extent> blocks)
      : Base(std::move(model), {stage == 0, blocks.first, blocks.second, stage == stages - 1}), stage_(stage), stages_(stages) {}
  Stage(Stage&&) = default;
  Stage& operator=(Stage&&) = default;

  int index() const noexcept { return stage_; }
  bool is_first() const noexcept { return stage_ == 0; }
  bool is_last() const noexcept { return stage_ == stages_ - 1; }
  /// The model's index of this stage's first block (blocks().size(): how many it holds; layers():
  /// the model's blocks policy, nn::Stack's).
  Extent first_layer() const noexcept { return this->first_block(); }

  /// The forward of micro-batch `mb`: from `input` on the first stage, else from `x` (the
  /// previous stage's output); returns the output, or nothing on the last stage, which keeps the
  /// loss instead. `target` is read on the last stage only.
  std::optional<X> forward(int mb, std::optional<X> x, const Input& input, const Target& target) {
    constexpr const char* op = "pipeline::Stage::forward";
    if (saved_.contains(mb) || losses_.contains(mb))
      fail(op, dtensor::detail::cat(" already holds micro-batch ", mb, " (forward twice)"));
    if (is_first() == x.has_value())
      fail(op, is_first() ? " takes the model's input, not an activation" : " needs the previous stage's activation");
    auto [out, s] = Base::forward(std::move(x), input, target);
    saved_.emplace(mb, std::move(s));
    if (out.loss) losses_.emplace(mb, std::move(*out.loss));
    if constexpr (Base::has_auxiliary_loss) {
      if (!is_last()) auxiliary_losses_[mb] = out.auxiliary;
    } else if (out.auxiliary != 0 && !is_last()) {
      fail(op, " has a part that added an auxiliary loss (nn::add_auxiliary_loss) without declaring it: give the module "
               "`static constexpr bool auxiliary_losses = true` so that the pipeline sums it over the stages");
    }
    return std::move(out.y);
  }

  /// The input gradients of micro-batch `mb` (of dloss * loss on the last stage, else from `dy`,
  /// the next stage's input gradient); returns the gradient of this stage's input, nothing on the
  /// first stage. The weight gradients wait for backward_weight(mb).
  std::optional<X> backward_input(int mb, std::optional<X> dy, double dloss) {
    Saved s = take_saved("pipeline::Stage::backward_input", mb, dy);
    auto [dx, w] = Base::backward_input(std::move(s), std::move(dy), dloss);
    weight_ctx_.emplace(mb, std::move(w));
    return std::move(dx);
  }

  /// Adds the weight gradients of micro-batch `mb` (after its backward_input).
  void backward_weight(int mb) {
    auto found = weight_ctx_.find(mb);
    if (found == weight_ctx_.end())
      fail("pipeline::Stage::backward_weight", dtensor::detail::cat(" has no backward_input of micro-batch ", mb));
    WeightCtx w = std::move(found->second);
    weight_ctx_.erase(found);
    Base::backward_weight(std::move(w));
  }

  /// The full backward of micro-batch `mb`, unit by unit (grads_ready as each unit finishes).
  std::optional<X> backward(int mb, std::optional<X> dy, double dloss) {
    Saved s = take_saved("pipeline::Stage::backward", mb, dy);
    return Base::backward(std::move(s), std::move(dy), dloss);
  }

  /// The loss of micro-batch `mb` (last stage, after its forward), this rank's share; removed.
  Loss take_loss(int mb) {
    auto found = losses_.find(mb);
    if (found == losses_.end())
      fail("pipeline::Stage::take_loss",
           is_last() ? dtensor::detail::cat(" has no loss of micro-batch ", mb) : std::string(" is not the last stage"));
    Loss loss = std::move(found->second);
    losses_.erase(found);
    return loss;
  }

  /// The weighted auxiliary losses of micro-batch `mb`'s forward on a stage other than the last
  /// (this rank's share; the last stage's are in its loss); removed from the stage.
  double take_auxiliary_loss(int mb)
    requires Base::has_auxiliary_loss
  {
    auto found = auxiliary_losses_.find(mb);
    if (found == auxiliary_losses_.end()) return 0;
    const double value = found->second;
    auxiliary_losses_.erase(found);
    return value;
  }

  /// The extents of the activation (and its gradient) that crosses stages for this input.
  auto activation_shape(const Input& input) const { return this->model().activation_shape(input); }

  /// Micro-batches whose forward ran and whose backward_input has not (activations held).
  std::size_t saved_count() const noexcept { return saved_.size(); }
  /// Micro-batches whose backward_input ran and whose backward_weight has not.
  std::size_t weight_pending_count() const noexcept { return weight_ctx_.size(); }

  /// Activation checkpointing of every block of this stage (blocks that can: nn::Checkpointed).
  void set_checkpoint(bool on)
    requires requires(typename Base::Block& b) { b.set_enabled(on); }
  {
    for (auto& block : this->blocks()) block.set_enabled(on);
  }

 private:
  [[noreturn]] void fail(const char* op, const std::string& what) const {
    this->mesh().comm().fail(op, dtensor::detail::cat("stage ", stage_, what));
  }
  Saved take_saved(const char* op, int mb, const std::optional<X>& dy) {
    auto found = saved_.find(mb);
    if (found == saved_.end()) fail(op, dtensor::detail::cat(" holds no forward of micro-batch ", mb));
    if (is_last() == dy.has_value())
      fail(op, is_last() ? " starts from the loss, not a gradient" : " needs the next stage's input gradient");
    Saved s = std::move(found->second);
    saved_.erase(found);
    return s;
  }

  int stage_ = 0;
  int stages_ = 1;
  std::map<int, Saved> saved_;
  std::map<int, WeightCtx> weight_ctx_;
  std::map<int, Loss> losses_;
  std::map<int, double> auxiliary_losses_;  // stages other than the last, when the blocks have auxiliary losses
};

/// This pipeline rank's stages of `model` (layout.stages_of(pipeline_rank), in that order), the
/// blocks divided as evenly as stage_layers gives.
template <class M>
std::vector<Stage<M>> split(const M& model, const StageLayout& layout, int pipeline_rank) {
  static_assert(require_splittable_model<M>());
  return split(model, layout, pipeline_rank, stage_layers(model.block_count(), layout.stages()));
}

/// The same with the blocks of each stage given ([first, end) per stage, e.g. from
/// stage_layers(layers, counts): fewer blocks on the stages that hold the embedding or the head).
template <class M>
std::vector<Stage<M>> split(const M& model, const StageLayout& layout, int pipeline_rank,
                            const std::vector<std::pair<Extent, Extent>>& blocks) {
  static_assert(require_splittable_model<M>());
  if (blocks.size() != std::size_t(layout.stages()))
    throw Error("pipeline::split", dtensor::detail::cat(blocks.size(), " block ranges for the layout's ", layout.stages(),
                                                        " stages"));
  std::vector<Stage<M>> stages;
  for (int s : layout.stages_of(pipeline_rank)) stages.emplace_back(model, s, layout.stages(), blocks[std::size_t(s)]);
  return stages;
}

}  // namespace dtensor::parallel::pipeline
