// bench_moe_dispatch — the merged expert-parallel dispatch + combine, unlimited and group-limited,
// against the raw all_to_all_v of the unmerged dispatch's bytes, on the threads backend.
//
//   bench_moe_dispatch [--benchmark_filter=tokens:4096]
//
// 4 ranks (threads of this process) form the "ep" group; 8 experts (2 per rank, 4 groups of 2:
// a group per rank), top-2 routing drawn uniformly at random (fixed seed) from each token's M
// best groups (M random groups: 4 is no limit), dropless, hidden size 256, float32, 256 .. 4096
// tokens per rank. Variants, back to back for each size:
//   raw_a2av    two comm->all_to_all_v calls (out and back) of one row per (token, choice), the
//               unmerged dispatch's bytes, on preallocated buffers: what the dispatch moved before
//   merged/M:m  parallel::order_by_rank + exchange_counts (one all_to_all) + dispatch (one
//               all_to_all_v of a row per (token, rank) and the pairs' side arrays, then the
//               gather by local expert) + combine (the gated sum per unit, then the all_to_all_v),
//               each allocating its result, routing limited to m of the 4 groups
// Timing as bench_comm_threads (bench_threads.hpp): each iteration's time is the slowest
// rank's. The counter "rows/token" is rank 0's rows out per token (dispatch, side arrays included).
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_threads.hpp"
#include "dtensor/parallel/expert_parallel.hpp"

namespace {

constexpr int ranks = 4;
constexpr std::int64_t experts = 8, topk = 2, dim = 256, groups = 4;

/// Rank r's top-2 choices for `tokens` tokens: uniform over the experts of `m` random groups.
std::vector<std::int32_t> choices(int rank, std::int64_t tokens, std::int64_t m) {
  std::mt19937 gen(std::uint32_t(1234 + rank));
  std::vector<std::int32_t> expert;
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<std::int32_t> allowed, group_order{0, 1, 2, 3};
    std::shuffle(group_order.begin(), group_order.end(), gen);
    for (std::int64_t g = 0; g < m; ++g)
      for (std::int64_t e = 0; e < experts / groups; ++e)
        allowed.push_back(std::int32_t(group_order[std::size_t(g)] * (experts / groups) + e));
    std::shuffle(allowed.begin(), allowed.end(), gen);
    expert.insert(expert.end(), allowed.begin(), allowed.begin() + topk);
  }
  return expert;
}

void run(benchmark::State& st, std::int64_t m, std::int64_t tokens) {
  const auto iters = std::size_t(dtensor::bench::iterations_for(std::size_t(tokens * topk * dim * 4)));
  const bool raw = m == 0;  // the unmerged bytes: uniform top-2
  std::int64_t rows_out = 0;
  auto times = dtensor::bench::times_on_ranks(ranks, iters, [&](const dtensor::CommPtr& w) {
    const auto expert = choices(w->rank(), tokens, raw ? groups : m);
    const std::vector<std::uint8_t> kept(expert.size(), 1);
    const std::vector<float> gates(expert.size(), 0.5f);
    const auto order = dtensor::parallel::order_by_rank(expert, kept, topk, experts, ranks);
    const auto plan = dtensor::parallel::exchange_counts<float>(*w, order, dim);
    if (w->rank() == 0) rows_out = raw ? tokens * topk : plan.dispatch_out.total;
    dtensor::Tensor<float, 2> x(dtensor::Shape<2>{tokens, dim});
    // The unmerged dispatch's element counts: one row per kept choice, to the rank of its expert.
    std::vector<std::int64_t> out_rows(ranks, 0), in_rows(ranks, 0);
    for (std::size_t r = 0; r < std::size_t(ranks); ++r)
      for (auto e = order.expert_offsets[r]; e < order.expert_offsets[r + 1]; ++e)
        out_rows[r] += order.pairs_per_expert[std::size_t(e)];
    w->all_to_all(std::span<const std::int64_t>(out_rows), std::span<std::int64_t>(in_rows));
    const dtensor::parallel::detail::Transfer out(out_rows, dim), in(in_rows, dim);
    return [w, raw, order, plan, x, gates, out, in, rows = dtensor::Tensor<float, 2>(dtensor::Shape<2>{out.total, dim}),
            arrived = std::vector<float>(std::size_t(in.total * dim)),
            back = std::vector<float>(std::size_t(out.total * dim))]() mutable {
      if (raw) {
        using Counts = std::span<const std::size_t>;
        w->all_to_all_v(std::as_const(rows).span(), Counts(out.counts), Counts(out.displs), std::span<float>(arrived),
                        Counts(in.counts), Counts(in.displs));
        w->all_to_all_v(std::span<const float>(arrived), Counts(in.counts), Counts(in.displs), std::span<float>(back),
                        Counts(out.counts), Counts(out.displs));
        benchmark::DoNotOptimize(back.data());
      } else {
        const auto p = dtensor::parallel::exchange_counts<float>(*w, order, dim);
        const auto d = dtensor::parallel::dispatch(*w, p, order, x, std::span<const float>(gates));
        const auto y = dtensor::parallel::combine(*w, p, d, d.rows);  // the experts: identity
        benchmark::DoNotOptimize(y.data());
      }
    };
  });
  const auto t = dtensor::bench::replay(st, times);
  const std::size_t bytes = std::size_t(rows_out * dim) * sizeof(float) * 2;
  dtensor::bench::set_bandwidth(st, bytes, dtensor::bench::bus_factor(dtensor::CollectiveKind::all_to_all_v, ranks), t);
  st.counters["rows/token"] = double(rows_out) / double(tokens);
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::bench::reuse_freed_memory();
  for (std::int64_t tokens : {256, 1024, 4096})
    for (std::int64_t m : {0, 4, 2, 1}) {
      const std::string name = (m == 0 ? std::string("raw_a2av") : "merged/M:" + std::to_string(m)) +
                               "/ranks:4/tokens:" + std::to_string(tokens);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, m, tokens); })
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
