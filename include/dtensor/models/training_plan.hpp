// dtensor/models/training_plan.hpp — one training step of a GPT or Llama plan, dry: the real step
// on meta tensors over the sim communicator, once per rank class (sim/dry_run.hpp).
//
//   models::TrainingPlan plan{.model = {.vocab = 128256, .seq = 8192, .dim = 16384, .heads = 128,
//                                    .layers = 126, .kv_heads = 8, .ffn = 53248},
//                          .batch = 2048, .microbatches = 16, .dp = 128, .tp = 8, .pp = 16};
//   auto classes = models::dry_run_plan<bfloat16, models::LlamaLayers, /*SP=*/true>(plan);
//   classes[0].report.to_table();  classes[0].peak_in_flight;   // bytes with the schedule's micro-batches
//
// Two programs, the trainer's (examples/train_gpt.cpp): mesh (pp, dp, fsdp, cp, tp); each pipeline
// rank builds its stages (parallel::pipeline::split of models::GptParts: embedding on the first, head
// on the last, its share of the blocks, uneven splits as stage_layers gives; one stage at pp 1)
// and runs the train::Trainer's own step (Trainer::step: the executor's schedule, FSDP's actions,
// the gradient syncs, clipping, AdamW) on meta tensors, with one micro-batch of the plan's
// schedule (TrainerOptions::one_microbatch: each rank's forwards, then its backwards), the
// report's phases marked by an observer that drives nothing (phase_observer).
//
//   zero == 0 (DDP)           mesh (pp, dp, 1, cp, tp): the trainer's ZeRO-1 over a size-1
//                             "fsdp" (the data ranks replicas on "dp", gradients all-reduced there),
//                             the sequence-parallel sync, clipping across stages and AdamW (a bf16
//                             model: fp32 master and moments, sim::as_run, unless bf16_moments).
//   zero 1..3 (FSDP)          mesh (pp, hsdp, dp / hsdp, cp, tp): the stages under
//                             parallel::pipeline::ShardedPipeline with fp32 master values, gradient
//                             shards and AdamW state (the model computes in T), HSDP when hsdp > 1,
//                             FSDP's actions around each stage the trainer's executor's (begin_stage,
//                             begin_last_backward, end_stage): at pp 1 ZeRO-3 gathers and reshards
//                             each unit.
//
// MoE (plan.moe.router.experts > 0, Layers = models::MoELayers over MetaMesh<"edp", "ep", "tp">): the
// pipeline program, the experts on the expert mesh over each stage's ranks (ep of them splitting
// the experts, as the trainer's), sharded over "edp" at the plan's ZeRO stage (ShardedPipeline's
// FullyShardGroups: DDP's experts are ZeRO-1 there), in the one AdamW.
// Routing is the balanced one a dry run assumes (nn::route_balanced): every expert gets its
// share of every rank's tokens, each token's choices within its M groups under group-limited
// routing (moe.router.groups, topk_groups). Any number of experts over any ep dividing dp x cp, as the
// runtime (parallel/experts.hpp: chunk_range, 5 over 2 is 3 + 2; fewer experts than ep leaves
// ranks without one): an expert rank holds, computes and receives for its share, so uneven shares
// are rank classes of their own (below) and the plan's per-rank figures are the largest share's.
//
// Rank classes: pipeline ranks by what their stages hold (first / last, layers per stage), the
// data dimensions by their chunk of the micro-batch, the tensor dimension by its heads; with
// experts that do not divide over ep, also by the expert rank's share (its ep coordinate is its
// position among the stage's data x context ranks modulo ep: parallel::make_expert_mesh). The
// phases are those the cost model reads ("forward" and "backward" are one micro-batch of this
// rank's stages); the last, "after step" (no work), starts with what the step leaves held. The activations of the micro-batches a schedule keeps in flight are not run:
// peak_in_flight adds (in flight - 1) times one micro-batch's saved activations per stage to the
// run's peak (the schedule's count for this pipeline rank, parallel/pipeline/validate.hpp).
// Zero-bubble schedules (ZB-H1, ZB-V, DualPipeV): the one micro-batch's backward runs split as
// the schedule splits it, every stage's input gradient ("backward_input") then every weight
// gradient ("backward_weight"; parallel::pipeline::one_microbatch); what W frees is the weight-gradient contexts, and the peak weighs the
// schedule's forwards held and contexts pending step by step (sim::detail::held_at_peak).
// Not here: FSDP across pipeline stages (a stage is sharded on its own stage mesh only), the uneven flat-unit
// shards of FSDP's tail ranks (the class is that of rank 0 of the shard dimension).
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/checkpoint/training_state.hpp"
#include "dtensor/comm/sim.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/core/checked.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/kernels/meta/attention.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/models/gpt_config.hpp"
#include "dtensor/models/llama.hpp"
#include "dtensor/models/moe_gpt.hpp"
#include "dtensor/nn/fp8_recipe.hpp"
#include "dtensor/nn/param_groups.hpp"
#include "dtensor/ops/all.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/optim/param_set.hpp"
#include "dtensor/optim/sgd.hpp"
#include "dtensor/parallel/context_grads.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/clip.hpp"
#include "dtensor/parallel/pipeline/executor.hpp"
#include "dtensor/parallel/pipeline/sharded_pipeline.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "dtensor/parallel/pipeline/validate.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"
#include "dtensor/parallel/vocab_parallel.hpp"
#include "dtensor/sim/analytic.hpp"
#include "dtensor/sim/cost_model.hpp"
#include "dtensor/sim/dry_run.hpp"
#include "dtensor/train/trainer.hpp"

