// dtensor/parallel/pipeline/executor.hpp — runs a validated schedule over this rank's stages.
//
//   DeviceMesh<"pp", "dp", "tp"> mesh(world, {pp, dp, tp});
//   auto stage_mesh = pipeline::stage_mesh_of(mesh);                      // DeviceMesh<"dp", "tp">
//   auto schedule = pipeline::make_schedule(pipeline::ScheduleKind::one_f_one_b, pp, M);
//   auto stages = pipeline::split(models::GptParts<double, decltype(stage_mesh)>(stage_mesh, cfg),
//                                 schedule.layout, mesh.coordinate(0));   // this rank's, in order (split.hpp)
//   pipeline::Executor exec(mesh, schedule, std::move(stages));           // validates the schedule
//   auto stats = exec.step(pipeline::split_microbatches<Ids>(stage_mesh, ids, targets, M));
//   if (stats.loss) ...                                                   // on the ranks of the last stage
//
// Each pipeline rank (coordinate of the mesh's first dimension, whose role must be
// Role::pipeline) runs its list of the schedule in order, with the meaning the validator and
// the simulator give the actions (simulate.hpp): RECV posts a receive (recv_from_async) and
// returns; the F, B or I that uses the data waits for it just before it computes; SEND starts an
// asynchronous send (send_to) and returns, so it overlaps the computations after it; sends are
// waited for at the end of the step (finished ones are dropped as the step goes on). Activations
// (the stage's activation_shape) go forward and their gradients backward only by these messages between the stage
// meshes of two pipeline coordinates, each rank to the rank at its own coordinate of the other
// stage mesh (distributed/transfer.hpp): with data and tensor parallelism inside the stages
// (pp x dp x tp), every (dp, tp) rank has its own message. Stages on the same rank hand over
// locally. The loss of each micro-batch is differentiated with weight 1/M, so the gradients are
// those of the mean over the batch, and the step's loss is the sum of the micro-batches' losses
// over M: with micro-batches of equal size, the batch mean (one full_tensor per micro-batch on
// the last stage's mesh, after the schedule). Gradients accumulate over the micro-batches; their
// data-parallel reduction, clipping and the optimizer are the caller's (clip.hpp for the norm
// over all stages).
//
// StageHooks run a caller's function at the edges of each local stage's share of a step: before
// its first forward, before its last backward (B or W) and after it, in this rank's list — where
// FSDP inside a stage unshards (when it keeps the stage gathered for the step), turns its
// per-unit gradient reduction on for the last micro-batch's backward, and reshards and reduces
// what is left (pipeline/sharded_pipeline.hpp; docs/fsdp.md, "FSDP inside pipeline stages").
//
// Measured per rank: the activations and weight contexts held after each action (to compare
// with the validator's memory report), wall time and time spent waiting for messages, and —
// with count_slots — the idle fraction in counted slots: every computation takes its cost in
// slots (Costs: F, I, W, B = I + W), a computation that uses a message starts no earlier than
// the slot in which its sender sent it, which travels with the data as a second small message;
// one all-reduce (max) over the pipeline group gives the step's length. This is the simulator's
// clock driven by the real run's messages: on a real run it gives what the schedule promises
// whatever the noise of the machine.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/core/factories.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/distributed/settings_agreement.hpp"
#include "dtensor/distributed/transfer.hpp"
#include "dtensor/mesh/roles.hpp"
#include "dtensor/parallel/pipeline/simulate.hpp"
#include "dtensor/parallel/pipeline/stage.hpp"
#include "dtensor/parallel/pipeline/validate.hpp"

