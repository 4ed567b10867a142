// dtensor/train/trainer_flags.hpp — the Trainer's own command-line flags: the loop (--steps, --lr,
// --seed, --eval-every, --check-finite, --trace, --plot), checkpoints (--save-every, --save-dir,
// --resume), whole weights in and out (--init-from, --export), the replica sync (--sync and its
// options) and offload (--offload, the memory budgets); their rows of a flag table (train/flag_table.hpp), the checks between them worded by
// the flags, and the TrainerOptions / FitOptions they make. Every program that trains with
// train::Trainer gets them: train_gpt, and a user's own trainer.
//
//   struct Options : train::cli::TrainerFlags { Extent layers = 4, batch = 16; };  // + MeshFlags
//   const auto table = train::cli::joined_rows<Options>({train::cli::mesh_flag_rows<Options>("mesh:"),
//                                                        my_model_rows, train::cli::trainer_flag_rows<Options>()});
//   train::cli::parse_flags(table, o, argc, argv, "my_trainer");
//   train::cli::check_trainer_flags(o, {.batch = o.batch});       // UsageError naming the flags
//   train::Trainer<Model> trainer(world, train::cli::trainer_options(o, {.batch = o.batch}), make_stage);
//   train::fit(trainer, train::cli::fit_options(o), data);
#pragma once

#include <unistd.h>  // access

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/checkpoint/pipeline_safetensors.hpp"
#include "dtensor/checkpoint/save.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/nn/activation_offload.hpp"
#include "dtensor/optim/memory_budget.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/sync/diloco.hpp"
#include "dtensor/parallel/sync/traffic.hpp"
#include "dtensor/train/flag_table.hpp"
#include "dtensor/train/flags.hpp"
#include "dtensor/train/loop.hpp"
#include "dtensor/train/options.hpp"
#include "dtensor/train/report.hpp"

namespace dtensor::train::cli {

/// The flags' values (their meaning, defaults and bounds: trainer_flag_rows). The mesh's are
/// MeshFlags'.
struct TrainerFlags : MeshFlags {
  int steps = 100, eval_every = 25;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  bool check_finite = false;
  std::string trace, plot;
  // Checkpoints (checkpoint/pipeline_state.hpp).
  int save_every = 0;
  std::string save_dir, resume;
  // Whole weights in and out (checkpoint/pipeline_safetensors.hpp).
  std::string init_from, export_path;
  // Beyond lock-step DP on "dp" (parallel/sync/), DiLoCo's options (parallel::sync::DiLoCoOptions;
  // --outer-lr 0 and --outer-momentum -1: the library's defaults).
  std::string sync = "ddp";
  int inner_steps = 50, staleness = 1, clients = 0;
  bool inner_steps_given = false, staleness_given = false;  // refused where --sync cannot use them
  int fragments = 1, overlap = 0;
  double overlap_alpha = 0, outer_lr = 0, outer_momentum = -1;
  bool bf16_reduce = false;
  // Offload (docs/offload.md: optim::OffloadedAdamW, FsdpOptions::offload_params_dir,
  // nn::ActivationOffload) and the memory budgets (optim/memory_budget.hpp).
  std::vector<std::string> offload;
  std::string offload_dir;
  std::size_t offload_buffer_kib = 64 << 10;
  bool offload_buffer_given = false;  // else, under --host-budget-mib, the budget sizes it
  double host_budget_mib = 0, device_budget_mib = 0;

