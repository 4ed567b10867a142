// dtensor/train/trainer.hpp — the training step, written once: any layered model (nn::LayeredModel:
// the GPT, Llama, MoE-GPT, the ViT or a user's own) under pipeline, data (DDP, ZeRO-1/2/3, HSDP),
// context and tensor + sequence parallelism, with AdamW, clipping and a replica sync.
//
//   train::TrainerOptions o{.degrees = {.pp = 2, .fsdp = 2, .tp = 2}, .microbatches = 4, .zero = 3,
//                           .adamw = {.lr = 3e-3}};
//   train::Trainer<MyParts<float, train::StageMeshIn<>>> trainer(world, o, [&](const auto& stage_mesh) {
//     return MyParts<float, train::StageMeshIn<>>(stage_mesh, cfg);        // the model's parts on the stage mesh
//   });
//   for (...) {
//     auto r = trainer.step(trainer.microbatches(inputs, targets));    // inputs/targets: the whole batch, on every rank
//     r.loss;                                                          // the batch's mean loss, on every rank
//   }
//
// The mesh is (pp, dp, fsdp, cp, tp) (train/options.hpp); each rank builds only the parts of its
// own pipeline stages (parallel::pipeline::split), which parallel::pipeline::ShardedPipeline wraps
// with FSDP over "fsdp" (HSDP with "dp"; ZeRO-1 over a size-1 "fsdp" is DDP).
//
// One step (step()), every rank together:
//   1. zero the gradients; run the schedule over the micro-batches (activations and their
//      gradients between stages by send/recv; each unit's gradient reduce-scattered during the
//      last micro-batch's backward), then the gradient syncs on "dp" (HSDP), "cp", under SP
//      "tp", and the experts' "edp" (ShardedPipeline::step);
//   2. the replica sync (train/replica_sync.hpp: DDP, or local SGD, DiLoCo, async, FedAvg);
//   3. clip the gradients' norm over every stage and mesh (one all-reduce per group), AdamW (or
//      its moments offloaded to files), the replica sync's outer step when due, and ZeRO-1/2's
//      all-gather of the updated shards;
//   4. the loss, from the last stage's ranks to every rank (one all-reduce of one double on "pp").
// Construction: the model's parameters are deferred (TrainerOptions::deferred_init, default
// on; nn/flat_params.hpp): each rank draws only its FSDP shard of each unit's flat buffer
// (ZeRO-3) or its stage's full values (ZeRO-1/2, which keep them), never the other stages'.
// The dry run (models/training_plan.hpp) is this Trainer's step() on meta tensors over the sim
// communicator, with one micro-batch of the plan's schedule (TrainerOptions::one_microbatch) and a
// StepObserver that marks the report's phases and drives nothing: what the planner reports is
// what this builds and runs.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/checkpoint/pipeline_state.hpp"
#include "dtensor/checkpoint/sync_state.hpp"
#include "dtensor/optim/offload_adamw.hpp"
#include "dtensor/optim/param_set.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/sharded_pipeline.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "dtensor/train/options.hpp"
#include "dtensor/train/replica_sync.hpp"

