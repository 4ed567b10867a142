// dtensor/parallel/pipeline/sharded_pipeline.hpp — pipeline stages sharded with FSDP: the
// schedule, the data-parallel, context-parallel and sequence-parallel gradient syncs of one step.
//
//   using Mesh = DeviceMesh<"pp", "dp", "fsdp", "cp", "tp">;      // size-1 dimensions where a parallelism is off
//   auto stage_mesh = pipeline::stage_mesh_of(mesh);               // DeviceMesh<"dp", "fsdp", "cp", "tp">
//   auto stages = pipeline::split(models::GptParts<float, decltype(stage_mesh), parallel::MegatronPlan<true>>(stage_mesh, cfg),
//                                 schedule.layout, mesh.coordinate(0));   // this rank's (split.hpp)
//   pipeline::ShardedPipeline run(mesh, schedule, std::move(stages), {.stage = 3});
//   auto opt = optim::make_adamw(run.params(), {...});             // one AdamW over every parameter of this rank
//                                                                  // (its shards of its stages; MoE: its experts too)
//   // each step:
//   run.zero_grad();
//   auto stats = run.step(microbatches);   // schedule + gradient syncs: the gradients are the batch mean's
//   run.clip_grad_norm(1.0);               // the norm over all stages
//   opt.step();
//   run.sync_parameters();                 // ZeRO-1/2: all-gather the updated parameters
//
// Each of this rank's stages is wrapped by parallel::fully_shard over the stage mesh's data-shard
// dimension flattened with the context one after it ("fsdp*cp", N' = fsdp x cp ranks: the context
// ranks shard the states too; HSDP with "dp" > 1; with "fsdp" and "cp" of size 1 and ZeRO-1 that
// is plain DDP).
// The micro-batches before the last accumulate their gradients unreduced in the units' full
// buffers (set_requires_gradient_sync(false)); the last micro-batch's backward reduces each unit
// as soon as its backward is complete (one reduce-scatter per unit, issued while the earlier
// units compute; ZeRO-2/3 free the unit's full gradient when it completes). ZeRO-3 has two modes
// per stage, FsdpOptions::reshard_after_forward (torchtitan's policy, PyTorch's name):
//
//   true   (default with one stage, pp 1)   each unit gathered for each micro-batch's forward and
//          again for its backward, freed after each (prefetching one ahead), as fully_shard does
//          on a model: 2 all-gathers per unit per micro-batch; the least memory (two units' full
//          parameters at a time)
//   false  (default with several stages)     the stage gathered once before its first forward
//          (PyTorch's UNSHARD) and kept until after its last backward (RESHARD): 1 all-gather per
//          unit per step, whatever the micro-batches; the stage's full parameters held for the step
//
// The executor's StageHooks place these actions where the schedule first and last touches the
// stage; a caller that drives the stages itself (the dry run, models/training_plan.hpp) calls the
// same begin_stage / begin_last_backward / end_stage. After the schedule, step() waits for the
// reductions (HSDP: then one all-reduce per unit on "dp"), and all-reduces what is still pending
// on the context dimension (parallel::context_parallel_grads: nothing of FSDP's shards, which
// their reduce-scatter over "fsdp*cp" reduced) and, under sequence parallelism, on
// the tensor dimension (parallel::sequence_parallel_grads).
// Collectives beyond the stages' own and the messages between them: exactly these.
//
// params() is every parameter of this rank's stages as one nn::ParamSet: the FSDP shards on the
// stage mesh and, for each other mesh a stage's parameters live on (nn::parameter_groups: a
// GPT with models::MoELayers has its experts on the expert mesh; a user's module declares its own),
// that group's shards too: each stage is sharded as fully_shard shards a whole model
// (parallel::FullyShardGroups), every group over its own mesh's data dimension(s) — the experts
// over "edp", with their block (ZeRO-3 gathers a block's experts with it; every stage
// reduce-scatters their gradients on "edp" as the block's backward ends). One optimizer
// (optim::make_adamw) and one clip (clip_grad_norm) take them all: no caller has a case for the
// experts.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/nn/param_groups.hpp"
#include "dtensor/parallel/context_grads.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/parallel/pipeline/clip.hpp"
#include "dtensor/parallel/pipeline/executor.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"

