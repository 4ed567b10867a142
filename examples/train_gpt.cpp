// examples/train_gpt.cpp — a character-level GPT trained with data, tensor and sequence
// parallelism on a (dp, tp) mesh.
//
//   train_gpt                                   # dp 2 x tp 4 + SP, 8 threads, /usr/share/common-licenses
//   train_gpt --dp 1 --tp 2 --steps 200 --data input.txt
//   mpirun -n 4 train_gpt --backend mpi --dp 2 --tp 2     # when built with -DDTENSOR_WITH_MPI=ON
//
// The text's characters are the vocabulary; the first 90% trains, the last 10% is the held-out
// validation set. Each step draws --batch sequences of --seq characters (the same on every
// rank, from --seed) as a [batch, seq] tensor, each data-parallel rank keeps its share, and the
// model (nn::GPT with parallel::MegatronPlan<--sp>) runs forward and backward — the data-parallel
// all-reduce of each unit's gradient buckets starting as soon as the backward has finished that
// unit (DataParallel::attach) —; then the wait for those, the sequence-parallel gradient sync,
// clipping to global norm 1 and AdamW. Rank 0
// prints a line per step, the validation loss every --eval-every steps, and a summary with the
// collectives of one step (from a CommLog) by kind and mesh dimension.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/training.hpp"
#ifdef DTENSOR_HAS_MPI
#include "dtensor/comm/mpi.hpp"
#endif