namespace dtensor::models {

/// A model and how it is split (see the top of this file).
struct TrainingPlan {
  models::GPTConfig model;  // layers: the whole model's; checkpoint: activation checkpointing of every block
  Extent batch = 1;     // sequences per step (all data ranks together)
  int microbatches = 1;
  int dp = 1, tp = 1, pp = 1;  // dp: every data rank (replicate x shard under HSDP)
  std::string schedule = "1f1b";
  int stages_per_rank = 0;  // 0: the schedule's default
  int zero = 0;             // 0: DDP; 1, 2, 3: FSDP's stage inside the pipeline's stages (any pp)
  int hsdp = 1;             // FSDP: replicate groups the data ranks form (1: plain FSDP)
  int cp = 1;               // context parallelism: ranks splitting every sequence
  parallel::ContextKind cp_kind = parallel::ContextKind::ring;
  bool cp_balanced = true;  // the head-tail order (parallel/context_layout.hpp): equal causal work per rank
  models::MoELayersConfig moe{};  // router.experts > 0: MoE blocks (Layers = models::MoELayers), balanced routing
  int ep = 1;               // expert parallelism: ranks splitting the experts (dividing dp x cp)
  // DDP (zero 0) of a bf16 model runs with fp32 master values and AdamW moments (as_run below:
  // mixed precision as practised, and as train_gpt --dtype bf16 runs it), unless this asks for
  // AdamW in bf16 straight on the values (no master; 4 bytes of moments per parameter, not 12).
  bool bf16_moments = false;
  // FP8 GEMMs (train_gpt --dtype fp8): the bf16 model with every nn::Linear's three GEMMs in FP8
  // (nn::Fp8Autocast over the dry run; the experts' GEMMs stay bf16, as the trainer runs them).
  bool fp8 = false;
  // The software the plan runs on (sim::PlanShape's fields of the same names): dtensor's fused
  // attention and gradient reduction behind the last backward, or a published run's older
  // stack (Megatron-LM of 2021/22: neither). fused_attention false: the meta attention kernels
  // record the scores in HBM (kernels::meta::MaterializedScores over the dry run);
  // overlap_gradient_reduction false: the estimate charges the reduction exposed
  // (sim::EstimateOptions). What the step runs and holds is the same either way.
  bool fused_attention = true;
  bool overlap_gradient_reduction = true;

