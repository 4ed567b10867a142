// Five parallelisms at once (issue 18's parity): the GPT trained 20 steps on the trainer's mesh
// (pp, dp, fsdp, cp, tp) — size-1 dimensions where a parallelism is off — through
// parallel::pipeline::ShardedPipeline (pipeline stages, each FSDP-sharded, context and tensor +
// sequence parallel inside) gives the per-step losses of the one-rank run within 1e-5 relative
// (double): PP x FSDP x CP x TP + SP on 16 threads, and 3- and 4-D combinations with every ZeRO
// stage, HSDP, ring / all-gather / Ulysses attention and several schedules.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <span>
#include <string>

#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/gpt_stage.hpp"
#include "dtensor/parallel/pipeline/sharded_pipeline.hpp"
#include "gpt_parity.hpp"
#include "moe_parity.hpp"
#include "support/on_ranks.hpp"

using namespace dtensor;
using namespace dtensor::testing;
namespace pp = dtensor::parallel::pipeline;

namespace {

using Mesh5 = DeviceMesh<"pp", "dp", "fsdp", "cp", "tp">;
using StageMesh = DeviceMesh<"dp", "fsdp", "cp", "tp">;

// 4 layers split over 2 stages (or 4, 1 each, with interleaving or ZB-V); 8 sequences a step, in
// micro-batches that give every data rank at least one sequence (the loss's reshape needs one).
constexpr Extent batch_5d = 8;
constexpr Extent layers_5d = 4;

struct Combo {
  int pp = 1, dp = 1, fsdp = 1, cp = 1, tp = 1;
  int ep = 1;  // MoE runs: expert ranks over dp x fsdp (0 experts: a dense GPT)
  int zero = 3;
  std::string schedule = "1f1b";
  int microbatches = 4;
  parallel::ContextKind cp_kind = parallel::ContextKind::ring;
  int ranks() const { return pp * dp * fsdp * cp * tp; }
};

std::string describe(const Combo& c) {
  return "pp " + std::to_string(c.pp) + " dp " + std::to_string(c.dp) + " fsdp " + std::to_string(c.fsdp) + " cp " +
         std::to_string(c.cp) + " (" + std::string(parallel::name_of(c.cp_kind)) + ") tp " + std::to_string(c.tp) +
         ", ZeRO-" + std::to_string(c.zero) + ", " + c.schedule + " x " + std::to_string(c.microbatches);
}

const std::vector<double>& reference() {
  static const std::vector<double> ref = [] {
    std::vector<double> losses;
    threads::run(1, [&](CommPtr w) {
      losses = run_parity<nn::ReplicatedPlan>(w, {1, 1}, {.batch = batch_5d, .layers = layers_5d}).losses;
    });
    return losses;
  }();
  return ref;
}

struct Run5d {
  std::vector<double> losses;  // every step's mean loss, on every rank
  std::size_t units = 0;       // FSDP units of this rank's stages
  std::size_t fsdp_gathers = 0, fsdp_reductions = 0;  // all-gathers / reduce-scatters + all-reduces on "fsdp", step 2
};

// The MoE runs: the MoE parity suite's model (2 layers, batch 4), 4 experts, top-2, dropless.
constexpr Extent moe_batch = parity_batch;
nn::MoELayersConfig moe_config() { return moe_parity_config(4, 2, 1); }

const std::vector<double>& moe_reference() {
  static const std::vector<double> ref = [] {
    std::vector<double> losses;
    threads::run(1, [&](CommPtr w) { losses = run_moe_parity<nn::ReplicatedPlan>(w, {1, 1}, 1, moe_config()).losses; });
    return losses;
  }();
  return ref;
}

/// The per-step losses of the combination, and FSDP's collectives of one step.
template <class Plan, bool MoE = false>
Run5d run_5d(CommPtr world, const Combo& c) {
  Mesh5 mesh(world, {c.pp, c.dp, c.fsdp, c.cp, c.tp});
  const StageMesh stage_mesh = pp::stage_mesh_of(mesh);
  auto cfg = parity_config();
  if (!MoE) cfg.layers = layers_5d;
  const Extent batch = MoE ? moe_batch : batch_5d;
  cfg.context = {.kind = c.cp_kind, .load_balanced = c.cp > 1 && c.cp_kind != parallel::ContextKind::ulysses};
  using Layers = std::conditional_t<MoE, nn::MoELayers<double, ExpertMesh>, nn::DenseLayers>;
  using Stage = pp::GptStage<double, StageMesh, Plan, std::int32_t, Layers>;
  auto make_layers = [&] {
    if constexpr (MoE) return Layers(parallel::make_expert_mesh<ExpertMesh>(stage_mesh, c.ep), moe_config());
    else return Layers{};
  };
  const Layers layers = make_layers();
  auto schedule = pp::make_schedule(pp::parse_schedule_kind(c.schedule), c.pp, c.microbatches);
  std::vector<Stage> stages;
  for (int s : schedule.layout.stages_of(mesh.coordinate(0)))
    stages.emplace_back(stage_mesh, cfg, s, schedule.layout.stages(), layers);
  pp::ShardedPipeline<Stage, Mesh5> run(mesh, schedule, std::move(stages), {.stage = c.zero}, 4096);
  optim::AdamW<double, 4> opt(run.params(), parity_adamw());
  struct NoExperts {
    void step() {}
  };
  auto make_expert_opt = [&] {
    if constexpr (MoE) return optim::AdamW<double, 3>(run.expert_params(), parity_adamw());
    else return NoExperts{};
  };
  auto expert_opt = make_expert_opt();
  Run5d out;
  for (auto& stage : run.executor().stages()) out.units += stage.units().size();
  for (int step = 0; step < parity_steps; ++step) {
    CommLog log;
    auto [ids, targets] = parity_tokens(step, cfg, batch);
    if (cfg.context.load_balanced) {  // stored in the order ring / all-gather attention balance
      ids = parallel::load_balance(ids, 1, c.cp);
      targets = parallel::load_balance(targets, 1, c.cp);
    }
    run.zero_grad();
    auto stats = run.step(pp::split_microbatches<typename Stage::Ids>(stage_mesh, ids, targets, c.microbatches));
    run.clip_grad_norm(1.0);
    opt.step();
    expert_opt.step();
    run.sync_parameters();
    double loss = stats.loss.value_or(-std::numeric_limits<double>::infinity());  // on the last stage's ranks
    if (step == 1) {
      out.fsdp_gathers = log.count(CollectiveKind::all_gather, "fsdp");
      // Gradient reductions: not the one-double all-reduce of MoE stages' auxiliary losses.
      for (const auto& r : log.records())
        out.fsdp_reductions += r.group == "fsdp" && (r.kind == CollectiveKind::reduce_scatter ||
                                                     (r.kind == CollectiveKind::all_reduce && r.bytes > sizeof(double)));
    }
    mesh.group(0).all_reduce(std::span<double>(&loss, 1), ReduceOp::max);
    out.losses.push_back(loss);
  }
  return out;
}

template <class Plan, bool MoE = false>
void check(const Combo& c) {
  INFO(describe(c) + (MoE ? ", MoE ep " + std::to_string(c.ep) : std::string()));
  const auto& ref = MoE ? moe_reference() : reference();
  auto failures = on_ranks(c.ranks(), [&](CommPtr world, auto report) {
    const Run5d run = run_5d<Plan, MoE>(world, c);
    report(compare_losses(run.losses, ref, 1e-5));
    // FSDP inside the stages: one reduction per unit per step, after the stage's last backward
    // (not one per micro-batch); ZeRO-3 one all-gather per unit (UNSHARD), ZeRO-1/2 one after
    // the optimizer (sync_parameters).
    if (run.fsdp_reductions != run.units)
      report("FSDP reduced " + std::to_string(run.fsdp_reductions) + " times for " + std::to_string(run.units) + " units");
    if (run.fsdp_gathers != run.units)
      report("FSDP all-gathered " + std::to_string(run.fsdp_gathers) + " times for " + std::to_string(run.units) + " units");
  });
  CHECK(failures.empty());
  for (const auto& f : failures) UNSCOPED_INFO(f);
}

using SP = parallel::MegatronPlan<true>;
using TP = parallel::MegatronPlan<false>;

}  // namespace

