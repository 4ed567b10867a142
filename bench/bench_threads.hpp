// bench/bench_threads.hpp — timing an operation on the ranks of the threads backend.
//
//   auto times = dtensor::bench::times_on_ranks(4, iters, [&](const dtensor::CommPtr& w) {
//     return [w, ...buffers...]() mutable { ...one operation... };
//   });
//   dtensor::bench::replay(st, times);   // hands them to Google Benchmark as manual times
//
// The ranks run inside one threads::run per benchmark. Every iteration: a barrier, the
// operation, and the slowest rank's time (an all-reduce of the times, outside the timed part).
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "bench_util.hpp"
#include "dtensor/comm/threads.hpp"

namespace dtensor::bench {

/// Runs `iters` timed iterations of the operation make_op(world) returns, on n ranks, after one
/// warm-up (first touch of the buffers, lazy state); returns the slowest rank's time of each.
template <class MakeOp>
std::vector<double> times_on_ranks(int n, std::size_t iters, MakeOp make_op) {
  using clock_type = std::chrono::steady_clock;
  std::vector<double> times(iters);
  threads::run(n, [&](CommPtr world) {
    auto op = make_op(world);
    op();
    for (std::size_t i = 0; i < iters; ++i) {
      world->barrier();
      const auto t0 = clock_type::now();
      op();
      double dt = std::chrono::duration<double>(clock_type::now() - t0).count();
      world->all_reduce(std::span<double>(&dt, 1), ReduceOp::max);
      if (world->rank() == 0) times[i] = dt;
    }
  });
  return times;
}

/// Reports `times` (one per iteration) as the benchmark's manual times; returns their sum.
inline Timer replay(benchmark::State& st, const std::vector<double>& times) {
  Timer t;
  std::size_t i = 0;
  for (auto _ : st) {
    st.SetIterationTime(times[i]);
    t.total += times[i++];
  }
  return t;
}

}  // namespace dtensor::bench