namespace dtensor::train {

/// What one step did on this rank.
struct StepResult {
  double loss = 0;                          // the batch's mean loss (every rank)
  parallel::pipeline::StepStats stats{};    // this rank's schedule measurements (parallel/pipeline/executor.hpp)
  bool updated = true;                      // the optimizer stepped (a replica sync may wait: async, FedAvg)
};

/// Sees a step's points as they come and drives nothing (Trainer::step's observer; the dry run
/// marks its report's phases with it): each action of this rank's schedule before it runs, and
/// the end of the schedule, before the gradient syncs, the update and the loss.
struct StepObserver {
  parallel::pipeline::ActionObserver before_action{};
  std::function<void()> after_schedule{};
};

/// This rank's memory in one phase of training (Trainer::memory()): the trainer's own
/// allocations in the model's memory space (the allocation ledger, core/memory_ledger.hpp), what
/// it held when the phase began plus the most the phase added at once; the largest over every
/// time the phase ran.
struct MemoryPhase {
  std::string name;                                   // "construction", "forward", "backward", "optimizer"
  std::array<std::int64_t, memory_tag_count> peak{};  // by tag (MemoryTag's order)
  std::int64_t total = 0;                             // all tags together, at once
  std::int64_t of(MemoryTag t) const noexcept { return peak[std::size_t(t)]; }
};

namespace detail {
template <class List>
struct list_traits;
template <class T, std::size_t N, class S>
struct list_traits<nn::ParamList<T, N, S>> {
  using value_type = T;
  static constexpr std::size_t rank = N;
};
}  // namespace detail

/// The mesh for `degrees` over `world` (every rank together); a dtensor::Error naming the degrees
/// when their product is not the number of ranks (the same on every rank given the same degrees:
/// the Trainer agrees on its options first).
template <class Space = host_space>
MeshIn<Space> make_mesh(CommPtr world, const Degrees& degrees) {
  degrees.check(world->size(), world->rank());
  return MeshIn<Space>(std::move(world), degrees.shape());
}

/// Model: the model's parts on the stage mesh (an nn::LayeredModel); Master: the element type of
/// the master values, gradient shards and optimizer state (void: the model's own; float for a
/// bf16 model: FSDP's mixed precision).
template <class Model, class Master = void>
class Trainer {
 public:
  using StageMesh = std::remove_cvref_t<decltype(std::declval<const Model&>().mesh())>;
  using Space = mesh_space_t<StageMesh>;
  using Mesh = MeshIn<Space>;
  static_assert(std::is_same_v<StageMesh, StageMeshIn<Space>>,
                "train::Trainer: build the model on the trainer's stage mesh, train::StageMeshIn<Space> "
                "(DeviceMesh<\"dp\", \"fsdp\", \"cp\", \"tp\">), the one the constructor passes to make_model");
  using Stage = parallel::pipeline::Stage<Model>;
  using Pipeline = parallel::pipeline::ShardedPipeline<Stage, Mesh, Master>;
  using Microbatches = typename parallel::pipeline::Executor<Stage, Mesh>::Microbatches;
  using Params = std::remove_cvref_t<decltype(std::declval<Pipeline&>().params())>;
  using StageParams = std::remove_cvref_t<decltype(std::declval<Params&>().template list<0>())>;
  using T = typename detail::list_traits<StageParams>::value_type;  // the master element type
  using Adam = decltype(optim::make_adamw(std::declval<Params&>(), optim::AdamWOptions{}));
  static constexpr bool host = std::is_same_v<Space, host_space>;

  /// Every rank of `world` together: the mesh, the schedule, this rank's stages of
  /// `make_model(stage_mesh)`, FSDP, the optimizer and the replica sync.
  /// Every rank's options must be the same: one all-gather at the start (TrainerOptions::
  /// agree_and_check), so that ranks given different options fail together, naming the difference.
  template <class MakeModel>
  Trainer(CommPtr world, const TrainerOptions& o, MakeModel&& make_model)
      : Trainer(Agreed{}, make_mesh<Space>(agreed(std::move(world), o), o.degrees), o, std::forward<MakeModel>(make_model)) {}

  template <class MakeModel>
  Trainer(const Mesh& mesh, const TrainerOptions& o, MakeModel&& make_model)
      : Trainer(Agreed{}, agreed(mesh, o), o, std::forward<MakeModel>(make_model)) {}

