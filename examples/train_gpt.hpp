// examples/train_gpt.hpp — a character-level GPT trained with any combination of pipeline, data
// (DDP, FSDP / ZeRO, HSDP), context, tensor + sequence and expert parallelism, in one loop.
//
//   train_gpt                                                   # pp 2 x fsdp 2 x cp 2 x tp 2 + SP, 16 threads
//   train_gpt --pp 1 --fsdp 1 --cp 1 --dp 2 --tp 4 --steps 200  # DDP x TP + SP on 8 threads
//   train_gpt --pp 2 --dp 2 --fsdp 2 --tp 2 --schedule zbv --microbatches 4   # HSDP inside pipeline stages
//   train_gpt --cp 1 --experts 4 --ep 2       # PP x FSDP x TP + SP x EP: MoE blocks, experts over the fsdp ranks
//   train_gpt --experts 4 --ep 2              # all at once: PP x FSDP x CP x TP + SP x EP (dropless routing)
//   mpirun -n 16 train_gpt --backend mpi                        # the same, one process per rank
//   train_gpt_cuda --device cuda --pp 1 --cp 1 --fsdp 2 --tp 2  # the model on a GPU, 4 ranks sharing it
//   mpirun -n 8 train_gpt_cuda --device cuda --backend nccl     # one GPU per process (examples/train_gpt_cuda.cu)
//   train_gpt --save-every 50 --save-dir ckpt --steps 100       # a checkpoint every 50 steps (atomically replaced)
//   train_gpt --pp 1 --fsdp 1 --cp 1 --tp 1 --resume ckpt --steps 200   # continue it on one rank (any mesh)
//   train_gpt --arch llama --kv-heads 2                         # Llama blocks: RMSNorm, rotary GQA, SwiGLU
//   train_gpt --dtype bf16                                      # bf16 model, fp32 master weights (examples/train_gpt_bf16.cpp)
//   train_gpt --dtype fp8                                       # the bf16 run, Linear GEMMs in FP8 (emulated, docs/fp8.md)
//
// The mesh. Every run uses one mesh, (pp, dp, fsdp, cp, tp), of pp x dp x fsdp x cp x tp ranks; a
// parallelism that is off is a dimension of size 1, whose collectives cost nothing. "pp" cuts
// the model into pipeline stages; the rest of the mesh (the stage mesh) runs a stage:
//   "dp"    replicates parameters (DDP; with "fsdp" > 1, HSDP's replicas),
//   "fsdp"  shards parameters, gradients and optimizer state (ZeRO --zero 1, 2 or 3),
//   "cp"    splits every sequence (ring, all-gather or Ulysses attention),
//   "tp"    splits the heads, the MLP and the vocabulary (Megatron), and with SP the sequence
//           between them;
// and with --experts, the MoE blocks' experts live on a second factorization of the data and
// context ranks, (edp, ep, tp) with ep x edp = dp x fsdp x cp (parallel::make_expert_mesh).
//
// A step. Every rank draws the same --batch sequences of --seq characters (from --seed), cuts
// them into --microbatches, and keeps its piece of each (its data rank's sequences, its context
// rank's positions). The pipeline schedule (--schedule) runs this rank's stages over the
// micro-batches (parallel::pipeline::Executor): activations and their gradients go between
// stages by send/recv; inside a stage each module's collectives are the tensor plan's and
// context attention's. Each stage is FSDP-sharded (parallel::fully_shard): its parameters are
// all-gathered before its first forward of the step and freed after its last backward, when its
// gradients, accumulated over the micro-batches, are reduce-scattered — while the schedule goes
// on. Then (parallel::pipeline::ShardedPipeline::step) the gradients are reduced over "dp",
// "cp" and, under SP, "tp"; the experts' over "edp"; they are clipped to norm 1 over all stages,
// and AdamW steps over this rank's shards. The step is train::Trainer's (train/trainer.hpp), the
// loop train::fit's (train/loop.hpp: timing, evaluation, checkpoints, the monitor, the report).
//
// Rank 0 prints the loss of every step (the mean over the batch, from the last stage; a progress
// bar on a terminal), the validation loss every --eval-every steps with the pipeline's idle
// fraction (and the MoE's load per expert), and at the end a summary with the collectives of one
// step (from a CommLog) by kind and group. --trace FILE writes a Chrome trace of steps 2..4
// (compute, collective and wait spans per rank; docs/observability.md), --plot FILE the train and
// validation loss curves as an SVG.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>  // access, sysconf

#include "content_digest.hpp"
#include "dtensor/checkpoint/pipeline_safetensors.hpp"
#include "dtensor/checkpoint/pipeline_state.hpp"
#include "dtensor/checkpoint/sync_state.hpp"
#include "dtensor/comm/hosts.hpp"
#include "dtensor/comm/sim.hpp"
#include "dtensor/distributed/settings_agreement.hpp"
#include "dtensor/kernels/host/blas_core.hpp"
#include "dtensor/kernels/host/parallel.hpp"
#include "dtensor/mesh/hosts.hpp"
#include "dtensor/models/expert_load.hpp"
#include "dtensor/models/generate.hpp"
#include "dtensor/models/gpt_config.hpp"
#include "dtensor/models/llama.hpp"
#include "dtensor/models/pipeline_generate.hpp"
#include "dtensor/models/serve.hpp"
#include "dtensor/nn/activation_offload.hpp"
#include "dtensor/nn/cross_mesh_params.hpp"
#include "dtensor/nn/fp8_recipe.hpp"
#include "dtensor/optim/check_finite.hpp"
#include "dtensor/optim/memory_budget.hpp"
#include "dtensor/optim/offload_adamw.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/sharded_pipeline.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "dtensor/parallel/sync/data_split.hpp"
#include "dtensor/parallel/sync/delayed_gradients.hpp"
#include "dtensor/parallel/sync/diloco.hpp"
#include "dtensor/parallel/sync/fed_avg.hpp"
#include "dtensor/parallel/sync/local_gradients.hpp"
#include "dtensor/parallel/sync/traffic.hpp"
#include "dtensor/trace/training_monitor.hpp"
#include "dtensor/trace/unit_spans.hpp"
#include "dtensor/train/trainer.hpp"
#include "dtensor/training.hpp"
#include "flag_table.hpp"
#include "flags.hpp"
#include "plan_auto.hpp"

#include "dtensor/train/loop.hpp"  // train::fit, the loop
#include "dtensor/train/report.hpp"
#ifdef DTENSOR_HAS_MPI
#include "dtensor/comm/mpi.hpp"
#endif

