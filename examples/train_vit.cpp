// examples/train_vit.cpp — a Vision-Transformer classifier (models/vit.hpp) trained on a synthetic
// image task with data (DDP, FSDP / ZeRO, HSDP), context and tensor + sequence parallelism, in
// one loop: the second model of the repository, written as a user writes theirs (docs/modules.md).
//
//   train_vit                                               # dp 1 x fsdp 2 (ZeRO-3) x cp 2 (ring) x tp 2 + SP: 8 threads
//   train_vit --fsdp 1 --cp 1 --tp 1 --dp 4                 # DDP on 4 threads
//   train_vit --dp 2 --fsdp 2 --cp 1 --tp 1 --zero 2        # HSDP with ZeRO-2 shards
//   train_vit --fsdp 1 --cp 2 --tp 2 --cp-kind ulysses      # CP (Ulysses) x TP + SP
//   train_vit --pp 2 --schedule zbv --layers 4              # ZB-V stages x FSDP x CP x TP + SP: 16 threads
//   train_vit --pp 2 --cp 1 --experts 4 --ep 2              # PP x FSDP x TP + SP x EP: MoE MLPs, experts over fsdp
//   mpirun -n 8 train_vit --backend mpi                     # the same, one process per rank
//   train_vit --dry-run --pp 4 --fsdp 8 --tp 4 --experts 8 --ep 8 --dim 2048 --heads 16 --layers 12
//                                                           # the step on meta tensors, 128 ranks: memory and bytes
//
// The flags are train_gpt's for every parallelism and the experts, rows and checks from the library
// (train/flag_table.hpp: --pp --dp --fsdp --zero --cp --cp-kind --tp --sp/--no-sp
// --[no-]reshard-after-forward --schedule --microbatches --ep; models/moe_flags.hpp: --experts
// --topk --capacity --moe-every; train/trainer_flags.hpp: their checks); the ranks agree on every
// flag of the table at setup.
//
// Every run, pipelined or not, is one train::Trainer (train/trainer.hpp) on the mesh (pp, dp,
// fsdp, cp, tp): the model's parts (models::ViTParts) cut into --pp pipeline stages (one stage at
// --pp 1), each FSDP-sharded inside parallel::pipeline::ShardedPipeline, which runs the --schedule
// over --microbatches and every gradient sync (the experts' over "edp": the expert mesh (edp, ep,
// tp) factors dp x fsdp x cp). "dp" replicates (with --fsdp 1, ZeRO-1 over one shard: DDP; with
// "fsdp" > 1, HSDP's replicas); "fsdp" shards parameters, gradients and AdamW state (ZeRO --zero
// 1, 2 or 3); "cp" splits every image's patches (attention: ring, all-gather or Ulysses,
// non-causal); "tp" splits the heads and the MLP (Megatron), with SP the patches between them.
// After the schedule the gradients still pending on "cp" and (SP) "tp" are all-reduced, clipped
// to norm 1, and AdamW steps. --dry-run builds the same Trainer on meta tensors.
//
// The task (models/vit_data.hpp): each image is --patches patches of --patch-dim values, a class
// pattern plus noise; every rank draws the same --batch images per step (from --seed and the
// step) and keeps its piece. Rank 0 prints the training loss of each step, the validation loss
// (a fixed held-out batch) every --eval-every steps, and at the end whether it fell.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dtensor/comm/threads.hpp"
#include "dtensor/distributed/settings_agreement.hpp"
#include "dtensor/models/moe_flags.hpp"      // --experts: models::MoELayers and its flags
#include "dtensor/models/training_plan.hpp"  // models::trainer_step: --dry-run
#include "dtensor/models/vit.hpp"
#include "dtensor/models/vit_data.hpp"
#include "dtensor/nn/moe_blocks.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/parallel/context_grads.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "dtensor/parallel/fully_shard.hpp"
#include "dtensor/parallel/gpt_plan.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/sharded_pipeline.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"
#include "dtensor/placement/chunk.hpp"
#include "dtensor/sim/dry_run.hpp"
#include "dtensor/sim/rank_classes.hpp"
#include "dtensor/train/loop.hpp"
#include "dtensor/train/trainer.hpp"
#include "dtensor/train/trainer_flags.hpp"
#include "flag_table.hpp"
#include "flags.hpp"
#ifdef DTENSOR_HAS_MPI
#include "dtensor/comm/mpi.hpp"
#endif