 private:
  struct Agreed {};
  static CommPtr agreed(CommPtr world, const TrainerOptions& o) {
    o.agree_and_check(*world);
    return world;
  }
  static const Mesh& agreed(const Mesh& mesh, const TrainerOptions& o) {
    o.agree_and_check(mesh.comm());
    for (std::size_t d = 0; d < Mesh::ndim; ++d)
      if (mesh.size(d) != o.degrees.shape()[d])
        mesh.comm().fail("train::Trainer", dtensor::detail::cat("the mesh's \"", Mesh::names[d], "\" has ", mesh.size(d),
                                                              " ranks, the options' degrees ", o.degrees.shape()[d]));
    return mesh;
  }

  template <class MakeModel>
  Trainer(Agreed, const Mesh& mesh, const TrainerOptions& o, MakeModel&& make_model)
      : build_(), o_(o), mesh_(mesh), stage_mesh_(parallel::pipeline::stage_mesh_of(mesh)),
        pipeline_(mesh_, schedule_of(o_), build_stages(make_model, stage_mesh_, o_, mesh_),
                  {.stage = o_.zero_stage(), .reshard_after_forward = o_.reshard_after_forward,
                   .reduce_replicas = o_.sync.kind == parallel::sync::SyncKind::ddp,
                   .offload_params_dir = o_.offload_params_dir},
                  o_.bucket_bytes) {
    if (!o_.offload_optimizer_dir.empty() && o_.offload_buffer_sizer) {
      mesh_.comm().barrier();  // every rank's model built: a process's memory holds them all
      o_.offload_buffer_bytes = o_.offload_buffer_sizer();
      mesh_.comm().barrier();  // every rank sized its buffer before any allocates one
    }
    if (o_.offload_optimizer_dir.empty())
      adam_.emplace(optim::make_adamw(pipeline_.params(), o_.adamw));
    else if constexpr (host)
      offloaded_ = make_offloaded(std::make_index_sequence<Params::lists>{});
    else
      mesh_.comm().fail("train::Trainer", "an optimizer offloaded to files needs the model in host memory");
    if (o_.sync.kind != parallel::sync::SyncKind::ddp)
      sync_.emplace(stage_mesh_, pipeline_.params().template list<0>(), o_.sync);
    record_memory(0, *build_.ledger);
    build_.ledger.reset();  // the first member's: no scope opened since is still open
  }

 public:
  Trainer(const Trainer&) = delete;  // the pipeline's hooks and the optimizer hold references into it
  Trainer& operator=(const Trainer&) = delete;

  /// The micro-batches of one batch every rank holds whole (inputs and targets with the same
  /// first extent, a multiple of the micro-batches): each rank's pieces, no communication. With
  /// TrainerOptions::one_microbatch, the first of them only (what the step then runs).
  template <class E1, std::size_t N1, class E2, std::size_t N2>
  Microbatches microbatches(const Tensor<E1, N1>& inputs, const Tensor<E2, N2>& targets) const {
    auto all = parallel::pipeline::split_microbatches<typename Stage::Input, typename Stage::Target>(
        stage_mesh_, inputs, targets, o_.microbatches);
    if (o_.one_microbatch) all.erase(all.begin() + 1, all.end());
    return all;
  }

  /// One training step over `batch` (see the top of this file); every rank together.
  /// `observe` sees the step's points (StepObserver) and changes nothing it does.
  StepResult step(const Microbatches& batch, const StepObserver& observe = {}) {
    StepResult r;
    r.stats = run_schedule(batch, observe);
    r.updated = update();
    r.loss = shared_loss(r.stats);
    return r;
  }