namespace dtensor::parallel::pipeline {

namespace detail {
/// The name of dimension `I` of a mesh, as a template argument. Read from Mesh::names rather than
/// deduced from BasicDeviceMesh<Space, Names...>: nvcc 13 does not deduce a pack of fixed_string
/// arguments in a partial specialization or a function template (the pipeline compiles as .cu).
template <class Mesh, std::size_t I>
struct dimension_name {
  static constexpr std::size_t size = Mesh::names[I].size() + 1;
  static constexpr fixed_string<size> name = [] {
    char text[size]{};
    for (std::size_t k = 0; k + 1 < size; ++k) text[k] = Mesh::names[I][k];
    return fixed_string<size>(text);
  }();
};
template <class Mesh>
using first_dimension = dimension_name<Mesh, 0>;

template <class Mesh, std::size_t... Rest>
auto sub_mesh_without_first(const Mesh& mesh, std::index_sequence<Rest...>) {
  return mesh.template sub<dimension_name<Mesh, Rest + 1>::name...>();
}
}  // namespace detail

/// The mesh of this rank's pipeline stage: every dimension of `mesh` but its first (the
/// pipeline dimension).
template <MeshType Mesh>
auto stage_mesh_of(const Mesh& mesh) {
  static_assert(Mesh::ndim >= 2, "a pipeline mesh has a pipeline dimension and a stage mesh");
  static_assert(role_of<Mesh>(0) == Role::pipeline,
                "the first mesh dimension must be the pipeline dimension (\"pp\", or one named so by mesh_roles)");
  return detail::sub_mesh_without_first(mesh, std::make_index_sequence<Mesh::ndim - 1>{});
}

/// The (pp, dp, tp) shape of a mesh of `ranks` ranks with `pipeline` stages and `tensor`-way
/// tensor parallelism: the rest is data parallelism. An error unless pp x tp divides the ranks.
inline std::array<int, 3> pipeline_mesh_shape(int ranks, int pipeline, int tensor) {
  if (pipeline < 1 || tensor < 1 || ranks % (pipeline * tensor) != 0)
    throw Error("pipeline::pipeline_mesh_shape",
                dtensor::detail::cat("--pp ", pipeline, " x --tp ", tensor, " = ", pipeline * tensor, " does not divide the ",
                                     ranks, " ranks: the ranks must be a multiple of pp x tp"));
  return {pipeline, ranks / (pipeline * tensor), tensor};
}

/// The M micro-batches of one batch tensor every rank holds whole (any element type and rank,
/// on the host): consecutive slices of B / M along its first dimension, each moved into the
/// mesh's memory space (a copy to the GPU on a cuda mesh) and distributed on `mesh` in D's
/// layout (no communication). M must divide B: the executor weights every micro-batch's loss
/// 1/M, which is the batch mean only when they are the same size (an error otherwise; a batch
/// that does not divide is the caller's to trim or pad).
template <class D, MeshType Mesh, class E, std::size_t N>
std::vector<D> split_microbatches(const Mesh& mesh, const Tensor<E, N>& batch, int microbatches) {
  constexpr const char* op = "pipeline::split_microbatches";
  static_assert(std::is_same_v<typename D::value_type, E> && D::rank == N,
                "pipeline::split_microbatches: the batch tensor's element type and rank must be the DTensor's");
  const Extent rows = batch.shape()[0];
  if (microbatches < 1 || rows % microbatches != 0)
    mesh.comm().fail(op, dtensor::detail::cat(microbatches, " micro-batches do not divide the batch ", dtensor::to_string(batch.shape()),
                                              ": its first extent must be a multiple of the micro-batches"));
  Shape<N> piece = batch.shape();
  piece[0] = rows / microbatches;
  const Extent step = numel(piece);
  std::vector<D> result;
  result.reserve(std::size_t(microbatches));
  for (int mb = 0; mb < microbatches; ++mb) {
    Tensor<E, N> slice(view_of<N>(batch, mb * step, piece));  // a copy of the rows
    result.push_back(distribute_replicated<typename D::layout>(mesh, into_space<mesh_space_t<Mesh>>(std::move(slice))));
  }
  return result;
}

/// The M micro-batches of a batch of inputs and targets (each any element type and rank, the
/// same first extent): pairs of the two splits above. Input [B, T] token ids with targets
/// [B, T] (a language model), or [B, ...] samples with [B] labels (a classifier).
template <class Input, class Target = Input, MeshType Mesh, class E1, std::size_t N1, class E2, std::size_t N2>
std::vector<std::pair<Input, Target>> split_microbatches(const Mesh& mesh, const Tensor<E1, N1>& inputs,
                                                         const Tensor<E2, N2>& targets, int microbatches) {
  if (inputs.shape()[0] != targets.shape()[0])
    mesh.comm().fail("pipeline::split_microbatches", "inputs " + dtensor::to_string(inputs.shape()) + " and targets " +
                                                         dtensor::to_string(targets.shape()) + " differ in their first extent");
  auto in = split_microbatches<Input>(mesh, inputs, microbatches);
  auto out = split_microbatches<Target>(mesh, targets, microbatches);
  std::vector<std::pair<Input, Target>> result;
  for (std::size_t i = 0; i < in.size(); ++i) result.emplace_back(std::move(in[i]), std::move(out[i]));
  return result;
}

/// What runs at the edges of each local stage's share of a step, given the stage's index: FSDP
/// inside a stage unshards its parameters before the stage's first forward and reshards them and
/// reduces its gradients after its last backward (PyTorch's UNSHARD / RESHARD actions, placed
/// where the schedule first and last touches the stage). Empty ones are skipped.
struct StageHooks {
  std::function<void(int)> before_first_forward;
  std::function<void(int)> before_last_backward;  // before the stage's last B or W of the step
  std::function<void(int)> after_last_backward;   // after it
};

/// Called before each action of this rank's list in a step (Executor::step): an observer that
/// drives nothing (the dry run marks its phases with it, models/training_plan.hpp).
using ActionObserver = std::function<void(const Action&)>;

struct ExecutorOptions {
  bool count_slots = true;  // send the slot clock with every message, one all-reduce per step
  Costs costs{};            // slots per computation, for the counted idle fraction
  StageHooks hooks{};
};

/// The most a rank's schedule held at once during one kind of action, above what it held when
/// the step began: the allocation ledger's bytes (core/memory_ledger.hpp) in the mesh's memory
/// space, by tag and all tags together.
struct PhaseMemory {
  std::array<std::int64_t, memory_tag_count> peak{};
  std::int64_t total = 0;
};

/// What one step measured on this rank.
struct StepStats {
  std::optional<double> loss;               // the batch's mean loss, on the ranks of the last stage
  std::vector<int> saved_after;             // activations held after each action of this rank's list
  std::vector<int> weight_pending_after;    // weight contexts held (I run, W not yet) after each action
  double busy_slots = 0, makespan_slots = 0;  // count_slots: this rank's computing slots, the step's length
  double wall_seconds = 0, wait_seconds = 0;  // the step, and the time spent waiting for messages
  // Memory during the forward actions (F, SEND_F, RECV_F, and FSDP's gathers before a stage's
  // first forward) and during the backward ones (B, I, W, SEND_B, RECV_B, FSDP's reductions after
  // a stage's last backward): the micro-batches interleave the two, so each action is measured
  // apart and counted in its kind's phase.
  PhaseMemory forward_memory{}, backward_memory{};