TEST_CASE("5-D: PP x FSDP x CP x TP + SP on 16 threads equals the one-rank run", "[parity][5d]") {
  check<SP>({.pp = 2, .fsdp = 2, .cp = 2, .tp = 2});
}

TEST_CASE("4-D combinations equal the one-rank run", "[parity][5d]") {
  // HSDP inside pipeline stages with TP + SP (ZeRO-2).
  check<SP>({.pp = 2, .dp = 2, .fsdp = 2, .tp = 2, .zero = 2, .microbatches = 2});
  // FSDP x CP (all-gather KV) x TP without a pipeline, GPipe over the micro-batches (ZeRO-1).
  check<TP>({.fsdp = 2, .cp = 2, .tp = 2, .zero = 1, .schedule = "gpipe", .cp_kind = parallel::ContextKind::allgather});
  // DDP (an "fsdp" of 1) x CP (Ulysses) x PP, interleaved with two stages per rank.
  check<TP>({.pp = 2, .dp = 2, .cp = 2, .zero = 1, .schedule = "interleaved", .cp_kind = parallel::ContextKind::ulysses});
}

TEST_CASE("3-D combinations equal the one-rank run", "[parity][5d]") {
  check<SP>({.pp = 2, .fsdp = 2, .tp = 2, .schedule = "zbv"});          // FSDP inside zero-bubble V stages
  check<TP>({.pp = 2, .fsdp = 2, .cp = 2, .schedule = "zb"});           // ZB-H1 (split backward) with FSDP and CP
  check<SP>({.dp = 2, .cp = 2, .tp = 2, .zero = 1, .microbatches = 1});  // DDP x CP x TP + SP, one micro-batch
}

TEST_CASE("MoE: expert parallelism with PP, FSDP and TP equals the one-rank MoE run", "[parity][5d][moe]") {
  check<TP, true>({.fsdp = 2, .tp = 2, .ep = 2, .microbatches = 1});                      // 3-D: FSDP x TP x EP
  check<TP, true>({.dp = 2, .fsdp = 2, .tp = 2, .ep = 4, .zero = 2, .microbatches = 1});   // 4-D: HSDP x TP x EP
  // Pipelines: the auxiliary losses of both stages, over 2 micro-batches.
  check<TP, true>({.pp = 2, .fsdp = 2, .tp = 2, .ep = 2, .microbatches = 2});              // 4-D: PP x FSDP x TP x EP
  check<TP, true>({.pp = 2, .dp = 2, .ep = 2, .zero = 1, .schedule = "gpipe", .microbatches = 2});  // 3-D: PP x DP x EP
}

TEST_CASE("The five: PP x FSDP x TP + SP x EP equals the one-rank MoE run", "[parity][5d][moe]") {
  check<SP, true>({.pp = 2, .fsdp = 2, .tp = 2, .ep = 2, .microbatches = 2});
  check<SP, true>({.pp = 2, .dp = 2, .fsdp = 2, .tp = 2, .ep = 4, .zero = 2, .schedule = "gpipe", .microbatches = 1});
}