  bool diloco_options_given() const {
    return fragments != 1 || overlap != 0 || overlap_alpha != 0 || bf16_reduce || outer_lr != 0 || outer_momentum >= 0;
  }
  bool offloads(std::string_view what) const {
    return std::find(offload.begin(), offload.end(), what) != offload.end();
  }
};

/// What the checks need of the program: its model and where it runs.
struct FlagContext {
  long long batch = 1;            // --batch: samples per step over all ranks
  long long layers = 0;           // the model's layers, which the pipeline's stages split (0: not checked)
  bool experts = false;           // --experts: MoE blocks (their all-reduce on "edp" spans replicas)
  std::string device = "cpu";     // --device
  std::string dtype = "f32";      // --dtype
  std::string program = "train";  // in the messages about files
};

/// The rows of the loop, checkpoints and whole weights.
template <class O>
FlagTable<O> loop_flag_rows() {
  static_assert(std::is_base_of_v<TrainerFlags, O>);
  using T = TrainerFlags;
  return {
      {"", "", "training (defaults: --steps 100 --lr 3e-3 --seed 1 --eval-every 25):"},
      {"--steps", "N", "training steps (with --resume, the total)", integer(&T::steps, 1)},
      {"--lr", "X", "AdamW's learning rate (at most 1e6)", positive(&T::lr, 1e6)},
      {"--seed", "N", "the initialization's and the batches' seed", integer(&T::seed, 0)},
      {"--eval-every", "N", "the validation loss every N steps", integer(&T::eval_every, 1)},
      {"--check-finite", "", "stop at the first NaN/Inf loss or parameter, naming it", set_to(&T::check_finite, true)},
      {"--trace", "FILE", "a Chrome trace of steps 2..4 (docs/observability.md)", text(&T::trace)},
      {"--plot", "FILE", "the train and validation loss curves as an SVG", text(&T::plot)},
      {"", "", "checkpoints (host memory):"},
      {"--save-every", "N", "save parameters, AdamW state, step and data position every N steps (with --save-dir)",
       integer(&T::save_every, 1)},
      {"--save-dir", "DIR", "where (atomically: DIR always holds a whole checkpoint)", text(&T::save_dir)},
      {"--resume", "DIR", "continue from a checkpoint saved on any mesh, up to --steps (the total)", text(&T::resume)},
      {"", "", "weights (CPU):"},
      {"--init-from", "FILE",
       "start from a safetensors file's weights (or a sharded *.index.json), any mesh's, instead of the random init",
       text(&T::init_from)},
      {"--export", "FILE.safetensors", "the trained weights, whole (any mesh), readable by Python's safetensors",
       text(&T::export_path)},
  };
}

/// A memory budget in MiB: at least one byte (1e-320 MiB is positive, but 0 bytes), within an
/// int64 of bytes.
template <class C>
auto mib_budget(double C::* m) {
  return valued(
      [=](C& o, const std::string& f, const std::string& v) {
        const double mib = positive_flag_value(f, v, double(std::int64_t(1) << 42));
        if (mib * (1 << 20) < 1) throw UsageError(f + " " + v + " is less than one byte");
        o.*m = mib;
      },
      m);
}

/// The rows of --sync and --offload (with the memory budgets).
template <class O>
FlagTable<O> sync_and_offload_flag_rows() {
  using T = TrainerFlags;
  return {
      {"", "", "--sync (on \"dp\", docs/beyond-sync.md):"},
      {"--sync", "ddp|local-sgd|diloco|async|fedavg",
       "ddp (default); local-sgd / diloco: average / DiLoCo outer step every --inner-steps H; async: the all-reduce "
       "of step t applied at t + --staleness s; fedavg: each dp rank a client on its own slice of the data, "
       "--clients K sampled per round of H steps",
       choice(&T::sync, {"ddp", "local-sgd", "diloco", "async", "fedavg"})},
      {"--inner-steps", "H", "local-sgd, diloco, fedavg: local steps between syncs (default 50)",
       marking(integer(&T::inner_steps, 1), &T::inner_steps_given)},
      {"--staleness", "s", "async: steps an all-reduce is late (default 1)",
       marking(integer(&T::staleness, 0), &T::staleness_given)},
      {"--clients", "K", "fedavg: clients sampled per round (default 0: every dp rank)", integer(&T::clients, 0)},
      {"--fragments", "F", "diloco: Streaming DiLoCo, F staggered pieces (default 1)", integer(&T::fragments, 1)},
      {"--overlap", "T", "diloco: a piece's all-reduce waited for T < H steps after issue (default 0)",
       integer(&T::overlap, 0)},
      {"--overlap-alpha", "A", "diloco with --overlap: its local steps merged with weight A in (0, 1] (default 0)",
       positive(&T::overlap_alpha, 1)},
      {"--bf16-reduce", "", "diloco: the outer all-reduce in bf16", set_to(&T::bf16_reduce, true)},
      {"--outer-lr", "X", "diloco: the outer learning rate (default 0.7)", positive(&T::outer_lr)},
      {"--outer-momentum", "M", "diloco: the outer Nesterov momentum in [0, 1) (default 0.9; 0: plain outer SGD)",
       valued(
           [](O& o, const std::string&, const std::string& v) {
             const auto m = parse_number(v);
             if (!m || !(*m >= 0 && *m < 1))
               throw UsageError("--outer-momentum expects a number in [0, 1), got '" + v + "'");
             o.outer_momentum = *m;
           },
           &T::outer_momentum)},
      {"", "", "offload (docs/offload.md):"},
      {"--offload", "optimizer,params,activations",
       "a comma list. optimizer: AdamW's moments in a file per rank under --offload-dir, the same update bit for "
       "bit (checkpoints save them); params: the FSDP master shards (ZeRO-3's parameter shards, a bf16 model's fp32 "
       "master) there, mapped, prefetched a unit ahead and written behind, not for an f32 model at ZeRO-1/2 (its "
       "master is its own values); activations: every block's saved activations there between its forward and "
       "backward (written behind, read ahead; the same losses bit for bit; dense models). Host memory only",
       comma_list(&T::offload, "--offload needs optimizer, params and/or activations (a comma list)")},
      {"--offload-dir", "DIR", "an existing, writable local directory with room for them", text(&T::offload_dir)},
      {"--offload-buffer-kib", "N",
       "--offload optimizer's staging buffer of host memory (default 65536, at most 2^44; under --host-budget-mib "
       "the budget sizes it)",
       marking(integer(&T::offload_buffer_kib, 1, std::size_t(1) << 44), &T::offload_buffer_given)},
      {"--host-budget-mib", "X",
       "the host memory this process's tensors may hold, in MiB (decimals allowed): over it after building the "
       "model and optimizer, or in the first step, is an error on every rank",
       mib_budget(&T::host_budget_mib)},
      {"--device-budget-mib", "X", "the same for the GPU's memory (--device cuda)", mib_budget(&T::device_budget_mib)},
  };
}

/// The rows of the loop, checkpoints, weights, --sync and --offload (the mesh's: mesh_flag_rows).
template <class O>
FlagTable<O> trainer_flag_rows() {
  return joined_rows<O>({loop_flag_rows<O>(), sync_and_offload_flag_rows<O>()});
}

inline std::string str(long long n) { return std::to_string(n); }

/// The mesh's defaults resolved (--zero, --microbatches) and checked against each other and the
/// batch: what the Trainer would otherwise report later, deep in a rank. `max_ranks`: the threads
/// backend's bound, or a dry run's (one rank per class runs, never the whole mesh).
inline void check_mesh_flags(MeshFlags& o, long long batch, long long max_ranks = threads::max_ranks) {
  // In long long: five dimensions of up to 4096 overflow an int.
  const long long ranks = (long long)o.pp * o.dp * o.fsdp * o.cp * o.tp;
  if (ranks > max_ranks)
    throw UsageError("pp x dp x fsdp x cp x tp = " + str(ranks) + " ranks, more than " + str(max_ranks));
  if (o.zero == 0) o.zero = o.fsdp > 1 ? 3 : 1;
  if (o.microbatches == 0) o.microbatches = o.pp > 1 ? 2 * o.pp : 1;
  if (o.reshard_after_forward && o.zero != 3)
    throw UsageError(std::string(*o.reshard_after_forward ? "--reshard-after-forward" : "--no-reshard-after-forward") +
                     " is for ZeRO-3 (--zero 3 with --fsdp > 1), got ZeRO-" + str(o.zero));
  try {
    parallel::pipeline::parse_schedule_kind(o.schedule);
  } catch (const Error& e) {
    throw UsageError("--schedule: " + std::string(e.what()));
  }
  if (batch % o.microbatches != 0)
    throw UsageError("--microbatches " + str(o.microbatches) + " does not divide --batch " + str(batch));
  const int data_ranks = o.dp * o.fsdp;
  if (batch / o.microbatches < data_ranks)
    throw UsageError("a micro-batch of " + str(batch / o.microbatches) +
                     " sequences (--batch / --microbatches) leaves some of the " + str(data_ranks) +
                     " data ranks (--dp x --fsdp) without a sequence");
}

/// A pipeline's stages each need a layer: --pp times the schedule's stages per rank (interleaved
/// schedules: 2 unless fixed) at most the model's `layers`. Checked after check_mesh_flags (the
/// schedule's name is valid); the Trainer's split would otherwise fail inside a rank.
inline void check_pipeline_layers(const MeshFlags& o, long long layers) {
  if (o.pp == 1) return;
  const int per_rank = parallel::pipeline::fixed_stages_per_rank(parallel::pipeline::parse_schedule_kind(o.schedule));
  const long long stages = (long long)o.pp * (per_rank == 0 ? 2 : per_rank);
  if (layers < stages)
    throw UsageError("--schedule " + o.schedule + " with --pp " + str(o.pp) + " has " + str(stages) +
                     " stages: --layers " + str(layers) + " must be at least that");
}

/// A transformer's heads over the mesh: --dim a multiple of --heads, --heads of --tp (Megatron
/// splits them), and of tp x cp under Ulysses (it splits them over both).
inline void check_heads_over_mesh(const MeshFlags& o, long long dim, long long heads) {
  if (dim % heads != 0) throw UsageError("--dim " + str(dim) + " is not a multiple of --heads " + str(heads));
  if (heads % o.tp != 0) throw UsageError("--heads " + str(heads) + " is not a multiple of --tp " + str(o.tp));
  if (o.cp_kind == nn::ContextKind::ulysses && heads % (o.tp * o.cp) != 0)
    throw UsageError("--cp-kind ulysses splits the heads over tp x cp: --heads " + str(heads) +
                     " is not a multiple of " + str(o.tp * o.cp));
}

/// --sync, --inner-steps, --staleness, --clients and DiLoCo's options (parallel/sync/).
inline void check_sync_flags(const TrainerFlags& o, const FlagContext& c) {
  if (o.clients > o.dp)
    throw UsageError("--clients " + str(o.clients) + ": more clients than the " + str(o.dp) + " dp ranks (--dp)");
  if (o.clients > 0 && o.sync != "fedavg") throw UsageError("--clients needs --sync fedavg");
  if (o.inner_steps_given && o.sync != "local-sgd" && o.sync != "diloco" && o.sync != "fedavg")
    throw UsageError("--inner-steps needs --sync local-sgd, diloco or fedavg (--sync " + o.sync +
                     " has no inner steps)");
  if (o.staleness_given && o.sync != "async")
    throw UsageError("--staleness needs --sync async (--sync " + o.sync + " applies each all-reduce at once)");
  if (o.diloco_options_given() && o.sync != "diloco")
    throw UsageError(
        "--fragments, --overlap, --overlap-alpha, --bf16-reduce, --outer-lr and --outer-momentum need --sync diloco");
  if (o.fragments > o.inner_steps)
    throw UsageError("--fragments " + str(o.fragments) + " exceeds --inner-steps " + str(o.inner_steps) +
                     " (a piece syncs once per H steps)");
  if (o.overlap >= o.inner_steps)
    throw UsageError("--overlap " + str(o.overlap) + ": must be below --inner-steps " + str(o.inner_steps) +
                     " (an all-reduce completes before its fragment is due again)");
  if (o.overlap_alpha != 0 && o.overlap == 0) throw UsageError("--overlap-alpha needs --overlap T > 0");
  // An overlapped all-reduce may be in flight at any step: its state is not a tensor to save.
  if (o.overlap > 0 && (o.save_every > 0 || !o.resume.empty()))
    throw UsageError("--overlap with checkpoints: an outer all-reduce may be in flight at the save");
  if (o.sync == "ddp") return;
  if (c.experts)
    throw UsageError("--sync " + o.sync + " with --experts: the experts' all-reduce on \"edp\" spans replicas");
  // The per-rank sync state (checkpoint/sync_state.hpp) is written from host memory.
  if (c.device == "cuda" && (o.save_every > 0 || !o.resume.empty()))
    throw UsageError("--sync " + o.sync + " with checkpoints and --device cuda: not supported yet (host only)");
}

/// --offload, --offload-dir, --offload-buffer-kib and the budgets (optim/offload_adamw.hpp). The
/// directory itself is checked by every rank when the optimizer makes its file.
inline void check_offload_flags(const TrainerFlags& o, const FlagContext& c) {
  if (o.device_budget_mib > 0 && c.device != "cuda")
    throw UsageError("--device-budget-mib with --device " + c.device +
                     ": the model is in host memory (--host-budget-mib)");
  for (const auto& w : o.offload)
    if (w != "optimizer" && w != "params" && w != "activations")
      throw UsageError("--offload " + w + ": unknown; what is offloaded: optimizer, params, activations");
  if (o.offload.empty()) {
    if (!o.offload_dir.empty()) throw UsageError("--offload-dir needs --offload optimizer, params or activations");
    if (o.offload_buffer_given)
      throw UsageError("--offload-buffer-kib needs --offload optimizer, params or activations");
    return;
  }
  const std::string what = o.offload.front();  // the first of the list, for the messages
  if (o.offload_dir.empty()) throw UsageError("--offload " + what + " needs --offload-dir DIR (a local directory)");
  if (o.offloads("activations")) {
    // The disk tier of a host model; a CUDA model's tier would be host memory (not measured yet).
    if (c.device != "cpu")
      throw UsageError("--offload activations with --device " + c.device + ": not built yet (host models only)");
    // MoE blocks' saved routing state (parallel/moe.hpp) does not list its tensors for the offload yet.
    if (c.experts) throw UsageError("--offload activations with --experts: not built yet (dense blocks only)");
  }
  if (!o.offloads("optimizer") && !o.offloads("params")) return;
  const std::string state = o.offloads("optimizer") ? "optimizer" : "params";
  if (c.device != "cpu")
    throw UsageError("--offload " + state + " with --device " + c.device +
                     ": the offloaded state is updated on the host");
  // An fp32 model's ZeRO-1/2 master values are the model's own full values (no second copy,
  // parallel/fsdp/unit_state.hpp master_in_values): nothing separate to put on disk.
  if (o.offloads("params") && o.zero <= 2 && c.dtype == "f32")
    throw UsageError("--offload params with --dtype f32 at ZeRO-" + str(o.zero) +
                     ": the master values are the model's own (nothing separate to offload); use --zero 3 (--fsdp > "
                     "1) or --dtype bf16");
  if (o.offloads("params") && o.pp > 1)
    throw UsageError("--offload params with --pp " + str(o.pp) +
                     ": a bad directory is agreed on within a stage's ranks only; use --pp 1");
  // Checkpoints save the offloaded moments (OffloadedAdamW::held_moments) through the pipeline's
  // format; --sync's per-rank state is saved through an AdamW in memory (sync_state_slots).
  if (o.sync != "ddp" && (o.save_every > 0 || !o.resume.empty()))
    throw UsageError("--offload " + state + " with --sync " + o.sync +
                     " and checkpoints: the per-rank sync state is saved with an AdamW in memory only");
}

/// --init-from and --export: the files, before training, not after it.
inline void check_weights_flags(const TrainerFlags& o, const FlagContext& c) {
  if (!o.export_path.empty() && !o.export_path.ends_with(".safetensors"))
    throw UsageError("--export " + o.export_path + ": the file name must end in .safetensors");
  if (!o.init_from.empty() && !o.resume.empty())
    throw UsageError("--init-from with --resume: one starting point, not two");
  check_output_file("--export", o.export_path);
  if (!o.init_from.empty() && !std::filesystem::is_regular_file(o.init_from))
    throw UsageError("--init-from " + o.init_from + ": no such file (a .safetensors file or a *.index.json)");
  if (o.export_path.empty() && o.init_from.empty()) return;
  if (c.experts) throw UsageError("--init-from and --export with --experts: not supported yet (--generate is)");
  if (c.device == "cuda") throw UsageError("--init-from and --export with --device cuda: not supported yet");
}

/// Every check between the Trainer's flags (the mesh's defaults resolved first): a UsageError
/// naming the flags, before any rank starts.
inline void check_trainer_flags(TrainerFlags& o, const FlagContext& c) {
  check_mesh_flags(o, c.batch);
  if (c.layers > 0) check_pipeline_layers(o, c.layers);
  if (o.save_every > 0 && o.save_dir.empty()) throw UsageError("--save-every needs --save-dir DIR");
  if (o.save_every == 0 && !o.save_dir.empty()) throw UsageError("--save-dir needs --save-every N");
  check_output_file("--trace", o.trace);  // before training, not after it
  check_output_file("--plot", o.plot);
  check_weights_flags(o, c);
  check_sync_flags(o, c);
  check_offload_flags(o, c);
}

/// --save-dir: fail before training, not at the first save, when the checkpoint cannot be
/// written (its parent is not a writable directory) or would replace what is not a checkpoint (a
/// regular file, a directory of other files). The save checks again (checkpoint::save).
inline void check_save_dir(const TrainerFlags& o, const std::string& program) {
  if (o.save_dir.empty()) return;
  const std::filesystem::path dir = std::filesystem::absolute(o.save_dir).lexically_normal();
  const auto parent = (dir.has_filename() ? dir : dir.parent_path()).parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec) || ::access(parent.c_str(), W_OK) != 0)
    throw Error(program + " --save-dir", "--save-dir " + o.save_dir + ": cannot write into " + parent.string() +
                                             (std::filesystem::exists(parent, ec) ? "" : " (it does not exist)"));
  const std::string op = program + " --save-dir";
  checkpoint::check_save_target(o.save_dir, op.c_str());  // not a file or another directory
}

