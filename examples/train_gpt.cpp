// examples/train_gpt.cpp — a character-level GPT trained with data, tensor, sequence and context
// parallelism on a (dp, tp) mesh, or a (dp, cp, tp) mesh with --cp > 1.
//
//   train_gpt                                   # dp 2 x tp 4 + SP, 8 threads, /usr/share/common-licenses
//   train_gpt --dp 1 --tp 2 --steps 200 --data input.txt
//   train_gpt --dp 1 --cp 2 --tp 2 --cp-kind ulysses       # the sequence split over "cp" for the whole model
//   mpirun -n 4 train_gpt --backend mpi --dp 2 --tp 2     # when built with -DDTENSOR_WITH_MPI=ON
//   train_gpt --fsdp 4 --tp 2                   # FSDP (ZeRO-3) over 4 data ranks x TP 2
//   train_gpt --dp 4 --zero 2                   # ZeRO-2 over the 4 data ranks
//   train_gpt --dp 4 --hsdp 2 --tp 1            # HSDP: 2 replicas x 2 shards (ZeRO-3)
//
// Without --zero / --fsdp the data ranks replicate the parameters (DDP, mesh (dp, tp)); with
// them the mesh is (dp, fsdp, tp) and parallel::fully_shard shards parameters, gradients and
// optimizer state over "fsdp" (--hsdp R: R replicas on "dp", each sharded over dp / R ranks).
//   train_gpt --dp 4 --tp 2 --no-sp --experts 4 --topk 2 --ep 2 --capacity 1.25   # MoE blocks (train_moe)
//
// The text's characters are the vocabulary; the first 90% trains, the last 10% is the held-out
// validation set. Each step draws --batch sequences of --seq characters (the same on every
// rank, from --seed) as a [batch, seq] tensor, each data-parallel rank keeps its share, and the
// model (nn::GPT with parallel::MegatronPlan<--sp>) runs forward and backward — the data-parallel
// all-reduce of each unit's gradient buckets starting as soon as the backward has finished that
// unit (DataParallel::attach) —; then the wait for those, the context-parallel gradient sync
// (with --cp > 1: parallel::context_parallel_grads; the batch is stored in the load-balanced
// order for ring and all-gather attention), the sequence-parallel gradient sync, clipping to
// global norm 1 and AdamW. Rank 0
// prints a line per step (a progress bar on a terminal), the validation loss every --eval-every
// steps, and a summary with the collectives of one step (from a CommLog) by kind and mesh
// dimension. --trace FILE writes a Chrome trace of steps 2..4 (compute, collective and wait spans
// per rank; docs/observability.md), --plot FILE the train and validation loss curves as an SVG.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/optim/check_finite.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/clip.hpp"
#include "dtensor/parallel/pipeline/executor.hpp"
#include "dtensor/parallel/pipeline/gpt_stage.hpp"
#include "dtensor/trace/training_monitor.hpp"
#include "dtensor/trace/unit_spans.hpp"
#include "dtensor/training.hpp"
#include "flags.hpp"
#ifdef DTENSOR_HAS_MPI
#include "dtensor/comm/mpi.hpp"
#endif