namespace examples::gpt {

using namespace dtensor;
namespace pp = parallel::pipeline;
// The meshes in a memory space (host_space, or cuda_space for --device cuda): the space of every
// tensor of the model, its gradients and its optimizer state.
template <class Space>
using MeshIn = train::MeshIn<Space>;  // (pp, dp, fsdp, cp, tp), every run; size 1 where a parallelism is off
template <class Space>
using StageMeshIn = train::StageMeshIn<Space>;   // one pipeline stage's ranks
template <class Space>
using ExpertMeshIn = BasicDeviceMesh<Space, "edp", "ep", "tp">;        // the MoE experts' (--experts)

// ---------------------------------------------------------------- flags

/// The flags' values (what each means, its default and bounds: flag_table() below).
struct Options : examples::MeshFlags {  // the mesh: --pp --dp --fsdp --cp --tp --ep --zero --sp --cp-kind ...
  // The model: GPT's blocks or Llama's (--arch, --kv-heads, --ffn: 0 = --heads, 4 x --dim), dense or MoE.
  Extent layers = 4, heads = 4, dim = 64, seq = 32, batch = 16;
  bool checkpoint = false;
  nn::Recompute recompute{};  // nn/recompute.hpp; full = --checkpoint
  std::string arch = "gpt";
  Extent kv_heads = 0, ffn = 0;
  Extent experts = 0, topk = 2, moe_every = 1;  // 0 experts: dense MLPs
  double capacity = 0;                          // 0: dropless
  // Training, and where it runs.
  int steps = 100, eval_every = 25;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  bool check_finite = false, tf32 = false;
  std::string trace, plot, data, backend = "threads", device = "cpu", dtype = "f32", attention = "auto";
  int intra_op_threads = 1;
  // Checkpoints (checkpoint/pipeline_state.hpp).
  int save_every = 0;
  std::string save_dir, resume;
  // Beyond lock-step DP on "dp" (parallel/sync/), DiLoCo's options (parallel::sync::DiLoCoOptions;
  // --outer-lr 0 and --outer-momentum -1: the library's defaults).
  std::string sync = "ddp";
  int inner_steps = 50, staleness = 1, clients = 0, kfold = 0;
  bool inner_steps_given = false, staleness_given = false;  // refused where --sync cannot use them
  int fragments = 1, overlap = 0;
  double overlap_alpha = 0, outer_lr = 0, outer_momentum = -1;
  bool bf16_reduce = false;
  bool diloco_options_given() const {
    return fragments != 1 || overlap != 0 || overlap_alpha != 0 || bf16_reduce || outer_lr != 0 || outer_momentum >= 0;
  }
  // Weights in and out, and text (checkpoint/safetensors.hpp, models/generate.hpp, models/serve.hpp).
  std::string export_path, init_from, prompt = "The ";
  int generate = 0, top_k = 0, serve_tp = 0;
  double temperature = 0, top_p = 1;
  // The `generate` program (train_gpt started as `generate`, examples/train_gpt.cpp): no
  // training, the model's shape read from the --resume checkpoint; --seed there seeds the sampling only.
  bool generate_program = false;
  std::optional<std::uint64_t> sampling_seed;
  std::uint64_t sample_seed() const { return sampling_seed.value_or(seed); }
  // Offload (docs/offload.md: optim::OffloadedAdamW, FsdpOptions::offload_params_dir,
  // nn::ActivationOffload) and the memory budgets (optim/memory_budget.hpp).
  std::vector<std::string> offload;
  std::string offload_dir;
  std::size_t offload_buffer_kib = 64 << 10;
  bool offload_buffer_given = false;  // else, under --host-budget-mib, the budget sizes it
  double host_budget_mib = 0, device_budget_mib = 0;
  bool offloads(std::string_view what) const { return std::find(offload.begin(), offload.end(), what) != offload.end(); }
  // --plan auto (examples/plan_auto.hpp); plan_report is what rank 0 prints about the choice.
  std::string plan, plan_device = "h100", plan_report;
  std::vector<std::string> plan_device_fields;  // --plan-device-field NAME=VALUE, in order
  int plan_ranks = 0;
};

using examples::flag_value;
using examples::UsageError;

inline std::string str(long long n) { return std::to_string(n); }

/// Every flag, one row each (examples/flag_table.hpp): the parse, the synopsis and --help.
inline const examples::FlagTable<Options>& flag_table() {
  using O = Options;
  using examples::choice, examples::integer, examples::marking, examples::positive, examples::set_to, examples::text;
  // At least one byte (1e-320 MiB is positive, but 0 bytes), within an int64 of bytes.
  auto budget = [](double O::* m) {
    return [=](O& o, const std::string& f, const std::string& v) {
      const double mib = examples::positive_flag_value(f, v, double(std::int64_t(1) << 42));
      if (mib * (1 << 20) < 1) throw UsageError(f + " " + v + " is less than one byte");
      o.*m = mib;
    };
  };
  static const examples::FlagTable<O> table = [&] {
    auto t = examples::mesh_flag_rows<O>(
        "mesh (pp, dp, fsdp, cp, tp), default pp 2 x dp 1 x fsdp 2 x cp 2 x tp 2 + SP: 16 ranks (threads, or mpirun "
        "-n). "
        "--schedule dualpipev needs --microbatches >= 2 x pp; ZeRO-3 (--zero 3, the default with --fsdp > 1) gathers "
        "each "
        "unit per micro-batch at pp 1 and keeps a stage gathered for the step with a pipeline.");
    const examples::FlagTable<O> rows{
        {"", "", "the model (defaults: --layers 4 --heads 4 --dim 64 --seq 32 --batch 16):"},
        {"--layers", "N", "transformer blocks", integer(&O::layers, 1)},
        {"--heads", "N", "attention heads (a multiple of --tp; dividing --dim)", integer(&O::heads, 1)},
        {"--dim", "N", "the model's width", integer(&O::dim, 1)},
        {"--seq", "N", "characters per sequence (at least 2)", integer(&O::seq, 2)},
        {"--batch", "N", "sequences per step over all ranks", integer(&O::batch, 1)},
        {"--checkpoint", "", "recompute every block in its backward (activation checkpointing: --recompute full)",
         set_to(&O::checkpoint, true)},
        {"--recompute", "none|full|selective|core_attn,norm,act,mlp",
         "what the blocks recompute in their backward "
         "(nn/recompute.hpp; default none)",
         [](O& o, const std::string&, const std::string& v) {
           try {
             o.recompute = nn::Recompute::parse(v);
           } catch (const Error& e) {
             throw UsageError("--recompute " + v + ": " + e.what());
           }
         }},
        {"--arch", "gpt|llama",
         "the blocks: GPT's (default), or Llama's: RMSNorm, rotary grouped-query attention, "
         "SwiGLU; not with --experts",
         choice(&O::arch, {"gpt", "llama"})},
        {"--kv-heads", "N", "--arch llama: the KV heads (default --heads, which N divides)", integer(&O::kv_heads, 1)},
        {"--ffn", "N", "--arch llama: the SwiGLU width (default 4 x --dim)", integer(&O::ffn, 1)},
        {"--experts", "E",
         "E > 0: MoE blocks of E experts (default 0: dense MLPs), split over --ep ranks (dividing "
         "dp x fsdp x cp; any E: 5 over 2 is 3 + 2)",
         integer(&O::experts, 0)},
        {"--topk", "K", "--experts: top-K routing (default 2)", integer(&O::topk, 1)},
        {"--capacity", "F", "--experts: the capacity factor (default dropless; with --cp > 1 at least E / K)",
         positive(&O::capacity)},
        {"--moe-every", "N", "--experts: every N-th block a MoE block (default 1: all)", integer(&O::moe_every, 1)},
        {"", "", "training (defaults: --steps 100 --lr 3e-3 --seed 1 --eval-every 25):"},
        {"--steps", "N", "training steps (with --resume, the total)", integer(&O::steps, 1)},
        {"--lr", "X", "AdamW's learning rate (at most 1e6)", positive(&O::lr, 1e6)},
        {"--seed", "N", "the initialization's and the batches' seed", integer(&O::seed, 0)},
        {"--eval-every", "N", "the validation loss every N steps", integer(&O::eval_every, 1)},
        {"--check-finite", "", "stop at the first NaN/Inf loss or parameter, naming it",
         set_to(&O::check_finite, true)},
        {"--data", "FILE", "the text (default: the files under /usr/share/common-licenses)", text(&O::data)},
        {"--trace", "FILE", "a Chrome trace of steps 2..4 (docs/observability.md)", text(&O::trace)},
        {"--plot", "FILE", "the train and validation loss curves as an SVG", text(&O::plot)},
        {"", "", "where it runs:"},
        {"--backend", "threads|mpi|nccl",
         "the ranks: threads (default), MPI processes (mpirun -n), or NCCL with "
         "--device cuda under mpirun (one GPU per process)",
         choice(&O::backend, {"threads", "mpi", "nccl"})},
        {"--device", "cpu|cuda",
         "cuda (train_gpt_cuda): the model on a GPU, the ranks threads sharing it, or --backend "
         "nccl under mpirun",
         choice(&O::device, {"cpu", "cuda"})},
        {"--dtype", "f32|bf16|fp8",
         "bf16: the model computes in bfloat16; master weights, gradient shards and AdamW state "
         "stay fp32 (FSDP mixed precision, also without --fsdp: ZeRO-1 on one shard); not with "
         "--experts. fp8: bf16 with every Linear's GEMMs in FP8 (E4M3 forward, E5M2 gradients, "
         "delayed scaling; the host emulation, docs/fp8.md); not with --checkpoint or --recompute "
         "full|mlp",
         choice(&O::dtype, {"f32", "bf16", "fp8"})},
        {"--tf32", "",
         "--device cuda: float GEMMs on TF32 tensor cores (fp32 accumulation, inputs rounded to 10 "
         "mantissa bits; PyTorch's allow_tf32)",
         set_to(&O::tf32, true)},
        {"--attention", "auto|fused|gemm",
         "--device cuda: the fused attention kernels or the cuBLAS chunks "
         "(docs/gpu.md); auto (the default) takes the chunks from 128 keys on",
         choice(&O::attention, {"auto", "fused", "gemm"})},
        {"--intra-op-threads", "N",
         "each rank's host kernels (attention, norms, GELU, AdamW, cross entropy, "
         "elementwise, permutes) on N threads: a pool of N - 1 workers per rank; the same bits "
         "as 1 (docs/host-kernels.md). The GEMMs' threads are OpenBLAS's: DTENSOR_BLAS_THREADS",
         integer(&O::intra_op_threads, 1, kernels::host::IntraOpThreads::max_threads)},
        {"", "", "checkpoints (host memory):"},
        {"--save-every", "N", "save parameters, AdamW state, step and data position every N steps (with --save-dir)",
         integer(&O::save_every, 1)},
        {"--save-dir", "DIR", "where (atomically: DIR always holds a whole checkpoint)", text(&O::save_dir)},
        {"--resume", "DIR", "continue from a checkpoint saved on any mesh, up to --steps (the total)",
         text(&O::resume)},
        {"", "", "--sync (on \"dp\", docs/beyond-sync.md):"},
        {"--sync", "ddp|local-sgd|diloco|async|fedavg",
         "ddp (default); local-sgd / diloco: average / DiLoCo outer step "
         "every --inner-steps H; async: the all-reduce of step t applied "
         "at t + --staleness s; fedavg: each dp rank a client on its own "
         "slice of the text, --clients K sampled per round of H steps",
         choice(&O::sync, {"ddp", "local-sgd", "diloco", "async", "fedavg"})},
        {"--inner-steps", "H", "local-sgd, diloco, fedavg: local steps between syncs (default 50)",
         marking(integer(&O::inner_steps, 1), &O::inner_steps_given)},
        {"--staleness", "s", "async: steps an all-reduce is late (default 1)",
         marking(integer(&O::staleness, 0), &O::staleness_given)},
        {"--clients", "K", "fedavg: clients sampled per round (default 0: every dp rank)", integer(&O::clients, 0)},
        {"--kfold", "k", "k runs over k folds of the text's blocks, then the validation loss's mean and std",
         integer(&O::kfold, 2)},
        {"--fragments", "F", "diloco: Streaming DiLoCo, F staggered pieces (default 1)", integer(&O::fragments, 1)},
        {"--overlap", "T", "diloco: a piece's all-reduce waited for T < H steps after issue (default 0)",
         integer(&O::overlap, 0)},
        {"--overlap-alpha", "A", "diloco with --overlap: its local steps merged with weight A in (0, 1] (default 0)",
         positive(&O::overlap_alpha, 1)},
        {"--bf16-reduce", "", "diloco: the outer all-reduce in bf16", set_to(&O::bf16_reduce, true)},
        {"--outer-lr", "X", "diloco: the outer learning rate (default 0.7)", positive(&O::outer_lr)},
        {"--outer-momentum", "M", "diloco: the outer Nesterov momentum in [0, 1) (default 0.9; 0: plain outer SGD)",
         [](O& o, const std::string&, const std::string& v) {
           const auto m = parse_number(v);
           if (!m || !(*m >= 0 && *m < 1))
             throw UsageError("--outer-momentum expects a number in [0, 1), got '" + v + "'");
           o.outer_momentum = *m;
         }},
        {"", "", "weights and text (CPU):"},
        {"--init-from", "FILE",
         "start from a safetensors file's weights (or a sharded *.index.json), any mesh's, "
         "instead of the random init",
         text(&O::init_from)},
        {"--export", "FILE.safetensors", "the trained weights, whole (any mesh), readable by Python's safetensors",
         text(&O::export_path)},
        {"--generate", "N",
         "N characters after --prompt from the trained model, on the training mesh with a KV cache "
         "per pipeline stage; with --resume DIR at or past --steps, from the checkpoint without "
         "training (the generate program: the same, the model's shape read from the checkpoint; "
         "generate --help)",
         integer(&O::generate, 1)},
        {"--prompt", "TEXT", "the text to continue (default \"The \"; characters of the training text)",
         text(&O::prompt)},
        {"--temperature", "T", "T > 0: sampled, not greedy", positive(&O::temperature)},
        {"--top-k", "K", "sampling from the K likeliest (needs --temperature)", integer(&O::top_k, 1)},
        {"--top-p", "P", "sampling from the nucleus: P in (0, 1], 1 = all (needs --temperature)",
         positive(&O::top_p, 1)},
        {"--serve-mesh", "tp=N",
         "the same text again on a serving mesh (tp N over ranks 0..N-1), the trained weights "
         "moved there in memory with the fewest bytes (docs/cross-mesh.md); its tokens must equal "
         "the training mesh's; from every pipeline stage, MoE experts included",
         [](O& o, const std::string& f, const std::string& v) {
           if (!v.starts_with("tp=")) throw UsageError("--serve-mesh expects tp=N, got '" + v + "'");
           o.serve_tp = flag_value<int>(f, v.substr(3), 1);
         }},
        {"", "", "offload (docs/offload.md):"},
        {"--offload", "optimizer,params,activations",
         "a comma list. optimizer: AdamW's moments in a file per rank "
         "under --offload-dir, the same update bit for bit (checkpoints "
         "save them); params: the FSDP master shards (ZeRO-3's parameter "
         "shards, a bf16 model's fp32 master) there, mapped, prefetched a "
         "unit ahead and written behind, not for an f32 model at ZeRO-1/2 "
         "(its master is its own values); activations: every block's saved "
         "activations there between its forward and backward (written "
         "behind, read ahead; the same losses bit for bit; dense models). "
         "Host memory only",
         examples::comma_list(&O::offload, "--offload needs optimizer, params and/or activations (a comma list)")},
        {"--offload-dir", "DIR", "an existing, writable local directory with room for them", text(&O::offload_dir)},
        {"--offload-buffer-kib", "N",
         "--offload optimizer's staging buffer of host memory (default 65536, at most "
         "2^44; under --host-budget-mib the budget sizes it)",
         marking(integer(&O::offload_buffer_kib, 1, std::size_t(1) << 44), &O::offload_buffer_given)},
        {"--host-budget-mib", "X",
         "the host memory this process's tensors may hold, in MiB (decimals allowed): over it "
         "after building the model and optimizer, or in the first step, is an error on every rank",
         budget(&O::host_budget_mib)},
        {"--device-budget-mib", "X", "the same for the GPU's memory (--device cuda)", budget(&O::device_budget_mib)},
        {"", "",
         "--plan auto (examples/plan_auto.hpp, docs/dry-run.md): the mesh flags (not given) and the "
         "recomputation (unless --checkpoint/--recompute) chosen for N ranks by the dry run's cost model for "
         "the device, printed with why, then trained:"},
        {"--plan", "auto", "choose the plan", text(&O::plan)},
        {"--ranks", "N", "the ranks to plan for", integer(&O::plan_ranks, 1, threads::max_ranks)},
        {"--plan-device", "h100|h100-500w|h200|a100", "the device the cost model's times are for (default h100)",
         text(&O::plan_device)},
        {"--plan-device-field", "NAME=VALUE", "one of the device's fields (sim/device.hpp); repeatable",
         examples::append(&O::plan_device_fields)},
        {"--help", "", "this text (also -h; anywhere on the line, before any flag is checked)"},
    };
    t.insert(t.end(), rows.begin(), rows.end());
    return t;
  }();
  return table;
}

/// The usage printed with a usage error: the synopsis (--help explains every flag).
inline std::string usage() {
  return examples::flags_synopsis(flag_table(), "train_gpt") +
         "  train_gpt --help: what each flag does and its default\n";
}

/// --arch's flags.
inline void check_architecture(const Options& o) {
  if (o.arch == "gpt" && (o.kv_heads != 0 || o.ffn != 0)) throw UsageError("--kv-heads and --ffn need --arch llama");
  if (o.arch == "llama" && o.experts > 0) throw UsageError("--arch llama with --experts: MoE blocks are GPT blocks");
  examples::check_kv_heads(o.heads, o.kv_heads);
}

/// --save-every, --save-dir and --resume: host memory only (the checkpoint library's buffers).
inline void check_checkpoints(const Options& o) {
  if (o.save_every > 0 && o.save_dir.empty()) throw UsageError("--save-every needs --save-dir DIR");
  if (o.save_every == 0 && !o.save_dir.empty()) throw UsageError("--save-dir needs --save-every N");
}

/// --init-from, --export, --generate and its sampling flags.
inline void check_interop(const Options& o) {
  if (!o.export_path.empty() && !o.export_path.ends_with(".safetensors"))
    throw UsageError("--export " + o.export_path + ": the file name must end in .safetensors");
  if (!o.init_from.empty() && !o.resume.empty()) throw UsageError("--init-from with --resume: one starting point, not two");
  examples::check_output_file("--export", o.export_path);  // before training, not after it
  if (!o.init_from.empty() && !std::filesystem::is_regular_file(o.init_from))
    throw UsageError("--init-from " + o.init_from + ": no such file (a .safetensors file or a *.index.json)");
  if (o.generate == 0 && (o.temperature > 0 || o.top_k > 0 || o.top_p < 1))
    throw UsageError("--temperature, --top-k and --top-p need --generate N");
  if (o.top_k > 0 && o.temperature == 0) throw UsageError("--top-k needs --temperature T (without it generation is greedy)");
  if (o.top_p < 1 && o.temperature == 0)
    throw UsageError("--top-p " + examples::cat(o.top_p) + " needs --temperature T (without it generation is greedy)");
  const bool any = !o.export_path.empty() || !o.init_from.empty() || o.generate > 0;
  if ((!o.export_path.empty() || !o.init_from.empty()) && o.experts > 0)
    throw UsageError("--init-from and --export with --experts: not supported yet (--generate is)");
  if (any && o.device == "cuda") throw UsageError("--init-from, --export and --generate with --device cuda: not supported yet");
  if (o.generate > 0 && o.kfold > 0) throw UsageError("--generate with --kfold: k models, no one to generate from");
  if (o.serve_tp > 0) {
    if (o.generate == 0) throw UsageError("--serve-mesh needs --generate N");
    if (o.serve_tp > o.pp * o.dp * o.fsdp * o.cp * o.tp)
      throw UsageError("--serve-mesh tp=" + std::to_string(o.serve_tp) + ": more ranks than the training mesh's " +
                       std::to_string(o.pp * o.dp * o.fsdp * o.cp * o.tp));
  }
}

/// --device, --dtype and --backend together: what this build can run (cuda_build: train_gpt_cuda).
inline void check_device(const Options& o, bool cuda_build) {
  if (o.device == "cuda" && !cuda_build)
    throw UsageError("--device cuda: this train_gpt was built without CUDA; run train_gpt_cuda (built with -DDTENSOR_WITH_CUDA=ON)");
  // train_gpt_cuda holds only the GPU's instantiations of the trainer: the host's doubled its two
  // nvcc units, CI's longest (docs/benchmarks.md, "CI").
  if (o.device == "cpu" && cuda_build)
    throw UsageError("train_gpt_cuda runs on the GPU: give --device cuda (the host run is train_gpt: the same trainer, "
                     "the same flags)");
  if (o.device == "cpu" && o.backend == "nccl") throw UsageError("--backend nccl needs --device cuda");
  if (o.tf32 && o.device != "cuda") throw UsageError("--tf32 needs --device cuda (the host's float GEMMs are fp32)");
  if (o.attention != "auto" && o.device != "cuda")
    throw UsageError("--attention " + o.attention + " needs --device cuda (the host has one attention kernel)");
  if (o.device == "cuda" && o.backend == "mpi") throw UsageError("--device cuda runs under mpirun with --backend nccl, not mpi");
  // bf16 keeps fp32 master values only for what FSDP shards; the MoE experts are outside it.
  if (o.dtype != "f32" && o.experts > 0)
    throw UsageError("--dtype " + o.dtype +
                     " with --experts: not supported yet (the experts are not FSDP-sharded, so they would "
                     "have no fp32 master copy)");
  // FP8 (nn/linear.hpp): the host emulation only; a recomputed forward would record the amaxes twice.
  if (o.dtype == "fp8" && o.device == "cuda")
    throw UsageError(
        "--dtype fp8 with --device cuda: not wired yet (the FP8 Linear is the host emulation; "
        "kernels/cuda/gemm_fp8.cuh is tested alone, docs/fp8.md)");
  if (o.dtype == "fp8" && (o.checkpoint || o.recompute.full || o.recompute.mlp))
    throw UsageError(
        "--dtype fp8 with --checkpoint or --recompute full|mlp: a recomputed Linear would record its FP8 "
        "amaxes twice and could quantize with another scale (docs/fp8.md)");
}

/// --sync, --inner-steps, --staleness, --clients, --kfold (parallel/sync/).
inline void check_sync(const Options& o) {
  if (o.clients > o.dp)
    throw UsageError("--clients " + str(o.clients) + ": more clients than the " + str(o.dp) + " dp ranks (--dp)");
  if (o.clients > 0 && o.sync != "fedavg") throw UsageError("--clients needs --sync fedavg");
  if (o.inner_steps_given && o.sync != "local-sgd" && o.sync != "diloco" && o.sync != "fedavg")
    throw UsageError("--inner-steps needs --sync local-sgd, diloco or fedavg (--sync " + o.sync + " has no inner steps)");
  if (o.staleness_given && o.sync != "async")
    throw UsageError("--staleness needs --sync async (--sync " + o.sync + " applies each all-reduce at once)");
  if (o.diloco_options_given() && o.sync != "diloco")
    throw UsageError("--fragments, --overlap, --overlap-alpha, --bf16-reduce, --outer-lr and --outer-momentum need --sync diloco");
  if (o.fragments > o.inner_steps)
    throw UsageError("--fragments " + str(o.fragments) + " exceeds --inner-steps " + str(o.inner_steps) + " (a piece syncs once per H steps)");
  if (o.overlap >= o.inner_steps)
    throw UsageError("--overlap " + str(o.overlap) + ": must be below --inner-steps " + str(o.inner_steps) +
                     " (an all-reduce completes before its fragment is due again)");
  if (o.overlap_alpha != 0 && o.overlap == 0) throw UsageError("--overlap-alpha needs --overlap T > 0");
  // An overlapped all-reduce may be in flight at any step: its state is not a tensor to save.
  if (o.overlap > 0 && (o.save_every > 0 || !o.resume.empty()))
    throw UsageError("--overlap with checkpoints: an outer all-reduce may be in flight at the save");
  if (o.sync == "ddp") return;
  if (o.experts > 0) throw UsageError("--sync " + o.sync + " with --experts: the experts' all-reduce on \"edp\" spans replicas");
  // The per-rank sync state (checkpoint/sync_state.hpp) is written from host memory.
  if (o.device == "cuda" && (o.save_every > 0 || !o.resume.empty()))
    throw UsageError("--sync " + o.sync + " with checkpoints and --device cuda: not supported yet (host only)");
}

/// --offload, --offload-dir, --offload-buffer-kib (optim/offload_adamw.hpp). The directory itself is
/// checked by every rank when the optimizer makes its file (missing, read-only, full: all fail).
inline void check_offload(const Options& o) {
  if (o.device_budget_mib > 0 && o.device != "cuda")
    throw UsageError("--device-budget-mib with --device " + o.device + ": the model is in host memory (--host-budget-mib)");
  for (const auto& w : o.offload)
    if (w != "optimizer" && w != "params" && w != "activations")
      throw UsageError("--offload " + w + ": unknown; what is offloaded: optimizer, params, activations");
  if (o.offload.empty()) {
    if (!o.offload_dir.empty()) throw UsageError("--offload-dir needs --offload optimizer, params or activations");
    if (o.offload_buffer_given) throw UsageError("--offload-buffer-kib needs --offload optimizer, params or activations");
    return;
  }
  const std::string what = o.offload.front();  // the first of the list, for the messages
  if (o.offload_dir.empty()) throw UsageError("--offload " + what + " needs --offload-dir DIR (a local directory)");
  if (o.offloads("activations")) {
    // The disk tier of a host model; a CUDA model's tier would be host memory, whose copies would
    // run on the compute stream here (not overlapped): not offered until measured on a GPU.
    if (o.device != "cpu") throw UsageError("--offload activations with --device " + o.device + ": not built yet (host models only)");
    // MoE blocks' saved routing state (parallel/moe.hpp) does not list its tensors for the offload yet.
    if (o.experts > 0) throw UsageError("--offload activations with --experts: not built yet (dense blocks only)");
  }
  if (!o.offloads("optimizer") && !o.offloads("params")) return;
  const std::string state = o.offloads("optimizer") ? "optimizer" : "params";
  if (o.device != "cpu") throw UsageError("--offload " + state + " with --device " + o.device + ": the offloaded state is updated on the host");
  // An fp32 model's ZeRO-1/2 master values are the model's own full values (no second copy,
  // parallel/fsdp/unit_state.hpp master_in_values): nothing separate to put on disk.
  if (o.offloads("params") && o.zero <= 2 && o.dtype == "f32")
    throw UsageError("--offload params with --dtype f32 at ZeRO-" + str(o.zero) +
                     ": the master values are the model's own (nothing separate to offload); use --zero 3 (--fsdp > 1) or --dtype bf16");
  if (o.offloads("params") && o.pp > 1)
    throw UsageError("--offload params with --pp " + str(o.pp) + ": a bad directory is agreed on within a stage's ranks only; use --pp 1");
  // Checkpoints save the offloaded moments (OffloadedAdamW::held_moments) through the pipeline's
  // format; --sync's per-rank state is saved through an AdamW in memory (sync_state_slots).
  if (o.sync != "ddp" && (o.save_every > 0 || !o.resume.empty()))
    throw UsageError("--offload " + state + " with --sync " + o.sync + " and checkpoints: the per-rank sync state is saved with an AdamW in memory only");
}

/// The constraints between flags that the library would otherwise report later, deep in a rank.
inline void check_options(Options& o, bool cuda_build) {
  if (o.zero == 0) o.zero = o.fsdp > 1 ? 3 : 1;
  if (o.microbatches == 0) o.microbatches = o.pp > 1 ? 2 * o.pp : 1;
  if (o.reshard_after_forward && o.zero != 3)
    throw UsageError(std::string(*o.reshard_after_forward ? "--reshard-after-forward" : "--no-reshard-after-forward") +
                     " is for ZeRO-3 (--zero 3 with --fsdp > 1), got ZeRO-" + str(o.zero));
  try {
    pp::parse_schedule_kind(o.schedule);
  } catch (const Error& e) {
    throw UsageError("--schedule: " + std::string(e.what()));
  }
  if (o.dim % o.heads != 0) throw UsageError("--dim " + str(o.dim) + " is not a multiple of --heads " + str(o.heads));
  if (o.heads % o.tp != 0) throw UsageError("--heads " + str(o.heads) + " is not a multiple of --tp " + str(o.tp));
  if (o.cp_kind == parallel::ContextKind::ulysses && o.heads % (o.tp * o.cp) != 0)
    throw UsageError("--cp-kind ulysses splits the heads over tp x cp: --heads " + str(o.heads) + " is not a multiple of " +
                     str(o.tp * o.cp));
  if (o.batch % o.microbatches != 0)
    throw UsageError("--microbatches " + str(o.microbatches) + " does not divide --batch " + str(o.batch));
  const int data_ranks = o.dp * o.fsdp;
  if (o.batch / o.microbatches < data_ranks)
    throw UsageError("a micro-batch of " + str(o.batch / o.microbatches) + " sequences (--batch / --microbatches) leaves some of the " +
                     str(data_ranks) + " data ranks (--dp x --fsdp) without a sequence");
  check_architecture(o);
  check_checkpoints(o);
  examples::check_output_file("--trace", o.trace);  // before training, not after it
  examples::check_output_file("--plot", o.plot);
  check_sync(o);
  check_interop(o);
  check_offload(o);
  if (o.kfold > 0 && (o.save_every > 0 || !o.resume.empty())) throw UsageError("--kfold with checkpoints: k runs, one directory");
  check_device(o, cuda_build);
  if (o.experts == 0) {
    if (o.ep != 1) throw UsageError("--ep " + str(o.ep) + " needs --experts");
    return;
  }
  if (o.topk > o.experts) throw UsageError("--topk " + str(o.topk) + " exceeds --experts " + str(o.experts));
  if (o.moe_every > o.layers)  // no block would be a MoE: a dense model under a MoE banner
    throw UsageError("--moe-every " + str(o.moe_every) + " exceeds --layers " + str(o.layers) + ": no block would have experts");
  // The experts' ranks factor the ranks that split the tokens: data x context.
  if (data_ranks * o.cp % o.ep != 0)
    throw UsageError("--ep " + str(o.ep) + " does not divide the token ranks --dp x --fsdp x --cp = " + str(data_ranks * o.cp));
  // Any --experts over --ep: they split like an uneven Shard (5 over 2: 3 + 2; parallel/experts.hpp).
  // Under CP a capacity that can drop a choice is refused (nn/router.hpp): it is per whole sequence.
  if (o.cp > 1 && o.capacity > 0 && o.capacity * double(o.topk) / double(o.experts) < 1.0)
    throw UsageError("--capacity with --cp > 1: capacity groups are whole sequences, split over the context ranks; "
                     "use dropless routing (no --capacity) or a factor of at least --experts / --topk");
}

inline Options parse(int argc, char** argv, bool cuda_build) {
  Options o;
  const auto given = examples::parse_flags(flag_table(), o, argc, argv, "train_gpt");  // --help: exits 0
  // --plan auto chooses the mesh flags: the first one given is an error there; --ep it keeps.
  std::string mesh_flag;
  for (const auto& a : given)
    if (a != "--ep" && mesh_flag.empty() && examples::is_mesh_flag<Options>(a)) mesh_flag = a;
  const bool ep_given = std::find(given.begin(), given.end(), "--ep") != given.end();
  examples::apply_plan_auto(o, mesh_flag, ep_given);  // --plan auto: the mesh flags from the cost model
  if (o.ranks() > threads::max_ranks)
    throw UsageError("pp x dp x fsdp x cp x tp = " + str(o.ranks()) + " ranks, more than " + str(threads::max_ranks));
  check_options(o, cuda_build);
  return o;
}

/// --save-dir: fail before training, not at the first save, when the checkpoint cannot be
/// written (its parent is not a writable directory) or would replace what is not a checkpoint (a
/// regular file, a directory of other files). The save checks again (checkpoint::save).
inline void check_save_dir(const Options& o) {
  if (o.save_dir.empty()) return;
  const std::filesystem::path dir = std::filesystem::absolute(o.save_dir).lexically_normal();
  const auto parent = (dir.has_filename() ? dir : dir.parent_path()).parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec) || ::access(parent.c_str(), W_OK) != 0)
    throw std::runtime_error("--save-dir " + o.save_dir + ": cannot write into " + parent.string() +
                             (std::filesystem::exists(parent, ec) ? "" : " (it does not exist)"));
  checkpoint::check_save_target(o.save_dir, "train_gpt --save-dir");  // not a file or another directory
}