/// --init-from FILE: the pipeline's weights from it (any mesh's; rank 0 says so).
template <class Tr>
void load_weights(const TrainerFlags& o, Tr& trainer) {
  if (o.init_from.empty()) return;
  checkpoint::import_pipeline_safetensors(o.init_from, trainer.pipeline());
  if (trainer.mesh().root().rank() == 0) std::printf("weights from %s\n", o.init_from.c_str());
}

/// --export FILE after training: the weights gathered into one safetensors file (whole tensors,
/// any mesh: PP and FSDP included).
template <class Tr>
void export_weights(const TrainerFlags& o, Tr& trainer) {
  if (o.export_path.empty()) return;
  checkpoint::export_pipeline_safetensors(o.export_path, trainer.pipeline());
  if (trainer.mesh().root().rank() == 0) std::printf("weights exported to %s\n", o.export_path.c_str());
}

/// --sync diloco's options (the library's defaults where a flag is not given).
inline parallel::sync::DiLoCoOptions diloco_options(const TrainerFlags& o) {
  parallel::sync::DiLoCoOptions d{.inner_steps = o.inner_steps,
                                  .bf16_reduce = o.bf16_reduce,
                                  .fragments = o.fragments,
                                  .overlap_steps = o.overlap,
                                  .overlap_alpha = o.overlap_alpha};
  if (o.outer_lr > 0) d.outer_lr = o.outer_lr;
  if (o.outer_momentum >= 0) d.outer_momentum = o.outer_momentum, d.nesterov = o.outer_momentum > 0;  // 0: plain SGD
  return d;
}