  /// The schedule and the gradient syncs inside each replica (step's part 1). What the
  /// schedule allocates without a tag of its own (FSDP's buffers and the gradients have theirs)
  /// is the activations and their gradients: tagged so (MemoryTag::activations).
  parallel::pipeline::StepStats run_schedule(const Microbatches& batch, const StepObserver& observe = {}) {
    MemoryLedger ledger;
    pipeline_.zero_grad();
    parallel::pipeline::StepStats stats;
    {
      MemoryTagScope tag(MemoryTag::activations);
      // The executor measures its forward and its backward actions apart (the micro-batches
      // interleave them); its figures are above what was held when it began.
      const Held before_schedule = held_now(ledger);
      stats = pipeline_.executor().step(batch, observe.before_action);
      note_peak(1, before_schedule, stats.forward_memory.peak, stats.forward_memory.total);
      note_peak(2, before_schedule, stats.backward_memory.peak, stats.backward_memory.total);
      if (observe.after_schedule) observe.after_schedule();
      // The gradient syncs after the schedule finish the backward.
      const Held before_syncs = held_now(ledger);
      MemoryLedger syncs;
      pipeline_.finish_gradient_syncs();
      note_peak(2, before_syncs, peaks_of(syncs), syncs.peak(Space::name));
    }
    record_memory_held(ledger);
    return stats;
  }

  /// After the gradients of a step are complete (step's parts 2 and 3): the replica sync,
  /// clipping, the optimizer, the outer sync, ZeRO-1/2's parameter all-gather. Returns whether
  /// the optimizer stepped.
  bool update() {
    MemoryLedger ledger;
    const bool updates = update_unmeasured();
    record_memory(3, ledger);
    return updates;
  }

  /// This rank's memory by phase (MemoryPhase): construction (the model built as shards,
  /// FSDP, the optimizer), forward and backward (run_schedule: each of the schedule's actions
  /// counted in its kind's phase, FSDP's gathers in the forward, its reductions and the gradient
  /// syncs in the backward), optimizer (update). Peaks per rank; reduce them over the ranks to
  /// report the largest (train_gpt's summary does).
  const std::array<MemoryPhase, 4>& memory() const noexcept { return memory_; }

 private:
  bool update_unmeasured() {
    const bool updates = sync_ ? sync_->gradients_ready() : true;
    if ((sync_ ? sync_->clips(updates) : true) && o_.clip_norm > 0) pipeline_.clip_grad_norm(o_.clip_norm);
    if (updates) {
      if (adam_) adam_->step();
      else step_offloaded();
    }
    ++steps_;
    if (sync_) sync_->after_update(steps_);
    pipeline_.sync_parameters();
    return updates;
  }

  /// What the trainer holds at a moment, by tag and in all (its held_ plus what an open scope added).
  struct Held {
    std::array<std::int64_t, memory_tag_count> by_tag{};
    std::int64_t total = 0;
  };
  Held held_now(const MemoryLedger& open) const {
    Held h{held_, held_total_};
    for (std::size_t t = 0; t < memory_tag_count; ++t) h.by_tag[t] += open.current(Space::name, MemoryTag(t));
    h.total += open.current(Space::name);
    return h;
  }
  static std::array<std::int64_t, memory_tag_count> peaks_of(const MemoryLedger& ledger) {
    std::array<std::int64_t, memory_tag_count> p{};
    for (std::size_t t = 0; t < memory_tag_count; ++t) p[t] = ledger.peak(Space::name, MemoryTag(t));
    return p;
  }
  /// Phase i saw `base` plus at most `added` (by tag) and `added_total` (all tags at once).
  void note_peak(std::size_t i, const Held& base, const std::array<std::int64_t, memory_tag_count>& added,
                 std::int64_t added_total) {
    auto& p = memory_[i];
    for (std::size_t t = 0; t < memory_tag_count; ++t) p.peak[t] = std::max(p.peak[t], base.by_tag[t] + added[t]);
    p.total = std::max(p.total, base.total + added_total);
  }
  /// What a closed phase leaves held (a scope over it).
  void record_memory_held(const MemoryLedger& ledger) {
    for (std::size_t t = 0; t < memory_tag_count; ++t) held_[t] += ledger.current(Space::name, MemoryTag(t));
    held_total_ += ledger.current(Space::name);
  }
  /// Phase i's peaks from `ledger` (a scope over the phase) on top of what the trainer held.
  void record_memory(std::size_t i, const MemoryLedger& ledger) {
    note_peak(i, Held{held_, held_total_}, peaks_of(ledger), ledger.peak(Space::name));
    record_memory_held(ledger);
  }