namespace dtensor::parallel::pipeline {

namespace detail {
/// One stage's parameters as FSDP holds them: a list of shards per parameter group (group 0 on
/// the stage mesh, then one per other mesh: nn::parameter_groups), in M on `Space`.
template <class M, class Space, class Groups, class Seq>
struct ShardSet;
template <class M, class Space, class Groups, std::size_t... I>
struct ShardSet<M, Space, Groups, std::index_sequence<I...>> {
  template <std::size_t J>
  using mesh_of = typename std::tuple_element_t<J, Groups>::mesh_type;
  using type = nn::ParamSet<nn::MeshParams<nn::ParamList<M, mesh_of<I>::ndim, Space>, mesh_of<I>>...>;
};
}  // namespace detail

/// Master: the element type of the master values, gradient shards and optimizer state (FSDP's
/// mixed precision, parallel/fully_shard.hpp); void: the stages' own.
template <class Stage, MeshType Mesh, class Master = void>
class ShardedPipeline {
  using StageMesh = std::remove_cvref_t<decltype(std::declval<const Stage&>().mesh())>;
  using Unit = std::remove_cvref_t<decltype(std::declval<Stage&>().units().front())>;
  using T = std::conditional_t<std::is_void_v<Master>, typename decltype(Unit::group)::element_type::element_type, Master>;
  using Space = mesh_space_t<StageMesh>;
  using Groups = nn::parameter_groups_t<Stage>;
  static constexpr std::size_t groups = std::tuple_size_v<Groups>;  // 1: every parameter on the stage mesh
  // A stage's FSDP: with parameters on further meshes (a MoE's experts on (edp, ep, tp)), every
  // group sharded over its own mesh's data dimension(s), as fully_shard does for a whole model
  // (parallel/fsdp/parameter_groups.hpp): one policy for the experts, pipelined or not.
  using Fsdp =
      std::conditional_t<(groups > 1), FullyShardGroups<Stage, StageMesh, T, Space>, FullyShard<Stage, StageMesh, T>>;
  using Set = typename detail::ShardSet<T, Space, Groups, std::make_index_sequence<groups>>::type;

 public:
  /// `stages`: this rank's, in the order schedule.layout.stages_of(pipeline rank) names them.
  ShardedPipeline(const Mesh& mesh, Schedule schedule, std::vector<Stage> stages, FsdpOptions fsdp = {},
                  std::size_t bucket_bytes = std::size_t(1) << 20)
      : mesh_(mesh),
        bucket_bytes_(bucket_bytes),
        keep_gathered_(fsdp.stage == 3 && !fsdp.reshard_after_forward.value_or(schedule.layout.stages() == 1)),
        executor_(mesh, std::move(schedule), std::move(stages), ExecutorOptions{.hooks = stage_hooks()}),
        params_(shard_stages(fsdp)) {}
  ShardedPipeline(const ShardedPipeline&) = delete;  // the executor's hooks hold `this`
  ShardedPipeline& operator=(const ShardedPipeline&) = delete;

  /// Every parameter of this rank's stages (its FSDP shards; MoE: its experts on their mesh), for
  /// one optimizer (optim::make_adamw) over all.
  Set& params() noexcept { return params_; }
  Executor<Stage, Mesh>& executor() noexcept { return executor_; }
  /// The whole mesh, "pp" included (checkpoint/pipeline_state.hpp saves over it).
  const Mesh& mesh() const noexcept { return mesh_; }
  const StageMesh& stage_mesh() { return executor_.stages().front().mesh(); }
  Fsdp& fsdp(std::size_t local_stage) { return *shards_.at(local_stage); }
  void zero_grad() {
    for (auto& shard : shards_) shard->zero_grad();
  }

  /// One schedule over the micro-batches, then every gradient sync: the gradients of params()
  /// are the batch mean's, reduced on every data, context and tensor dimension.
  StepStats step(const typename Executor<Stage, Mesh>::Microbatches& microbatches) {
    StepStats stats = executor_.step(microbatches);
    finish_gradient_syncs();
    return stats;
  }

  /// The gradient syncs after the schedule (step() calls it): wait for FSDP's reductions (HSDP:
  /// then "dp"), all-reduce on the context and, under SP, the tensor dimension. Public for a
  /// caller that drives the stages itself (the dry run, models/training_plan.hpp: FSDP's
  /// unshard() before a stage's forward, reshard() and reduce_gradients() after its backward).
  void finish_gradient_syncs() {
    for (auto& shard : shards_) shard->finish_gradient_sync();
    const StageMesh& stage_mesh = executor_.stages().front().mesh();
    auto& shards = params_.template list<0>();
    context_parallel_grads(shards, stage_mesh, {.bucket_bytes = bucket_bytes_});  // none without "cp"
    sequence_parallel_grads(shards, stage_mesh, {.bucket_bytes = bucket_bytes_});  // none without SP
  }

