// bench/bench_context_attention.cpp — ring attention (forward + backward) over the context
// dimension of the threads backend, with and without split-phase overlap, in the same run; the
// baseline is the raw one-rank kernel (kernels::host::attention + attention_backward) on the whole
// sequence.
//
//   bench_context_attention
//   bench_context_attention --benchmark_filter='cp:4'
//
// Arguments: cp (ranks), overlap (1: the next K/V chunk's send_recv is issued before the current
// chunk's attention and waited on after it; 0: issued after it), balanced (the causal
// load-balanced order). Each iteration is one forward and one backward of causal attention on
// q, k, v [B, H, T, D] (float) with T split on "cp"; the manual time is the slowest rank's.
// Counters: the K/V bytes each rank receives in the forward's and backward's rotations
// (kv_bytes) and kv_bytes/s over the iteration.
#include <benchmark/benchmark.h>

#include "bench_threads.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/parallel/context_parallel.hpp"

namespace {

using namespace dtensor;
using Mesh = DeviceMesh<"cp">;
using L = Layout<Shard<2>>;  // q, k, v [B, H, T, D]: the sequence on "cp"

constexpr Extent batch = 1, heads = 4, seq = 512, head_dim = 32;
constexpr std::size_t iters = 5;

const Shape<4> shape{batch, heads, seq, head_dim};
const auto q_whole = normal<float>(shape, 1), k_whole = normal<float>(shape, 2), v_whole = normal<float>(shape, 3),
           dout_whole = normal<float>(shape, 4);

void BM_attention_one_rank(benchmark::State& st) {
  auto times = bench::times_on_ranks(1, iters, [](const CommPtr&) {
    return [] {
      auto f = kernels::host::attention(q_whole, k_whole, v_whole);
      auto g = kernels::host::attention_backward(q_whole, k_whole, v_whole, f.out, f.lse, dout_whole);
      benchmark::DoNotOptimize(g.dq.data());
    };
  });
  bench::replay(st, times);
}

void BM_ring_attention(benchmark::State& st) {
  const int cp = int(st.range(0));
  const parallel::ContextAttentionOptions o{.kind = parallel::ContextKind::ring, .load_balanced = st.range(2) != 0,
                                            .overlap = st.range(1) != 0};
  auto stored = [&](const Tensor<float, 4>& t) { return o.load_balanced ? parallel::load_balance(t, 2, cp) : t; };
  auto times = bench::times_on_ranks(cp, iters, [&](const CommPtr& world) {
    Mesh mesh(world, {cp});
    auto q = distribute_replicated<L>(mesh, stored(q_whole)), k = distribute_replicated<L>(mesh, stored(k_whole)),
         v = distribute_replicated<L>(mesh, stored(v_whole)), dout = distribute_replicated<L>(mesh, stored(dout_whole));
    return [=] {
      auto [out, saved] = parallel::context_attention(q, k, v, o);
      auto g = parallel::context_attention_backward(dout, q, k, v, out, saved, o);
      benchmark::DoNotOptimize(g.dq.to_local().data());
    };
  });
  const auto t = bench::replay(st, times);
  // Forward: cp-1 K and V chunks in; backward: cp-1 K and V chunks and cp dK/dV accumulators.
  const double chunk = double(batch * heads * seq * head_dim) / cp * sizeof(float);
  const double kv_bytes = chunk * (2 * (cp - 1) + 2 * (cp - 1) + 2 * cp);
  st.counters["kv_bytes"] = kv_bytes;
  st.counters["kv_bytes_per_s"] = kv_bytes * double(st.iterations()) / t.total;
}

}  // namespace

BENCHMARK(BM_attention_one_rank)->UseManualTime()->Iterations(iters)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ring_attention)
    ->ArgNames({"cp", "overlap", "balanced"})
    ->ArgsProduct({{2, 4}, {1, 0}, {1}})
    ->Args({4, 1, 0})
    ->Args({4, 0, 0})
    ->UseManualTime()
    ->Iterations(iters)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