 public:
  /// The loss of a step's statistics on every rank: it lives on the last stage's ranks, and the
  /// maximum over the pipeline group brings it to all (one all-reduce of one double).
  double shared_loss(const parallel::pipeline::StepStats& stats) {
    double loss = stats.loss.value_or(-std::numeric_limits<double>::infinity());
    mesh_.template group<"pp">().all_reduce(std::span<double>(&loss, 1), ReduceOp::max);
    return loss;
  }

  /// The mean loss over `batch` with the current parameters, through the same schedule; the
  /// gradients it makes are dropped.
  double evaluate(const Microbatches& batch) {
    pipeline_.zero_grad();
    const double loss = shared_loss(pipeline_.step(batch));
    pipeline_.zero_grad();
    return loss;
  }

  /// At the end of training: what a replica sync still has in flight lands.
  void finish() {
    if (sync_) sync_->finish();
  }

  // ---- checkpoints (checkpoint/pipeline_state.hpp; any mesh and schedule resumes them)

  /// Saves this rank's parameters (FSDP shards of its stages; MoE: its experts), the optimizer's
  /// moments and step count and `meta` at `dir`; with a replica sync other than DDP, every rank's
  /// own parameters, moments and sync state. Collective over the mesh.
  void save(const std::string& dir, checkpoint::TrainingMeta meta) {
    if (!sync_) {
      if (adam_) return checkpoint::save_pipeline_state(dir, pipeline_, *adam_, std::move(meta));
      if constexpr (host) {  // the moments read from the files for the save
        auto held = held_moments();
        return checkpoint::save_pipeline_state(dir, pipeline_, held, std::move(meta));
      }
    }
    auto own = sync_slots(sync_->settle());  // first: it refuses an offloaded optimizer
    auto slots = checkpoint::detail::pipeline_slots(pipeline_, *adam_);
    checkpoint::append(slots, std::move(own));
    const checkpoint::HostStaging<Space, T> staged(slots, true);
    meta.optimizer_steps = adam_->steps();
    checkpoint::save(dir, mesh_, slots, meta);
  }

  /// Loads what save() saved (the configuration must equal `config`) and returns its metadata;
  /// the step count continues from meta.step.
  checkpoint::TrainingMeta resume(const std::string& dir, const std::map<std::string, std::string>& config) {
    checkpoint::TrainingMeta meta;
    if (adam_) meta = checkpoint::load_pipeline_state(dir, pipeline_, *adam_, config);
    else if constexpr (host) {  // the moments through host memory, then back to the files
      auto held = held_moments();
      meta = checkpoint::load_pipeline_state(dir, pipeline_, held, config);
      store_moments(held);
    }
    steps_ = long(meta.step);
    if (sync_) {  // mid-round: each replica its own parameters and moments
      auto slots = sync_slots(sync_->resume_at(long(meta.step)));
      const checkpoint::HostStaging<Space, T> staged(slots, false);
      checkpoint::load_same_mesh(dir, mesh_, slots, {.config = config});
      staged.copy_back();
      adam_->set_steps(long(adamw_steps_));
      pipeline_.sync_parameters();
    }
    return meta;
  }

  // ---- what the trainer holds