// ---------------------------------------------------------------- data

inline std::string read_text(const std::string& file) {
  std::string text;
  auto add = [&](const std::filesystem::path& p) {
    // An ifstream opens a directory and reads nothing: say so instead of training on no text.
    if (std::filesystem::is_directory(p)) throw std::runtime_error("--data " + p.string() + " is a directory, not a text file");
    std::ifstream in(p, std::ios::binary);
    if (!in) throw std::runtime_error("--data: cannot read " + p.string());
    std::ostringstream s;
    s << in.rdbuf();
    text += s.str();
  };
  if (!file.empty()) add(file);
  else {
    const std::filesystem::path dir = "/usr/share/common-licenses";
    if (!std::filesystem::is_directory(dir)) throw std::runtime_error(dir.string() + " not found: pass --data FILE");
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());  // the same text on every machine and rank
    for (const auto& f : files) add(f);
  }
  return text;
}

/// The characters of the text as ids 0..V-1 (sorted); the first 90% trains, the rest validates.
struct Corpus {
  std::vector<char> chars;
  std::vector<std::int32_t> train, val;
};

/// "65 characters, hash 1234...": the vocabulary itself (its characters, in id order), for the
/// checkpoint's configuration, so that a text of the same size but other characters is refused.
inline std::string vocabulary_id(const Corpus& c) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (char ch : c.chars) h = (h ^ std::uint8_t(ch)) * 1099511628211ull;
  return std::to_string(c.chars.size()) + " characters, hash " + std::to_string(h);
}

