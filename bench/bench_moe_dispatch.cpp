// bench_moe_dispatch — expert-parallel dispatch + combine against the raw all_to_all_v of the same
// bytes, on the threads backend.
//
//   bench_moe_dispatch [--benchmark_filter=tokens:4096]
//
// 4 ranks (threads of this process) form the "ep" group; 8 experts (2 per rank), top-2 routing
// drawn uniformly at random (fixed seed), dropless, hidden size 256, float32, 256 .. 4096 tokens
// per rank. Variants, back to back for each size:
//   raw_a2av   two comm->all_to_all_v calls (out and back) with the counts a dispatch would use,
//              on preallocated buffers: the speed limit
//   moe        parallel::exchange_counts (one all_to_all of 8 int64) + parallel::dispatch (the
//              all_to_all_v, then the regrouping copy by local expert) + parallel::combine (the
//              copy back, then the all_to_all_v), each allocating its result
// Timing as bench_comm_threads (bench_threads.hpp): each iteration's time is the slowest
// rank's. "bytes" is this rank's rows out x hidden x 4 B, counted once per direction (2x).
#include <random>
#include <utility>
#include <string>
#include <vector>

#include "bench_threads.hpp"
#include "dtensor/parallel/expert_parallel.hpp"

namespace {

constexpr int ranks = 4;
constexpr std::int64_t experts = 8, topk = 2, dim = 256;

enum class Variant { raw_a2av, moe };
constexpr const char* variant_name[] = {"raw_a2av", "moe"};

/// Rank r's rows per expert for `tokens` tokens of top-2 uniform routing.
std::vector<std::int64_t> rows_per_expert(int rank, std::int64_t tokens) {
  std::mt19937 gen(std::uint32_t(1234 + rank));
  std::uniform_int_distribution<std::int64_t> pick(0, experts - 1);
  std::vector<std::int64_t> rows(std::size_t(experts), 0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const auto a = pick(gen);
    auto b = pick(gen);
    while (b == a) b = pick(gen);
    ++rows[std::size_t(a)], ++rows[std::size_t(b)];
  }
  return rows;
}

void run(benchmark::State& st, Variant v, std::int64_t tokens) {
  const auto iters = std::size_t(dtensor::bench::iterations_for(std::size_t(tokens * topk * dim * 4)));
  const std::size_t bytes = std::size_t(tokens * topk * dim) * sizeof(float) * 2;
  auto times = dtensor::bench::times_on_ranks(ranks, iters, [&](const dtensor::CommPtr& w) {
    const auto counts = rows_per_expert(w->rank(), tokens);
    auto plan = dtensor::parallel::exchange_counts(*w, counts, dim);
    dtensor::Tensor<float, 2> rows(dtensor::Shape<2>{plan.rows_sent(), dim});
    return [w, v, counts, plan, rows, arrived = std::vector<float>(std::size_t(plan.rows_received() * dim)),
            back = std::vector<float>(std::size_t(plan.rows_sent() * dim))]() mutable {
      if (v == Variant::raw_a2av) {
        using Counts = std::span<const std::size_t>;
        w->all_to_all_v(std::as_const(rows).span(), Counts(plan.send_counts), Counts(plan.send_displs), std::span<float>(arrived),
                        Counts(plan.recv_counts), Counts(plan.recv_displs));
        w->all_to_all_v(std::span<const float>(arrived), Counts(plan.recv_counts), Counts(plan.recv_displs),
                        std::span<float>(back), Counts(plan.send_counts), Counts(plan.send_displs));
        benchmark::DoNotOptimize(back.data());
      } else {
        const auto p = dtensor::parallel::exchange_counts(*w, counts, dim);
        const auto grouped = dtensor::parallel::dispatch(*w, p, rows);
        const auto out = dtensor::parallel::combine(*w, p, grouped);
        benchmark::DoNotOptimize(out.data());
      }
    };
  });
  const auto t = dtensor::bench::replay(st, times);
  dtensor::bench::set_bandwidth(st, bytes, dtensor::bench::bus_factor(dtensor::CollectiveKind::all_to_all_v, ranks), t);
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::bench::reuse_freed_memory();
  for (std::int64_t tokens : {256, 1024, 4096})
    for (Variant v : {Variant::raw_a2av, Variant::moe}) {
      const std::string name = std::string(variant_name[int(v)]) + "/ranks:4/tokens:" + std::to_string(tokens);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, v, tokens); })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond)
          ->Iterations(dtensor::bench::iterations_for(std::size_t(tokens * topk * dim * 4)));
    }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