  const Mesh& mesh() const noexcept { return mesh_; }
  const StageMesh& stage_mesh() const noexcept { return stage_mesh_; }
  const parallel::pipeline::Schedule& schedule() noexcept { return pipeline_.executor().schedule(); }
  const TrainerOptions& options() const noexcept { return o_; }
  Pipeline& pipeline() noexcept { return pipeline_; }
  std::vector<Stage>& stages() noexcept { return pipeline_.executor().stages(); }
  Params& params() noexcept { return pipeline_.params(); }
  /// The in-memory AdamW (empty with the optimizer offloaded).
  std::optional<Adam>& optimizer() noexcept { return adam_; }
  std::optional<ReplicaSync<T, StageMesh>>& replica_sync() noexcept { return sync_; }
  long steps() const noexcept { return steps_; }
  /// What the trainer's own allocations hold now on this rank (the model's shards, gradients,
  /// optimizer state, buffers it keeps), by tag and in all: the base of memory()'s phases.
  const std::array<std::int64_t, memory_tag_count>& held_by_tag() const noexcept { return held_; }
  std::int64_t held_total() const noexcept { return held_total_; }

  /// The model's parameter count: the global extents of every stage's parameters (the experts
  /// included), from the flat-group entries FSDP keeps, summed over the pipeline ranks. Every rank
  /// together: one all-reduce of one int64 on "pp".
  std::int64_t parameter_count() {
    std::int64_t n = 0;
    for (auto& stage : stages())
      nn::for_each_parameter(stage, [&](auto& p) {
        if (!p.defined()) return;
        std::int64_t elements = 1;
        for (Extent e : p.group()->entries()[p.index()].global_shape) elements *= std::int64_t(e);
        n += elements;
      });
    mesh_.template group<"pp">().all_reduce(std::span<std::int64_t>(&n, 1), ReduceOp::sum);
    return n;
  }

  /// The optimizer offload's disk traffic summed over this rank's offloaded optimizers.
  optim::OffloadStats offload_stats() const {
    optim::OffloadStats sum;
    std::apply(
        [&](const auto&... opt) {
          auto add = [&](const auto& p) {
            if (!p) return;
            const auto& s = p->stats();
            sum.bytes_read += s.bytes_read, sum.bytes_written += s.bytes_written, sum.io_seconds += s.io_seconds;
            sum.wait_seconds += s.wait_seconds, sum.step_seconds += s.step_seconds, sum.file_bytes += s.file_bytes;
            sum.chunks += s.chunks;
          };
          (add(opt), ...);
        },
        offloaded_);
    return sum;
  }

 private:
  static parallel::pipeline::Schedule schedule_of(const TrainerOptions& o) {
    auto s = parallel::pipeline::make_schedule(parallel::pipeline::parse_schedule_kind(o.schedule), o.degrees.pp,
                                               o.microbatches, o.stages_per_rank);
    return o.one_microbatch ? parallel::pipeline::one_microbatch(s) : s;
  }
  /// This rank's stages of `make_model(stage_mesh)`. With o.deferred_init (the default) the
  /// model is made inside an nn::DeferredInit scope: every parameter made from an nn::Init holds
  /// no memory until FSDP draws this rank's shard of its unit (parallel/fsdp/unit_state.hpp),
  /// so the construction peak is the sharded states, not the model; parameters made from values
  /// are built as before (nn/flat_params.hpp).
  template <class MakeModel>
  static std::vector<Stage> build_stages(MakeModel& make_model, const StageMesh& stage_mesh, const TrainerOptions& o,
                                         const Mesh& mesh) {
    nn::DeferredInit deferred(o.deferred_init);
    Model model = make_model(stage_mesh);
    MemoryTagScope tag(MemoryTag::parameters);
    return parallel::pipeline::split(model, schedule_of(o).layout, mesh.coordinate(0));
  }

