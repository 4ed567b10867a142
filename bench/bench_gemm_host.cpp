// Host GEMM: dtensor's gemm (kernels/host/gemm.hpp) against cblas_sgemm called directly, and the
// portable loop, on the same sizes in the same run. Counter: GFLOP/s (2 m n k per iteration).
//
//   BM_dtensor_gemm      kernels::host::gemm<float> (CBLAS when built with dtensor::blas)
//   BM_cblas_sgemm       cblas_sgemm directly (the baseline; needs dtensor::blas)
//   BM_portable_gemm     kernels::host::detail::gemm_portable<float> (the no-BLAS path)
//
// Arguments: m, n, k. Square sizes and GPT-2-small shapes (tokens x 3072 x 768 for the MLP up
// projection with 4096 tokens, and its input gradient). dtensor and cblas of one size run back to
// back; compare them with --benchmark_repetitions=5 (medians), the machine being shared. The BLAS runs one thread, the per-rank
// default of dtensor (ranks are threads; see gemm.hpp); pass --threads via DTENSOR_BENCH_BLAS_THREADS.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <vector>

#include "dtensor/core/factories.hpp"
#include "dtensor/kernels/host/gemm.hpp"

namespace kh = dtensor::kernels::host;
using dtensor::Extent;

namespace {

struct Operands {
  dtensor::Tensor<float, 2> a, b, c;
  Operands(Extent m, Extent n, Extent k)
      : a(dtensor::uniform<float>(dtensor::Shape<2>{m, k}, 1, -1, 1)),
        b(dtensor::uniform<float>(dtensor::Shape<2>{k, n}, 2, -1, 1)),
        c(dtensor::Shape<2>{m, n}) {}
};

void set_counters(benchmark::State& state, Extent m, Extent n, Extent k) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2e-9 * double(m) * double(n) * double(k), benchmark::Counter::kIsIterationInvariantRate);
}

int blas_threads() {
  const char* s = std::getenv("DTENSOR_BENCH_BLAS_THREADS");
  return s ? std::atoi(s) : 1;
}

template <class Gemm>
void run(benchmark::State& state, Gemm gemm) {
  const Extent m = state.range(0), n = state.range(1), k = state.range(2);
  kh::set_blas_threads(blas_threads());
  Operands o(m, n, k);
  for (auto _ : state) {
    gemm(m, n, k, o);
    benchmark::DoNotOptimize(o.c.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, m, n, k);
}

void BM_dtensor_gemm(benchmark::State& state) {
  run(state, [](Extent m, Extent n, Extent k, Operands& o) {
    kh::gemm<float>(false, false, 1.f, o.a.data(), o.b.data(), 0.f, o.c.data(), m, n, k, k, n, n);
  });
}

void BM_portable_gemm(benchmark::State& state) {
  run(state, [](Extent m, Extent n, Extent k, Operands& o) {
    kh::detail::gemm_portable<float>(false, false, 1.f, o.a.data(), o.b.data(), 0.f, o.c.data(), m, n, k, k, n, n);
  });
}

#ifdef DTENSOR_HAS_CBLAS
void BM_cblas_sgemm(benchmark::State& state) {
  run(state, [](Extent m, Extent n, Extent k, Operands& o) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.f, o.a.data(), int(k),
                o.b.data(), int(n), 0.f, o.c.data(), int(n));
  });
}
#endif

// The sizes: square, and GPT-2-small shapes (4096 tokens: MLP up-projection and its input
// gradient; 1024 tokens: the fused QKV projection).
constexpr Extent kSizes[][3] = {{256, 256, 256},    {512, 512, 512},   {1024, 1024, 1024}, {2048, 2048, 2048},
                                {4096, 3072, 768},  {4096, 768, 3072}, {1024, 2304, 768}};

}  // namespace

// Registered size by size, dtensor next to the baseline, so that the two measurements of a size
// run back to back under the same machine load (the figures compare them, not absolute speed).
int main(int argc, char** argv) {
  for (const auto& s : kSizes) {
    const std::vector<int64_t> args{s[0], s[1], s[2]};
    benchmark::RegisterBenchmark("BM_dtensor_gemm", BM_dtensor_gemm)->Args(args)->Unit(benchmark::kMillisecond)->UseRealTime();
#ifdef DTENSOR_HAS_CBLAS
    benchmark::RegisterBenchmark("BM_cblas_sgemm", BM_cblas_sgemm)->Args(args)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif
  }
  for (const auto& s : kSizes)
    benchmark::RegisterBenchmark("BM_portable_gemm", BM_portable_gemm)
        ->Args({s[0], s[1], s[2]})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