/// The budgets of --host-budget-mib / --device-budget-mib: per process, its `ranks_sharing` ranks
/// sharing it (the threads backend's ranks share one process).
inline optim::MemoryBudget host_budget(const TrainerFlags& o, int ranks_sharing) {
  return {.space = "host", .bytes = std::int64_t(o.host_budget_mib * (1 << 20)), .ranks_sharing = ranks_sharing};
}
inline optim::MemoryBudget device_budget(const TrainerFlags& o, int ranks_sharing) {
  return {.space = "cuda", .bytes = std::int64_t(o.device_budget_mib * (1 << 20)), .ranks_sharing = ranks_sharing};
}

/// The step's options: the mesh, the schedule, FSDP, AdamW (betas 0.9, 0.95, weight decay 0.1),
/// clipping to norm 1, --sync, --offload; the staging buffer as given, or a quarter of what the
/// host budget leaves. `c.batch`: fedavg's samples per client and step.
inline TrainerOptions trainer_options(const TrainerFlags& o, const FlagContext& c,
                                      const optim::MemoryBudget& host = {}) {
  TrainerOptions t{.degrees = {.pp = o.pp, .dp = o.dp, .fsdp = o.fsdp, .cp = o.cp, .tp = o.tp},
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
                            .samples_per_step = double(c.batch / o.dp),
                            .diloco = diloco_options(o)},
                   .offload_params_dir = o.offloads("params") ? o.offload_dir : std::string(),
                   .offload_optimizer_dir = o.offloads("optimizer") ? o.offload_dir : std::string(),
                   .offload_buffer_bytes = o.offload_buffer_kib << 10};
  if (!o.offload_buffer_given) {
    const std::size_t given = o.offload_buffer_kib << 10;
    t.offload_buffer_sizer = [given, host] { return host.buffer_for_offload(given, 4 * sizeof(float) * 64); };
  }
  return t;
}