  /// Clips every gradient of params() to `max_norm` by their one norm over all stages (and
  /// meshes); returns the norm.
  double clip_grad_norm(double max_norm) { return pipeline::clip_grad_norm(params_, mesh_.group(0), max_norm); }

  /// ZeRO-1/2: all-gathers the updated parameters into the stages (ZeRO-3: the next step does).
  void sync_parameters() {
    for (auto& shard : shards_) shard->sync_parameters();
  }

  /// ZeRO-3 keeps each stage gathered from its first forward to its last backward of a step
  /// (FsdpOptions::reshard_after_forward false), rather than gathering per unit and micro-batch.
  bool keeps_stages_gathered() const noexcept { return keep_gathered_; }

  /// What the executor's hooks do around local stage `local` (an index into executor().stages()),
  /// public for a caller that drives the stages itself (the dry run): before its first forward
  /// of a step, before its last backward (B or W), after it.
  void begin_stage(std::size_t local) {
    Fsdp& shard = *shards_.at(local);
    shard.set_requires_gradient_sync(false);  // the micro-batches before the last accumulate
    if (keep_gathered_) shard.unshard();
  }
  void begin_last_backward(std::size_t local) { shards_.at(local)->set_requires_gradient_sync(true); }
  void end_stage(std::size_t local) {
    Fsdp& shard = *shards_.at(local);
    if (keep_gathered_) shard.reshard();
    shard.reduce_gradients();  // a unit whose backward brought no gradient hook (none in a model's own units)
    shard.set_requires_gradient_sync(false);
  }

 private:
  /// Wraps each of the executor's stages with FSDP (the executor holds them from here on and
  /// does not move them: FSDP keeps references); returns every parameter of this rank's stages.
  Set shard_stages(FsdpOptions fsdp) {
    if (fsdp.reshard_after_forward.value_or(false) && fsdp.stage != 3)
      mesh_.comm().fail("pipeline::ShardedPipeline",
                        dtensor::detail::cat("reshard_after_forward needs ZeRO stage 3, not ", fsdp.stage));
    // Inside fully_shard: per unit (its hooks) or held by unshard() for the step (keep_gathered_).
    fsdp.reshard_after_forward = fsdp.stage == 3 ? std::optional<bool>(true) : std::nullopt;
    auto all = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<std::remove_cvref_t<decltype(std::declval<Set&>().template list<I>())>...>{};
    }(std::make_index_sequence<groups>{});
    for (Stage& stage : executor_.stages()) {
      shards_.push_back(std::make_unique<Fsdp>(stage, stage.mesh(), fsdp));
      shards_.back()->set_requires_gradient_sync(false);
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (append(std::get<I>(all), shard_list<I>(*shards_.back())), ...);
      }(std::make_index_sequence<groups>{});
    }
    // Each list with its mesh (the first stage's: every stage's meshes are the same).
    auto meshes = nn::parameter_groups(executor_.stages().front());
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return Set(nn::on(*std::get<I>(meshes).mesh, std::move(std::get<I>(all)))...);
    }(std::make_index_sequence<groups>{});
  }
  /// Group I's shards of one stage's FSDP.
  template <std::size_t I>
  static auto& shard_list(Fsdp& f) {
    if constexpr (groups > 1) return f.params().template list<I>();
    else return f.params();
  }
  template <class List>
  static void append(List& to, const List& from) {
    for (const auto& p : from) to.push_back(p);
  }

  /// begin_stage, begin_last_backward and end_stage at the schedule's edges of each stage.
  StageHooks stage_hooks() {
    return {.before_first_forward = [this](int stage) { begin_stage(local_of(stage)); },
            .before_last_backward = [this](int stage) { begin_last_backward(local_of(stage)); },
            .after_last_backward = [this](int stage) { end_stage(local_of(stage)); }};
  }
  std::size_t local_of(int stage) {
    auto& stages = executor_.stages();
    for (std::size_t i = 0; i < stages.size(); ++i)
      if (stages[i].index() == stage) return i;
    mesh_.comm().fail("pipeline::ShardedPipeline", dtensor::detail::cat("stage ", stage, " is not on this rank"));
  }

  Mesh mesh_;
  std::size_t bucket_bytes_;
  bool keep_gathered_;
  Executor<Stage, Mesh> executor_;
  std::vector<std::unique_ptr<Fsdp>> shards_;
  Set params_;
};

}  // namespace dtensor::parallel::pipeline