namespace {

using namespace dtensor;
using Mesh = DeviceMesh<"dp", "tp">;
using ShardedMesh = DeviceMesh<"dp", "fsdp", "tp">;
using ContextMesh = DeviceMesh<"dp", "cp", "tp">;  // with --cp > 1

struct Options {
  int dp = 2, tp = 4, cp = 1;
  parallel::ContextKind cp_kind = parallel::ContextKind::ring;
  int zero = 0;     // 0: DDP; 1, 2, 3: ZeRO stage over the data ranks (parallel::fully_shard)
  int hsdp = 1;     // replicas of the sharded data ranks (HSDP when > 1)
  int prefetch = 2; // ZeRO-3: units unsharded at once
  bool sp = true;
  Extent layers = 2, heads = 4, dim = 128, seq = 64, batch = 16;
  int steps = 300, eval_every = 50;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  bool checkpoint = false;
  bool check_finite = false;  // stop at the first NaN/Inf loss or parameter, naming it
  std::string trace, plot;    // --trace FILE (a Chrome trace of steps 2..4), --plot FILE (SVG loss curves)
  std::string data, backend = "threads";
  // Pipeline parallelism (--pp > 1): mesh (pp, dp, tp), a schedule over --microbatches.
  int pp = 1, microbatches = 0;  // 0: 2 x pp
  std::string schedule = "1f1b";
  // Mixture of experts (0 experts: dense MLPs). See train_moe.
  Extent experts = 0, topk = 2, moe_every = 1;
  int ep = 1;
  double capacity = 0;  // 0: dropless
};

const char* usage =
    "usage: train_gpt [--dp N] [--tp N] [--cp N] [--cp-kind ring|allgather|ulysses] [--sp | --no-sp] [--layers N] [--heads N] [--dim N] [--seq N]\n"
    "                 [--batch N] [--steps N] [--lr X] [--seed N] [--eval-every N] [--checkpoint]\n"
    "                 [--check-finite] [--data FILE] [--backend threads|mpi] [--trace FILE] [--plot FILE]\n"
    "                 [--fsdp N] [--zero 1|2|3] [--hsdp R] [--prefetch N]\n"
    "                 [--pp N --schedule gpipe|1f1b|interleaved|zb|zbv --microbatches M]\n"
    "                 [--experts E --topk K --ep N --capacity F --moe-every N]\n"
    "  defaults: --dp 2 --tp 4 --sp --layers 2 --heads 4 --dim 128 --seq 64 --batch 16 --steps 300 --lr 3e-3\n"
    "            --seed 1 --eval-every 50, data: the files under /usr/share/common-licenses\n"
    "  --batch is the number of sequences per step over all data-parallel ranks (a multiple of --dp);\n"
    "  --heads must be a multiple of --tp; --backend mpi needs an MPI build and mpirun -n dp*cp*tp (pp*dp*tp).\n"
    "  --fsdp N is --dp N --zero 3; --zero shards over the --dp ranks (DDP without it); --hsdp R splits them\n"
    "  into R replicas (R divides --dp; ZeRO-3 unless --zero says); --prefetch: ZeRO-3 units unsharded at once.\n"
    "  --cp N > 1: context parallelism on a (dp, cp, tp) mesh, --cp-kind ring (default) | allgather | ulysses\n"
    "  (ulysses: --heads a multiple of --tp x --cp).\n"
    "  --pp N > 1: pipeline stages on a (pp, dp, tp) mesh, --schedule (default 1f1b) over --microbatches\n"
    "  (default 2 x pp; must divide --batch); --layers must be at least the number of stages.\n"
    "  --experts E > 0: MoE blocks (every --moe-every-th block, default all) with E experts, top-K routing\n"
    "  (default 2), split over --ep expert ranks (a divisor of --dp; default 1), capacity factor F\n"
    "  (default: dropless); needs --no-sp. Each step prints the load per expert and the dropped fraction.\n";

using examples::flag_value;
using examples::UsageError;

// ---------------------------------------------------------------- pipeline flags

/// --pp N, --schedule NAME, --microbatches M; false for any other flag.
template <class Value>
bool parse_pipeline_flag(const std::string& a, Value&& value, Options& o) {
  if (a == "--pp") o.pp = flag_value<int>(a, value(), 1, threads::detail::max_ranks);
  else if (a == "--schedule") o.schedule = value();
  else if (a == "--microbatches") o.microbatches = flag_value<int>(a, value(), 1);
  else return false;
  return true;
}

/// --cp N and --cp-kind K (context parallelism); false for any other flag.
template <class Value>
bool parse_context_flag(const std::string& a, Value&& value, Options& o) {
  if (a == "--cp") o.cp = flag_value<int>(a, value(), 1, threads::detail::max_ranks);
  else if (a == "--cp-kind") {
    const std::string k = value();
    try {
      o.cp_kind = parallel::parse_context_kind(k);
    } catch (const Error&) {
      throw UsageError("--cp-kind is ring, allgather or ulysses, got '" + k + "'");
    }
  } else
    return false;
  return true;
}

/// The context-parallel constraints on the other options.
void check_context_options(const Options& o) {
  if (o.cp_kind == parallel::ContextKind::ulysses && o.heads % (o.tp * o.cp) != 0)
    throw UsageError("--cp-kind ulysses splits the heads over tp * cp: --heads " + std::to_string(o.heads) +
                     " is not a multiple of --tp " + std::to_string(o.tp) + " x --cp " + std::to_string(o.cp));
}

/// Attention's context-parallel options: ring and all-gather store the sequence load balanced
/// (their per-rank work under the causal mask is even then); Ulysses attends to every position of
/// its heads and needs no balancing.
parallel::ContextAttentionOptions context_options(const Options& o) {
  return {.kind = o.cp_kind, .load_balanced = o.cp > 1 && o.cp_kind != parallel::ContextKind::ulysses};
}

void check_pipeline_flags(Options& o) {
  try {
    parallel::pipeline::parse_schedule_kind(o.schedule);
  } catch (const Error& e) {
    throw UsageError("--schedule: " + std::string(e.what()));
  }
  if (o.microbatches == 0) o.microbatches = 2 * o.pp;
  if (o.pp > 1 && o.batch % o.microbatches != 0)
    throw UsageError("--microbatches " + std::to_string(o.microbatches) + " does not divide --batch " +
                     std::to_string(o.batch));
  if (o.pp > 1 && o.zero > 0)
    throw UsageError("--pp with --zero / --fsdp / --hsdp: FSDP inside pipeline stages is not supported yet");
}

/// The mixture-of-experts flags; false when `a` is none of them.
template <class Value>
bool parse_moe_flag(Options& o, const std::string& a, Value&& value) {
  if (a == "--experts") o.experts = flag_value<Extent>(a, value(), 1);
  else if (a == "--topk") o.topk = flag_value<Extent>(a, value(), 1);
  else if (a == "--ep") o.ep = flag_value<int>(a, value(), 1, threads::detail::max_ranks);
  else if (a == "--capacity") o.capacity = examples::positive_flag_value(a, value());
  else if (a == "--moe-every") o.moe_every = flag_value<Extent>(a, value(), 1);
  else return false;
  return true;
}

void check_moe_options(const Options& o) {
  if (o.experts == 0) {
    if (o.ep != 1) throw UsageError("--ep " + std::to_string(o.ep) + " needs --experts");
    return;
  }
  if (o.topk > o.experts) throw UsageError("--topk " + std::to_string(o.topk) + " exceeds --experts " + std::to_string(o.experts));
  if (o.dp % o.ep != 0) throw UsageError("--ep " + std::to_string(o.ep) + " does not divide --dp " + std::to_string(o.dp));
  if (o.experts % o.ep != 0)
    throw UsageError("--experts " + std::to_string(o.experts) + " is not a multiple of --ep " + std::to_string(o.ep));
  if (o.sp) throw UsageError("--experts needs --no-sp (the MoE routes whole tokens)");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--dp") o.dp = flag_value<int>(a, value(), 1, threads::detail::max_ranks);
    else if (a == "--fsdp") {
      o.dp = flag_value<int>(a, value(), 1, threads::detail::max_ranks);
      o.zero = 3;
    } else if (a == "--zero") {
      o.zero = flag_value<int>(a, value(), 1);
      if (o.zero > 3) throw UsageError("--zero is a ZeRO stage (1, 2 or 3), got " + std::to_string(o.zero));
    } else if (a == "--hsdp") o.hsdp = flag_value<int>(a, value(), 1, threads::detail::max_ranks);
    else if (a == "--prefetch") o.prefetch = flag_value<int>(a, value(), 1);
    else if (a == "--tp") o.tp = flag_value<int>(a, value(), 1, threads::detail::max_ranks);
    else if (parse_context_flag(a, value, o)) continue;
    else if (a == "--sp") o.sp = true;
    else if (a == "--no-sp") o.sp = false;
    else if (a == "--layers") o.layers = flag_value<Extent>(a, value(), 1);
    else if (a == "--heads") o.heads = flag_value<Extent>(a, value(), 1);
    else if (a == "--dim") o.dim = flag_value<Extent>(a, value(), 1);
    else if (a == "--seq") o.seq = flag_value<Extent>(a, value(), 2);
    else if (a == "--batch") o.batch = flag_value<Extent>(a, value(), 1);
    else if (a == "--steps") o.steps = flag_value<int>(a, value(), 1);
    else if (a == "--eval-every") o.eval_every = flag_value<int>(a, value(), 1);
    else if (a == "--lr") o.lr = examples::positive_flag_value(a, value());
    else if (a == "--seed") o.seed = flag_value<std::uint64_t>(a, value(), 0);
    else if (a == "--checkpoint") o.checkpoint = true;
    else if (a == "--check-finite") o.check_finite = true;
    else if (a == "--data") o.data = value();
    else if (a == "--trace") o.trace = value();
    else if (a == "--plot") o.plot = value();
    else if (parse_pipeline_flag(a, value, o)) continue;
    else if (parse_moe_flag(o, a, value)) continue;
    else if (a == "--backend") {
      o.backend = value();
      if (o.backend != "threads" && o.backend != "mpi") throw UsageError("--backend is threads or mpi, got '" + o.backend + "'");
    } else if (a == "--help" || a == "-h") {
      std::cout << usage;
      std::exit(0);
    } else
      throw UsageError("unknown flag '" + a + "'");
  }
  if (o.dim % o.heads != 0) throw UsageError("--dim " + std::to_string(o.dim) + " is not a multiple of --heads " + std::to_string(o.heads));
  if (o.heads % o.tp != 0) throw UsageError("--heads " + std::to_string(o.heads) + " is not a multiple of --tp " + std::to_string(o.tp));
  check_moe_options(o);
  if (o.batch % o.dp != 0) throw UsageError("--batch " + std::to_string(o.batch) + " is not a multiple of --dp " + std::to_string(o.dp));
  if (o.hsdp > 1) {
    if (o.dp % o.hsdp != 0)
      throw UsageError("--hsdp " + std::to_string(o.hsdp) + " does not divide the " + std::to_string(o.dp) +
                       " data-parallel ranks (--dp)");
    if (o.zero == 0) o.zero = 3;
  }
  check_pipeline_flags(o);
  if (o.experts > 0 && (o.pp > 1 || o.zero > 0))
    throw UsageError("--experts with --pp or --zero / --fsdp / --hsdp: not supported yet (MoE runs with DDP x EP x TP)");
  check_context_options(o);
  if (o.cp > 1 && (o.pp > 1 || o.zero > 0 || o.experts > 0))
    throw UsageError("--cp with --pp, --zero / --fsdp / --hsdp or --experts: not supported yet");
  return o;
}

