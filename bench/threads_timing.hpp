// bench/threads_timing.hpp — timing an operation on the ranks of the threads backend.
//
//   auto times = dtensor::bench::times_on_ranks(4, iters, [&](const CommPtr& world) {
//     return [world, buffers...]() mutable { ...one operation... };
//   });
//
// Ranks meet at a barrier, run one operation, and the iteration's time is the slowest rank's (an
// all-reduce of the times, outside the timed part); the ranks run inside one threads::run, and
// their times are then handed to Google Benchmark as manual iteration times.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "dtensor/comm/threads.hpp"

namespace dtensor::bench {

/// Runs `iters` timed iterations of the operation make_op(world) returns, on n ranks; returns
/// the slowest rank's time of each iteration (seconds).
template <class MakeOp>
std::vector<double> times_on_ranks(int n, std::size_t iters, MakeOp make_op) {
  using clock_type = std::chrono::steady_clock;
  std::vector<double> times(iters);
  dtensor::threads::run(n, [&](dtensor::CommPtr world) {
    auto op = make_op(world);
    op();  // warm-up: first touch of the buffers, lazy state
    for (std::size_t i = 0; i < iters; ++i) {
      world->barrier();
      const auto t0 = clock_type::now();
      op();
      double dt = std::chrono::duration<double>(clock_type::now() - t0).count();
      world->all_reduce(std::span<double>(&dt, 1), dtensor::ReduceOp::max);
      if (world->rank() == 0) times[i] = dt;
    }
  });
  return times;
}

}  // namespace dtensor::bench
