// bench/bench_gpt_step_host.cpp — one GPT training step (forward, backward, gradient syncs,
// clipping, AdamW) in tokens/s, on one rank and under tensor / sequence / data parallelism over
// the threads backend, in the same run: the one-rank step is the baseline of the others.
//
//   bench_gpt_step_host                         # the model of examples/train_gpt.cpp's defaults
//   bench_gpt_step_host --benchmark_filter='tp:2'
//
// Each benchmark iteration starts a threads::run of dp*tp ranks, builds the model, runs one
// untimed warm-up step and then `steps` timed steps; the iteration's manual time is rank 0's
// time for those steps between barriers (setup excluded). Counter: tokens/s over the global
// batch. The same step as train_gpt, on random token ids (the data does not change the work).
// The `overlap` argument: 1 = DDP attached to the backward (each unit's buckets all-reduced as
// soon as it is done, as train_gpt does), 0 = one all_reduce_gradients after the backward; the
// DP=2 step runs both ways in the same run. BM_gpt_step_zero3: the same step under
// parallel::fully_shard (ZeRO-3) over `fsdp` ranks, with prefetch 2 (unit i+1's all-gather in
// flight while unit i computes) and 1 (each unit gathered when it starts), in the same run.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <random>

#include "dtensor/training.hpp"

namespace {

using namespace dtensor;
using Mesh = DeviceMesh<"dp", "tp">;

constexpr Extent vocab = 96, seq = 64, dim = 128, heads = 4, layers = 2, batch = 16;
constexpr int steps = 5;

/// Random ids and targets, the same on every rank.
template <class Ids, class MeshT>
std::pair<Ids, Ids> random_batch(const MeshT& mesh) {
  std::mt19937 rng(11);
  Tensor<std::int32_t, 2> ids(Shape<2>{batch, seq}), tgt(Shape<2>{batch, seq});
  for (Extent i = 0; i < ids.numel(); ++i) {
    ids[i] = std::int32_t(rng() % vocab);
    tgt[i] = std::int32_t(rng() % vocab);
  }
  using L = typename Ids::layout;
  return {distribute_replicated<L>(mesh, ids), distribute_replicated<L>(mesh, tgt)};
}

/// Seconds for `steps` calls of step() on all ranks together, after one untimed warm-up step
/// (first-touch of every buffer).
template <class Step>
double time_steps(Communicator& world, Step& step) {
  step();
  world.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) step();
  world.barrier();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <bool SP>
double timed_steps(CommPtr world, int dp, int tp, bool overlap) {
  using Model = models::GPT<float, Mesh, parallel::MegatronPlan<SP>>;
  Mesh mesh(world, {dp, tp});
  Model model(mesh, {.vocab = vocab, .seq = seq, .dim = dim, .heads = heads, .layers = layers, .seed = 7});
  nn::ParamList<float, 2> ps;
  model.collect(ps);
  optim::AdamW<float, 2> opt(ps, {.lr = 1e-3});
  parallel::DataParallel<Mesh> ddp(mesh, {.bucket_bytes = std::size_t(1) << 20});
  if (overlap) ddp.attach(model);

  auto [x, y] = random_batch<typename Model::Ids>(mesh);
  auto step = [&] {  // the same step as train_gpt's
    opt.zero_grad();
    auto [loss, saved] = model.forward(x, y);
    model.backward(std::move(saved));
    if (overlap) ddp.finish_gradient_sync();
    else ddp.all_reduce_gradients(ps);
    parallel::sequence_parallel_grads(ps, mesh, {.bucket_bytes = std::size_t(1) << 20});
    optim::clip_grad_norm(ps, mesh, 1.0);
    opt.step();
    benchmark::DoNotOptimize(loss);
  };
  return time_steps(*world, step);
}

void BM_gpt_step(benchmark::State& st) {
  const int dp = int(st.range(0)), tp = int(st.range(1));
  const bool sp = st.range(2) != 0, overlap = st.range(3) != 0;
  double total = 0;
  for (auto _ : st) {
    double t = 0;
    threads::run(dp * tp, [&](CommPtr w) {
      const double mine = sp ? timed_steps<true>(w, dp, tp, overlap) : timed_steps<false>(w, dp, tp, overlap);
      if (w->rank() == 0) t = mine;
    });
    st.SetIterationTime(t);
    total += t;
  }
  st.counters["tokens_per_s"] = double(batch * seq) * steps * double(st.iterations()) / total;
  st.counters["ranks"] = dp * tp;
}

using ShardedMesh = DeviceMesh<"dp", "fsdp", "tp">;

double timed_zero3_steps(CommPtr world, int fsdp_ranks, int prefetch) {
  using Model = models::GPT<float, ShardedMesh>;
  ShardedMesh mesh(world, {1, fsdp_ranks, 1});
  Model model(mesh, {.vocab = vocab, .seq = seq, .dim = dim, .heads = heads, .layers = layers, .seed = 7});
  auto fsdp = parallel::fully_shard(model, mesh, {.stage = 3, .prefetch = prefetch});
  optim::AdamW<float, 3> opt(fsdp.params(), {.lr = 1e-3});
  auto [x, y] = random_batch<typename Model::Ids>(mesh);
  auto step = [&] {
    opt.zero_grad();
    auto [loss, saved] = model.forward(x, y);
    model.backward(std::move(saved));
    fsdp.finish_gradient_sync();
    optim::clip_grad_norm(fsdp.params(), mesh, 1.0);
    opt.step();
    benchmark::DoNotOptimize(loss);
  };
  return time_steps(*world, step);
}

void BM_gpt_step_zero3(benchmark::State& st) {
  const int fsdp_ranks = int(st.range(0)), prefetch = int(st.range(1));
  double total = 0;
  for (auto _ : st) {
    double t = 0;
    threads::run(fsdp_ranks, [&](CommPtr w) {
      const double mine = timed_zero3_steps(w, fsdp_ranks, prefetch);
      if (w->rank() == 0) t = mine;
    });
    st.SetIterationTime(t);
    total += t;
  }
  st.counters["tokens_per_s"] = double(batch * seq) * steps * double(st.iterations()) / total;
  st.counters["ranks"] = fsdp_ranks;
}

}  // namespace

BENCHMARK(BM_gpt_step_zero3)
    ->ArgNames({"fsdp", "prefetch"})
    ->Args({2, 2})  // unit i+1 gathered while unit i computes
    ->Args({2, 1})  // no prefetch
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

BENCHMARK(BM_gpt_step)
    ->ArgNames({"dp", "tp", "sp", "overlap"})
    ->Args({1, 1, 0, 1})  // the baseline: one rank
    ->Args({1, 2, 0, 1})
    ->Args({1, 2, 1, 1})
    ->Args({2, 1, 0, 0})  // DDP after the backward
    ->Args({2, 1, 0, 1})  // DDP overlapped with the backward
    ->Args({2, 2, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

BENCHMARK_MAIN();