std::string read_text(const std::string& file) {
  std::string text;
  auto add = [&](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + p.string());
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

/// The characters of the text as ids 0..V-1 (sorted), and the text as ids.
struct Corpus {
  std::vector<char> chars;
  std::vector<std::int32_t> train, val;
};

Corpus encode(const std::string& text, Extent seq) {
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
    throw std::runtime_error("the text (" + std::to_string(text.size()) + " characters) is too short for --seq " +
                             std::to_string(seq));
  return c;
}

/// The [batch, seq] ids and targets of the sequences starting at `starts`, whole on every rank.
std::pair<Tensor<std::int32_t, 2>, Tensor<std::int32_t, 2>> tokens_of(const std::vector<std::int32_t>& data,
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

/// Sequences as the model stores them: in the load-balanced order on a context dimension that asks for it.
template <class Model>
Tensor<std::int32_t, 2> stored_order(const Model& model, Tensor<std::int32_t, 2> t) {
  if constexpr (has_role<typename Model::Ids::mesh_type, Role::context>)
    if (model.config().context.load_balanced)
      return parallel::load_balance(t, 1, parallel::context_size(model.mesh()));
  return t;
}

/// This rank's piece of the batch of sequences starting at `starts`, as `model` takes it.
template <class Model>
std::pair<typename Model::Ids, typename Model::Ids> batch_of(const Model& model, const std::vector<std::int32_t>& data,
                                                            const std::vector<std::size_t>& starts, Extent seq) {
  auto [ids, tgt] = tokens_of(data, starts, seq);
  using L = typename Model::Ids::layout;
  return {distribute_replicated<L>(model.mesh(), stored_order(model, std::move(ids))),
          distribute_replicated<L>(model.mesh(), stored_order(model, std::move(tgt)))};
}

/// DDP on a (dp, tp) or, with --cp, (dp, cp, tp) mesh; fully_shard on a (dp, fsdp, tp) one.
template <bool SP, class M>
void train(CommPtr world, const Options& o, const Corpus& corpus) {
  constexpr bool Sharded = has_role<M, Role::data_shard>;
  constexpr bool Context = has_role<M, Role::context>;
  using Model = nn::GPT<float, M, parallel::MegatronPlan<SP>>;
  const bool root = world->rank() == 0;
  auto make_mesh = [&] {
    if constexpr (Sharded) {
      const auto [replicas, shards] = parallel::hsdp_shape(o.dp, o.hsdp);
      return M(world, {replicas, shards, o.tp});
    } else if constexpr (Context) {
      return M(world, {o.dp, o.cp, o.tp});
    } else {
      return M(world, {o.dp, o.tp});
    }
  };
  M mesh = make_mesh();
  const nn::GPTConfig cfg{.vocab = Extent(corpus.chars.size()), .seq = o.seq, .dim = o.dim, .heads = o.heads,
                          .layers = o.layers, .mlp_ratio = 4, .checkpoint = o.checkpoint, .seed = o.seed,
                          .context = context_options(o)};
  Model model(mesh, cfg);
  Extent nparams = 0;
  for (auto& u : model.units()) nparams += Extent(u.group->size());  // local; summed below for the banner
  // The parameters the optimizer steps over: the model's (DDP) or this rank's shards (FSDP).
  nn::ParamList<float, M::ndim> model_params;
  std::optional<parallel::DataParallel<M>> ddp;
  struct NoFsdp {};
  std::conditional_t<Sharded, std::optional<parallel::FullyShard<Model, M, float>>, NoFsdp> fsdp;
  if constexpr (Sharded) {
    fsdp.emplace(model, mesh, parallel::FsdpOptions{.stage = o.zero, .prefetch = o.prefetch});
  } else {
    model.collect(model_params);
    ddp.emplace(mesh, parallel::DataParallelOptions{.bucket_bytes = std::size_t(1) << 20});
    ddp->attach(model);  // each unit's gradient buckets are all-reduced while the backward goes on
  }
  auto& ps = [&]() -> nn::ParamList<float, M::ndim>& {
    if constexpr (Sharded) return fsdp->params();
    else return model_params;
  }();
  optim::AdamW<float, M::ndim> opt(ps, {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});

  world->all_reduce(std::span<Extent>(&nparams, 1), ReduceOp::sum);
  if (root && Sharded)
    std::printf("train_gpt: ZeRO-%d over %d data ranks (%d replica%s x %d shards), prefetch %d\n", o.zero, o.dp, o.hsdp,
                o.hsdp > 1 ? "s" : "", o.dp / o.hsdp, o.prefetch);
  if (root)
    std::printf("train_gpt: %zu characters (vocab %zu), train %zu / val %zu; mesh dp %d x cp %d (%s) x tp %d%s, %s backend\n"
                "model: %lld layers, dim %lld, %lld heads, seq %lld, batch %lld; %lld parameter elements over all ranks\n",
                corpus.train.size() + corpus.val.size(), corpus.chars.size(), corpus.train.size(), corpus.val.size(),
                o.dp, o.cp, std::string(parallel::name_of(o.cp_kind)).c_str(), o.tp, SP ? " + SP" : "", o.backend.c_str(), (long long)o.layers, (long long)o.dim,
                (long long)o.heads, (long long)o.seq, (long long)o.batch, (long long)nparams);

  std::mt19937_64 rng(o.seed);  // the same stream on every rank: every rank draws the same batches
  auto draw = [&](const std::vector<std::int32_t>& data) {
    std::vector<std::size_t> s(static_cast<std::size_t>(o.batch));
    for (auto& x : s) x = std::size_t(rng() % (data.size() - std::size_t(o.seq) - 1));
    return s;
  };
  // A fixed held-out set: 4 batches spread over the validation text.
  std::vector<std::vector<std::size_t>> val_starts;
  for (int k = 0; k < 4; ++k) {
    std::vector<std::size_t> s;
    for (Extent b = 0; b < o.batch; ++b)
      s.push_back((std::size_t(k * o.batch + b) * 7919u) % (corpus.val.size() - std::size_t(o.seq) - 1));
    val_starts.push_back(s);
  }
  auto validate = [&] {
    double sum = 0;
    for (const auto& s : val_starts) {
      auto [ids, tgt] = batch_of(model, corpus.val, s, o.seq);
      sum += full_tensor(model.evaluate(ids, tgt))[0];
    }
    return sum / double(val_starts.size());
  };

  std::map<std::string, std::pair<std::size_t, std::size_t>> per_step;  // kind/group -> (count, bytes), step 2
  double train_loss = 0, val_loss = 0, elapsed = 0;
  const double tokens_per_step = double(o.batch * o.seq);
  // --trace, --plot and the progress bar (a bar on a terminal, a line per step elsewhere).
  trace::TrainingMonitor monitor(world, {.trace_path = o.trace, .plot_path = o.plot, .total_steps = o.steps,
                                         .tokens_per_step = tokens_per_step});
  if (!o.trace.empty()) trace::trace_units(model);  // a span per unit; after DDP / FSDP set their hooks
  for (int step = 1; step <= o.steps; ++step) {
    auto [ids, tgt] = batch_of(model, corpus.train, draw(corpus.train), o.seq);
    world->barrier();  // time the step on all ranks together
    const auto t0 = std::chrono::steady_clock::now();
    typename Model::Loss loss;
    {
      auto traced = monitor.step(step);
      CommLog log;
      opt.zero_grad();
      auto [step_loss, saved] = model.forward(ids, tgt);
      loss = std::move(step_loss);
      model.backward(std::move(saved));
      if constexpr (Sharded) fsdp->finish_gradient_sync();
      else ddp->finish_gradient_sync();
      parallel::context_parallel_grads(ps, mesh, {.bucket_bytes = std::size_t(1) << 20});  // none without "cp"
      parallel::sequence_parallel_grads(ps, mesh, {.bucket_bytes = std::size_t(1) << 20});
      optim::clip_grad_norm(ps, mesh, 1.0);
      opt.step();
      if constexpr (Sharded) fsdp->sync_parameters();  // ZeRO-1/2: all-gather the updated parameters
      if (step == std::min(2, o.steps))
        for (const auto& r : log.records()) {
          auto& e = per_step[std::string(name_of(r.kind)) + " on " + r.group];
          ++e.first;
          e.second += r.bytes;
        }
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    elapsed += dt;
    train_loss = full_tensor(loss)[0];  // the global mean: one all-reduce on "dp" (not timed, not in the table)
    if (o.check_finite) {  // the loss is the same on every rank; a parameter piece is this rank's own
      optim::check_finite_loss(train_loss, step);
      optim::check_finite(ps, step, "parameter", world->rank());
    }
    monitor.train_loss(step, train_loss);
    if (step % o.eval_every == 0 || step == o.steps) {
      val_loss = validate();
      monitor.validation_loss(step, val_loss);
    }
  }
  monitor.finish();
  if (root) {
    std::printf("\nsummary: %d steps in %.1f s; final train loss %.4f, validation loss %.4f; %.0f tokens/s\n",
                o.steps, elapsed, train_loss, val_loss, tokens_per_step * o.steps / elapsed);
    std::printf("collectives of one training step on rank 0 (forward, backward, gradient syncs, clipping, AdamW):\n");
    for (const auto& [k, v] : per_step)
      std::printf("  %-28s x%-4zu %10zu bytes\n", k.c_str(), v.first, v.second);
  }
}

// ---------------------------------------------------------------- pipeline training (--pp > 1)

/// Trains on a (pp, dp, tp) mesh: this rank's stages of the GPT (parallel::pipeline::GptStage)
/// run the --schedule over --microbatches per step (parallel::pipeline::Executor), then DDP's
/// all-reduce on "dp" (after the schedule), the sequence-parallel sync, clipping by the norm over
/// all stages and AdamW. The validation loss is that of a schedule step whose gradients are
/// dropped (the executor runs training schedules only).
template <bool SP>
void train_pipeline(CommPtr world, const Options& o, const Corpus& corpus) {
  namespace pp = parallel::pipeline;
  using PipelineMesh = DeviceMesh<"pp", "dp", "tp">;
  using Stage = pp::GptStage<float, Mesh, parallel::MegatronPlan<SP>>;
  PipelineMesh mesh(world, pp::pipeline_mesh_shape(world->size(), o.pp, o.tp));
  const Mesh stage_mesh = pp::stage_mesh_of(mesh);
  const nn::GPTConfig cfg{.vocab = Extent(corpus.chars.size()), .seq = o.seq, .dim = o.dim, .heads = o.heads,
                          .layers = o.layers, .mlp_ratio = 4, .checkpoint = o.checkpoint, .seed = o.seed};
  const auto schedule = pp::make_schedule(pp::parse_schedule_kind(o.schedule), o.pp, o.microbatches);
  std::vector<Stage> stages;
  for (int s : schedule.layout.stages_of(mesh.coordinate(0))) stages.emplace_back(stage_mesh, cfg, s, schedule.layout.stages());
  pp::Executor<Stage, PipelineMesh> exec(mesh, schedule, std::move(stages));
  nn::ParamList<float, 2> ps;
  for (Stage& stage : exec.stages()) nn::collect(stage, ps);
  optim::AdamW<float, 2> opt(ps, {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  parallel::DataParallel<Mesh> ddp(stage_mesh, {.bucket_bytes = std::size_t(1) << 20});
  // The rank that prints: the first (dp, tp) rank of the stage mesh that holds the last stage.
  const bool printer = stage_mesh.rank() == 0 && schedule.layout.rank_of(schedule.layout.stages() - 1) == mesh.coordinate(0);
  if (printer)
    std::printf("train_gpt: mesh pp %d x dp %d x tp %d%s, %s backend; schedule %s, %d micro-batches, %d stages "
                "(%lld layers); peak activations per pipeline rank (validator):",
                o.pp, mesh.size(1), o.tp, SP ? " + SP" : "", o.backend.c_str(), o.schedule.c_str(), o.microbatches,
                schedule.layout.stages(), (long long)o.layers);
  if (printer)
    for (int peak : exec.memory().peak_saved) std::printf(" %d", peak);
  if (printer) std::printf("\n");

  std::mt19937_64 rng(o.seed);  // the same stream on every rank
  auto draw = [&] {
    std::vector<std::size_t> s(static_cast<std::size_t>(o.batch));
    for (auto& x : s) x = std::size_t(rng() % (corpus.train.size() - std::size_t(o.seq) - 1));
    return s;
  };
  auto run_step = [&](const std::vector<std::int32_t>& data, const std::vector<std::size_t>& starts) {
    auto [ids, tgt] = tokens_of(data, starts, o.seq);
    return exec.step(pp::split_microbatches<typename Stage::Ids>(stage_mesh, ids, tgt, o.microbatches));
  };
  double elapsed = 0, idle = 0, waiting = 0, loss = 0;
  for (int step = 1; step <= o.steps; ++step) {
    const auto starts = draw();
    world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    auto stats = run_step(corpus.train, starts);
    ddp.all_reduce_gradients(ps);
    parallel::sequence_parallel_grads(ps, stage_mesh, {.bucket_bytes = std::size_t(1) << 20});
    pp::clip_grad_norm(ps, stage_mesh, mesh.group(0), 1.0);
    opt.step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    elapsed += dt;
    idle = stats.idle_fraction();
    waiting += stats.wait_seconds / stats.wall_seconds;
    if (printer && stats.loss) {
      loss = *stats.loss;
      std::printf("step %4d/%d  loss %.4f  %8.0f tokens/s  idle %.3f (counted slots)\n", step, o.steps, loss,
                  double(o.batch * o.seq) / dt, idle);
    }
    if (step % o.eval_every == 0 || step == o.steps) {
      std::vector<std::size_t> val(static_cast<std::size_t>(o.batch));
      for (std::size_t b = 0; b < val.size(); ++b) val[b] = (b * 7919u) % (corpus.val.size() - std::size_t(o.seq) - 1);
      opt.zero_grad();  // the gradients of this step are dropped: the next training step zeroes them again
      auto val_stats = run_step(corpus.val, val);
      if (printer && val_stats.loss) std::printf("step %4d  validation loss %.4f\n", step, *val_stats.loss);
    }
    std::fflush(stdout);
  }
  if (printer)
    std::printf("\nsummary: %d steps in %.1f s; final train loss %.4f; %.0f tokens/s; idle fraction of pipeline "
                "rank %d %.3f in counted slots, %.3f of wall time spent waiting for messages (mean over steps)\n",
                o.steps, elapsed, loss, double(o.batch * o.seq) * o.steps / elapsed, mesh.coordinate(0), idle,
                waiting / o.steps);
}

// ---------------------------------------------------------------- mixture-of-experts training (--experts E)

using ExpertMesh = DeviceMesh<"edp", "ep", "tp">;

/// The MoE blocks' last routing, summed over the data ranks (one all-reduce on "dp"): the load
/// per expert (over all MoE blocks) and the dropped fraction of the choices.
template <class Model>
std::pair<std::vector<std::int64_t>, double> moe_load(Model& model, const Mesh& mesh, Extent experts) {
  std::vector<std::int64_t> sums(std::size_t(experts) + 2, 0);  // load per expert, routed, dropped
  for (const auto& b : model.blocks()) {
    const auto& st = model.layers().stats(b);
    for (std::size_t e = 0; e < st.load.size(); ++e) sums[e] += st.load[e];
    sums[std::size_t(experts)] += st.routed;
    sums[std::size_t(experts) + 1] += st.dropped;
  }
  mesh.group<"dp">().all_reduce(std::span<std::int64_t>(sums), ReduceOp::sum);
  const double routed = double(sums[std::size_t(experts)]);
  const double dropped = routed > 0 ? double(sums[std::size_t(experts) + 1]) / routed : 0;
  sums.resize(std::size_t(experts));
  return {sums, dropped};
}

/// Training with MoE blocks (nn::MoEGPT, Megatron TP without SP): the dense parameters reduced
/// by DDP on "dp" during the backward, the experts' on "edp" after it, one clipping norm over
/// both, AdamW on each. Prints the loss (cross-entropy + aux losses), the load per expert and
/// the dropped fraction every step, the validation loss every --eval-every steps.
void train_moe(CommPtr world, const Options& o, const Corpus& corpus) {
  using Model = nn::MoEGPT<float, Mesh, ExpertMesh, parallel::MegatronPlan<false>>;
  const bool root = world->rank() == 0;
  Mesh mesh(world, {o.dp, o.tp});
  auto emesh = parallel::make_expert_mesh<ExpertMesh>(mesh, o.ep);
  const nn::GPTConfig cfg{.vocab = Extent(corpus.chars.size()), .seq = o.seq, .dim = o.dim, .heads = o.heads,
                          .layers = o.layers, .mlp_ratio = 4, .checkpoint = o.checkpoint, .seed = o.seed};
  nn::MoELayersConfig mc;
  mc.router.experts = o.experts;
  mc.router.topk = o.topk;
  mc.router.z_loss_coeff = 1e-3;
  if (o.capacity > 0) mc.router.capacity_factor = o.capacity;
  mc.every = o.moe_every;
  Model model(mesh, cfg, nn::MoELayers<float, ExpertMesh>(emesh, mc));
  nn::ParamList<float, 2> ps;
  model.collect(ps);
  auto& experts = model.layers().expert_params();
  const optim::AdamWOptions ao{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  optim::AdamW<float, 2> opt(ps, ao);
  optim::AdamW<float, 3> expert_opt(experts, ao);
  parallel::DataParallel<Mesh> ddp(mesh, {.bucket_bytes = std::size_t(1) << 20});
  parallel::DataParallel<ExpertMesh> expert_ddp(emesh, {.bucket_bytes = std::size_t(1) << 20});
  ddp.attach(model);
  if (root)
    std::printf("train_gpt (MoE): mesh dp %d x tp %d, expert mesh edp %d x ep %d x tp %d; %lld experts, top-%lld, "
                "capacity %s, MoE every %lld block(s); %zu dense + %zu expert parameter tensors on rank 0\n",
                o.dp, o.tp, o.dp / o.ep, o.ep, o.tp, (long long)o.experts, (long long)o.topk,
                o.capacity > 0 ? ("factor " + std::to_string(o.capacity).substr(0, 4)).c_str() : "dropless", (long long)o.moe_every, ps.size(),
                experts.size());
  std::mt19937_64 rng(o.seed);  // the same stream on every rank
  auto draw = [&](const std::vector<std::int32_t>& data) {
    std::vector<std::size_t> s(static_cast<std::size_t>(o.batch));
    for (auto& x : s) x = std::size_t(rng() % (data.size() - std::size_t(o.seq) - 1));
    return s;
  };
  for (int step = 1; step <= o.steps; ++step) {
    auto [ids, tgt] = batch_of(model, corpus.train, draw(corpus.train), o.seq);
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    expert_opt.zero_grad();
    auto [loss, saved] = model.forward(ids, tgt);
    model.backward(std::move(saved));
    ddp.finish_gradient_sync();
    expert_ddp.all_reduce_gradients(experts);
    parallel::sequence_parallel_grads(ps, mesh, {.bucket_bytes = std::size_t(1) << 20});
    optim::clip_grad_norm(ps, mesh, experts, emesh, 1.0);
    opt.step();
    expert_opt.step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double value = full_tensor(loss)[0];
    const auto [load, dropped] = moe_load(model, mesh, o.experts);
    if (root) {
      std::printf("step %4d/%d  loss %.4f  %8.0f tokens/s  load", step, o.steps, value, double(o.batch * o.seq) / dt);
      for (auto n : load) std::printf(" %lld", (long long)n);
      std::printf("  dropped %.3f\n", dropped);
    }
    if (step % o.eval_every == 0 || step == o.steps) {
      auto [vids, vtgt] = batch_of(model, corpus.val, draw(corpus.val), o.seq);
      const double val = full_tensor(model.evaluate(vids, vtgt))[0];
      if (root) std::printf("step %4d  validation loss %.4f (one batch)\n", step, val);
    }
    std::fflush(stdout);
  }
}

void run_rank(CommPtr world, const Options& o, const Corpus& c) {
  if (o.pp > 1) {
    const auto shape = parallel::pipeline::pipeline_mesh_shape(world->size(), o.pp, o.tp);
    if (shape[1] != o.dp)
      world->fail("train_gpt", "the job has " + std::to_string(world->size()) + " ranks; --pp " + std::to_string(o.pp) +
                                   " x --tp " + std::to_string(o.tp) + " leaves dp " + std::to_string(shape[1]) +
                                   ", but --dp is " + std::to_string(o.dp));
    if (o.sp) train_pipeline<true>(std::move(world), o, c);
    else train_pipeline<false>(std::move(world), o, c);
    return;
  }
  const int ranks = o.dp * o.cp * o.tp;
  if (world->size() != ranks)
    world->fail("train_gpt", "the job has " + std::to_string(world->size()) + " ranks but --dp " + std::to_string(o.dp) +
                                 " x --cp " + std::to_string(o.cp) + " x --tp " + std::to_string(o.tp) + " needs " +
                                 std::to_string(ranks));
  if (o.experts > 0) {
    train_moe(std::move(world), o, c);
  } else if (o.zero > 0) {
    if (o.sp) train<true, ShardedMesh>(std::move(world), o, c);
    else train<false, ShardedMesh>(std::move(world), o, c);
  } else if (o.cp > 1) {
    if (o.sp) train<true, ContextMesh>(std::move(world), o, c);
    else train<false, ContextMesh>(std::move(world), o, c);
  } else {
    if (o.sp) train<true, Mesh>(std::move(world), o, c);
    else train<false, Mesh>(std::move(world), o, c);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "train_gpt: %s\n%s", e.what(), usage);
    return 2;
  }
  try {
    const Corpus corpus = encode(read_text(o.data), o.seq);
    if (o.backend == "mpi") {
#ifdef DTENSOR_HAS_MPI
      return dtensor::mpi::run(argc, argv, [&](CommPtr world) { run_rank(std::move(world), o, corpus); });
#else
      std::fprintf(stderr, "train_gpt: --backend mpi needs a build with -DDTENSOR_WITH_MPI=ON\n");
      return 2;
#endif
    }
    threads::run(o.pp * o.dp * o.cp * o.tp, [&](CommPtr world) { run_rank(std::move(world), o, corpus); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