inline Corpus encode(const std::string& text, Extent seq) {
  Corpus c;
  std::vector<int> id(256, -1);
  for (unsigned char ch : text) id[ch] = 0;
  for (int ch = 0; ch < 256; ++ch)
    if (id[std::size_t(ch)] == 0) {
      id[std::size_t(ch)] = int(c.chars.size());
      c.chars.push_back(char(ch));
    }
  const std::size_t split = text.size() * 9 / 10;
  for (std::size_t i = 0; i < text.size(); ++i)
    (i < split ? c.train : c.val).push_back(std::int32_t(id[static_cast<unsigned char>(text[i])]));
  if (c.train.size() <= std::size_t(seq) + 1 || c.val.size() <= std::size_t(seq) + 1)
    throw std::runtime_error("the text (--data, " + str((long long)text.size()) + " characters) is too short for --seq " + str(seq));
  return c;
}

/// --kfold: fold f of k over the text's blocks (parallel::sync::kfold from --seed, about 200
/// blocks): the other folds' blocks train, fold f's validate, each joined in order.
inline Corpus fold_of(const Corpus& whole, int k, int f, std::uint64_t seed, Extent seq) {
  std::vector<std::int32_t> all(whole.train);
  all.insert(all.end(), whole.val.begin(), whole.val.end());
  const std::size_t block = std::max<std::size_t>(4 * (std::size_t(seq) + 1), all.size() / 200);
  const std::size_t blocks = all.size() / block;  // the tail joins the last block
  const auto split = parallel::sync::kfold(blocks, std::size_t(k), seed).at(std::size_t(f));
  Corpus c{whole.chars, {}, {}};
  auto add = [&](std::vector<std::int32_t>& to, std::size_t b) {
    const std::size_t lo = b * block, hi = b + 1 == blocks ? all.size() : lo + block;
    to.insert(to.end(), all.begin() + std::ptrdiff_t(lo), all.begin() + std::ptrdiff_t(hi));
  };
  for (std::size_t b : split.train) add(c.train, b);
  for (std::size_t b : split.val) add(c.val, b);
  return c;
}