/// The loop's options of the flags, the budgets and the rank's ledger (the program adds its
/// checkpoint configuration, tokens per step and hosts).
inline FitOptions fit_options(const TrainerFlags& o, const optim::MemoryBudget& host = {.space = "host"},
                              const optim::MemoryBudget& device = {.space = "cuda"}, MemoryLedger* ledger = nullptr) {
  return {.steps = o.steps,
          .eval_every = o.eval_every,
          .save_every = o.save_every,
          .save_dir = o.save_dir,
          .resume_dir = o.resume,
          .check_finite = o.check_finite,
          .trace_path = o.trace,
          .plot_path = o.plot,
          .host_budget = host,
          .device_budget = device,
          .rank_ledger = ledger};
}

/// --sync's settings in a checkpoint's configuration: its state travels as each rank's own
/// tensors, so a checkpoint resumes only under the same sync.
inline void add_sync_config(const TrainerFlags& o, std::map<std::string, std::string>& config) {
  using parallel::sync::SyncKind;
  const auto kind = parallel::sync::parse_sync(o.sync);
  if (kind == SyncKind::ddp) return;
  config["sync"] = o.sync;
  config["sync_inner_steps"] = str(o.inner_steps);
  if (kind == SyncKind::async) config["sync_staleness"] = str(o.staleness);
  if (kind == SyncKind::fedavg) config["sync_clients"] = str(o.clients);
}