  Extent micro_batch() const { return batch / microbatches; }
  /// pp x dp x cp x tp, checked: a mesh's ranks are ints, so a product past 2^31 - 1 throws
  /// (naming the factors) instead of wrapping to a negative count or an endless dry run.
  long long gpus() const {
    return checked_product<int>(std::array<int, 4>{pp, dp, cp, tp}, "models::TrainingPlan",
                                "number of GPUs pp x dp x cp x tp");
  }
  bool has_experts() const { return moe.router.experts > 0; }
  /// The pipeline program (any pp and cp; FSDP inside stages; MoE).
  /// Always: the dry run runs the trainer's own step, a pipeline (of one stage at pp 1) with FSDP
  /// inside (parallel::pipeline::ShardedPipeline); before issue 40 a pp 1 FSDP plan ran
  /// fully_shard on models::GPT directly, code the trainer never ran.
  bool pipelined() const { return true; }
};

/// The plan as it runs in T (bf16: true when T is bfloat16): DDP of a bf16 model is ZeRO-1 over
/// one shard per data rank, the data ranks its replicas (HSDP dp x 1; sim::as_run of the
/// analytic PlanShape: fp32 master values and moments beside the bf16 values and gradients, the
/// fp32 gradients all-reduced over the data ranks), unless bf16_moments; every other plan is itself.
inline TrainingPlan as_run(TrainingPlan p, bool bf16) {
  if (bf16 && p.zero == 0 && !p.bf16_moments) p.zero = 1, p.hsdp = p.dp;
  return p;
}

/// One rank class's report and what the schedule adds to its memory.
struct PlanClass {
  sim::RankReport report;
  int pipeline_rank = 0;
  std::vector<int> pipeline_ranks{};  // every pipeline rank whose stages do this class's work (pipeline_rank first)
  int in_flight = 1;               // (stage, micro-batch) forwards this pipeline rank holds at most
  std::int64_t saved_per_stage = 0;  // activations one micro-batch leaves saved on one stage
  std::int64_t contexts_per_stage = 0;  // zero-bubble: weight-gradient contexts one micro-batch's I leaves on one stage until its W
  double held_at_peak = 0, contexts_at_peak = 0;  // the schedule's counts at this rank's peak (sim::detail::held_at_peak)
  double in_flight_bytes = 0;      // the schedule's activations and contexts at that peak: held x saved + contexts x context bytes
  double peak_in_flight = 0;       // the step's peak (construction excluded) plus the other in-flight micro-batches' activations
};

/// Throws naming the flag-level field when the plan cannot run.
inline void check_plan(const TrainingPlan& p) {
  constexpr const char* op = "models::TrainingPlan";
  auto fail = [&](auto&&... what) { throw Error(op, dtensor::detail::cat(what...)); };
  if (p.dp < 1 || p.tp < 1 || p.pp < 1 || p.cp < 1 || p.microbatches < 1 || p.batch < 1 || p.hsdp < 1)
    fail("dp ", p.dp, ", tp ", p.tp, ", pp ", p.pp, ", cp ", p.cp, ", microbatches ", p.microbatches, ", batch ", p.batch,
         ", hsdp ", p.hsdp, ": all must be >= 1");
  (void)p.gpus();  // throws when pp x dp x cp x tp overflows a mesh's int ranks
  if (p.batch % p.microbatches != 0) fail("batch ", p.batch, " is not a multiple of microbatches ", p.microbatches);
  if (p.zero < 0 || p.zero > 3) fail("zero ", p.zero, " is not 0 (DDP) or a ZeRO stage 1, 2, 3");
  if (p.cp > 1 && p.cp_balanced && p.model.seq % (2 * p.cp) != 0)
    fail("seq ", p.model.seq, " is not a multiple of 2 x cp ", p.cp, " (load-balanced context parallelism)");
  if (p.cp > 1 && p.cp_kind == parallel::ContextKind::ulysses && (p.model.heads / p.tp) % p.cp != 0)
    fail("heads ", p.model.heads, " / tp ", p.tp, " is not a multiple of cp ", p.cp, " (Ulysses splits the heads)");
  if (p.fp8 && (p.model.checkpoint || p.model.recompute.full || p.model.recompute.mlp))
    fail("fp8 with full or mlp recomputation: a recomputed Linear would record its FP8 amaxes twice (docs/fp8.md)");
  if (p.zero == 0 && p.hsdp > 1) fail("hsdp ", p.hsdp, " needs FSDP (zero 1, 2 or 3)");
  if (p.dp % p.hsdp != 0) fail("hsdp ", p.hsdp, " does not divide dp ", p.dp);
  if (!p.has_experts() && p.ep != 1) fail("ep ", p.ep, " needs experts (moe.router.experts > 0)");
  if (p.has_experts()) {
    nn::check_router_config(p.moe.router, op);
    const long long tokens_ranks = 1LL * p.dp * p.cp;  // fits: the GPU count did
    // Any expert count over ep, as the runtime splits them (parallel/experts.hpp: chunk_range).
    if (p.ep < 1 || tokens_ranks % p.ep != 0)
      fail("ep ", p.ep, " must divide dp x cp = ", tokens_ranks, " (the ranks that split the tokens)");
    if (p.moe.node_size < 0 || (p.moe.node_size > 0 && p.ep % p.moe.node_size != 0))
      fail("moe.node_size ", p.moe.node_size, " must divide ep ", p.ep, " (0: the one-stage dispatch)");
    if (p.moe.node_size > 0) parallel::check_nodes_own_experts(p.moe.router.experts, p.ep, p.moe.node_size);
  }
}

namespace detail {

inline parallel::pipeline::Schedule plan_schedule(const TrainingPlan& p) {
  namespace pp = parallel::pipeline;
  return pp::make_schedule(pp::parse_schedule_kind(p.schedule), p.pp, p.microbatches, p.stages_per_rank);
}

/// What pipeline rank r's stages hold: first/last and layers per stage ("F8 M8" ...).
inline std::vector<std::string> pipeline_rank_keys(const TrainingPlan& p, const parallel::pipeline::Schedule& s) {
  const auto layers = parallel::pipeline::stage_layers(p.model.layers, s.layout.stages());
  std::vector<std::string> keys;
  for (int r = 0; r < s.layout.ranks; ++r) {
    std::string key;
    for (int stage : s.layout.stages_of(r)) {
      const auto [first, end] = layers[std::size_t(stage)];
      key += dtensor::detail::cat(stage == 0 ? "F" : "", stage == s.layout.stages() - 1 ? "L" : "", end - first, " ");
    }
    keys.push_back(key);
  }
  return keys;
}

/// The last phase: it starts with what the step leaves held (model states), before the program's teardown.
inline constexpr const char* after_step = "after step";

inline constexpr std::size_t bucket_bytes = std::size_t(25) << 20;

inline optim::AdamWOptions adamw_options() { return {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1}; }

/// Whether the schedule splits backwards into I and W (zero-bubble schedules): then the dry run
/// does too (parallel::pipeline::one_microbatch), and counts the weight-gradient contexts.
inline bool split_backward(const parallel::pipeline::Schedule& s) {
  for (const auto& list : s.actions)
    for (const auto& a : list)
      if (a.kind == parallel::pipeline::ActionKind::backward_weight) return true;
  return false;
}

/// Replicated ids of one micro-batch (meta: shapes only; another space: token 0 everywhere), in
/// the layout the model reads.
template <class Ids, class Mesh>
Ids meta_ids(const Mesh& mesh, const TrainingPlan& p) {
  using Space = mesh_space_t<Mesh>;
  return distribute_replicated<typename Ids::layout>(mesh, Tensor<std::int32_t, 2, Space>(Shape<2>{p.micro_batch(), p.model.seq}));
}

/// The pipeline program's mesh shape (pp, dp, fsdp, cp, tp), size 1 where a parallelism is off:
/// DDP (zero 0) replicates on "dp" (fsdp 1); ZeRO shards on "fsdp" = dp / hsdp.
inline std::array<int, 5> pipeline_shape(const TrainingPlan& p) {
  return p.zero == 0 ? std::array{p.pp, p.dp, 1, p.cp, p.tp} : std::array{p.pp, p.hsdp, p.dp / p.hsdp, p.cp, p.tp};
}

/// The model config the stages are built with: the plan's context attention.
inline models::GPTConfig stage_config(const TrainingPlan& p) {
  models::GPTConfig c = p.model;
  c.context.kind = p.cp_kind;
  c.context.load_balanced = p.cp_balanced;
  return c;
}

/// The stages' Layers policy: models::MoELayers on the expert mesh over the stage's ranks, or a dense one.
template <class Layers, class StageMesh>
Layers plan_layers(const StageMesh& stage_mesh, const TrainingPlan& p) {
  if constexpr (requires { typename Layers::ExpertMesh; })
    return Layers(parallel::make_expert_mesh<typename Layers::ExpertMesh>(stage_mesh, p.ep), p.moe);
  else
    return Layers{};
}

/// The Recorder's phases of a step, marked as the trainer's step reaches them (a
/// train::StepObserver; it drives nothing): "forward" at this rank's first forward action (its
/// receive, or FSDP's gather before it), "backward" at its first backward one ("backward_input"
/// when the schedule splits backwards into I and W, then "backward_weight" at its first W),
/// "optimizer" once the schedule has run (the gradient syncs, clip, the optimizer step, the
/// parameter sync, the loss). The phases only move on: with one micro-batch every forward of a
/// rank comes before its backwards and (zero-bubble) every I before its W (one_microbatch).
inline train::StepObserver phase_observer(sim::Recorder& rec, bool split) {
  namespace pp = parallel::pipeline;
  auto at = std::make_shared<int>(0);  // the phase reached: 1 forward, 2 backward(_input), 3 backward_weight
  return {.before_action =
              [&rec, at, split](const pp::Action& a) {
                using K = pp::ActionKind;
                const bool forward = a.kind == K::forward || a.kind == K::send_forward || a.kind == K::recv_forward;
                const int phase = forward ? 1 : a.kind == K::backward_weight ? 3 : 2;
                if (phase <= *at) return;
                *at = phase;
                rec.phase(phase == 1   ? "forward"
                          : phase == 3 ? "backward_weight"
                          : split      ? "backward_input"
                                       : "backward",
                          /*overlapped=*/true);
              },
          .after_schedule = [&rec] { rec.phase("optimizer"); }};
}

/// The dry run of a train::Trainer's step for any model (the GPT here, train_vit --dry-run): the
/// trainer's own step() over the one micro-batch (`x`, `y`) — built with
/// TrainerOptions::one_microbatch — its phases marked on `rec` (phase_observer), then the
/// phase after_step. Nothing here drives a stage: the schedule, FSDP's actions, the gradient
/// syncs, clipping and the optimizer are the trainer's (train/trainer.hpp).
template <class Trainer, class Input, class Target>
void trainer_step(Trainer& trainer, const Input& x, const Target& y, sim::Recorder& rec) {
  typename Trainer::Microbatches batch;
  batch.emplace_back(x, y);
  trainer.step(batch, phase_observer(rec, split_backward(trainer.schedule())));
  rec.phase(after_step);
}

/// The trainer's options for a plan: the plan's schedule, run with one of its micro-batches
/// (TrainerOptions::one_microbatch; dry_run_plan counts the others from the schedule).
inline train::TrainerOptions trainer_options(const TrainingPlan& p) {
  const auto shape = pipeline_shape(p);
  train::TrainerOptions o;
  o.degrees = {.pp = shape[0], .dp = shape[1], .fsdp = shape[2], .cp = shape[3], .tp = shape[4]};
  o.schedule = p.schedule;
  o.microbatches = p.microbatches;
  o.one_microbatch = true;
  o.stages_per_rank = p.stages_per_rank;
  o.zero = p.zero;
  o.adamw = adamw_options();
  o.clip_norm = 1.0;
  o.bucket_bytes = bucket_bytes;
  return o;
}

/// Any pp and cp: this pipeline rank's stages, one micro-batch (see the top of this file); DDP
/// (zero 0) or FSDP inside the stages (parallel::pipeline::ShardedPipeline, fp32 master).
/// Space: meta in a dry run; host_space runs the same step for real (on the threads backend:
/// test_sim holds the two reports equal).
template <class T, class Layers, bool SP, class Space = meta_space>
void pipeline_rank_step(CommPtr world, const TrainingPlan& p, sim::Recorder& rec) {
  namespace pp = parallel::pipeline;
  using Mesh = BasicDeviceMesh<Space, "pp", "dp", "fsdp", "cp", "tp">;
  using StageMesh = BasicDeviceMesh<Space, "dp", "fsdp", "cp", "tp">;
  using Model = models::GptParts<T, StageMesh, parallel::MegatronPlan<SP>, std::int32_t, Layers>;
  using Stage = pp::Stage<Model>;
  Mesh mesh(world, pipeline_shape(p));
  const StageMesh stage_mesh = pp::stage_mesh_of(mesh);
  const models::GPTConfig config = stage_config(p);
  rec.phase("parameters");
  // The trainer's own step (train/trainer.hpp), this rank's stages built by it. FSDP (zero 1..3):
  // fp32 master values, gradient shards and AdamW state over "fsdp"; MoE: the experts in T. DDP
  // (zero 0): ZeRO-1 over a size-1 "fsdp", the data ranks its replicas on "dp", as train_gpt
  // --fsdp 1 runs it; a bf16 model gets here only with bf16_moments (as_run), AdamW in bf16 on the
  // values (Master void). Before issue 41 DDP was a second assembly of the step here.
  auto run = [&]<class Master>() {
    train::Trainer<Model, Master> trainer(
        mesh, trainer_options(p), [&](const StageMesh& m) { return Model(m, config, plan_layers<Layers>(m, p)); });
    const auto ids = meta_ids<typename Stage::Input>(stage_mesh, p);
    trainer_step(trainer, ids, ids, rec);
  };
  // `if constexpr`: an fp32 model instantiates one trainer (its master is its own type either way).
  if constexpr (std::is_same_v<T, float>) run.template operator()<float>();
  else if (p.zero > 0) run.template operator()<float>();
  else run.template operator()<void>();
}

}  // namespace detail

// Public for programs that dry-run their own Trainer (train_vit --dry-run): the plan's pipeline
// schedule, a Trainer's own step on meta tensors with its phases recorded (and the observer that
// marks them), and the name of the phase after the step.
using detail::after_step;
using detail::phase_observer;
using detail::plan_schedule;
using detail::trainer_step;

/// The links of the plan's mesh: (pp, dp, fsdp, cp, tp) (and its expert mesh's edp, ep under MoE).
inline sim::Topology plan_topology(const TrainingPlan& p, const sim::Hardware& hw) {
  sim::Topology t(std::array<std::string_view, 5>{"pp", "dp", "fsdp", "cp", "tp"}, detail::pipeline_shape(p), hw);
  // The experts' mesh factors each stage's token ranks (dp x cp of them) as edp x ep.
  if (p.has_experts())
    t.add_dims(std::array<std::string_view, 4>{"pp", "edp", "ep", "tp"}, std::array{p.pp, p.dp * p.cp / p.ep, p.ep, p.tp});
  // The node-level dispatch's groups (parallel/node_dispatch.hpp): "ep" as (ep_across, ep_node),
  // nodes of node_size consecutive expert ranks.
  if (p.has_experts() && p.moe.node_size > 0)
    t.add_dims(std::array<std::string_view, 5>{"pp", "edp", "ep_across", "ep_node", "tp"},
               std::array{p.pp, p.dp * p.cp / p.ep, p.ep / p.moe.node_size, p.moe.node_size, p.tp});
  return t;
}

/// The estimate's settings of a plan (sim/cost_model.hpp): its ZeRO stage, DualPipeV's
/// overlapped pairs (each pair's expert all-to-alls behind the other half's compute), whether
/// its software overlaps the gradient reduction, and the calibration.
inline sim::EstimateOptions estimate_options(const TrainingPlan& p, const sim::Calibration& cal = sim::calibration) {
  namespace pp = parallel::pipeline;
  sim::EstimateOptions o{
      .zero = p.zero, .calibration = cal, .overlap_gradient_reduction = p.overlap_gradient_reduction};
  if (pp::parse_schedule_kind(p.schedule) == pp::ScheduleKind::dual_pipe_v)
    o.overlapped = pp::dual_pipe_v_overlapped(p.pp, p.microbatches);
  return o;
}

/// The plan's step once per rank class (see the top of this file): T the model's element type,
/// Layers models::DenseLayers (GPT) or models::LlamaLayers, SP sequence parallelism on "tp".
template <class T, class Layers, bool SP>
std::vector<PlanClass> dry_run_plan(const TrainingPlan& given) {
  check_plan(given);
  if (given.fp8 && !std::is_same_v<T, bfloat16>)
    throw Error("models::dry_run_plan", "fp8 is the bf16 model with FP8 GEMMs: run it with T = bfloat16");
  const nn::Fp8Autocast fp8(given.fp8);  // every rank's Linears (process-wide, set before the ranks start)
  // The software's attention: scores in HBM where the plan says so (process-wide, as above).
  const kernels::meta::MaterializedScores scores(!given.fused_attention);
  // DDP in bf16: with its fp32 master and moments (the topology and the estimate's options of
  // `given` describe the same ranks and links: plan_topology, EstimateOptions).
  const TrainingPlan p = as_run(given, !std::is_same_v<T, float>);
  const auto schedule = detail::plan_schedule(p);
  const int v = schedule.layout.stages_per_rank;
  const sim::DimensionWork tensor = sim::DimensionWork::splitting({p.model.heads});
  std::vector<PlanClass> result;
  if (p.pipelined()) {
    const auto shape = detail::pipeline_shape(p);
    const Extent per_replica = chunk_range(p.micro_batch(), shape[1], 0).size();
    // Context ranks hold chunks of the sequence; their causal work is equal under load balancing
    // and Ulysses (each rank attends the whole sequence for its heads), else it grows with the rank.
    const bool equal_context_work = p.cp_balanced || p.cp_kind == parallel::ContextKind::ulysses;
    const std::array<sim::DimensionWork, 5> work{
        sim::DimensionWork::keyed(detail::pipeline_rank_keys(p, schedule)),
        sim::DimensionWork::splitting({p.micro_batch()}), sim::DimensionWork::splitting({per_replica}),
        equal_context_work ? sim::DimensionWork::splitting({p.model.seq}) : sim::DimensionWork::distinct(), tensor};
    const Extent experts = p.moe.router.experts;
    // Experts that do not divide over ep: the share of the expert rank (its token-rank index modulo ep).
    const auto classes = p.has_experts() && experts % p.ep != 0
                             ? sim::rank_classes<5>(shape, work, {false, true, true, true, false},
                                                    [&](const std::array<int, 5>& c) {
                                                      const int t = (c[1] * shape[2] + c[2]) * shape[3] + c[3];
                                                      return chunk_range(experts, p.ep, t % p.ep).size();
                                                    })
                             : sim::rank_classes<5>(shape, work);
    auto reports = sim::dry_run<5>(shape, classes, [&](CommPtr world, sim::Recorder& rec) {
      detail::pipeline_rank_step<T, Layers, SP>(std::move(world), p, rec);
    });
    const auto memory = parallel::pipeline::validate(schedule);
    const auto keys = detail::pipeline_rank_keys(p, schedule);
    for (std::size_t i = 0; i < reports.size(); ++i) {
      PlanClass c{std::move(reports[i]), classes[i].coordinate[0]};
      c.pipeline_ranks.push_back(c.pipeline_rank);
      for (int r = 0; r < p.pp; ++r)
        if (r != c.pipeline_rank && keys[std::size_t(r)] == keys[std::size_t(c.pipeline_rank)]) c.pipeline_ranks.push_back(r);
      c.in_flight = std::max(v, memory.peak_saved[std::size_t(c.pipeline_rank)]);
      c.held_at_peak = c.in_flight;
      result.push_back(std::move(c));
    }
  }
  for (auto& c : result) {
    const auto& fwd = c.report.phase("forward");
    const auto tag = std::size_t(MemoryTag::activations);
    c.saved_per_stage = (fwd.end[tag] - fwd.start[tag]) / v;
    if (p.pipelined() && detail::split_backward(schedule)) {
      // Zero-bubble: what W frees is the contexts I left; the rank's peak weighs both counts
      // step by step (a W context is smaller than a forward's saved state).
      const auto& input = c.report.phase("backward_input");
      const auto& weight = c.report.phase("backward_weight");
      c.contexts_per_stage = std::max<std::int64_t>(0, input.end[tag] - weight.end[tag]) / v;
      const double ratio = c.saved_per_stage > 0 ? double(c.contexts_per_stage) / double(c.saved_per_stage) : 0;
      const auto at = sim::detail::held_at_peak(parallel::pipeline::validate(schedule), ratio, c.pipeline_rank);
      c.held_at_peak = at.held, c.contexts_at_peak = at.contexts;
      c.in_flight = std::max(v, int(at.held));
    }
    c.in_flight_bytes = c.held_at_peak * double(c.saved_per_stage) + c.contexts_at_peak * double(c.contexts_per_stage);
    // The step's own peak: building the trainer is not part of a step (its own peak,
    // construction_peak_total, is judged apart: examples/plan_rescore.hpp's verdict takes both);
    // the one micro-batch run holds v stages' saved activations of the schedule's in flight.
    c.peak_in_flight = double(c.report.step_peak_total()) +
                       std::max(0.0, c.in_flight_bytes - double(v) * double(c.saved_per_stage));
  }
  return result;
}

/// The dry run's step of plan `p` from its classes (sim::estimate_plan over every class, on the
/// plan's topology and schedule, with its estimate options) on `hw` under `cal`: what --search,
/// --plan auto and --published rank and report by. `schedule`: plan_schedule(p), when the caller
/// costs the same plan again (under other calibrations) and keeps it.
inline sim::PlanEstimate estimate_dry_run(const TrainingPlan& p, const std::vector<PlanClass>& classes,
                                          const sim::Hardware& hw, const parallel::pipeline::Schedule& schedule,
                                          const sim::Calibration& cal = sim::calibration) {
  std::vector<sim::ClassInput> inputs;
  for (const auto& c : classes) inputs.push_back({&c.report, c.pipeline_ranks});
  return sim::estimate_plan(inputs, plan_topology(p, hw), schedule, estimate_options(p, cal));
}
inline sim::PlanEstimate estimate_dry_run(const TrainingPlan& p, const std::vector<PlanClass>& classes,
                                          const sim::Hardware& hw, const sim::Calibration& cal = sim::calibration) {
  return estimate_dry_run(p, classes, hw, plan_schedule(p), cal);
}

/// The analytic estimate's plan (sim::PlanShape) as the dry run's TrainingPlan: `base` gives the
/// model (and a MoE model's configuration), `shape` how it is split and the software it runs.
inline TrainingPlan training_plan_of(TrainingPlan base, const sim::PlanShape& shape) {
  const nn::Recompute rc = shape.recomputes();
  base.model.checkpoint = rc.full;
  base.model.recompute = rc.full ? nn::Recompute{} : rc;
  base.batch = shape.batch;
  base.microbatches = shape.microbatches();
  base.dp = shape.dp, base.tp = shape.tp, base.pp = shape.pp, base.cp = shape.cp, base.ep = shape.ep;
  base.moe.node_size = shape.ep_node_size;
  base.zero = shape.zero, base.hsdp = shape.hsdp;
  base.bf16_moments = shape.bf16_moments;  // DDP in bf16: fp32 master and moments unless asked (sim::as_run)
  base.fp8 = shape.fp8;
  base.schedule = shape.schedule;
  base.stages_per_rank = shape.stages_per_rank > 1 ? shape.stages_per_rank : 0;
  base.cp_kind = parallel::parse_context_kind(shape.cp_kind);
  base.fused_attention = shape.fused_attention;
  base.overlap_gradient_reduction = shape.overlap_gradient_reduction;
  return base;
}

/// The same from the analytic estimate's model (sim::ModelShape): the GPT's configuration (the
/// blocks' kind, GPT's or Llama's, is the dry run's Layers: ModelShape::llama), its MLA shape
/// and its MoE configuration (balanced routing, dropless).
inline TrainingPlan training_plan_of(const sim::ModelShape& m, const sim::PlanShape& shape) {
  TrainingPlan base{.model = {.vocab = m.vocab,
                              .seq = m.seq,
                              .dim = m.dim,
                              .heads = m.heads,
                              .layers = m.layers,
                              .mlp_ratio = 4,
                              .kv_heads = m.kv_heads,
                              .ffn = m.ffn}};
  base.model.mla = {.q_lora_rank = m.q_lora_rank,
                    .kv_lora_rank = m.kv_lora_rank,
                    .qk_nope_head_dim = m.qk_nope_dim,
                    .qk_rope_head_dim = m.qk_rope_dim,
                    .v_head_dim = m.v_head_dim};
  if (m.moe()) {
    base.moe.router.experts = m.experts;
    base.moe.router.topk = m.topk;
    base.moe.router.groups = m.expert_groups;
    base.moe.router.topk_groups = m.topk_groups;
    base.moe.every = m.moe_every;
    base.moe.dense_first = m.dense_first;
    base.moe.shared = m.shared_experts;
    base.moe.hidden = m.expert_ffn;
  }
  return training_plan_of(base, shape);
}

}  // namespace dtensor::models

// The names the GPT's dry run had before models/ became its namespace (sim::TrainingPlan and so
// on): kept, so that code written against them compiles as before.
namespace dtensor::sim {
using models::after_step;
using models::as_run;
using models::check_plan;
using models::dry_run_plan;
using models::phase_observer;
using models::plan_schedule;
using models::plan_topology;
using models::PlanClass;
using models::trainer_step;
using models::TrainingPlan;
}  // namespace dtensor::sim
