// bench/bench_util.hpp — plumbing shared by dtensor's Google Benchmark programs.
//
//   // a benchmark over MPI: every rank runs it, rank 0 reports
//   static void BM_x(benchmark::State& st) {
//     dtensor::bench::mpi_time(st, MPI_COMM_WORLD, [&] { ...one operation... });
//     dtensor::bench::set_bandwidth(st, bytes, dtensor::bench::bus_factor(CollectiveKind::all_gather, n));
//   }
//   int main(int argc, char** argv) { return dtensor::bench::mpi_main(argc, argv); }
//
// Conventions (DESIGN §9): manual time, each iteration's time is the maximum over the ranks;
// every rank runs the same iterations (a fixed count per size, iterations_for(): Google
// Benchmark's own choice also looks at each rank's wall time, so ranks could disagree and
// deadlock); only rank 0 reports; counters are bytes_per_second, and algbw /
// busbw in GB/s with the nccl-tests factors (busbw = algbw * factor), where "bytes" is
// nccl-tests' size: the larger of one rank's input and output.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/comm/comm_log.hpp"

#if defined(DTENSOR_HAS_MPI)
#include <mpi.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace dtensor::bench {

/// nccl-tests' bus-bandwidth factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter and
/// all-to-all (n-1)/n; 1 for the rest.
inline double bus_factor(CollectiveKind k, int n) {
  switch (k) {
    case CollectiveKind::all_reduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all:
    case CollectiveKind::all_to_all_v: return double(n - 1) / n;
    default: return 1.0;
  }
}

/// Sums the manual iteration times, which the bandwidth counters need.
struct Timer {
  double total = 0;
};

/// bytes_per_second (Google Benchmark's own), and algbw / busbw in GB/s (10^9 B/s, as
/// nccl-tests prints them), from `bytes` moved per iteration and the summed manual time.
inline void set_bandwidth(benchmark::State& st, std::size_t bytes, double factor, const Timer& t) {
  st.SetBytesProcessed(std::int64_t(st.iterations()) * std::int64_t(bytes));
  const double algbw = t.total > 0 ? double(bytes) * double(st.iterations()) / t.total / 1e9 : 0.0;
  st.counters["algbw"] = algbw;
  st.counters["busbw"] = algbw * factor;
  st.counters["bytes"] = double(bytes);
}

/// "1KiB", "64MiB": the size part of a benchmark's name.
inline std::string size_name(std::size_t bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (bytes >= 1024 && bytes % 1024 == 0 && u < 3) bytes /= 1024, ++u;
  return std::to_string(bytes) + unit[u];
}

/// 1 KiB, 4 KiB, ... up to `max` bytes (powers of 4).
inline std::vector<std::size_t> sizes(std::size_t min = 1024, std::size_t max = std::size_t(64) << 20) {
  std::vector<std::size_t> s;
  for (std::size_t b = min; b <= max; b *= 4) s.push_back(b);
  return s;
}

/// A fixed iteration count for `bytes`: about 256 MiB moved per benchmark, between 5 and 2000
/// iterations; DTENSOR_BENCH_SCALE (a factor, default 1) scales it for longer or shorter runs.
inline benchmark::IterationCount iterations_for(std::size_t bytes) {
  static const double scale = [] {
    const char* e = std::getenv("DTENSOR_BENCH_SCALE");
    return e ? std::atof(e) : 1.0;
  }();
  const double it = scale * double(std::size_t(256) << 20) / double(bytes);
  return benchmark::IterationCount(std::clamp(it, 5.0, std::max(5.0, 2000.0 * scale)));
}

/// Makes freed memory stay in the process (glibc: no mmap for large blocks, no trimming), as a
/// training loop's caching allocator would: a benchmark that allocates its result every
/// iteration (redistribute) then reuses pages instead of faulting in fresh zeroed ones, which
/// on a virtual machine costs more than the copy itself. DTENSOR_BENCH_FRESH_PAGES=1 keeps
/// glibc's defaults, to measure that cost. Returns whether it changed anything.
inline bool reuse_freed_memory() {
#if defined(__GLIBC__)
  const char* e = std::getenv("DTENSOR_BENCH_FRESH_PAGES");
  if (e && *e == '1') return false;
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  benchmark::AddCustomContext("malloc", "freed memory reused (M_MMAP_MAX=0, no trim)");
  return true;
#else
  return false;
#endif
}

/// Reports nothing: what ranks other than 0 use, so a run prints one table.
class NullReporter final : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

#if defined(DTENSOR_HAS_MPI)

/// The benchmark loop under MPI: per iteration, a barrier (so that every rank starts together),
/// one op(), and the time of the slowest rank as the iteration's manual time.
template <class Op>
Timer mpi_time(benchmark::State& st, MPI_Comm comm, Op&& op) {
  Timer t;
  for (auto _ : st) {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    op();
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm);
    st.SetIterationTime(dt);
    t.total += dt;
  }
  return t;
}

/// main() of an MPI benchmark program after MPI is initialized: rank 0 reports (to the console
/// and to --benchmark_out), the other ranks run the same benchmarks silently.
inline int mpi_main(int argc, char** argv) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<char*> args(argv, argv + argc);
  if (rank != 0)  // a file reporter there would overwrite rank 0's file
    std::erase_if(args, [](char* a) { return std::string_view(a).starts_with("--benchmark_out"); });
  int n = int(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  return 0;
}

#endif  // DTENSOR_HAS_MPI

}  // namespace dtensor::bench
