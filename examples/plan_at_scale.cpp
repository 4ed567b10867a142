// examples/plan_at_scale.cpp — a training plan for thousands of GPUs, run dry on this machine:
// the real GPT training step (nn::GPT with parallel::MegatronPlan, DDP, clipping, AdamW) on
// meta tensors over the sim communicator, once per rank class, then the report per class and the
// estimated step time on H100s (docs/dry-run.md).
//
//   plan_at_scale                                          # GPT-3 175B-like on 16,384 GPUs
//   plan_at_scale --layers 126 --dim 16384 --heads 128 --vocab 128256 --seq 8192
//                 --batch 2048 --dp 128 --tp 8 --pp 16 --microbatches 16 --trace step.json
//
// What runs: one micro-batch of one pipeline stage (--layers / --pp blocks, with the embedding
// and the head: every stage is given both, so the first and last stages are exact and the
// middle ones overcount those two units) on a (dp, tp) mesh; the pipeline schedule enters through
// the cost model (parallel/pipeline/simulate.hpp), and the activations of the micro-batches a
// schedule keeps in flight are the one micro-batch's times their number (the most any rank of
// the schedule holds). Not yet here: FSDP/ZeRO (--zero), context and expert parallelism, the
// Llama block (RMSNorm, GQA, SwiGLU: --kv-heads, --ffn); see docs/dry-run.md.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "dtensor/comm/sim.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/validate.hpp"
#include "dtensor/sim/chrome_trace.hpp"
#include "dtensor/sim/cost_model.hpp"
#include "dtensor/sim/dry_run.hpp"
#include "dtensor/training.hpp"
#include "flags.hpp"

namespace {

using namespace dtensor;
using examples::flag_value;
using examples::UsageError;

struct Options {
  Extent layers = 96, dim = 12288, heads = 96, vocab = 50257, seq = 2048, batch = 1536, mlp_ratio = 4;
  int dp = 128, tp = 8, pp = 16, microbatches = 16, stages_per_rank = 0;
  bool sp = true;
  std::string schedule = "1f1b", trace;
  sim::Hardware hardware;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--layers") o.layers = flag_value<Extent>(a, value(), 1);
    else if (a == "--dim") o.dim = flag_value<Extent>(a, value(), 1);
    else if (a == "--heads") o.heads = flag_value<Extent>(a, value(), 1);
    else if (a == "--vocab") o.vocab = flag_value<Extent>(a, value(), 1);
    else if (a == "--seq") o.seq = flag_value<Extent>(a, value(), 1);
    else if (a == "--batch") o.batch = flag_value<Extent>(a, value(), 1);
    else if (a == "--mlp-ratio") o.mlp_ratio = flag_value<Extent>(a, value(), 1);
    else if (a == "--dp") o.dp = flag_value<int>(a, value(), 1);
    else if (a == "--tp") o.tp = flag_value<int>(a, value(), 1);
    else if (a == "--pp") o.pp = flag_value<int>(a, value(), 1);
    else if (a == "--microbatches") o.microbatches = flag_value<int>(a, value(), 1);
    else if (a == "--stages-per-rank") o.stages_per_rank = flag_value<int>(a, value(), 1);
    else if (a == "--schedule") o.schedule = value();
    else if (a == "--no-sp") o.sp = false;
    else if (a == "--trace") o.trace = value();
    else if (a == "--efficiency") o.hardware.efficiency = examples::positive_flag_value(a, value());
    else if (a == "--peak-tflops") o.hardware.peak_flops = examples::positive_flag_value(a, value()) * 1e12;
    else throw UsageError("unknown flag " + a);
  }
  if (o.heads % o.tp != 0)
    throw UsageError("--heads " + std::to_string(o.heads) + " is not a multiple of --tp " + std::to_string(o.tp));
  if (o.dim % o.heads != 0)
    throw UsageError("--dim " + std::to_string(o.dim) + " is not a multiple of --heads " + std::to_string(o.heads));
  if (o.layers % o.pp != 0)
    throw UsageError("--layers " + std::to_string(o.layers) + " is not a multiple of --pp " + std::to_string(o.pp));
  if (o.batch % o.microbatches != 0)
    throw UsageError("--batch " + std::to_string(o.batch) + " is not a multiple of --microbatches " +
                     std::to_string(o.microbatches));
  if (!(o.hardware.efficiency <= 1)) throw UsageError("--efficiency must be in (0, 1]");
  return o;
}