/// --offload activations: every block's saved activations in a file per rank under --offload-dir
/// between its forward and its backward (nn/activation_offload.hpp). Built by every rank together;
/// null without the flag.
template <class Tr>
std::shared_ptr<nn::ActivationOffload> offload_activations(const TrainerFlags& o, Tr& trainer, Communicator& world) {
  if (!o.offloads("activations")) return nullptr;
  auto offload = std::make_shared<nn::ActivationOffload>(
      nn::ActivationOffloadOptions{.tier = nn::OffloadTier::disk, .dir = o.offload_dir}, &world);
  for (auto& stage : trainer.stages()) stage.set_activation_offload(offload);
  return offload;
}

/// The budgets after building the model and optimizer (every rank fails alike), with a hint.
inline void check_budgets_built(const TrainerFlags& o, Communicator& world, const optim::MemoryBudget& host,
                                const optim::MemoryBudget& device) {
  host.check(world, "after building the model and optimizer",
             o.offloads("optimizer") ? "a larger budget, or a smaller --offload-buffer-kib"
                                     : "--offload optimizer --offload-dir DIR moves AdamW's moments to disk "
                                       "(--offload optimizer,params the master shards too)");
  device.check(world, "after building the model and optimizer", "a larger budget or more ranks");
}

/// The lines after the summary (rank 0's figures): the host budget, what --offload moved to
/// files (offload_notes) and the activations' offload.
template <class Tr>
std::string offload_and_budget_notes(const TrainerFlags& o, Tr& trainer, const nn::ActivationOffload* activations,
                                     const optim::MemoryBudget& host, std::int64_t host_held_built) {
  std::string s;
  if (host.active())
    s += formatted("host memory budget: %.3f MiB per process, %d rank(s) sharing it; held after building %.3f MiB\n",
                   o.host_budget_mib, host.ranks_sharing, double(host_held_built) / (1 << 20));
  s += offload_notes(trainer);
  if (activations) {
    const auto& st = activations->stats();
    s += formatted(
        "activation offload (rank 0): %zu block states to %s, wrote %.2f MiB, read %.2f MiB back (%zu kept in "
        "memory) in %.3f s of I/O (%.0f MiB/s), %.0f%% of it hidden behind the compute\n",
        st.entries, o.offload_dir.c_str(), double(st.bytes_written) / (1 << 20), double(st.bytes_read) / (1 << 20),
        st.kept, st.io_seconds,
        st.io_seconds > 0 ? double(st.bytes_read + st.bytes_written) / (1 << 20) / st.io_seconds : 0.0,
        100 * st.hidden());
  }
  return s;
}

