// examples/train_gpt.hpp — a character-level GPT (or Llama, or MoE-GPT) trained with any
// combination of pipeline, data (DDP, FSDP / ZeRO, HSDP), context, tensor + sequence and expert
// parallelism: a flag table, the text corpus, the model's spec and main. The step is the
// library's train::Trainer, the loop train::fit; the flags every trainer shares, their checks and
// options are train/*_flags.hpp; the text models/text_corpus.hpp and models/text_generation.hpp.
// docs/training.md walks through a run (train_gpt --help: every flag), docs/trainer.md the pieces.
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "content_digest.hpp"
#include "dtensor/kernels/host/blas_core.hpp"
#include "dtensor/models/expert_load.hpp"
#include "dtensor/models/gpt_size.hpp"
#include "dtensor/models/llama.hpp"
#include "dtensor/models/mla_flags.hpp"
#include "dtensor/models/moe_flags.hpp"
#include "dtensor/models/text_corpus.hpp"
#include "dtensor/models/text_generation.hpp"
#include "dtensor/nn/fp8_recipe.hpp"
#include "dtensor/train/run_flags.hpp"
#include "dtensor/train/trainer_flags.hpp"
#include "dtensor/training.hpp"
#include "flag_table.hpp"
#include "plan_auto.hpp"
#include "print_mfu.hpp"