  template <std::size_t... I>
  auto make_offloaded(std::index_sequence<I...>) {
    auto one = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
      using List = std::remove_cvref_t<decltype(pipeline_.params().template list<J>())>;
      using Opt = optim::OffloadedAdamW<typename detail::list_traits<List>::value_type, detail::list_traits<List>::rank>;
      return std::make_unique<Opt>(pipeline_.params().template list<J>(), o_.adamw,
                                   optim::OffloadOptions{.dir = o_.offload_optimizer_dir,
                                                         .host_buffer_bytes = o_.offload_buffer_bytes},
                                   &mesh_.comm());
    };
    return std::make_tuple(one(std::integral_constant<std::size_t, I>{})...);
  }
  template <std::size_t... I>
  static auto offloaded_type(std::index_sequence<I...>) {
    if constexpr (host)
      return std::tuple<std::unique_ptr<optim::OffloadedAdamW<
          typename detail::list_traits<std::remove_cvref_t<decltype(std::declval<Params&>().template list<I>())>>::value_type,
          detail::list_traits<std::remove_cvref_t<decltype(std::declval<Params&>().template list<I>())>>::rank>>...>{};
    else
      return std::tuple<>{};
  }
  using Offloaded = decltype(offloaded_type(std::make_index_sequence<Params::lists>{}));

  void step_offloaded() {
    std::apply([](auto&... opt) { (opt->step(), ...); }, offloaded_);
  }
  /// Every offloaded optimizer's moments in host memory, joined as make_adamw's optimizer is, so
  /// a checkpoint saves and loads them under AdamW's names (either kind resumes either).
  auto held_moments() {
    return std::apply(
        [](auto&... opt) { return optim::Joint<std::remove_cvref_t<decltype(opt->held_moments())>...>(opt->held_moments()...); },
        offloaded_);
  }
  template <class Joint>
  static void store_moments(Joint& held) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (held.template part<I>().store(), ...); }(
        std::make_index_sequence<Joint::parts>{});
  }
  /// A replica sync's checkpoint: this rank's own parameters, moments and step count, and the
  /// sync state (checkpoint/sync_state.hpp) — host memory, parameters on the stage mesh only.
  checkpoint::Slots<T> sync_slots(const std::vector<std::span<T>>& pending) {
    checkpoint::Slots<T> slots;
    if (!adam_)
      mesh_.comm().fail("train::Trainer", dtensor::detail::cat("a checkpoint with sync ", parallel::sync::to_string(o_.sync.kind),
                                                              " saves each rank's state with an AdamW in memory: not with "
                                                              "the optimizer offloaded to files"));
    if constexpr (host && Params::lists == 1) {
      slots = checkpoint::per_rank(checkpoint::detail::pipeline_slots(pipeline_, *adam_), mesh_);
      slots.push_back(checkpoint::count_slot("adamw.steps", adamw_steps_, adam_->steps(), mesh_));
      if (sync_->diloco()) checkpoint::append(slots, checkpoint::diloco_slots(*sync_->diloco(), mesh_));
      if (sync_->delayed()) checkpoint::append(slots, checkpoint::delayed_slots(*sync_->delayed(), pending, mesh_));
    } else {
      mesh_.comm().fail("train::Trainer", "checkpoints of a replica sync other than DDP need a model in host memory "
                                          "with every parameter on the stage mesh (no experts)");
    }
    return slots;
  }

  struct BuildLedger {  // the construction's ledger: opened first, closed at the end of the constructor
    std::optional<MemoryLedger> ledger;
    BuildLedger() { ledger.emplace(); }
  };
  BuildLedger build_;  // first: it sees every member's allocations
  std::array<MemoryPhase, 4> memory_{MemoryPhase{"construction"}, MemoryPhase{"forward"}, MemoryPhase{"backward"},
                                     MemoryPhase{"optimizer"}};
  std::array<std::int64_t, memory_tag_count> held_{};  // what the trainer holds now, by tag ...
  std::int64_t held_total_ = 0;                        // ... and in all
  TrainerOptions o_;
  Mesh mesh_;
  StageMesh stage_mesh_;
  Pipeline pipeline_;
  std::optional<Adam> adam_;
  Offloaded offloaded_{};
  std::optional<ReplicaSync<T, StageMesh>> sync_;
  long steps_ = 0;
  T adamw_steps_ = 0;  // a replica sync's checkpoint: this rank's AdamW step count (FedAvg: only sampled clients step)
};

}  // namespace dtensor::train