namespace {

using namespace dtensor;
using Mesh = DeviceMesh<"dp", "tp">;

struct Options {
  int dp = 2, tp = 4;
  bool sp = true;
  Extent layers = 2, heads = 4, dim = 128, seq = 64, batch = 16;
  int steps = 300, eval_every = 50;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  bool checkpoint = false;
  std::string data, backend = "threads";
};

const char* usage =
    "usage: train_gpt [--dp N] [--tp N] [--sp | --no-sp] [--layers N] [--heads N] [--dim N] [--seq N]\n"
    "                 [--batch N] [--steps N] [--lr X] [--seed N] [--eval-every N] [--checkpoint]\n"
    "                 [--data FILE] [--backend threads|mpi]\n"
    "  defaults: --dp 2 --tp 4 --sp --layers 2 --heads 4 --dim 128 --seq 64 --batch 16 --steps 300 --lr 3e-3\n"
    "            --seed 1 --eval-every 50, data: the files under /usr/share/common-licenses\n"
    "  --batch is the number of sequences per step over all data-parallel ranks (a multiple of --dp);\n"
    "  --heads must be a multiple of --tp; --backend mpi needs an MPI build and mpirun -n dp*tp.\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

long parse_int(const std::string& flag, const std::string& v, long lo) {
  std::size_t used = 0;
  long x = 0;
  try {
    x = std::stol(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || v.empty()) throw UsageError(flag + " expects an integer, got '" + v + "'");
  if (x < lo) throw UsageError(flag + " must be >= " + std::to_string(lo) + ", got " + v);
  return x;
}

double parse_double(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || v.empty() || !(x > 0)) throw UsageError(flag + " expects a positive number, got '" + v + "'");
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--dp") o.dp = int(parse_int(a, value(), 1));
    else if (a == "--tp") o.tp = int(parse_int(a, value(), 1));
    else if (a == "--sp") o.sp = true;
    else if (a == "--no-sp") o.sp = false;
    else if (a == "--layers") o.layers = parse_int(a, value(), 1);
    else if (a == "--heads") o.heads = parse_int(a, value(), 1);
    else if (a == "--dim") o.dim = parse_int(a, value(), 1);
    else if (a == "--seq") o.seq = parse_int(a, value(), 2);
    else if (a == "--batch") o.batch = parse_int(a, value(), 1);
    else if (a == "--steps") o.steps = int(parse_int(a, value(), 1));
    else if (a == "--eval-every") o.eval_every = int(parse_int(a, value(), 1));
    else if (a == "--lr") o.lr = parse_double(a, value());
    else if (a == "--seed") o.seed = std::uint64_t(parse_int(a, value(), 0));
    else if (a == "--checkpoint") o.checkpoint = true;
    else if (a == "--data") o.data = value();
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
  if (o.batch % o.dp != 0) throw UsageError("--batch " + std::to_string(o.batch) + " is not a multiple of --dp " + std::to_string(o.dp));
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

template <class Model>
std::pair<typename Model::Ids, typename Model::Ids> batch_of(const Mesh& mesh, const std::vector<std::int32_t>& data,
                                                            const std::vector<std::size_t>& starts, Extent seq) {
  const Shape<2> shape{Extent(starts.size()), seq};
  Tensor<std::int32_t, 2> ids(shape), tgt(shape);
  for (std::size_t b = 0; b < starts.size(); ++b)
    for (Extent t = 0; t < seq; ++t) {
      ids(Extent(b), t) = data[starts[b] + std::size_t(t)];
      tgt(Extent(b), t) = data[starts[b] + std::size_t(t) + 1];
    }
  using L = typename Model::Ids::layout;
  return {distribute_replicated<L>(mesh, ids), distribute_replicated<L>(mesh, tgt)};
}

template <bool SP>
void train(CommPtr world, const Options& o, const Corpus& corpus) {
  using Model = nn::GPT<float, Mesh, parallel::MegatronPlan<SP>>;
  const bool root = world->rank() == 0;
  Mesh mesh(world, {o.dp, o.tp});
  const nn::GPTConfig cfg{.vocab = Extent(corpus.chars.size()), .seq = o.seq, .dim = o.dim, .heads = o.heads,
                          .layers = o.layers, .mlp_ratio = 4, .checkpoint = o.checkpoint, .seed = o.seed};
  Model model(mesh, cfg);
  nn::ParamList<float, 2> ps;
  model.collect(ps);
  optim::AdamW<float, 2> opt(ps, {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  parallel::DataParallel<Mesh> ddp(mesh, {.bucket_bytes = std::size_t(1) << 20});
  ddp.attach(model);  // each unit's gradient buckets are all-reduced while the backward goes on

  Extent nparams = 0;
  for (const auto& p : ps) nparams += Extent(p.value.size());  // local; summed below for the banner
  world->all_reduce(std::span<Extent>(&nparams, 1), ReduceOp::sum);
  if (root)
    std::printf("train_gpt: %zu characters (vocab %zu), train %zu / val %zu; mesh dp %d x tp %d%s, %s backend\n"
                "model: %lld layers, dim %lld, %lld heads, seq %lld, batch %lld; %lld parameter elements over all ranks\n",
                corpus.train.size() + corpus.val.size(), corpus.chars.size(), corpus.train.size(), corpus.val.size(),
                o.dp, o.tp, SP ? " + SP" : "", o.backend.c_str(), (long long)o.layers, (long long)o.dim,
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
      auto [ids, tgt] = batch_of<Model>(mesh, corpus.val, s, o.seq);
      sum += full_tensor(model.evaluate(ids, tgt))[0];
    }
    return sum / double(val_starts.size());
  };

  std::map<std::string, std::pair<std::size_t, std::size_t>> per_step;  // kind/group -> (count, bytes), step 2
  double train_loss = 0, val_loss = 0, elapsed = 0;
  const double tokens_per_step = double(o.batch * o.seq);
  for (int step = 1; step <= o.steps; ++step) {
    auto [ids, tgt] = batch_of<Model>(mesh, corpus.train, draw(corpus.train), o.seq);
    world->barrier();  // time the step on all ranks together
    const auto t0 = std::chrono::steady_clock::now();
    typename Model::Loss loss;
    {
      CommLog log;
      opt.zero_grad();
      auto [step_loss, saved] = model.forward(ids, tgt);
      loss = std::move(step_loss);
      model.backward(std::move(saved));
      ddp.finish_gradient_sync();
      parallel::sequence_parallel_grads(ps, mesh, {.bucket_bytes = std::size_t(1) << 20});
      optim::clip_grad_norm(ps, mesh, 1.0);
      opt.step();
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
    if (root)
      std::printf("step %4d/%d  loss %.4f  %8.0f tokens/s  %5.1f s left\n", step, o.steps, train_loss,
                  tokens_per_step / dt, elapsed / step * (o.steps - step));
    if (step % o.eval_every == 0 || step == o.steps) {
      val_loss = validate();
      if (root) std::printf("step %4d  validation loss %.4f\n", step, val_loss);
    }
    std::fflush(stdout);
  }
  if (root) {
    std::printf("\nsummary: %d steps in %.1f s; final train loss %.4f, validation loss %.4f; %.0f tokens/s\n",
                o.steps, elapsed, train_loss, val_loss, tokens_per_step * o.steps / elapsed);
    std::printf("collectives of one training step on rank 0 (forward, backward, gradient syncs, clipping, AdamW):\n");
    for (const auto& [k, v] : per_step)
      std::printf("  %-28s x%-4zu %10zu bytes\n", k.c_str(), v.first, v.second);
  }
}

void run_rank(CommPtr world, const Options& o, const Corpus& c) {
  if (world->size() != o.dp * o.tp)
    world->fail("train_gpt", "the job has " + std::to_string(world->size()) + " ranks but --dp " + std::to_string(o.dp) +
                                 " x --tp " + std::to_string(o.tp) + " needs " + std::to_string(o.dp * o.tp));
  if (o.sp) train<true>(std::move(world), o, c);
  else train<false>(std::move(world), o, c);
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
    threads::run(o.dp * o.tp, [&](CommPtr world) { run_rank(std::move(world), o, corpus); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
