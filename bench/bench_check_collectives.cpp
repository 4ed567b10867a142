// bench_check_collectives — what the collective check (fingerprints before every collective
// and redistribution, Communicator::set_check_collectives) costs on the threads backend.
//
//   bench_check_collectives [--benchmark_filter=redistribute]
//
// On 4 ranks (threads), the same operation under each check, back to back (argument "check"):
//   0  none (the full check off and the always-on check off: set_verify_every(0))
//   1  the always-on check alone, every build's default (a running hash compared every 16 calls)
//   2  the full check (debug builds and tests: one fingerprint all-gather before every call)
//   all_reduce    world->all_reduce of 16 floats (latency-bound: the worst case, the check is
//                 one more all-gather of a 152-byte record per rank)
//   redistribute  full_tensor of a Shard<0> 64 x 16 float tensor (4 KiB) on a 1-D mesh: the
//                 check adds the redistribution's fingerprint and the all_gather's
// Each benchmark runs one threads::run; rank 0's wall time over the loop (between barriers)
// divided by the iterations is the time per operation. Compare "check:1" and "check:2" against
// "check:0".
#include <chrono>
#include <span>
#include <vector>

#include <benchmark/benchmark.h>

#include "dtensor/dtensor.hpp"

namespace {

constexpr int ranks = 4;
constexpr int iterations = 2000;

/// Seconds per call of op(world), under check mode `mode` (see the top) on every communicator.
template <class MakeOp>
double seconds_per_op(int mode, MakeOp make_op) {
  double per_op = 0;
  const auto saved = dtensor::comm_defaults();
  dtensor::comm_defaults().check_collectives = mode == 2;  // meshes and splits made below inherit it
  dtensor::comm_defaults().verify_every = mode == 1 ? 16 : 0;
  dtensor::threads::run(ranks, [&](dtensor::CommPtr world) {
    auto op = make_op(world);
    op();  // warm-up
    world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) op();
    world->barrier();
    if (world->rank() == 0) per_op = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;
  });
  dtensor::comm_defaults() = saved;
  return per_op;
}

void report(benchmark::State& st, double per_op) {
  for (auto _ : st) st.SetIterationTime(per_op);
}

void all_reduce(benchmark::State& st) {
  report(st, seconds_per_op(int(st.range(0)), [](const dtensor::CommPtr& w) {
           return [w, x = std::vector<float>(16, 1.0f)]() mutable { w->all_reduce(std::span<float>(x), dtensor::ReduceOp::sum); };
         }));
}

void redistribute(benchmark::State& st) {
  report(st, seconds_per_op(int(st.range(0)), [](const dtensor::CommPtr& w) {
           dtensor::DeviceMesh<"x"> mesh(w, {ranks});
           auto x = dtensor::distribute_replicated<dtensor::Layout<dtensor::Shard<0>>>(
               mesh, dtensor::arange<float>(dtensor::Shape<2>{64, 16}));
           return [x]() { benchmark::DoNotOptimize(dtensor::full_tensor(x).data()); };
         }));
}

}  // namespace

BENCHMARK(all_reduce)->ArgName("check")->Arg(0)->Arg(1)->Arg(2)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(redistribute)->ArgName("check")->Arg(0)->Arg(1)->Arg(2)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