  int peak_saved() const { return saved_after.empty() ? 0 : *std::max_element(saved_after.begin(), saved_after.end()); }
  /// The share of the step's slots this rank did not compute (count_slots).
  double idle_fraction() const { return makespan_slots > 0 ? 1 - busy_slots / makespan_slots : 0; }
};

template <class Stage, MeshType Mesh>
class Executor {
  static_assert(require_stage<Stage>());  // the stage protocol: parallel/pipeline/stage.hpp

 public:
  using X = typename Stage::X;
  using Input = typename Stage::Input;
  using Target = typename Stage::Target;
  using Microbatches = std::vector<std::pair<Input, Target>>;  // each micro-batch's input and target
  using StageMesh = std::remove_cvref_t<decltype(std::declval<const Stage&>().mesh())>;

  /// `stages`: this rank's stages, those schedule.layout.stages_of(pipeline coordinate) names,
  /// in that order. Throws if the schedule breaks a rule (asynchronous sends), or does not fit
  /// the mesh or the stages.
  Executor(const Mesh& mesh, Schedule schedule, std::vector<Stage> stages, ExecutorOptions options = {})
      : mesh_(mesh), schedule_(std::move(schedule)), stages_(std::move(stages)), options_(options) {
    constexpr const char* op = "pipeline::Executor";
    static_assert(role_of<Mesh>(0) == Role::pipeline, "the first mesh dimension must be the pipeline dimension");
    agree_on_schedule(op);  // first: the checks below would fail on some ranks only
    if (schedule_.ranks() != mesh.size(0))
      mesh.comm().fail(op, dtensor::detail::cat("the schedule is for ", schedule_.ranks(), " pipeline ranks, the mesh's \"",
                                                Mesh::names[0], "\" dimension has ", mesh.size(0)));
    memory_ = validate(schedule_, {.sends = SendMode::asynchronous});
    const std::vector<int> mine = schedule_.layout.stages_of(pipeline_rank());
    if (stages_.size() != mine.size())
      mesh.comm().fail(op, dtensor::detail::cat("pipeline rank ", pipeline_rank(), " holds ", mine.size(),
                                                " stages in this layout, got ", stages_.size()));
    for (std::size_t i = 0; i < mine.size(); ++i)
      if (stages_[i].index() != mine[i])
        mesh.comm().fail(op, dtensor::detail::cat("pipeline rank ", pipeline_rank(), ": stage ", i, " is stage ",
                                                  stages_[i].index(), ", the layout puts stage ", mine[i], " here"));
    // Where each local stage's share of a step begins (its first F) and ends (its last B or W).
    const auto& list = schedule_.actions[std::size_t(pipeline_rank())];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.kind == ActionKind::forward && !first_forward_.contains(a.stage)) first_forward_[a.stage] = i;
      if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight) last_backward_[a.stage] = i;
    }
  }

  int pipeline_rank() const { return mesh_.coordinate(0); }
  const Schedule& schedule() const noexcept { return schedule_; }
  /// The validator's memory report of the schedule (every rank's).
  const MemoryReport& memory() const noexcept { return memory_; }
  std::vector<Stage>& stages() noexcept { return stages_; }

  /// Runs this rank's list once over the M micro-batches (each an input and a target on the
  /// stage mesh, e.g. from split_microbatches): forwards, backwards, messages; weight gradients added to the parameters.
  /// `before_action`, when given, sees each action before it runs (before FSDP's hooks around it).
  StepStats step(const Microbatches& microbatches, const ActionObserver& before_action = {}) {
    constexpr const char* op = "pipeline::Executor::step";
    const int m = schedule_.microbatches;
    if (int(microbatches.size()) != m)
      mesh_.comm().fail(op, dtensor::detail::cat("the schedule runs ", m, " micro-batches, got ", microbatches.size()));
    const auto start = std::chrono::steady_clock::now();
    Run run(*this, microbatches);
    const auto& list = schedule_.actions[std::size_t(pipeline_rank())];
    const std::string_view space = mesh_space_t<Mesh>::name;
    MemoryLedger step_ledger;  // what the step holds, action by action
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& action = list[i];
      const bool forward = action.kind == ActionKind::forward || action.kind == ActionKind::send_forward ||
                           action.kind == ActionKind::recv_forward;
      PhaseMemory& phase = forward ? run.stats.forward_memory : run.stats.backward_memory;
      std::array<std::int64_t, memory_tag_count> held{};
      for (std::size_t t = 0; t < memory_tag_count; ++t) held[t] = step_ledger.current(space, MemoryTag(t));
      const std::int64_t held_total = step_ledger.current(space);
      {
        MemoryLedger action_ledger;
        if (before_action) before_action(action);
        if (options_.hooks.before_first_forward && is_at(first_forward_, action.stage, i))
          options_.hooks.before_first_forward(action.stage);
        if (options_.hooks.before_last_backward && is_at(last_backward_, action.stage, i))
          options_.hooks.before_last_backward(action.stage);
        run.execute(action);
        if (options_.hooks.after_last_backward && is_at(last_backward_, action.stage, i))
          options_.hooks.after_last_backward(action.stage);
        for (std::size_t t = 0; t < memory_tag_count; ++t)
          phase.peak[t] = std::max(phase.peak[t], held[t] + action_ledger.peak(space, MemoryTag(t)));
        phase.total = std::max(phase.total, held_total + action_ledger.peak(space));
      }
      // A sent tensor is freed once its send finished: at once in a dry run (the sim backend has
      // no peer), when the peer takes the data in a real one.
      run.drop_finished_sends();
      int saved = 0, pending = 0;
      for (const Stage& stage : stages_) saved += int(stage.saved_count()), pending += int(stage.weight_pending_count());
      run.stats.saved_after.push_back(saved);
      run.stats.weight_pending_after.push_back(pending);
    }
    run.wait_sends();
    for (Stage& stage : stages_)
      if (stage.is_last()) {
        double total = 0;
        // The loss is one number in the mesh's space: read on the host (a copy from a GPU). Meta
        // tensors (a dry run) have no values: the same collectives, a loss of 0.
        for (int mb = 0; mb < m; ++mb) {
          const auto loss = full_tensor(stage.take_loss(mb));
          if constexpr (!std::is_same_v<mesh_space_t<Mesh>, meta_space>) total += to_space<host_space>(loss)[0];
        }
        run.stats.loss = total / double(m);
      }
    if constexpr (requires(Stage& s) { s.take_auxiliary_loss(0); })
      if (schedule_.layout.stages() > 1) add_auxiliary_losses(run.stats);  // one stage: all in its loss
    if (options_.count_slots) {
      double end = run.clock;
      mesh_.group(0).all_reduce(std::span<double>(&end, 1), ReduceOp::max);
      run.stats.makespan_slots = end;
    }
    run.stats.wall_seconds = seconds_since(start);
    return std::move(run.stats);
  }

 private:
  using Clock = std::chrono::steady_clock;

  /// Every rank of the mesh must run the same schedule: ranks built with another schedule or
  /// micro-batch count would pair sends with the wrong receives (a hang, a truncation, or a
  /// silently wrong gradient). One all-gather at setup, in every build
  /// (distributed/settings_agreement.hpp), names what differs and which ranks hold what.
  void agree_on_schedule(const char* op) {
    std::uint64_t h = 14695981039346656037ull;  // FNV-1a over every rank's action list
    std::size_t count = 0;
    for (const auto& list : schedule_.actions) {
      for (const Action& a : list) {
        for (int v : {a.stage, int(a.kind), a.microbatch}) h = (h ^ std::uint64_t(std::uint32_t(v))) * 1099511628211ull;
        ++count;
      }
      h = (h ^ 0xffu) * 1099511628211ull;  // end of a rank's list
    }
    const auto& l = schedule_.layout;
    require_same_settings(mesh_.comm(), op,
                          {{"pipeline ranks", dtensor::detail::cat(l.ranks)},
                           {"stages", dtensor::detail::cat(l.stages())},
                           {"micro-batches", dtensor::detail::cat(schedule_.microbatches)},
                           {"schedule (actions)", dtensor::detail::cat(count, " actions, hash ", h)}});
  }

  /// MoE: the auxiliary losses of the stages other than the last, which their forwards kept, into
  /// the step's loss: this rank's shares summed over the stage mesh's data and context dimensions (as
  /// full_tensor sums the loss's), then over the pipeline ranks (one all-reduce of one double
  /// on each; every rank takes part).
  void add_auxiliary_losses(StepStats& stats) {
    double extra = 0;
    for (Stage& stage : stages_)
      if (!stage.is_last())
        for (int mb = 0; mb < schedule_.microbatches; ++mb) extra += stage.take_auxiliary_loss(mb);
    const StageMesh& stage_mesh = stages_.front().mesh();
    for (std::size_t dim = 0; dim < StageMesh::ndim; ++dim)
      if (is_data_dim<StageMesh>(dim) || role_of<StageMesh>(dim) == Role::context)  // shares of the tokens
        stage_mesh.group(dim).all_reduce(std::span<double>(&extra, 1), ReduceOp::sum);
    mesh_.group(0).all_reduce(std::span<double>(&extra, 1), ReduceOp::sum);
    if (stats.loss) *stats.loss += extra / double(schedule_.microbatches);
  }

  static bool is_at(const std::map<int, std::size_t>& positions, int stage, std::size_t i) {
    auto found = positions.find(stage);
    return found != positions.end() && found->second == i;
  }
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  struct Incoming {
    PendingRecv<X> data;
    std::unique_ptr<double> sent_at;  // the sender's slot clock (count_slots)
    Work sent_at_work;
  };
  struct Outgoing {
    X data;
    Work work;
    std::unique_ptr<double> sent_at;
    Work sent_at_work;
    bool done() { return work.test() && sent_at_work.test(); }
  };

  /// The state of one step.
  struct Run {
    Run(Executor& executor, const Microbatches& batches) : exec(executor), microbatches(batches) {}

    Executor& exec;
    const Microbatches& microbatches;
    StepStats stats{};
    double clock = 0;                          // slots, count_slots
    std::map<Action, Incoming> incoming;       // keyed by the RECV
    std::map<std::pair<int, int>, X> outputs;  // (stage, mb): a forward's output, to send or hand over
    std::map<std::pair<int, int>, X> input_grads;  // (stage, mb): a backward's input gradient
    std::deque<Outgoing> outgoing;

    Stage& stage(int index) {
      for (Stage& s : exec.stages_)
        if (s.index() == index) return s;
      exec.mesh_.comm().fail("pipeline::Executor", dtensor::detail::cat("stage ", index, " is not on this rank"));
    }
    int tag(const Action& message) const {
      // The sending stage, the direction and the micro-batch name a message; even tags carry data, odd ones the clock.
      const Action send = is_send(message.kind) ? message : counterpart(message);
      const int direction = send.kind == ActionKind::send_backward ? 1 : 0;
      return 2 * ((send.stage * 2 + direction) * exec.schedule_.microbatches + send.microbatch);
    }
    MeshRanks<StageMesh::ndim> peer(const Action& message) const {
      return exec.mesh_.template slice<detail::first_dimension<Mesh>::name>(exec.schedule_.layout.rank_of(counterpart(message).stage));
    }
    X take(std::map<std::pair<int, int>, X>& from, int stage, int mb) {
      auto found = from.find({stage, mb});
      if (found == from.end())
        exec.mesh_.comm().fail("pipeline::Executor", dtensor::detail::cat("no tensor of stage ", stage, " micro-batch ", mb));
      X x = std::move(found->second);
      from.erase(found);
      return x;
    }
    /// The received tensor of `recv`, waited for now; the clock moves to its send's slot.
    X receive(const Action& recv) {
      auto found = incoming.find(recv);
      if (found == incoming.end())
        exec.mesh_.comm().fail("pipeline::Executor", "no receive posted for " + to_string(recv));
      const auto start = Clock::now();
      X x = found->second.data.take();
      found->second.sent_at_work.wait();
      stats.wait_seconds += seconds_since(start);
      if (found->second.sent_at) clock = std::max(clock, *found->second.sent_at);
      incoming.erase(found);
      return x;
    }
    /// F's input: the previous stage's output, handed over here or received.
    std::optional<X> forward_input(const Action& f) {
      if (f.stage == 0) return std::nullopt;
      if (exec.schedule_.layout.rank_of(f.stage - 1) == exec.pipeline_rank()) return take(outputs, f.stage - 1, f.microbatch);
      return receive({f.stage, ActionKind::recv_forward, f.microbatch});
    }
    /// B's or I's output gradient: the next stage's input gradient, handed over here or received.
    std::optional<X> output_gradient(const Action& b) {
      if (b.stage + 1 == exec.schedule_.layout.stages()) return std::nullopt;
      if (exec.schedule_.layout.rank_of(b.stage + 1) == exec.pipeline_rank())
        return take(input_grads, b.stage + 1, b.microbatch);
      return receive({b.stage, ActionKind::recv_backward, b.microbatch});
    }
    void compute(const Action& action) { clock += exec.options_.costs.of(action.kind), stats.busy_slots += exec.options_.costs.of(action.kind); }

    void execute(const Action& action) {
      const int mb = action.microbatch;
      const double dloss = 1.0 / double(exec.schedule_.microbatches);
      switch (action.kind) {
        case ActionKind::forward: {
          auto x = forward_input(action);
          const auto& [input, target] = microbatches[std::size_t(mb)];
          auto y = stage(action.stage).forward(mb, std::move(x), input, target);
          if (y) outputs.emplace(std::pair{action.stage, mb}, std::move(*y));
          compute(action);
          break;
        }
        case ActionKind::backward:
        case ActionKind::backward_input: {
          auto dy = output_gradient(action);
          Stage& s = stage(action.stage);
          auto dx = action.kind == ActionKind::backward ? s.backward(mb, std::move(dy), dloss)
                                                        : s.backward_input(mb, std::move(dy), dloss);
          if (dx) input_grads.emplace(std::pair{action.stage, mb}, std::move(*dx));
          compute(action);
          break;
        }
        case ActionKind::backward_weight:
          stage(action.stage).backward_weight(mb);
          compute(action);
          break;
        case ActionKind::send_forward:
        case ActionKind::send_backward: {
          auto& source = action.kind == ActionKind::send_forward ? outputs : input_grads;
          Outgoing out{take(source, action.stage, mb), Work(), nullptr, Work()};
          const auto to = peer(action);
          out.work = send_to(out.data, to, tag(action));
          if (exec.options_.count_slots) {
            out.sent_at = std::make_unique<double>(clock);
            out.sent_at_work = exec.mesh_.root().send_async(std::span<const double>(out.sent_at.get(), 1),
                                                            to.root_rank_at(stage(action.stage).mesh().coordinate()), tag(action) + 1);
          }
          outgoing.push_back(std::move(out));
          break;
        }
        case ActionKind::recv_forward:
        case ActionKind::recv_backward: {
          const Stage& s = stage(action.stage);
          const auto from = peer(action);
          const auto shape = s.activation_shape(microbatches[std::size_t(mb)].first);
          Incoming in{recv_from_async<typename X::layout, typename X::value_type>(s.mesh(), from, shape, tag(action)), nullptr,
                      Work()};
          if (exec.options_.count_slots) {
            in.sent_at = std::make_unique<double>(0);
            in.sent_at_work = exec.mesh_.root().recv_async(std::span<double>(in.sent_at.get(), 1),
                                                           from.root_rank_at(s.mesh().coordinate()), tag(action) + 1);
          }
          incoming.emplace(action, std::move(in));
          break;
        }
      }
    }
    void drop_finished_sends() {
      while (!outgoing.empty() && outgoing.front().done()) outgoing.pop_front();
    }
    void wait_sends() {
      const auto start = Clock::now();
      for (Outgoing& out : outgoing) out.work.wait(), out.sent_at_work.wait();
      outgoing.clear();
      stats.wait_seconds += seconds_since(start);
    }
  };

  Mesh mesh_;
  Schedule schedule_;
  std::vector<Stage> stages_;
  ExecutorOptions options_;
  MemoryReport memory_;
  std::map<int, std::size_t> first_forward_, last_backward_;  // local stage -> position in this rank's list
};

}  // namespace dtensor::parallel::pipeline