/// One micro-batch of one stage, DDP over "dp", Megatron TP (+ SP) over "tp": the step of
/// examples/train_gpt.cpp on meta tensors, with the phases the cost model reads.
template <bool SP>
void stage_step(CommPtr world, const Options& o, sim::Recorder& rec) {
  using Mesh = MetaMesh<"dp", "tp">;
  using Model = nn::GPT<float, Mesh, parallel::MegatronPlan<SP>>;
  Mesh mesh(world, {o.dp, o.tp});
  rec.phase("parameters");
  const nn::GPTConfig cfg{.vocab = o.vocab, .seq = o.seq, .dim = o.dim, .heads = o.heads,
                          .layers = o.layers / o.pp, .mlp_ratio = o.mlp_ratio};
  std::optional<Model> model;
  {
    MemoryTagScope tag(MemoryTag::parameters);
    model.emplace(mesh, cfg);
  }
  nn::ParamList<float, 2, meta_space> params;
  model->collect(params);
  parallel::DataParallel<Mesh> ddp(mesh, parallel::DataParallelOptions{.bucket_bytes = std::size_t(25) << 20});
  ddp.attach(*model);
  optim::AdamW<float, 2, meta_space> opt(params, {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  const Shape<2> batch{o.batch / o.microbatches, o.seq};
  using L = typename Model::Ids::layout;
  const auto ids = distribute_replicated<L>(mesh, Tensor<std::int32_t, 2, meta_space>(batch));
  const auto targets = distribute_replicated<L>(mesh, Tensor<std::int32_t, 2, meta_space>(batch));
  opt.zero_grad();
  rec.phase("forward");
  auto [loss, saved] = [&] {
    MemoryTagScope tag(MemoryTag::activations);
    return model->forward(ids, targets);
  }();
  rec.phase("backward", /*overlapped=*/true);
  model->backward(std::move(saved));
  rec.phase("optimizer");
  ddp.finish_gradient_sync();
  parallel::sequence_parallel_grads(params, mesh, {.bucket_bytes = std::size_t(25) << 20});
  optim::clip_grad_norm(params, mesh, 1.0);
  opt.step();
}

int run(const Options& o) {
  namespace pp = parallel::pipeline;
  const auto kind = pp::parse_schedule_kind(o.schedule);
  const auto schedule = pp::make_schedule(kind, o.pp, o.microbatches, o.stages_per_rank);
  const int stages_per_rank = schedule.layout.stages_per_rank;
  const long long gpus = 1LL * o.dp * o.tp * o.pp;
  std::printf("plan_at_scale: %lld GPUs = pp %d x dp %d x tp %d%s; %s schedule, %d micro-batches\n", gpus, o.pp, o.dp,
              o.tp, o.sp ? " + SP" : "", o.schedule.c_str(), o.microbatches);
  std::printf("model: %lld layers, dim %lld, %lld heads, mlp x%lld, vocab %lld, seq %lld, global batch %lld\n",
              (long long)o.layers, (long long)o.dim, (long long)o.heads, (long long)o.mlp_ratio, (long long)o.vocab,
              (long long)o.seq, (long long)o.batch);
  const auto started = std::chrono::steady_clock::now();
  // Every stage runs the same blocks here, so the classes are those of one stage's (dp, tp) mesh.
  const std::array<int, 2> shape{o.dp, o.tp};
  const auto classes = sim::rank_classes<2>(
      shape, {sim::DimensionWork::splitting({o.batch / o.microbatches}), sim::DimensionWork::splitting({o.heads})});
  auto reports = sim::dry_run<2>(shape, classes, [&](CommPtr world, sim::Recorder& rec) {
    if (o.sp) stage_step<true>(world, o, rec);
    else stage_step<false>(world, o, rec);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::array<std::string_view, 3> names{"pp", "dp", "tp"};
  const sim::Topology topology(names, std::array{o.pp, o.dp, o.tp}, o.hardware);
  // The micro-batches a rank of the schedule holds at once (its forwards not yet backwarded).
  const auto memory = pp::validate(schedule);
  int in_flight = 1;
  for (int held : memory.peak_saved) in_flight = std::max(in_flight, held);
  for (auto& r : reports) {
    r.ranks *= o.pp;
    std::cout << '\n' << r.to_table();
    const auto est = sim::estimate_step(r, topology, schedule, stages_per_rank);
    const auto& fwd = r.phase("forward");
    const std::int64_t saved = fwd.end[std::size_t(MemoryTag::activations)] - fwd.start[std::size_t(MemoryTag::activations)];
    const double peak = double(r.peak_total()) + double(in_flight - 1) * double(saved);
    std::printf("estimate: step %.3f s (pipeline %.3f s, bubble %.1f %%, once per step %.3f s); compute %.3f s, "
                "communication %.3f s of which exposed %.3f s; peak memory with %d micro-batches in flight %s\n",
                est.step_seconds, est.pipeline_seconds, 100 * est.bubble_fraction, est.once_per_step_seconds,
                est.compute_seconds, est.communication_seconds, est.exposed_communication_seconds, in_flight,
                sim::detail::human_bytes(peak).c_str());
    if (!o.trace.empty() && &r == &reports.front()) {
      std::ofstream(o.trace) << sim::chrome_trace(est, 0, r.name);
      std::printf("trace of %s (pipeline rank 0): %s\n", r.name.c_str(), o.trace.c_str());
    }
  }
  std::printf("\ndry run: %zu rank classes for %lld GPUs in %.2f s\n", reports.size(), gpus, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "plan_at_scale: %s\nusage: plan_at_scale [--layers N --dim N --heads N --vocab N --seq N "
                         "--batch N --mlp-ratio N --dp N --tp N --pp N --microbatches N --schedule "
                         "gpipe|1f1b|interleaved|zb|zbv --stages-per-rank N --no-sp --trace FILE --efficiency X "
                         "--peak-tflops X]\n",
                 e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan_at_scale: %s\n", e.what());
    return 1;
  }
}