namespace {

using namespace dtensor;
using examples::UsageError;
namespace cli = train::cli;
// The whole mesh (size 1 where a parallelism is off) and the experts' (--experts).
using PipeMesh = DeviceMesh<"pp", "dp", "fsdp", "cp", "tp">;
using ExpertMesh = DeviceMesh<"edp", "ep", "tp">;

// ---------------------------------------------------------------- flags

struct Options : cli::MeshFlags, models::cli::MoEFlags {
  // The model and the task.
  Extent layers = 2, heads = 4, dim = 64, patches = 16, patch_dim = 48, classes = 10, batch = 32;
  // Training.
  int steps = 60, eval_every = 20;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  std::string backend = "threads";
  bool dry_run = false;  // --dry-run: the step on meta tensors, once per rank class

  Options() { pp = 1, dp = 1, fsdp = 2, cp = 2, tp = 2; }  // every parallelism but the pipeline
};

/// Every flag, one row each (train/flag_table.hpp): the parse, the synopsis, --help and the
/// ranks' agreement (the mesh's and the experts' rows are the library's, as train_gpt's).
const examples::FlagTable<Options>& flag_table() {
  using O = Options;
  using examples::integer;
  static const auto table = examples::joined_rows<O>({
      examples::mesh_flag_rows<O>(
          "mesh (pp, dp, fsdp, cp, tp), default pp 1 x dp 1 x fsdp 2 (ZeRO-3) x cp 2 (ring) x tp 2 + SP: 8 ranks. "
          "--fsdp 1: DDP over --dp; --fsdp > 1: ZeRO --zero (default 3), HSDP with --dp > 1. --pp > 1: pipeline "
          "stages (--schedule, --microbatches M, default 2 x pp; M divides --batch, --layers >= the stages)."),
      {
          {"", "",
           "the model and the task (defaults: --layers 2 --heads 4 --dim 64 --patches 16 --patch-dim 48 --classes "
           "10 --batch 32):"},
          {"--layers", "N", "transformer blocks", integer(&O::layers, 1)},
          {"--heads", "N", "attention heads (a multiple of --tp; dividing --dim)", integer(&O::heads, 1)},
          {"--dim", "N", "the model's width", integer(&O::dim, 1)},
          {"--patches", "N", "patches per image", integer(&O::patches, 1)},
          {"--patch-dim", "N", "values per patch", integer(&O::patch_dim, 1)},
          {"--classes", "N", "classes (at least 2)", integer(&O::classes, 2)},
          {"--batch", "N", "images per step over all ranks", integer(&O::batch, 1)},
      },
      models::cli::moe_flag_rows<O>(),
      {
          {"", "", "training (defaults: --steps 60 --lr 3e-3 --seed 1 --eval-every 20):"},
          {"--steps", "N", "training steps", integer(&O::steps, 1)},
          {"--lr", "X", "AdamW's learning rate (at most 1e6)", examples::positive(&O::lr, 1e6)},
          {"--seed", "N", "the initialization's and the batches' seed", integer(&O::seed, 0)},
          {"--eval-every", "N", "the validation loss every N steps", integer(&O::eval_every, 1)},
          {"--backend", "threads|mpi", "the ranks: threads (default) or MPI processes (mpirun -n)",
           examples::choice(&O::backend, {"threads", "mpi"})},
          {"--dry-run", "",
           "one step on meta tensors (any size, any rank count; docs/dry-run.md): memory and bytes per "
           "rank class",
           examples::set_to(&O::dry_run, true)},
          {"--help", "", "this text (also -h; anywhere on the line, before any flag is checked)"},
      },
  });
  return table;
}

std::string str(long long n) { return std::to_string(n); }

/// A huge size (--dim 2^20, --layers 100000, --batch 2^30, ...) allocated for minutes or ended in
/// a tensor's "cannot allocate" naming no flag: a lower bound of the memory the flags ask for, in
/// long double (no overflow), checked before anything runs. Every parameter's value, gradient
/// and two AdamW moments (16 bytes), one activation per patch and model dimension for the batch
/// (4 bytes), and the images; MPI ranks are processes, each holding at least its share.
void check_memory(const Options& o) {
  using L = long double;
  const L d = L(o.dim), mlp = 4 * d;  // ViTConfig's mlp_ratio
  const L moe_layers = o.experts > 0 ? L(nn::moe_block_count(o.layers, o.moe_every, o.dense_first)) : 0;
  const L params = L(o.layers) * 4 * d * d + (L(o.layers) - moe_layers) * 2 * d * mlp +
                   moe_layers * L(o.experts) * 2 * d * mlp + (L(o.patch_dim) + L(o.patches) + L(o.classes)) * d;
  const L activations = L(o.batch) * L(o.patches) * (d + L(o.patch_dim));
  const bool mpi = o.backend == "mpi";
  examples::check_fits_memory((params * 16 + activations * 4) / (mpi ? L(o.ranks()) : 1),
                              "the model's parameters (--layers " + str(o.layers) + ", --dim " + str(o.dim) +
                                  ", --patch-dim " + str(o.patch_dim) + ", --patches " + str(o.patches) + ", --classes " +
                                  str(o.classes) + (o.experts > 0 ? ", --experts " + str(o.experts) : "") +
                                  ") with their gradients and AdamW moments, and a step's activations (--batch " +
                                  str(o.batch) + " x --patches x --dim)",
                              mpi);
}

/// The library's checks of the mesh, the pipeline's depth, the heads and the experts (those of
/// train_gpt, train/trainer_flags.hpp), then the ViT's own: the dry run's bounds, or the memory.
void check_options(Options& o) {
  // A dry run runs one rank per class, not per rank: its bound is the sim world's (an int), its
  // sizes are never allocated.
  cli::check_mesh_flags(o, o.batch, o.dry_run ? std::numeric_limits<int>::max() : threads::max_ranks);
  cli::check_pipeline_layers(o, o.layers);
  cli::check_heads_over_mesh(o, o.dim, o.heads);
  models::cli::check_moe_flags(o, o, o.layers);
  if (o.dry_run) {
    if (o.backend != "threads") throw UsageError("--dry-run runs on the sim communicator: --backend mpi has no effect");
    // A dry run builds every block and expert as a module: bounded like plan_at_scale's.
    if (o.layers > 100'000) throw UsageError("--layers " + str(o.layers) + " exceeds the dry run's 100000");
    if (o.experts > 100'000) throw UsageError("--experts " + str(o.experts) + " exceeds the dry run's 100000");
  } else {
    check_memory(o);
  }
}

Options parse(int argc, char** argv) {
  Options o;
  examples::parse_flags(flag_table(), o, argc, argv, "train_vit");  // --help: exits 0
  check_options(o);
  return o;
}

// ---------------------------------------------------------------- training

models::ViTConfig config_of(const Options& o) {
  // Non-causal attention has no imbalance over the context ranks: the patches stay in order.
  return {.patches = o.patches, .patch_dim = o.patch_dim, .classes = o.classes, .dim = o.dim, .heads = o.heads,
          .layers = o.layers, .seed = o.seed, .context = {.kind = o.cp_kind, .load_balanced = false}};
}
optim::AdamWOptions adamw_of(const Options& o) {
  return {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
}
/// The pipeline program's step options: the flags' mesh, schedule, ZeRO stage and AdamW, clip 1.
train::TrainerOptions trainer_options(const Options& o) {
  train::TrainerOptions t;
  t.degrees = {.pp = o.pp, .dp = o.dp, .fsdp = o.fsdp, .cp = o.cp, .tp = o.tp};
  t.schedule = o.schedule;
  t.microbatches = o.microbatches;
  t.zero = o.zero;
  t.reshard_after_forward = o.reshard_after_forward;
  t.adamw = adamw_of(o);
  return t;
}
void print_summary(const Options& o, double elapsed, double train_loss, double first_val, double val_loss) {
  std::printf("\nsummary: %d steps in %.1f s; final train loss %.4f; validation loss %.4f at step 0, %.4f at step %d\n",
              o.steps, elapsed, train_loss, first_val, val_loss, o.steps);
  std::printf(val_loss < first_val ? "validation loss fell\n" : "validation loss did not fall\n");
}

/// Every run (one stage at --pp 1; experts with --experts): the ViT's parts cut by pipeline::split,
/// each stage FSDP-sharded, one step = the schedule over the micro-batches and every gradient sync
/// (the Trainer's ShardedPipeline).
template <class Plan, bool MoE>
void train_pipeline(CommPtr world, const Options& o) {
  namespace pp = parallel::pipeline;
  PipeMesh mesh(world, {o.pp, o.dp, o.fsdp, o.cp, o.tp});
  using StageMesh = train::StageMeshIn<host_space>;
  const models::ViTConfig cfg = config_of(o);
  using Layers = std::conditional_t<MoE, models::MoELayers<float, ExpertMesh>, models::DenseLayers>;
  using Parts = models::ViTParts<float, StageMesh, Plan, Layers>;
  // The step (train/trainer.hpp): this rank's stages, FSDP, one AdamW over every parameter of this
  // rank (shards and experts), clipping to norm 1.
  train::Trainer<Parts> trainer(mesh, trainer_options(o), [&](const StageMesh& m) {
    return Parts(m, cfg, models::cli::layers_of<Layers>(m, o, o));
  });
  const bool root = world->rank() == 0;
  if (root)
    std::printf("train_vit: mesh pp %d (%s x %d) x dp %d x fsdp %d (ZeRO-%d) x cp %d (%s) x tp %d%s = %d ranks%s; model: "
                "%lld layers, dim %lld, %lld heads, %lld patches of %lld, %lld classes, batch %lld\n",
                o.pp, o.schedule.c_str(), o.microbatches, o.dp, o.fsdp, o.zero, o.cp,
                std::string(parallel::name_of(o.cp_kind)).c_str(), o.tp, o.sp && o.tp > 1 ? " + SP" : "", o.ranks(),
                MoE ? (", " + str(o.experts) + " experts over ep " + str(o.ep)).c_str() : "", (long long)o.layers,
                (long long)o.dim, (long long)o.heads, (long long)o.patches, (long long)o.patch_dim, (long long)o.classes,
                (long long)o.batch);
  auto batch_of = [&](std::uint64_t seed) {
    auto [x, y] = models::synthetic_images<float>(cfg, o.batch, seed);
    return trainer.microbatches(x, y);
  };
  const auto val = batch_of(1'000'000 + o.seed);
  // The loop (train/loop.hpp): step s draws its images from the seed and s; the held-out batch
  // through the same schedule (its gradients are dropped); a line per step.
  const double first_val = trainer.evaluate(val);
  train::FitData<decltype(trainer)> data;
  data.batch = [&](int step) { return batch_of(o.seed * 100'003 + std::uint64_t(step)); };
  data.evaluate = [&](int) { return trainer.evaluate(val); };
  const auto r = train::fit(trainer, {.steps = o.steps, .eval_every = o.eval_every, .progress_bar = false}, data);
  if (root) print_summary(o, r.elapsed, r.train_loss, first_val, r.val_loss);
}

// ---------------------------------------------------------------- --dry-run

/// The step of train_pipeline on meta tensors, as the rank of `world` (one rank class):
/// train_pipeline's Trainer and its own step (models::trainer_step: Trainer::step with the
/// report's phases marked), one micro-batch of the schedule through this pipeline rank's stages,
/// every gradient sync, clip and AdamW.
template <class Plan, bool MoE>
void dry_pipeline_step(CommPtr world, const Options& o, sim::Recorder& rec) {
  namespace pp = parallel::pipeline;
  using Mesh = MetaMesh<"pp", "dp", "fsdp", "cp", "tp">;
  using StageMesh = MetaMesh<"dp", "fsdp", "cp", "tp">;
  using MetaExperts = MetaMesh<"edp", "ep", "tp">;
  using Layers = std::conditional_t<MoE, models::MoELayers<float, MetaExperts>, models::DenseLayers>;
  using Parts = models::ViTParts<float, StageMesh, Plan, Layers>;
  using Stage = pp::Stage<Parts>;
  Mesh mesh(world, {o.pp, o.dp, o.fsdp, o.cp, o.tp});
  rec.phase("parameters");
  train::TrainerOptions options = trainer_options(o);
  options.one_microbatch = true;  // one of the schedule's micro-batches, as models::dry_run_plan runs
  train::Trainer<Parts> trainer(mesh, options, [&](const StageMesh& m) {
    return Parts(m, config_of(o), models::cli::layers_of<Layers>(m, o, o));
  });
  const StageMesh& stage_mesh = trainer.stage_mesh();
  const Extent micro = o.batch / o.microbatches;
  const auto x = distribute_replicated<typename Stage::Input::layout>(
      stage_mesh, Tensor<float, 3, meta_space>(Shape<3>{micro, o.patches, o.patch_dim}));
  const auto y = distribute_replicated<typename Stage::Target::layout>(stage_mesh, Tensor<std::int32_t, 1, meta_space>(Shape<1>{micro}));
  models::trainer_step(trainer, x, y, rec);
}

/// The rank classes of the mesh (pp, dp, fsdp, cp, tp): every pipeline rank its own class (its
/// stages); the data dimensions by their chunk of the micro-batch, "cp" by its patches
/// (non-causal: equal work per patch), "tp" by its heads and (SP) patches. The uneven flat-unit
/// shards of FSDP's tail ranks are not a class of their own (as in models::dry_run_plan).
std::vector<sim::RankClass<5>> dry_run_classes(const Options& o, const std::array<int, 5>& shape) {
  using W = sim::DimensionWork;
  const Extent micro = o.batch / o.microbatches;
  const Extent per_replica = chunk_range(micro, o.dp, 0).size();
  const W context = W::splitting({o.patches});
  const W tensor = W::splitting({o.heads, o.sp ? chunk_range(o.patches, o.cp, 0).size() : o.heads});
  return sim::rank_classes<5>(shape,
                              {W::distinct(), W::splitting({micro}), W::splitting({per_replica}), context, tensor});
}

/// --dry-run: the step once per rank class; each class's report, then the largest per-rank figures.
int dry_run(const Options& o) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<sim::RankReport> reports;
  auto go = [&]<class Plan>() {
    const std::array<int, 5> shape{o.pp, o.dp, o.fsdp, o.cp, o.tp};
    reports = sim::dry_run<5>(shape, dry_run_classes(o, shape), [&](CommPtr world, sim::Recorder& rec) {
      if (o.experts > 0) dry_pipeline_step<Plan, true>(std::move(world), o, rec);
      else dry_pipeline_step<Plan, false>(std::move(world), o, rec);
    });
  };
  if (o.sp) go.template operator()<parallel::MegatronPlan<true>>();
  else go.template operator()<parallel::MegatronPlan<false>>();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("train_vit --dry-run: mesh pp %d x dp %d x fsdp %d (ZeRO-%d) x cp %d (%s) x tp %d%s = %d ranks%s; model: "
              "%lld layers, dim %lld, %lld heads, %lld patches of %lld, %lld classes, batch %lld%s\n",
              o.pp, o.dp, o.fsdp, o.zero, o.cp, std::string(parallel::name_of(o.cp_kind)).c_str(), o.tp,
              o.sp && o.tp > 1 ? " + SP" : "", o.ranks(),
              o.experts > 0 ? (", " + str(o.experts) + " experts over ep " + str(o.ep)).c_str() : "", (long long)o.layers,
              (long long)o.dim, (long long)o.heads, (long long)o.patches, (long long)o.patch_dim, (long long)o.classes,
              (long long)o.batch,
              o.pp > 1 || o.experts > 0 ? (" (" + o.schedule + "; one of " + str(o.microbatches) + " micro-batches per pipeline rank)").c_str() : "");
  std::size_t most_memory = 0, most_sent = 0;
  for (std::size_t i = 0; i < reports.size(); ++i) {
    std::cout << '\n' << reports[i].to_table();
    if (reports[i].step_peak_total() > reports[most_memory].step_peak_total()) most_memory = i;
    if (reports[i].wire().sent > reports[most_sent].wire().sent) most_sent = i;
  }
  // The line a script (and CTest) reads: the largest figures any rank has in the step.
  std::printf("\ndry run: %zu rank classes for %d ranks in %.2f s; per rank at most: peak memory in the step %s (%s), "
              "collective bytes sent %s (%s)\n",
              reports.size(), o.ranks(), seconds, sim::human_bytes(double(reports[most_memory].step_peak_total())).c_str(),
              reports[most_memory].name.c_str(), sim::human_bytes(double(reports[most_sent].wire().sent)).c_str(),
              reports[most_sent].name.c_str());
  return 0;
}

void run_rank(CommPtr world, const Options& o) {
  // First, before the mesh or any collective: one all-gather that finds ranks given different
  // flags, in every build, naming the flag and the ranks (comm/settings_agreement.hpp).
  require_same_settings(*world, "train_vit", examples::settings_of(flag_table(), o));
  if (world->size() != o.ranks())
    world->fail("train_vit", "the job has " + str(world->size()) + " ranks but pp x dp x fsdp x cp x tp = " + str(o.ranks()));
  auto on = [&]<class Plan>() {
    if (o.experts > 0) train_pipeline<Plan, true>(world, o);
    else train_pipeline<Plan, false>(world, o);
  };
  if (o.sp) on.template operator()<parallel::MegatronPlan<true>>();
  else on.template operator()<parallel::MegatronPlan<false>>();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "train_vit: %s\n%s  train_vit --help: what each flag does and its default\n", e.what(),
                 examples::flags_synopsis(flag_table(), "train_vit").c_str());
    return 2;
  }
  try {
    if (o.dry_run) return dry_run(o);
    if (o.backend == "mpi") {
#ifdef DTENSOR_HAS_MPI
      return dtensor::mpi::run(argc, argv, [&](CommPtr world) { run_rank(std::move(world), o); });
#else
      std::fprintf(stderr, "train_vit: --backend mpi needs a build with -DDTENSOR_WITH_MPI=ON\n");
      return 2;
#endif
    }
    threads::run(o.ranks(), [&](CommPtr world) { run_rank(std::move(world), o); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_vit: %s\n", e.what());
    return 1;
  }
  return 0;
}