/// --sync on "dp" (dp > 1): the dry-run figure of docs/beyond-sync.md for this rank's shards,
/// checked against the library's own count (bench/plot_sync.py reads the line).
template <class Tr>
void print_sync_payload(const TrainerFlags& o, Tr& trainer, const std::string& program) {
  using parallel::sync::SyncKind;
  if (o.dp == 1) return;
  std::size_t elements = 0;
  for (const auto& p : trainer.params().template list<0>()) elements += p.value.size();
  const auto kind = parallel::sync::parse_sync(o.sync);
  const parallel::sync::SyncCost cost{.inner_steps = o.inner_steps, .bf16_reduce = o.bf16_reduce};
  const double bytes = parallel::sync::payload_bytes_per_step(kind, elements, sizeof(float), cost);
  const double ddp = parallel::sync::payload_bytes_per_step(SyncKind::ddp, elements, sizeof(float));
  auto& sync = trainer.replica_sync();
  if (sync && sync->diloco() && sync->diloco()->payload_bytes_per_step() != bytes)
    throw Error(program, "DiLoCo's payload " + std::to_string(sync->diloco()->payload_bytes_per_step()) +
                             " B/step != the formula's " + std::to_string(bytes));
  if (trainer.mesh().root().rank() == 0)
    std::printf("sync %s on dp: %.0f all-reduce payload bytes per step on rank 0 (DDP: %.0f, %.1fx)\n", o.sync.c_str(),
                bytes, ddp, ddp / bytes);
}

}  // namespace dtensor::train::cli
