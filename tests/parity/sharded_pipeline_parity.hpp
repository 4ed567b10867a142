// tests/parity/sharded_pipeline_parity.hpp — one GPT training run on the trainer's mesh (pp, dp,
// fsdp, cp, tp) through parallel::pipeline::ShardedPipeline, for the 5-D parity tests (threads
// and MPI): the per-step losses and FSDP's collectives of one step.
//
// The oracles are the one-rank runs of gpt_parity.hpp (dense: 4 layers, 8 sequences a step) and
// moe_parity.hpp (MoE: 2 layers, 4 sequences, aux and z losses on): the same model, data, AdamW
// and clipping, so every combination must give their per-step losses.
#pragma once

#include <algorithm>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtensor/optim/param_set.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "dtensor/parallel/pipeline/sharded_pipeline.hpp"
#include "gpt_parity.hpp"
#include "moe_parity.hpp"

namespace dtensor::testing {

namespace pp = dtensor::parallel::pipeline;

// The meshes in a memory space: host, or cuda_space for the GPU run (tests/cuda/test_gpt_cuda.cu).
template <class Space = host_space>
using Mesh5In = BasicDeviceMesh<Space, "pp", "dp", "fsdp", "cp", "tp">;
template <class Space = host_space>
using StageMeshIn = BasicDeviceMesh<Space, "dp", "fsdp", "cp", "tp">;
using Mesh5 = Mesh5In<>;
using StageMesh = StageMeshIn<>;

// 4 layers split over 2 stages (or 4, 1 each, with interleaving or ZB-V); 8 sequences a step, in
// micro-batches that give every data rank at least one sequence (the loss's reshape needs one).
inline constexpr Extent batch_5d = 8;
inline constexpr Extent layers_5d = 4;

struct Combo {
  int pp = 1, dp = 1, fsdp = 1, cp = 1, tp = 1;
  int ep = 1;  // MoE runs: expert ranks over dp x fsdp x cp (0 experts: a dense GPT)
  Extent experts = 4;  // MoE runs: the experts (5 over ep 2: 3 + 2)
  int zero = 3;
  std::string schedule = "1f1b";
  int microbatches = 4;
  parallel::ContextKind cp_kind = parallel::ContextKind::ring;
  std::optional<bool> reshard_after_forward{};  // ZeRO-3: unset, ShardedPipeline's default
  bool checkpoint = false;                       // activation checkpointing (each block recomputed in its backward)
  int ranks() const { return pp * dp * fsdp * cp * tp; }
  /// FSDP's shard group: "fsdp", flattened with "cp" after it (parallel::FsdpShardDims), N' ranks.
  int shard_ranks() const { return fsdp * cp; }
  std::string shard_group() const { return cp > 1 ? "fsdp*cp" : "fsdp"; }
};

inline std::string describe(const Combo& c) {
  return "pp " + std::to_string(c.pp) + " dp " + std::to_string(c.dp) + " fsdp " + std::to_string(c.fsdp) + " cp " +
         std::to_string(c.cp) + " (" + std::string(parallel::name_of(c.cp_kind)) + ") tp " + std::to_string(c.tp) +
         ", ZeRO-" + std::to_string(c.zero) + ", " + c.schedule + " x " + std::to_string(c.microbatches) +
         (c.reshard_after_forward ? (*c.reshard_after_forward ? ", reshard after forward" : ", stages kept gathered") : "");
}

/// The one-rank runs the dense and the MoE combinations must reproduce (defined, with the runs
/// below, in parity_5d_runs.cpp).
std::vector<double> dense_reference(CommPtr one_rank);

struct Run5d {
  std::vector<double> losses;  // every step's mean loss, on every rank
  std::size_t units = 0;       // FSDP units of this rank's stages
  std::size_t fsdp_gathers = 0, fsdp_reductions = 0;  // all-gathers / reduce-scatters + all-reduces on the shard group, step 2
  std::size_t cp_all_reduces = 0;  // all-reduces on "cp" in step 2 (a dense model's: none, FSDP reduced over "fsdp*cp")
  // Model states held after the last step on this rank, on the allocation ledger (host
  // parameters + gradients + optimizer state), and the elements of its stages' flat buffers.
  double state_bytes = 0, psi = 0;
  bool kept_gathered = false;  // ZeRO-3 held each stage for the step (ShardedPipeline::keeps_stages_gathered)
  // Step 2's peak on this rank's ledger by tag, and its largest unit's flat elements (padded to
  // the shard count): what the formulas of docs/fsdp.md are stated in.
  std::int64_t peak_parameters = 0, peak_gradients = 0, peak_optimizer = 0, peak_total = 0;
  double largest_unit = 0;
  std::vector<double> unit_elements;  // each local unit's flat elements padded to the shard count, in order
  // MoE: this rank's experts' elements (its stages' expert units, whole), its shards of them in
  // params() (list 1), and the most those shards may hold: each unit's ceil(size / edp); and the
  // elements of its expert units outside every piece (a zero gap: none, nn::FlatEntry::slot).
  double expert_elements = 0, expert_shards = 0, expert_shard_bound = 0;
  std::size_t expert_gap = 0;
  /// The most elements two neighbouring units hold (the prefetch window of 2: unit u computing
  /// while u + 1 or u - 1 is gathered, or u's gradient computed while u + 1's is reduced).
  double adjacent_pair() const {
    double m = unit_elements.empty() ? 0 : unit_elements.front();
    for (std::size_t u = 0; u + 1 < unit_elements.size(); ++u) m = std::max(m, unit_elements[u] + unit_elements[u + 1]);
    return m;
  }
};

// The MoE runs: the MoE parity suite's model (2 layers, batch 4), 4 experts (or `experts`), top-2, dropless.
inline constexpr Extent moe_batch = parity_batch;
inline models::MoELayersConfig moe_config(Extent experts = 4) { return moe_parity_config(experts, 2, 1); }

std::vector<double> moe_reference(CommPtr one_rank, Extent experts = 4);

/// The per-step losses of the combination, and FSDP's collectives of one step; the model in
/// `Space` (MoE: host only), its values in T, FSDP's master values, gradient shards and optimizer
/// state in Master (void: T; bfloat16 values with float master: mixed precision).
template <class Plan, bool MoE = false, class Space = host_space, class T = double, class Master = void>
Run5d run_5d(CommPtr world, const Combo& c) {
  static_assert(!MoE || std::is_same_v<T, double>, "run_5d: the MoE combinations run in double");
  using Mesh5 = Mesh5In<Space>;
  using StageMesh = StageMeshIn<Space>;
  MemoryLedger ledger;  // everything the run allocates on this rank's thread
  Mesh5 mesh(world, {c.pp, c.dp, c.fsdp, c.cp, c.tp});
  const StageMesh stage_mesh = pp::stage_mesh_of(mesh);
  auto cfg = parity_config();
  if (!MoE) cfg.layers = layers_5d;
  cfg.checkpoint = c.checkpoint;
  const Extent batch = MoE ? moe_batch : batch_5d;
  cfg.context = {.kind = c.cp_kind, .load_balanced = c.cp > 1 && c.cp_kind != parallel::ContextKind::ulysses};
  using Layers = std::conditional_t<MoE, models::MoELayers<double, ExpertMesh>, models::DenseLayers>;
  using Model = models::GptParts<T, StageMesh, Plan, std::int32_t, Layers>;
  using Stage = pp::Stage<Model>;
  auto make_layers = [&] {
    if constexpr (MoE) return Layers(parallel::make_expert_mesh<ExpertMesh>(stage_mesh, c.ep), moe_config(c.experts));
    else return Layers{};
  };
  const Layers layers = make_layers();
  auto schedule = pp::make_schedule(pp::parse_schedule_kind(c.schedule), c.pp, c.microbatches);
  auto stages = pp::split(Model(stage_mesh, cfg, layers), schedule.layout, mesh.coordinate(0));
  pp::ShardedPipeline<Stage, Mesh5, Master> run(mesh, schedule, std::move(stages),
                                        {.stage = c.zero, .reshard_after_forward = c.reshard_after_forward}, 4096);
  auto opt = optim::make_adamw(run.params(), parity_adamw());  // every parameter: the shards and (MoE) the experts
  Run5d out;
  for (auto& stage : run.executor().stages()) {
    out.units += stage.units().size();
    for (auto& u : stage.units()) {
      out.psi += double(u.group->size());
      const auto n = std::size_t(c.shard_ranks());
      const double padded = double((u.group->size() + n - 1) / n * n);
      out.largest_unit = std::max(out.largest_unit, padded);
      out.unit_elements.push_back(padded);
    }
  }
  out.kept_gathered = run.keeps_stages_gathered();
  if constexpr (MoE) {
    const auto edp = std::size_t(c.dp * c.fsdp * c.cp / c.ep);
    for (auto& stage : run.executor().stages())
      for (auto& u : *std::get<1>(nn::parameter_groups(stage)).units) {
        out.expert_elements += double(u.group->size());
        out.expert_shard_bound += double((u.group->size() + edp - 1) / edp);
      }
    for (const auto& p : run.params().template list<1>()) out.expert_shards += double(p.value.size());
    for (auto& stage : run.executor().stages())
      out.expert_gap += flat_gap(*std::get<1>(nn::parameter_groups(stage)).units);
  }
  for (int step = 0; step < parity_steps; ++step) {
    CommLog log;
    std::optional<MemoryLedger> step_ledger;  // step 2's peaks
    if (step == 1) step_ledger.emplace();
    auto [ids, targets] = parity_tokens(step, cfg, batch);
    if (cfg.context.load_balanced) {  // stored in the order ring / all-gather attention balance
      ids = parallel::load_balance(ids, 1, c.cp);
      targets = parallel::load_balance(targets, 1, c.cp);
    }
    run.zero_grad();
    auto stats = run.step(pp::split_microbatches<typename Stage::Input>(stage_mesh, ids, targets, c.microbatches));
    run.clip_grad_norm(1.0);
    opt.step();
    run.sync_parameters();
    double loss = stats.loss.value_or(-std::numeric_limits<double>::infinity());  // on the last stage's ranks
    if (step == 1) {
      // Peaks relative to what the rank held when the step began (the ledger scope's start).
      const auto base = [&](MemoryTag t) { return ledger.current(Space::name, t) - step_ledger->current(Space::name, t); };
      out.peak_parameters = base(MemoryTag::parameters) + step_ledger->peak(Space::name, MemoryTag::parameters);
      out.peak_gradients = base(MemoryTag::gradients) + step_ledger->peak(Space::name, MemoryTag::gradients);
      out.peak_optimizer = base(MemoryTag::optimizer_state) + step_ledger->peak(Space::name, MemoryTag::optimizer_state);
      out.peak_total = ledger.current(Space::name) - step_ledger->current(Space::name) + step_ledger->peak(Space::name);
      const std::string group = c.shard_group();
      out.fsdp_gathers = log.count(CollectiveKind::all_gather, group);
      // Gradient reductions: not the one-double all-reduce of MoE stages' auxiliary losses.
      for (const auto& r : log.records()) {
        out.fsdp_reductions += r.group == group && (r.kind == CollectiveKind::reduce_scatter ||
                                                    (r.kind == CollectiveKind::all_reduce && r.bytes > sizeof(double)));
        out.cp_all_reduces += r.group == "cp" && r.kind == CollectiveKind::all_reduce;
      }
    }
    mesh.group(0).all_reduce(std::span<double>(&loss, 1), ReduceOp::max);
    out.losses.push_back(loss);
  }
  out.state_bytes = double(ledger.current(Space::name, MemoryTag::parameters) + ledger.current(Space::name, MemoryTag::gradients) +
                           ledger.current(Space::name, MemoryTag::optimizer_state));
  return out;
}

// The runs both 5-D suites make (the threads one, test_5d_parity, and the MPI one,
// test_5d_parity_mpi: the communicator is type-erased, so their instantiations are the same) are
// compiled once, in parity_5d_runs.cpp, an object library linked into both: each suite's unit
// compiled them again, about 100 s of CI's build (docs/benchmarks.md, "CI: the clean-clone time").
extern template Run5d run_5d<parallel::MegatronPlan<false>, false>(CommPtr, const Combo&);
extern template Run5d run_5d<parallel::MegatronPlan<true>, false>(CommPtr, const Combo&);
extern template Run5d run_5d<parallel::MegatronPlan<false>, true>(CommPtr, const Combo&);
extern template Run5d run_5d<parallel::MegatronPlan<true>, true>(CommPtr, const Combo&);
extern template Run5d run_5d<parallel::MegatronPlan<false>, false, host_space, bfloat16, float>(CommPtr, const Combo&);

}  // namespace dtensor::testing