/// The [batch, seq] ids and targets (the next characters) of the sequences starting at `starts`.
inline std::pair<Tensor<std::int32_t, 2>, Tensor<std::int32_t, 2>> tokens_of(const std::vector<std::int32_t>& data,
                                                                      const std::vector<std::size_t>& starts, Extent seq) {
  const Shape<2> shape{Extent(starts.size()), seq};
  Tensor<std::int32_t, 2> ids(shape), tgt(shape);
  for (std::size_t b = 0; b < starts.size(); ++b)
    for (Extent t = 0; t < seq; ++t) {
      ids(Extent(b), t) = data[starts[b] + std::size_t(t)];
      tgt(Extent(b), t) = data[starts[b] + std::size_t(t) + 1];
    }
  return {std::move(ids), std::move(tgt)};
}

// ---------------------------------------------------------------- training

/// MoE, on the validation line: the routing of the last forward of this rank's MoE blocks, summed
/// over the mesh (models/expert_load.hpp): kept choices per expert, and the dropped share of them.
template <class Model, class Mesh>
std::string expert_note(Model& model, const Mesh& mesh, Extent experts) {
  const auto [load, dropped] = models::expert_load(model, mesh, experts);
  std::string note = "  expert load";
  for (auto n : load) note += " " + str(n);
  char drop[32];
  std::snprintf(drop, sizeof drop, "  dropped %.3f", dropped);
  return note + drop;
}

/// --export FILE after training: the weights gathered into one safetensors file (whole tensors,
/// any mesh: PP and FSDP included).
template <class Pipeline>
void export_weights(const Options& o, Pipeline& model, bool root) {
  if (o.export_path.empty()) return;
  checkpoint::export_pipeline_safetensors(o.export_path, model);
  if (root) std::printf("weights exported to %s\n", o.export_path.c_str());
}

/// --generate's sampling flags, as the library's options (models/generate.hpp).
inline models::GenerateOptions generate_options(const Options& o) {
  return {.new_tokens = o.generate,
          .temperature = o.temperature,
          .top_k = o.top_k,
          .top_p = o.top_p,
          .seed = o.sample_seed()};
}

/// --serve-mesh tp=N: the trained model moved in memory to a serving mesh (tp N over ranks
/// 0..N-1) that generates from the same prompt with the same options (models/serve.hpp); its
/// tokens must equal `trained` (the training mesh's).
template <class Stage, class Mesh>
void serve_text(const Options& o, std::vector<Stage>& stages, const Mesh& mesh, const pp::StageLayout& layout,
                const std::vector<std::int32_t>& prompt, const std::vector<std::int32_t>& trained) {
  using Layers = std::remove_cvref_t<decltype(stages.front().model().layers())>;
  constexpr bool moe = requires { typename Layers::ExpertMesh; };
  const int n = o.serve_tp;
  const auto s = models::serve_on_tp(stages, mesh, layout, n, prompt, generate_options(o));
  if (s.serve_rank != 0) return;
  const auto& moved = s.moved;
  std::printf(
      "served on tp=%d (ranks 0..%d), weights moved in memory from %d pipeline stage(s)%s: %zu parameters, %zu B "
      "over %zu links (minimum %zu B, %zu B copied locally) in %.3f s; tokens %s the training mesh's\n",
      n, n - 1, layout.stages(), moe ? " and their experts" : "", moved.parameters, moved.bytes, moved.links,
      moved.minimum_bytes, moved.local_bytes, s.move_seconds, s.tokens == trained ? "equal to" : "DIFFERENT from");
  if (s.tokens != trained)
    throw std::runtime_error("--serve-mesh: the serving mesh generated other tokens than the training mesh");
}

/// --prompt as the corpus's character ids (a character the training text lacks is an error).
inline std::vector<std::int32_t> prompt_ids(const std::string& text, const Corpus& corpus) {
  std::vector<std::int32_t> prompt;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    const auto at = std::find(corpus.chars.begin(), corpus.chars.end(), ch);
    if (at == corpus.chars.end()) {
      // A UTF-8 character of several bytes is named whole, not as its first (broken) byte.
      const auto lead = static_cast<unsigned char>(ch);
      const std::size_t n = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
      throw std::runtime_error(
          "--prompt: the character '" + text.substr(i, n) + "'" +
          (n > 1 ? " (" + str((long long)n) + " bytes in UTF-8; the vocabulary is single bytes)" : "") +
          " is not in the training text's " + str((long long)corpus.chars.size()) + " characters");
    }
    prompt.push_back(std::int32_t(at - corpus.chars.begin()));
  }
  return prompt;
}

/// --generate N: text from the model as it is (after training, or loaded by `generate`), on the
/// training mesh itself, its FSDP shards gathered once for the whole generation
/// (models/pipeline_generate.hpp), and with --serve-mesh again on a serving mesh. Every rank
/// generates the same text; rank 0 prints it.
template <class Pipeline, class Mesh>
void generate_text(const Options& o, const Corpus& corpus, Pipeline& model, const Mesh& mesh,
                   const pp::Schedule& schedule) {
  if (o.generate == 0) return;
  const auto prompt = prompt_ids(o.prompt, corpus);
  auto& stages = model.executor().stages();
  const auto g = models::generate_on_pipeline(model, schedule.layout, mesh, prompt, generate_options(o),
                                              [&](const std::vector<std::int32_t>& ids) {
                                                if (o.serve_tp > 0)
                                                  serve_text(o, stages, mesh, schedule.layout, prompt, ids);
                                              });
  if (mesh.comm().rank() != 0) return;
  std::string text;
  for (std::int32_t id : g.tokens) text += corpus.chars[std::size_t(id)];
  char how[96] = "greedy";
  if (o.temperature > 0) std::snprintf(how, sizeof how, "temperature %g, top-k %d, top-p %g", o.temperature, o.top_k, o.top_p);
  using Stage = std::remove_cvref_t<decltype(stages.front())>;
  const char* cache = models::KvCacheable<Stage> ? "KV cache" : "no KV cache: each window recomputed";
  std::printf("generated (%s, %d characters, %s; %d pipeline stages on %d ranks, %.1f characters/s):\n%s\n", how,
              o.generate, cache, schedule.layout.stages(), mesh.comm().size(), o.generate / g.seconds, text.c_str());
}

/// --sync diloco's options from the flags (the library's defaults where a flag is not given).
inline parallel::sync::DiLoCoOptions diloco_options(const Options& o) {
  parallel::sync::DiLoCoOptions d{.inner_steps = o.inner_steps, .bf16_reduce = o.bf16_reduce, .fragments = o.fragments,
                                  .overlap_steps = o.overlap, .overlap_alpha = o.overlap_alpha};
  if (o.outer_lr > 0) d.outer_lr = o.outer_lr;
  if (o.outer_momentum >= 0) d.outer_momentum = o.outer_momentum, d.nesterov = o.outer_momentum > 0;  // 0: plain outer SGD
  return d;
}

/// The program's own lines after the summary (rank 0's figures): the host budget, what --offload
/// moved to files (train::offload_notes) and the activations' offload.
template <bool Host, class Tr>
std::string run_notes(const Options& o, Tr& trainer, const nn::ActivationOffload* activations,
                      const optim::MemoryBudget& host_budget, std::int64_t host_held_built) {
  std::string s;
  if (host_budget.active())
    s += train::formatted(
        "host memory budget: %.3f MiB per process, %d rank(s) sharing it; held after building %.3f MiB\n",
        o.host_budget_mib, host_budget.ranks_sharing, double(host_held_built) / (1 << 20));
  s += train::offload_notes(trainer);
  if (Host && activations) {
    const auto& st = activations->stats();
    s += train::formatted(
        "activation offload (rank 0): %zu block states to %s, wrote %.2f MiB, read %.2f MiB back (%zu kept in "
        "memory) in %.3f s of I/O (%.0f MiB/s), %.0f%% of it hidden behind the compute\n",
        st.entries, o.offload_dir.c_str(), double(st.bytes_written) / (1 << 20), double(st.bytes_read) / (1 << 20),
        st.kept, st.io_seconds,
        st.io_seconds > 0 ? double(st.bytes_read + st.bytes_written) / (1 << 20) / st.io_seconds : 0.0,
        100 * st.hidden());
  }
  return s;
}

/// The model of the flags: its config (ring and all-gather attention in the load-balanced order).
inline nn::GPTConfig gpt_config(const Options& o, const Corpus& corpus) {
  const bool balanced = o.cp > 1 && o.cp_kind != parallel::ContextKind::ulysses;
  return {.vocab = Extent(corpus.chars.size()),
          .seq = o.seq,
          .dim = o.dim,
          .heads = o.heads,
          .layers = o.layers,
          .mlp_ratio = 4,
          .checkpoint = o.checkpoint,
          .seed = o.seed,
          .context = {.kind = o.cp_kind, .load_balanced = balanced},
          .kv_heads = o.kv_heads,
          .ffn = o.ffn,
          .recompute = o.recompute};
}

