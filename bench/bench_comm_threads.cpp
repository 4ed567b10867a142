// bench_comm_threads — the threads backend's all-gather against memcpy of the same bytes.
//
//   bench_comm_threads [--benchmark_filter=ranks:4] [--benchmark_format=json]
//
// For 2 and 4 ranks (threads of this process) and 1 KiB .. 64 MiB (one rank's output,
// float32), three variants run back to back for each size:
//   memcpy        every rank copies `bytes` from a buffer of its own into another: the speed
//                 limit of a zero-copy gather, where every rank copies the n blocks it receives
//                 straight out of its peers' send buffers, all ranks at once
//   all_gather    world->all_gather(send, recv) on preallocated buffers
//   redistribute  redistribute<Replicate>(x) of a Shard<0> DTensor on the 1-d mesh of all ranks,
//                 a new result each time (its allocation included)
// Every variant is timed the same way: ranks meet at a barrier, run one operation, and the
// iteration's time is the slowest rank's (an all-reduce of the times, outside the timed part).
// The ranks run inside one threads::run per benchmark; their times are then handed to Google
// Benchmark as manual iteration times.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "bench_threads.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/dtensor.hpp"

namespace {

using dtensor::CollectiveKind;

enum class Variant { memcpy, all_gather, redistribute };
constexpr const char* variant_name[] = {"memcpy", "all_gather", "redistribute"};


void run(benchmark::State& st, int n, Variant v, std::size_t bytes) {
  const std::size_t total = bytes / sizeof(float), block = total / std::size_t(n);
  const auto iters = std::size_t(dtensor::bench::iterations_for(bytes));
  std::vector<double> times;
  switch (v) {
    case Variant::memcpy:
      times = dtensor::bench::times_on_ranks(n, iters, [&](const dtensor::CommPtr&) {
        return [src = std::vector<float>(total, 1.0f), dst = std::vector<float>(total)]() mutable {
          std::memcpy(dst.data(), src.data(), dst.size() * sizeof(float));
          benchmark::DoNotOptimize(dst.data());
        };
      });
      break;
    case Variant::all_gather:
      times = dtensor::bench::times_on_ranks(n, iters, [&](const dtensor::CommPtr& w) {
        return [w, send = std::vector<float>(block, 1.0f), recv = std::vector<float>(total)]() mutable {
          w->all_gather(std::span<const float>(send), std::span<float>(recv));
        };
      });
      break;
    case Variant::redistribute:
      times = dtensor::bench::times_on_ranks(n, iters, [&](const dtensor::CommPtr& w) {
        using Mesh = dtensor::DeviceMesh<"x">;
        const Mesh mesh(w, {n});
        const dtensor::Shape<2> global{dtensor::Extent(total / 16), 16};  // 64-byte rows, even shards
        auto x = dtensor::from_local<dtensor::Layout<dtensor::Shard<0>>>(
            mesh, dtensor::zeros<float>(dtensor::Shape<2>{global[0] / n, 16}), global);
        return [x = std::move(x)] {
          auto y = dtensor::redistribute<dtensor::Layout<dtensor::Replicate>>(x);
          benchmark::DoNotOptimize(y.to_local().data());
        };
      });
      break;
  }
  const dtensor::bench::Timer t = dtensor::bench::replay(st, times);
  dtensor::bench::set_bandwidth(st, bytes, v == Variant::memcpy ? 1.0 : dtensor::bench::bus_factor(CollectiveKind::all_gather, n), t);
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::bench::reuse_freed_memory();
  for (int n : {2, 4})
    for (std::size_t bytes : dtensor::bench::sizes())
      for (Variant v : {Variant::memcpy, Variant::all_gather, Variant::redistribute}) {
        const std::string name = std::string(variant_name[int(v)]) + "/ranks:" + std::to_string(n) + "/" +
                                 dtensor::bench::size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, n, v, bytes); })
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond)
            ->Iterations(dtensor::bench::iterations_for(bytes));
      }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