namespace examples::gpt {

using namespace dtensor;
namespace cli = train::cli;
using models::Corpus;
template <class Space>
using ExpertMeshIn = BasicDeviceMesh<Space, "edp", "ep", "tp">;  // the MoE experts' (--experts)
using cli::str, examples::UsageError;

// ---------------------------------------------------------------- flags

/// The flags' values (what each means, its default and bounds: flag_table() below); the mesh's,
/// the loop's, checkpoints', weights', --sync's and --offload's are cli::TrainerFlags', where the
/// ranks run cli::RunFlags', the text's models::cli::GenerationFlags'.
struct Options : cli::TrainerFlags,
                 cli::RunFlags,
                 models::cli::MoEFlags,
                 models::cli::MlaFlags,
                 models::cli::GenerationFlags,
                 examples::PlanFlags {
  Extent layers = 4, heads = 4, dim = 64, seq = 32, batch = 16;
  Extent kv_heads = 0, ffn = 0;  // --arch llama (0: --heads, 4 x --dim)
  Extent vocab = 0;              // --vocab (0: the text's alphabet)
  bool checkpoint = false;
  nn::Recompute recompute{};  // nn/recompute.hpp; full = --checkpoint
  std::string arch = "gpt", data;
  int kfold = 0;
  bool generate_program = false;  // the `generate` program (examples/generate.cpp): no training
  std::string gpu;                // --device cuda: the GPU's name (train_gpt_cuda.cuh), for the MFU line
  std::function<void(const train::FitReport&)> kernel_report;  // --profile-kernels (train_gpt_cuda.cuh)

  const char* program() const { return generate_program ? "generate" : "train_gpt"; }
  cli::FlagContext context() const {
    return {.batch = batch, .layers = layers, .experts = experts > 0, .device = device, .dtype = dtype};
  }
};

/// Every flag, one row each (train/flag_table.hpp): the parse, --help and the ranks' agreement.
inline const examples::FlagTable<Options>& flag_table() {
  using O = Options;
  using examples::choice, examples::integer, examples::recompute, examples::set_to, examples::text;
  static const auto table = examples::joined_rows<O>({
      examples::mesh_flag_rows<O>(
          "mesh (pp, dp, fsdp, cp, tp), default pp 2 x dp 1 x fsdp 2 x cp 2 x tp 2 + SP: 16 ranks (threads, or mpirun "
          "-n). --schedule dualpipev needs --microbatches >= 2 x pp; ZeRO-3 (--zero 3, the default with --fsdp > 1) "
          "gathers each unit per micro-batch at pp 1 and keeps a stage gathered for the step with a pipeline."),
      {
          {"", "", "the model (defaults: --layers 4 --heads 4 --dim 64 --seq 32 --batch 16):"},
          {"--layers", "N", "transformer blocks", integer(&O::layers, 1)},
          {"--heads", "N", "attention heads (a multiple of --tp; dividing --dim)", integer(&O::heads, 1)},
          {"--dim", "N", "the model's width", integer(&O::dim, 1)},
          {"--seq", "N", "characters per sequence (at least 2)", integer(&O::seq, 2)},
          {"--batch", "N", "sequences per step over all ranks", integer(&O::batch, 1)},
          {"--vocab", "N",
           "the embedding's and head's rows, at least the text's alphabet (default); e.g. GPT-2's 50257",
           integer(&O::vocab, 1)},
          {"--checkpoint", "", "recompute every block in its backward (activation checkpointing: --recompute full)",
           set_to(&O::checkpoint, true)},
          {"--recompute", "none|full|selective|core_attn,norm,act,mlp",
           "what the blocks recompute in their backward (nn/recompute.hpp; default none)", recompute(&O::recompute)},
          {"--arch", "gpt|llama",
           "the blocks: GPT's (default), or Llama's: RMSNorm, rotary grouped-query attention, SwiGLU; not with "
           "--experts",
           choice(&O::arch, {"gpt", "llama"})},
          {"--kv-heads", "N", "--arch llama: the KV heads (default --heads, which N divides)",
           integer(&O::kv_heads, 1)},
          {"--ffn", "N", "--arch llama: the SwiGLU width (default 4 x --dim)", integer(&O::ffn, 1)},
      },
      models::cli::mla_flag_rows<O>(),
      models::cli::moe_flag_rows<O>(),
      {
          {"", "", "the text (characters; its first 90% trains, the rest validates):"},
          {"--data", "FILE", "the text (default: the files under /usr/share/common-licenses)", text(&O::data)},
          {"--kfold", "k", "k runs over k folds of the text's blocks, then the validation loss's mean and std",
           integer(&O::kfold, 2)},
      },
      cli::trainer_flag_rows<O>(),
      {{"", "", "where it runs:"}},
      cli::run_flag_rows<O>("train_gpt"),
      models::cli::generation_flag_rows<O>(),
      examples::plan_auto_rows<O>(),
      {{"--help", "", "this text (also -h; anywhere on the line, before any flag is checked)"}},
  });
  return table;
}

/// The usage printed with a usage error: the synopsis (--help explains every flag).
inline std::string usage() {
  return examples::flags_synopsis(flag_table(), "train_gpt") +
         "  train_gpt --help: what each flag does and its default\n";
}

/// What the model adds to the library's checks: its shape over the mesh, --arch, --experts over
/// --ep, fp8 and --kfold.
inline void check_model(const Options& o) {
  cli::check_heads_over_mesh(o, o.dim, o.heads);
  if (o.arch == "gpt" && (o.kv_heads != 0 || o.ffn != 0)) throw UsageError("--kv-heads and --ffn need --arch llama");
  // One more whole trainer per element type and device (compile time): the Llama MoE
  // (models::LlamaMoE) trains through train::Trainer in a program of its own, and plan_at_scale
  // dry-runs it.
  if (o.arch == "llama" && o.experts > 0)
    throw UsageError(
        "--arch llama with --experts: not in train_gpt (models::LlamaMoE trains with train::Trainer; "
        "plan_at_scale --arch llama --experts plans it)");
  examples::check_kv_heads(o.heads, o.kv_heads);
  models::cli::check_mla_flags(o, o.arch, o.kv_heads, o.generate > 0);
  models::cli::check_moe_flags(o, o, o.layers);
  if (o.experts > 0 && o.device == "cuda" && o.dtype != "f32")
    throw UsageError("--experts with --device cuda and --dtype " + o.dtype +
                     ": not in train_gpt_cuda (its MoE trains in fp32; on the host, train_gpt trains it in " + o.dtype +
                     ")");
  // A recomputed forward would record the FP8 amaxes twice.
  if (o.dtype == "fp8" && (o.checkpoint || o.recompute.full || o.recompute.mlp))
    throw UsageError(
        "--dtype fp8 with --checkpoint or --recompute full|mlp: a recomputed Linear would record its FP8 "
        "amaxes twice and could quantize with another scale (docs/fp8.md)");
  if (o.generate > 0 && o.kfold > 0) throw UsageError("--generate with --kfold: k models, no one to generate from");
  if (o.generate > 0 && o.vocab > 0) throw UsageError("--generate with --vocab: ids past the text's alphabet");
  if (o.kfold > 0 && (o.save_every > 0 || !o.resume.empty()))
    throw UsageError("--kfold with checkpoints: k runs, one directory");
}

/// The flags (a UsageError names what is wrong), --plan auto's choice applied, every check run.
inline Options parse(int argc, char** argv, bool cuda_build) {
  Options o;
  // --help exits 0; --plan auto chooses the mesh flags (examples/plan_auto.hpp).
  examples::apply_plan_auto(o, examples::parse_flags(flag_table(), o, argc, argv, "train_gpt"));
  check_model(o);
  cli::check_trainer_flags(o, o.context());
  models::cli::check_generation_flags(o, o.ranks(), o.device, o.backend);
  cli::check_run_flags(o, cuda_build, "train_gpt");
  return o;
}

// ---------------------------------------------------------------- the model

/// The model of the flags: its config (ring and all-gather attention in the load-balanced order).
inline models::GPTConfig gpt_config(const Options& o, const Corpus& corpus) {
  return {.vocab = models::vocabulary_size(corpus, o.vocab),
          .seq = o.seq,
          .dim = o.dim,
          .heads = o.heads,
          .layers = o.layers,
          .mlp_ratio = 4,
          .checkpoint = o.checkpoint,
          .seed = o.seed,
          .context = {.kind = o.cp_kind, .load_balanced = o.cp > 1 && o.cp_kind != parallel::ContextKind::ulysses},
          .kv_heads = o.kv_heads,
          .ffn = o.ffn,
          .recompute = o.recompute,
          .mla = models::cli::latent_attention_config(o)};
}

/// What a checkpoint must match to resume: the configuration that fixes the tensors, and --sync's
/// settings. Any mesh and schedule can resume it.
inline std::map<std::string, std::string> checkpoint_config(const Options& o, const models::GPTConfig& cfg,
                                                            const Corpus& corpus) {
  auto config = models::config_of(cfg);
  config["model"] = o.arch;
  config["vocabulary"] = models::vocabulary_id(corpus);  // another text's alphabet of the same size is refused
  if (o.experts > 0) config["experts"] = str(o.experts), config["moe_every"] = str(o.moe_every);
  if (o.experts > 0 && o.dense_first > 0) config["dense_first"] = str(o.dense_first);  // which blocks have experts
  if (o.shared > 0) config["shared_experts"] = str(o.shared);  // their parameters are the checkpoint's
  cli::add_sync_config(o, config);
  return config;
}

/// The run's first lines on rank 0: the mesh, the schedule and model, the parameter count and the
/// GEMMs' kernels (most of a CPU step).
template <class Compute, class Trainer>
void print_header(const Options& o, const Corpus& corpus, Trainer& trainer, std::int64_t parameters) {
  cli::print_mesh_line(o, o, o.program(), cli::dtype_words(o));
  std::printf(
      "schedule %s: %d micro-batches over %d stages; model: %lld layers, dim %lld, %lld heads, seq %lld, "
      "batch %lld, vocab %zu",
      o.schedule.c_str(), o.microbatches, trainer.schedule().layout.stages(), (long long)o.layers, (long long)o.dim,
      (long long)o.heads, (long long)o.seq, (long long)o.batch, (size_t)models::vocabulary_size(corpus, o.vocab));
  std::printf("%s", models::cli::attention_words(o, o.arch, o.heads, o.kv_heads).c_str());
  if (o.zero == 3)
    std::printf("; ZeRO-3 %s", trainer.pipeline().keeps_stages_gathered() ? "keeps each stage gathered for the step"
                                                                          : "gathers each unit per micro-batch");
  if (o.experts > 0) {
    std::printf("; MoE: %lld experts, top-%lld, over ep %d", (long long)o.experts, (long long)o.topk, o.ep);
    if (o.topk_groups > 0 && o.topk_groups < o.groups)
      std::printf(" (within %lld of %lld groups)", (long long)o.topk_groups, (long long)o.groups);
    if (o.ep_node_size > 0) std::printf(", node-level dispatch over nodes of %d expert ranks", o.ep_node_size);
  }
  std::printf("\nparameters: %lld\n", (long long)parameters);
  if constexpr (Trainer::host) std::printf("%s\n", kernels::host::blas_kernels_line().c_str());
}

// ---------------------------------------------------------------- the run

/// After the loop (unless it ran no step: resumed at --steps for text only): the report, --sync's
/// payload and --export; then --generate's text.
template <bool MoE, class Trainer>
void finish(const Options& o, const Corpus& corpus, Trainer& trainer, const train::FitReport& report,
            const std::string& notes) {
  if (report.steps_run > 0) {
    train::print_report(report, notes);
    print_mfu(o, models::vocabulary_size(corpus, o.vocab), report, trainer.mesh().comm().size());
    cli::print_sync_payload(o, trainer, "train_gpt");
    if constexpr (Trainer::host && !MoE) cli::export_weights(o, trainer);
  }
  models::print_generated_text(models::cli::text_generation(o, o.seed), corpus, trainer.pipeline(), trainer.mesh(),
                               trainer.schedule());
}

/// The GPT, Llama or MoE-GPT of the flags as a train::Trainer, its header printed, then
/// train::fit on the text and the report. Returns the last validation loss. Compute: the model's
/// element type (float, or bfloat16); master values, gradient shards and AdamW state are float.
template <class Space, class Compute, class Plan, class Layers>
double run_gpt(CommPtr world, const Options& o, const Corpus& corpus) {
  using StageMesh = train::StageMeshIn<Space>;
  using Model = models::GptParts<Compute, StageMesh, Plan, std::int32_t, Layers>;
  constexpr bool moe = requires { typename Layers::ExpertMesh; }, host = std::is_same_v<Space, host_space>;
  MemoryLedger rank_ledger;  // this rank's allocations from here on: the step's peak by tag against before
  const models::GPTConfig cfg = gpt_config(o, corpus);
  const int ranks_here = o.backend == "threads" ? world->size() : 1;  // sharing the process's budgets
  const auto host_budget = cli::host_budget(o, ranks_here), device_budget = cli::device_budget(o, ranks_here);
  train::Trainer<Model, float> trainer(
      world, cli::trainer_options(o, o.context(), host_budget),
      [&](const StageMesh& m) { return Model(m, cfg, models::cli::layers_of<Layers>(m, o, o)); });
  std::shared_ptr<nn::ActivationOffload> activations;
  if constexpr (host && !moe) activations = cli::offload_activations(o, trainer, *world);
  world->barrier();  // every rank's optimizer built
  cli::check_budgets_built(o, *world, host_budget, device_budget);
  const std::int64_t held_built = host_budget.held();
  const std::int64_t parameters = trainer.parameter_count();  // collective: every rank
  if (world->rank() == 0) print_header<Compute>(o, corpus, trainer, parameters);
  auto fo = cli::fit_options(o, host_budget, device_budget, &rank_ledger);
  fo.config = checkpoint_config(o, cfg, corpus), fo.tokens_per_step = double(o.batch * o.seq);
  fo.allow_finished = o.generate != 0, fo.hosts = cli::print_hosts(o, trainer.mesh());  // --generate: at --steps
  if constexpr (host && !moe) cli::load_weights(o, trainer);
  std::mt19937_64 rng(o.seed);  // the batches' generator: the checkpoint's data state
  auto data = models::text_batches(corpus, trainer,
                                   {.batch = o.batch,
                                    .seq = o.seq,
                                    .microbatches = o.microbatches,
                                    .cp = o.cp,
                                    .load_balanced = o.cp_kind != parallel::ContextKind::ulysses,
                                    .dp = o.dp,
                                    .fedavg = o.sync == "fedavg"},
                                   rng);
  data.eval_note = [&](int, const parallel::pipeline::StepStats& stats) {  // MoE: the validation batch's routing
    if constexpr (moe)
      return train::idle_note(stats) + models::expert_load_note(trainer.pipeline(), trainer.mesh(), o.experts);
    else return train::idle_note(stats);
  };
  const auto report = train::fit(trainer, fo, data);
  finish<moe>(o, corpus, trainer, report,
              cli::offload_and_budget_notes(o, trainer, activations.get(), host_budget, held_built));
  return report.steps_run > 0 ? report.val_loss : 0;
}

/// The model types: one per kind of block (GPT, Llama or MoE) and plan (with or without SP).
template <class Space, class Compute, bool SP>
double train_blocks(CommPtr world, const Options& o, const Corpus& corpus) {
  using Plan = parallel::MegatronPlan<SP>;
  // MoE in the model's element type: fp32, and bf16 (fp8: bf16 with FP8 GEMMs, the experts' too)
  // on the host; a GPU's bf16 MoE is refused by check_model (one more trainer in its nvcc unit).
  if constexpr (std::is_same_v<Compute, float> || std::is_same_v<Space, host_space>)
    if (o.experts > 0)
      return run_gpt<Space, Compute, Plan, models::MoELayers<Compute, ExpertMeshIn<Space>>>(std::move(world), o,
                                                                                            corpus);
  if (o.arch == "llama") return run_gpt<Space, Compute, Plan, models::LlamaLayers>(std::move(world), o, corpus);
  return run_gpt<Space, Compute, Plan, models::DenseLayers>(std::move(world), o, corpus);
}

/// Every flag's value (the flag table's), the file a rank starts from and the text's contents:
/// the ranks' agreement at setup (comm/settings_agreement.hpp).
inline std::vector<Setting> settings_of(const Options& o, const Corpus& corpus) {
  auto settings = examples::settings_of(flag_table(), o);
  settings.push_back(examples::starting_file_setting(o.init_from, o.resume));
  settings.push_back({"--data (contents)", models::content_id(corpus)});
  return settings;
}

template <class Space, class Compute>
void run_rank(CommPtr world, const Options& o, const Corpus& corpus) {
  const kernels::host::IntraOpThreads intra_op(o.intra_op_threads);  // this rank's pool, for its lifetime
  // First, before anything sized by the flags: one all-gather that finds ranks given different
  // flags. A GPU job agrees over MPI before NCCL starts (train_gpt_cuda.cuh).
  if constexpr (std::is_same_v<Space, host_space>) require_same_settings(*world, "train_gpt", settings_of(o, corpus));
  if (world->size() != o.ranks())
    world->fail("train_gpt", "the job has " + str(world->size()) + " ranks but pp x dp x fsdp x cp x tp = " + str(o.ranks()));
  if (world->rank() == 0 && !o.plan_report.empty()) std::fputs(o.plan_report.c_str(), stdout);
  auto train_on = [&](const Corpus& c) {
    return o.sp ? train_blocks<Space, Compute, true>(world, o, c) : train_blocks<Space, Compute, false>(world, o, c);
  };
  if (o.kfold == 0) train_on(corpus);
  else models::kfold_runs(corpus, o.kfold, o.seed, o.seq, world->rank() == 0, train_on);
}

/// Fails at once when the model cannot fit (issue 25): every parameter's value, gradient and two
/// AdamW moments (16 bytes in float) and one activation per token and dimension exist at least
/// once over the ranks; more than this process may hold is an error naming the sizes. A lower
/// bound: it never refuses a job that fits. MPI ranks are processes: each needs its share.
inline void check_memory_estimate(const Options& o, const Corpus& corpus) {
  const long double params =
      models::approx_parameter_count(gpt_config(o, corpus), o.experts, o.moe_every, o.dense_first);
  const long double activations = (long double)o.batch * (long double)o.seq * (long double)o.dim;
  const std::string sizes =
      examples::cat("the model has about ", train::formatted("%.3Lg", params), " parameters (--layers ", o.layers,
                    ", --dim ", o.dim, o.experts > 0 ? ", --experts" : "", ") and a step ",
                    train::formatted("%.3Lg", activations), " activations (--batch ", o.batch, " x --seq ", o.seq,
                    " x --dim): their values, gradients, AdamW moments and one activation per token");
  const bool mpi = o.backend == "mpi";
  examples::check_fits_memory((params * 16.0L + activations * 4.0L) / (mpi ? (long double)o.ranks() : 1.0L), sizes, mpi);
}

/// The run without a GPU (train_gpt): --device cuda is refused by parse already.
struct NoGpu {
  static constexpr bool available = false;
  template <class Compute>
  int run(int, char**, const Options&, const Corpus&) const { return 2; }
};

/// The run after parsing, with the model in Compute (float, or bfloat16 for --dtype bf16); Gpu
/// runs --device cuda (train_gpt_cuda.cuh's CudaGpu) or nothing (NoGpu).
template <class Compute, class Gpu = NoGpu>
int run(int argc, char** argv, const Options& o, const Gpu& gpu = {}) {
  try {
    const Corpus corpus = models::encode(models::read_text(o.data, "--data"), o.seq, {"--data", "--seq"});
    check_memory_estimate(o, corpus);
    cli::check_save_dir(o, "train_gpt");
    if constexpr (Gpu::available) {  // --device cuda: only the GPU's instantiations (train_gpt_cuda.cuh)
      return gpu.template run<Compute>(argc, argv, o, corpus);
    } else {
      // The host BLAS's kernels, chosen by the CPU's features (kernels/host/blas_core.hpp) here,
      // before the rank threads start: the choice sets OPENBLAS_CORETYPE for an instant.
      (void)kernels::host::blas_kernels();
      auto rank = [&](CommPtr world) { run_rank<host_space, Compute>(std::move(world), o, corpus); };
      return cli::run_ranks(o, o.ranks(), argc, argv, rank, o.program());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", o.program(), e.what());
    return 1;
  }
}

/// One variant's run (f32 or bf16), each instantiated in its own translation unit.
using RunFn = int (*)(int argc, char** argv, const Options& o);

using ParseFn = Options (*)(int argc, char** argv, bool cuda_build);

/// main: the flags (a usage error exits 2, with the usage), then the f32 or bf16 run; the parse
/// is train_gpt's or the generate program's (examples/generate.cpp).
inline int main(int argc, char** argv, bool cuda_build, RunFn f32, RunFn bf16, ParseFn parse_flags = parse,
                const char* program = "train_gpt", std::string (*program_usage)() = usage) {
  Options o;
  try {
    o = parse_flags(argc, argv, cuda_build);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n%s", program, e.what(), program_usage().c_str());
    return 2;
  }
  if (o.dtype == "f32") return f32(argc, argv, o);
  const nn::Fp8Autocast fp8(o.dtype == "fp8");  // fp8: the bf16 run, its Linears' GEMMs in FP8 (nn/fp8_recipe.hpp)
  return bf16(argc, argv, o);
}

}  // namespace examples::gpt