/// This rank's stages' layers: dense, or MoE blocks with their experts on the expert mesh.
template <class Layers, class StageMesh>
Layers gpt_layers(const Options& o, const StageMesh& stage_mesh) {
  if constexpr (requires { typename Layers::ExpertMesh; }) {
    nn::MoELayersConfig mc;
    mc.router.experts = o.experts;
    mc.router.topk = o.topk;
    mc.router.z_loss_coeff = 1e-3;
    if (o.capacity > 0) mc.router.capacity_factor = o.capacity;
    mc.every = o.moe_every;
    return Layers(parallel::make_expert_mesh<typename Layers::ExpertMesh>(stage_mesh, o.ep), mc);
  } else {
    return Layers{};
  }
}

/// The step's options (train/trainer.hpp): the mesh, the schedule, FSDP, AdamW, clipping, --sync,
/// --offload; the staging buffer as given, or a quarter of what the host budget leaves.
inline train::TrainerOptions trainer_options(const Options& o, const optim::MemoryBudget& host_budget) {
  train::TrainerOptions t{.degrees = {.pp = o.pp, .dp = o.dp, .fsdp = o.fsdp, .cp = o.cp, .tp = o.tp},
                          .schedule = o.schedule,
                          .microbatches = o.microbatches,
                          .zero = o.zero,
                          .reshard_after_forward = o.reshard_after_forward,
                          .adamw = {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
                          .clip_norm = 1.0,
                          .sync = {.kind = parallel::sync::parse_sync(o.sync),
                                   .inner_steps = o.inner_steps,
                                   .staleness = o.staleness,
                                   .clients = o.clients,
                                   .seed = o.seed,
                                   .samples_per_step = double(o.batch / o.dp),
                                   .diloco = diloco_options(o)},
                          .offload_params_dir = o.offloads("params") ? o.offload_dir : std::string(),
                          .offload_optimizer_dir = o.offloads("optimizer") ? o.offload_dir : std::string(),
                          .offload_buffer_bytes = o.offload_buffer_kib << 10};
  if (!o.offload_buffer_given)
    t.offload_buffer_sizer = [&o, host_budget] {
      return host_budget.buffer_for_offload(o.offload_buffer_kib << 10, 4 * sizeof(float) * 64);
    };
  return t;
}

/// The run's first lines on rank 0: the mesh, the schedule and model, the parameter count and the
/// GEMMs' kernels (most of a CPU step), and who chose them.
template <class Compute, class Trainer>
void print_header(const Options& o, const Corpus& corpus, Trainer& trainer, std::int64_t parameters) {
  std::printf(
      "%s: mesh pp %d x dp %d x fsdp %d (ZeRO-%d) x cp %d (%s) x tp %d%s = %d ranks, %s backend, device %s, "
      "dtype %s\n",
      o.generate_program ? "generate" : "train_gpt", o.pp, o.dp, o.fsdp, o.zero, o.cp,
      std::string(parallel::name_of(o.cp_kind)).c_str(), o.tp, o.sp ? " + SP" : "", o.ranks(), o.backend.c_str(),
      o.device.c_str(),
      std::is_same_v<Compute, float> ? "f32"
      : o.dtype == "fp8"
          ? "fp8 (E4M3/E5M2 Linear GEMMs, host emulation; bf16 elsewhere; fp32 master weights and AdamW state)"
          : "bf16 (fp32 master weights and AdamW state)");
  std::printf(
      "schedule %s: %d micro-batches over %d stages; model: %lld layers, dim %lld, %lld heads, seq %lld, batch "
      "%lld, vocab %zu",
      o.schedule.c_str(), o.microbatches, trainer.schedule().layout.stages(), (long long)o.layers, (long long)o.dim,
      (long long)o.heads, (long long)o.seq, (long long)o.batch, corpus.chars.size());
  if (o.arch != "gpt")
    std::printf("; %s (kv heads %lld)", o.arch.c_str(), (long long)(o.kv_heads ? o.kv_heads : o.heads));
  if (o.zero == 3)
    std::printf("; ZeRO-3 %s", trainer.pipeline().keeps_stages_gathered() ? "keeps each stage gathered for the step"
                                                                          : "gathers each unit per micro-batch");
  if (o.experts > 0)
    std::printf("; MoE: %lld experts, top-%lld, over ep %d", (long long)o.experts, (long long)o.topk, o.ep);
  std::printf("\nparameters: %lld\n", (long long)parameters);
  if constexpr (Trainer::host) std::printf("%s\n", kernels::host::blas_kernels_line().c_str());
}

/// What a checkpoint must match to resume (--resume DIR; --save-every N --save-dir DIR): the
/// configuration that fixes the tensors, and --sync's settings (its state travels as each rank's
/// own tensors). Any mesh and schedule can resume it.
inline std::map<std::string, std::string> checkpoint_config(const Options& o, const nn::GPTConfig& cfg,
                                                            const Corpus& corpus) {
  using parallel::sync::SyncKind;
  auto config = checkpoint::config_of(cfg);
  config["model"] = o.arch;
  config["vocabulary"] = vocabulary_id(corpus);  // another text's alphabet of the same size is refused
  if (o.experts > 0) config["experts"] = str(o.experts), config["moe_every"] = str(o.moe_every);
  const auto kind = parallel::sync::parse_sync(o.sync);
  if (kind != SyncKind::ddp) {
    config["sync"] = o.sync;
    config["sync_inner_steps"] = str(o.inner_steps);
    if (kind == SyncKind::async) config["sync_staleness"] = str(o.staleness);
    if (kind == SyncKind::fedavg) config["sync_clients"] = str(o.clients);
  }
  return config;
}

/// The batches: every rank draws the same --batch sequences (the same --seed), in the order the
/// model stores them (load-balanced for ring and all-gather attention), cut into micro-batches;
/// under FedAvg sequence b belongs to client c (its micro-batch's rows split over "dp" first, as
/// torch.chunk), which reads only its own contiguous slice of the text: local, non-IID data.
/// Validation: a fixed batch of the held-out text. `rng` is the checkpoint's data state.
template <class Trainer>
train::FitData<Trainer> text_data(const Options& o, const Corpus& corpus, Trainer& trainer, std::mt19937_64& rng) {
  const bool fed = parallel::sync::parse_sync(o.sync) == parallel::sync::SyncKind::fedavg;
  const bool balanced = o.cp > 1 && o.cp_kind != parallel::ContextKind::ulysses;
  auto microbatches_of = [&o, &trainer, balanced](const std::vector<std::int32_t>& data,
                                                  const std::vector<std::size_t>& starts) {
    auto [ids, targets] = tokens_of(data, starts, o.seq);
    if (balanced) ids = parallel::load_balance(ids, 1, o.cp), targets = parallel::load_balance(targets, 1, o.cp);
    return trainer.microbatches(ids, targets);
  };
  train::FitData<Trainer> data;
  data.batch = [&o, &corpus, &rng, fed, microbatches_of](int) {
    std::vector<std::size_t> starts(static_cast<std::size_t>(o.batch));
    const std::size_t span = corpus.train.size() - std::size_t(o.seq) - 1, dp = std::size_t(o.dp);
    const std::size_t mb = std::size_t(o.batch / o.microbatches), chunk = (mb + dp - 1) / dp;
    for (std::size_t b = 0; b < starts.size(); ++b) {
      const std::size_t c = (b % mb) / chunk, lo = fed ? span * c / dp : 0, hi = fed ? span * (c + 1) / dp : span;
      starts[b] = lo + std::size_t(rng() % std::max<std::size_t>(1, hi - lo));
    }
    return microbatches_of(corpus.train, starts);
  };
  data.evaluate = [&o, &corpus, &trainer, microbatches_of](int) {
    std::vector<std::size_t> starts(static_cast<std::size_t>(o.batch));
    for (std::size_t b = 0; b < starts.size(); ++b)
      starts[b] = (b * 7919u) % (corpus.val.size() - std::size_t(o.seq) - 1);
    return trainer.evaluate(microbatches_of(corpus.val, starts));
  };
  data.state = [&rng] {
    std::ostringstream state;
    state << rng;
    return state.str();
  };
  data.restore = [&rng](const std::string& state) {
    std::istringstream in(state);
    return bool(in >> rng);
  };
  return data;
}

/// --sync on "dp": the dry-run figure of docs/beyond-sync.md for this rank's shards, checked
/// against the library's own count (bench/plot_sync.py reads the line).
template <class Trainer>
void print_sync_payload(const Options& o, Trainer& trainer) {
  using parallel::sync::SyncKind;
  std::size_t elements = 0;
  for (const auto& p : trainer.params().template list<0>()) elements += p.value.size();
  const auto kind = parallel::sync::parse_sync(o.sync);
  const parallel::sync::SyncCost cost{.inner_steps = o.inner_steps, .bf16_reduce = o.bf16_reduce};
  const double bytes = parallel::sync::payload_bytes_per_step(kind, elements, sizeof(float), cost);
  const double ddp = parallel::sync::payload_bytes_per_step(SyncKind::ddp, elements, sizeof(float));
  auto& sync = trainer.replica_sync();
  if (sync && sync->diloco() && sync->diloco()->payload_bytes_per_step() != bytes)
    throw Error("train_gpt", "DiLoCo's payload " + std::to_string(sync->diloco()->payload_bytes_per_step()) +
                                 " B/step != the formula's " + std::to_string(bytes));
  if (trainer.mesh().root().rank() == 0)
    std::printf("sync %s on dp: %.0f all-reduce payload bytes per step on rank 0 (DDP: %.0f, %.1fx)\n", o.sync.c_str(),
                bytes, ddp, ddp / bytes);
}

/// The GPT, Llama or MoE-GPT of the flags as a train::Trainer (the model's parts, the mesh, the
/// step's options), its header printed, then train::fit (train/loop.hpp) and the report; --export
/// and --generate after. Returns the last validation loss.
/// Compute: the model's element type (--dtype: float, or bfloat16). The master values, gradient
/// shards and AdamW state are float either way: every stage is FSDP-sharded (ZeRO-1 over a size-1
/// "fsdp" dimension when --fsdp 1), and fully_shard<float> keeps them in fp32 (FSDP2's mixed
/// precision: parameters all-gathered in bf16, gradients reduced in fp32).
template <class Space, class Compute, class Plan, class Layers>
double run_gpt(CommPtr world, const Options& o, const Corpus& corpus) {
  using StageMesh = StageMeshIn<Space>;
  using Model = nn::GptParts<Compute, StageMesh, Plan, std::int32_t, Layers>;
  constexpr bool host = std::is_same_v<Space, host_space>;
  constexpr bool moe = requires { typename Layers::ExpertMesh; };  // nn::MoELayers
  // This rank's allocations from here on: the step's peak by tag against what it held before.
  MemoryLedger rank_ledger;
  const nn::GPTConfig cfg = gpt_config(o, corpus);
  // --host-budget-mib / --device-budget-mib: per process, its ranks sharing it (docs/offload.md).
  const int ranks_here = o.backend == "threads" ? world->size() : 1;
  const optim::MemoryBudget host_budget{.space = "host", .bytes = std::int64_t(o.host_budget_mib * (1 << 20)),
                                        .ranks_sharing = ranks_here};
  const optim::MemoryBudget device_budget{.space = "cuda", .bytes = std::int64_t(o.device_budget_mib * (1 << 20)),
                                          .ranks_sharing = ranks_here};
  train::Trainer<Model, float> trainer(world, trainer_options(o, host_budget), [&](const StageMesh& stage_mesh) {
    return Model(stage_mesh, cfg, gpt_layers<Layers>(o, stage_mesh));
  });
  auto& model = trainer.pipeline();
  // --offload activations: every block's saved activations in a file per rank under --offload-dir
  // between its forward and its backward (nn/activation_offload.hpp). Built by every rank together.
  std::shared_ptr<nn::ActivationOffload> activation_offload;
  if constexpr (host && !moe)
    if (o.offloads("activations")) {
      activation_offload = std::make_shared<nn::ActivationOffload>(
          nn::ActivationOffloadOptions{.tier = nn::OffloadTier::disk, .dir = o.offload_dir}, world.get());
      for (auto& stage : trainer.stages()) stage.set_activation_offload(activation_offload);
    }
  world->barrier();  // every rank's optimizer built
  host_budget.check(*world, "after building the model and optimizer",
                    o.offloads("optimizer") ? "a larger budget, or a smaller --offload-buffer-kib"
                                            : "--offload optimizer --offload-dir DIR moves AdamW's moments to disk "
                                              "(--offload optimizer,params the master shards too)");
  device_budget.check(*world, "after building the model and optimizer", "a larger budget or more ranks");
  const std::int64_t host_held_built = host_budget.held();
  const std::int64_t parameters = trainer.parameter_count();
  const bool root = world->rank() == 0;
  if (root) print_header<Compute>(o, corpus, trainer, parameters);
  // Across machines: which dimensions cross hosts (docs/multinode.md); only the process backends
  // exchange their host names (the threads backend's ranks share one host).
  const auto& mesh = trainer.mesh();
  const std::vector<std::string> hosts = o.backend == "threads" ? std::vector<std::string>{} : host_names(mesh.root());
  const auto placed = mesh_hosts(mesh, hosts.empty() ? std::vector<std::string>(std::size_t(world->size()), "") : hosts);
  if (root && placed.count > 1) std::printf("%s\n", describe_hosts(mesh, placed).c_str());
  if constexpr (host && !moe)
    if (!o.init_from.empty()) {
      checkpoint::import_pipeline_safetensors(o.init_from, model);
      if (root) std::printf("weights from %s\n", o.init_from.c_str());
    }
  // The loop (train/loop.hpp): batches, timing, the budgets over the first step, evaluation,
  // checkpoints (the step, the data position and the batch generator's state), --trace, --plot,
  // the progress bar and the report.
  const train::FitOptions fo{.steps = o.steps,
                             .eval_every = o.eval_every,
                             .save_every = o.save_every,
                             .save_dir = o.save_dir,
                             .resume_dir = o.resume,
                             .config = checkpoint_config(o, cfg, corpus),
                             .allow_finished = o.generate != 0,  // --generate: text from the checkpoint
                             .tokens_per_step = double(o.batch * o.seq),
                             .check_finite = o.check_finite,
                             .trace_path = o.trace,
                             .plot_path = o.plot,
                             .hosts = hosts,
                             .host_budget = host_budget,
                             .device_budget = device_budget,
                             .rank_ledger = &rank_ledger};
  std::mt19937_64 rng(o.seed);
  auto data = text_data(o, corpus, trainer, rng);
  data.eval_note = [&](int, const pp::StepStats& stats) {
    std::string more = train::idle_note(stats);
    if constexpr (moe) more += expert_note(model, mesh, o.experts);  // the validation batch's routing
    return more;
  };
  const train::FitReport report = train::fit(trainer, fo, data);
  if (report.steps_run > 0) {  // else resumed at --steps with --generate (or the generate program): text only
    train::print_report(report, run_notes<host>(o, trainer, activation_offload.get(), host_budget, host_held_built));
    if (o.dp > 1) print_sync_payload(o, trainer);
    if constexpr (host && !moe) export_weights(o, model, root);
  }
  if constexpr (host) generate_text(o, corpus, model, mesh, trainer.schedule());
  return report.steps_run > 0 ? report.val_loss : 0;
}

/// The model types: one per kind of block (GPT, Llama or MoE) and plan (with or without SP),
/// whatever the sizes of the mesh.
template <class Space, class Compute, bool SP>
double train_blocks(CommPtr world, const Options& o, const Corpus& corpus) {
  using Plan = parallel::MegatronPlan<SP>;
  if constexpr (std::is_same_v<Compute, float>)  // MoE is fp32-only (check_device)
    if (o.experts > 0)
      return run_gpt<Space, Compute, Plan, nn::MoELayers<float, ExpertMeshIn<Space>>>(std::move(world), o, corpus);
  if (o.arch == "llama") return run_gpt<Space, Compute, Plan, nn::LlamaLayers>(std::move(world), o, corpus);
  return run_gpt<Space, Compute, Plan, nn::DenseLayers>(std::move(world), o, corpus);
}

/// Every flag's value (and the data's size and hash), for the ranks' agreement at setup.
inline std::vector<Setting> settings_of(const Options& o, const Corpus& corpus) {
  auto num = [](double v) {  // the shortest text that reads back as v: 3e-3 and 0.003 agree, 0.0030001 does not
    char b[32];
    const auto r = std::to_chars(b, b + sizeof b, v);
    return std::string(b, r.ptr);
  };
  auto n = [](auto v) { return std::to_string(v); };
  auto flag = [](bool v) { return std::string(v ? "on" : "off"); };
  std::uint64_t data_hash = 14695981039346656037ull;  // FNV-1a over the vocabulary and the tokens
  for (char c : corpus.chars) data_hash = (data_hash ^ std::uint8_t(c)) * 1099511628211ull;
  for (const auto* part : {&corpus.train, &corpus.val})
    for (auto t : *part) data_hash = (data_hash ^ std::uint32_t(t)) * 1099511628211ull;
  return {{"--pp", n(o.pp)}, {"--dp", n(o.dp)}, {"--fsdp", n(o.fsdp)}, {"--cp", n(o.cp)}, {"--tp", n(o.tp)},
          {"--ep", n(o.ep)},
          // One entry for both (the agreement takes at most 48 settings).
          {"--zero, --reshard-after-forward",
           n(o.zero) + ", " + (o.reshard_after_forward ? flag(*o.reshard_after_forward) : "default")},
          {"--sp", flag(o.sp)},
          {"--cp-kind", std::string(parallel::name_of(o.cp_kind))}, {"--schedule", o.schedule},
          {"--microbatches", n(o.microbatches)}, {"--layers", n(o.layers)}, {"--heads", n(o.heads)},
          {"--dim", n(o.dim)}, {"--seq", n(o.seq)}, {"--batch", n(o.batch)}, {"--checkpoint", flag(o.checkpoint)},
          {"--experts", n(o.experts)}, {"--topk", n(o.topk)}, {"--moe-every", n(o.moe_every)},
          {"--capacity", num(o.capacity)}, {"--steps", n(o.steps)}, {"--eval-every", n(o.eval_every)},
          {"--lr", num(o.lr)}, {"--seed", n(o.seed)}, {"--check-finite", flag(o.check_finite)}, {"--trace", o.trace},
          {"--plot", o.plot}, {"--data", o.data},
          // The file a rank starts from, by its contents (--init-from and --resume exclude each other).
          examples::starting_file_setting(o.init_from, o.resume),
          {"--data (contents)", n(corpus.chars.size()) + " characters, " + n(corpus.train.size() + corpus.val.size()) +
                                    " tokens, hash " + n(data_hash)},
          {"--backend", o.backend}, {"--device", o.device}, {"--dtype --tf32 --attention", o.dtype + (o.tf32 ? " tf32" : "") + " " + o.attention}, {"--arch", o.arch},
          {"--kv-heads", n(o.kv_heads)}, {"--ffn", n(o.ffn)}, {"--save-every", n(o.save_every)},
          {"--save-dir", o.save_dir}, {"--resume", o.resume}, {"--sync", o.sync}, {"--inner-steps", n(o.inner_steps)},
          // One setting for DiLoCo's six option flags (the agreement takes at most 48).
          {"--fragments --overlap --overlap-alpha --bf16-reduce --outer-lr --outer-momentum",
           n(o.fragments) + " | " + n(o.overlap) + " | " + num(o.overlap_alpha) + " | " + flag(o.bf16_reduce) + " | " +
               num(o.outer_lr) + " | " + num(o.outer_momentum)},
          {"--staleness", n(o.staleness)}, {"--clients", n(o.clients)}, {"--kfold", n(o.kfold)},
          // One setting for the seven weights-and-text flags (the agreement takes at most 48).
          {"--init-from --export --generate --prompt --temperature --top-k --top-p --serve-mesh",
           o.init_from + " | " + o.export_path + " | " + n(o.generate) + " | " + o.prompt + " | " + num(o.temperature) + " | " +
               n(o.top_k) + " | " + num(o.top_p) + " | " + n(o.serve_tp)},
          // One setting for the three offload flags (the agreement takes at most 48).
          {"--offload --offload-dir --offload-buffer-kib --host-budget-mib --device-budget-mib", [&] {
             std::string l;
             for (const auto& w : o.offload) l += (l.empty() ? "" : ",") + w;
             return l + " | " + o.offload_dir + " | " + n(o.offload_buffer_kib) + " | " + num(o.host_budget_mib) + " | " +
                    num(o.device_budget_mib);
           }()}};
}

template <class Space, class Compute>
void run_rank(CommPtr world, const Options& o, const Corpus& corpus) {
  // This rank's intra-op pool (--intra-op-threads), started once, for the rank's lifetime.
  const kernels::host::IntraOpThreads intra_op(o.intra_op_threads);
  // First, before anything sized by the flags (the mesh, a collective): one all-gather that
  // finds ranks given different flags, in every build (distributed/settings_agreement.hpp).
  // On the host's communicators; a GPU job agrees over MPI before NCCL starts (train_gpt_cuda.cu),
  // and threads sharing one GPU share one Options.
  if constexpr (std::is_same_v<Space, host_space>) require_same_settings(*world, "train_gpt", settings_of(o, corpus));
  if (world->size() != o.ranks())
    world->fail("train_gpt", "the job has " + str(world->size()) + " ranks but pp x dp x fsdp x cp x tp = " + str(o.ranks()));
  if (world->rank() == 0 && !o.plan_report.empty()) std::fputs(o.plan_report.c_str(), stdout);
  auto train_on = [&](const Corpus& c) {
    return o.sp ? train_blocks<Space, Compute, true>(world, o, c) : train_blocks<Space, Compute, false>(world, o, c);
  };
  if (o.kfold == 0) {
    train_on(corpus);
    return;
  }
  // --kfold k: k runs, one per fold, then the validation loss's mean and (sample) std.
  std::vector<double> val;
  for (int f = 0; f < o.kfold; ++f) {
    if (world->rank() == 0) std::printf("--kfold %d: fold %d\n", o.kfold, f);
    val.push_back(train_on(fold_of(corpus, o.kfold, f, o.seed, o.seq)));
  }
  const auto [mean, sd] = parallel::sync::mean_std(val);
  if (world->rank() == 0) std::printf("k-fold (k = %d): validation loss %.4f +- %.4f (mean +- std over folds)\n", o.kfold, mean, sd);
}

/// Fails at once when the model cannot fit (issue 25): every parameter's value, gradient and two
/// AdamW moments exist at least once over the ranks (16 bytes in float), so more than this
/// process may hold (ulimit -v, else the machine's memory) is an error naming the sizes, before
/// minutes of allocating ended in a bare std::bad_alloc. A lower bound: it never refuses a job
/// that fits. MPI ranks are processes: each needs at least its share.
inline void check_memory_estimate(const Options& o, const Corpus& corpus) {
  const long double d = (long double)o.dim, ffn = o.ffn > 0 ? (long double)o.ffn : 4.0L * d;
  const long double experts = o.experts > 0 ? (long double)o.experts : 1.0L;
  const long double moe_layers = o.experts > 0 ? (long double)(o.layers / o.moe_every) : 0.0L;
  const long double params = (long double)o.layers * 4.0L * d * d + ((long double)o.layers - moe_layers) * 2.0L * d * ffn +
                             moe_layers * experts * 2.0L * d * ffn + ((long double)corpus.chars.size() + (long double)o.seq) * d;
  // And one step's activations: at least one float per token and model dimension, for the whole
  // batch (--batch 2147483648 allocated for minutes before this was counted).
  const long double activations = (long double)o.batch * (long double)o.seq * d;
  const bool mpi = o.backend == "mpi";
  char sizes[512];
  std::snprintf(sizes, sizeof sizes,
                "the model has about %.3Lg parameters (--layers %lld, --dim %lld%s) and a step %.3Lg activations (--batch "
                "%lld x --seq %lld x --dim): their values, gradients, AdamW moments and one activation per token",
                params, (long long)o.layers, (long long)o.dim, o.experts > 0 ? ", --experts" : "", activations,
                (long long)o.batch, (long long)o.seq);
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
    const Corpus corpus = encode(read_text(o.data), o.seq);
    check_memory_estimate(o, corpus);
    check_save_dir(o);
    if constexpr (Gpu::available) {
      return gpu.template run<Compute>(argc, argv, o, corpus);  // --device cuda (check_device)
    } else {
      // The host BLAS's kernels, chosen by the CPU's features (kernels/host/blas_core.hpp) here,
      // before the rank threads start: the choice sets OPENBLAS_CORETYPE for an instant.
      (void)kernels::host::blas_kernels();
      if (o.backend == "mpi") {
#ifdef DTENSOR_HAS_MPI
        return dtensor::mpi::run(argc, argv, [&](CommPtr world) { run_rank<host_space, Compute>(std::move(world), o, corpus); });
#else
        (void)argc, (void)argv;
        std::fprintf(stderr, "%s: --backend mpi needs a build with -DDTENSOR_WITH_MPI=ON\n", o.generate_program ? "generate" : "train_gpt");
        return 2;
#endif
      }
      threads::run(o.ranks(), [&](CommPtr world) { run_rank<host_space, Compute>(std::move(world), o, corpus); });
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", o.generate_program ? "generate" : "train_gpt", e.what());
    return 1;
  }
  return 0;
}

/// The `generate` program (train_gpt started as `generate`, examples/train_gpt.cpp): this trainer with no training steps, which
/// prints text from a checkpoint.
inline const char* generate_usage =
    "usage: generate --resume DIR [--generate N] [--prompt TEXT] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "                [mesh flags: --pp --dp --fsdp --cp --tp --ep --zero --sp/--no-sp --cp-kind --schedule] [--data FILE]\n"
    "       generate --init-from FILE.safetensors [model flags: --layers --heads --dim --seq --arch --kv-heads --ffn] ...\n"
    "  Text from a train_gpt checkpoint (e.g. the main job's, build-main/train_gpt_ckpt): the model's shape is read\n"
    "  from the checkpoint, its weights loaded on the mesh the flags give (any mesh: the checkpoint reshards;\n"
    "  default train_gpt's, pp 2 x fsdp 2 x cp 2 x tp 2), then N characters (default 200) after --prompt TEXT\n"
    "  (default \"The \"), greedy or sampled (--temperature T > 0, --top-k K, --top-p P; --seed S seeds the draws),\n"
    "  with a KV cache per pipeline stage (models/generate.hpp). The vocabulary is the training text's (--data, default\n"
    "  the files under /usr/share/common-licenses, as train_gpt's). The other flags are train_gpt's (train_gpt --help).\n";

/// The `generate` program's flags, turned into train_gpt's: the checkpoint's model flags first
/// (then the user's, which may not change them: the load compares), --generate 200 by default,
/// no training steps.
inline Options parse_generate(int argc, char** argv, bool cuda_build) {
  if (examples::help_requested(argc, argv)) {
    std::cout << generate_usage;
    std::exit(0);
  }
  std::vector<std::string> args{argv[0], "--generate", "200"};
  std::vector<std::string> user;
  std::string resume;
  std::optional<std::string> seed;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    for (const char* training : {"--steps", "--save-every", "--save-dir", "--eval-every", "--kfold", "--sync", "--export"})
      if (a == training) throw UsageError(a + " is a training flag (train_gpt's): generate trains nothing");
    if (a == "--dtype" || a == "--device")
      throw UsageError(a + ": generate computes in float on the CPU (the checkpoint's master weights are fp32)");
    if ((a == "--resume" || a == "--seed") && i + 1 < argc) {
      (a == "--resume" ? resume : seed.emplace()) = examples::nonempty_flag_value(a, argv[++i]);
      continue;
    }
    user.push_back(a);
  }
  if (!resume.empty()) {
    std::map<std::string, std::string> config;
    try {
      config = checkpoint::read_manifest(resume).meta.config;
    } catch (const std::exception& e) {
      throw UsageError(std::string("--resume ") + resume + ": " + e.what());
    }
    auto get = [&](const char* key) {
      const auto found = config.find(key);
      if (found == config.end() || found->second.empty())
        throw UsageError("--resume " + resume + ": its configuration has no " + key + " (not a train_gpt checkpoint?)");
      return found->second;
    };
    if (config.contains("sync"))
      throw UsageError("--resume " + resume + ": a checkpoint of --sync " + config["sync"] + " (each replica its own weights)");
    args.insert(args.end(), {"--resume", resume, "--layers", get("layers"), "--heads", get("heads"), "--dim", get("dim"),
                             "--seq", get("seq"), "--seed", get("seed"), "--arch", get("model")});
    if (get("kv_heads") != "0") args.insert(args.end(), {"--kv-heads", get("kv_heads")});
    if (get("ffn") != "0") args.insert(args.end(), {"--ffn", get("ffn")});
    if (config.contains("experts")) args.insert(args.end(), {"--experts", get("experts"), "--moe-every", get("moe_every")});
  } else if (seed) {
    args.insert(args.end(), {"--seed", *seed});  // --init-from: the model's own seed does not matter
  }
  args.insert(args.end(), user.begin(), user.end());
  std::vector<char*> pointers;
  for (auto& a : args) pointers.push_back(a.data());
  Options o = parse(int(pointers.size()), pointers.data(), cuda_build);
  if (o.resume.empty() && o.init_from.empty())
    throw UsageError("generate needs --resume DIR (a train_gpt checkpoint) or --init-from FILE.safetensors with the model's flags");
  if (seed) o.sampling_seed = examples::flag_value<std::uint64_t>("--seed", *seed, 0);  // "abc", "-1": usage errors
  o.generate_program = true;
  o.steps = 0;
  return o;
}

/// One variant's run (f32 or bf16), each instantiated in its own translation unit.
using RunFn = int (*)(int argc, char** argv, const Options& o);

/// main: the flags (a usage error exits 2), then the f32 or bf16 run.
inline int main(int argc, char** argv, bool cuda_build, RunFn f32, RunFn bf16, bool generating = false) {
  Options o;
  try {
    o = generating ? parse_generate(argc, argv, cuda_build) : parse(argc, argv, cuda_build);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n%s", generating ? "generate" : "train_gpt", e.what(),
                 generating ? generate_usage : usage().c_str());
    return 2;
  }
  if (o.dtype == "f32") return f32(argc, argv, o);
  const nn::Fp8Autocast fp8(o.dtype == "fp8");  // fp8: the bf16 run, its Linears' GEMMs in FP8 (nn/fp8_recipe.hpp)
  return bf16(argc, argv, o);
}

}  // namespace examples::gpt
