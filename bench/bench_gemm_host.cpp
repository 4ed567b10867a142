// Host GEMM: dtensor's gemm (kernels/host/gemm.hpp) against cblas_sgemm called directly, and the
// portable loop, on the same sizes in the same run. Counter: GFLOP/s (2 m n k per iteration).
//
//   BM_dtensor_gemm      kernels::host::gemm<float> (CBLAS when built with dtensor::blas)
//   BM_cblas_sgemm       cblas_sgemm directly (the baseline; needs dtensor::blas)
//   BM_portable_gemm     kernels::host::detail::gemm_portable<float> (the no-BLAS path)
//   BM_bf16_gemm         kernels::host::gemm<bfloat16>: the kernel bf16_gemm_kernel() picks (AMX tiles,
//                        AVX512-BF16 or widened + sgemm; its name is the benchmark's label)
//   BM_bf16_avx512       detail::gemm_bf16_avx512 (where the CPU has AVX512-BF16)
//   BM_bf16_widen_sgemm  detail::gemm_bf16_widen: A and B widened to float, sgemm, C rounded (the
//                        path before issue 46; the reference of the bf16 rows' ratios)
//
// bf16 arguments: m, n, k, trans_a, trans_b — the trainer's Linear products (y = x w^T, dx = dy w,
// dw = dy^T x) of the l4d384 model's MLP ([1024 x 384] x [384 x 1536]) and the default model's
// ([1024 x 128] x [128 x 512]), 1024 tokens per rank; the three kernels of a shape run back to back.
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
#include "dtensor/kernels/host/gemm_bf16.hpp"

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

/// bf16 operands stored as the transposes say: op(A) [m, k], op(B) [k, n], C [m, n].
struct Bf16Operands {
  dtensor::Tensor<dtensor::bfloat16, 2> a, b, c;
  Bf16Operands(Extent m, Extent n, Extent k, bool ta, bool tb)
      : a(cast(dtensor::uniform<float>(dtensor::Shape<2>{ta ? k : m, ta ? m : k}, 1, -1, 1))),
        b(cast(dtensor::uniform<float>(dtensor::Shape<2>{tb ? n : k, tb ? k : n}, 2, -1, 1))),
        c(dtensor::Shape<2>{m, n}) {}
  static dtensor::Tensor<dtensor::bfloat16, 2> cast(const dtensor::Tensor<float, 2>& x) {
    dtensor::Tensor<dtensor::bfloat16, 2> y(x.shape());
    for (Extent i = 0; i < x.numel(); ++i) y[i] = dtensor::bfloat16(x[i]);
    return y;
  }
};

using Bf16Gemm = void (*)(bool, bool, dtensor::bfloat16, const dtensor::bfloat16*, const dtensor::bfloat16*,
                          dtensor::bfloat16, dtensor::bfloat16*, Extent, Extent, Extent, Extent, Extent, Extent);

void run_bf16(benchmark::State& state, Bf16Gemm gemm) {
  const Extent m = state.range(0), n = state.range(1), k = state.range(2);
  const bool ta = state.range(3) != 0, tb = state.range(4) != 0;
  kh::set_blas_threads(blas_threads());
  Bf16Operands o(m, n, k, ta, tb);
  for (auto _ : state) {
    gemm(ta, tb, dtensor::bfloat16(1.f), o.a.data(), o.b.data(), dtensor::bfloat16(0.f), o.c.data(), m, n, k,
         o.a.extent(1), o.b.extent(1), n);
    benchmark::DoNotOptimize(o.c.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, m, n, k);
}

void BM_bf16_gemm(benchmark::State& state) {
  state.SetLabel(kh::bf16_gemm_name(kh::bf16_gemm_kernel()));
  run_bf16(state, kh::gemm<dtensor::bfloat16>);
}
void BM_bf16_widen_sgemm(benchmark::State& state) { run_bf16(state, kh::detail::gemm_bf16_widen); }
#if DTENSOR_HOST_MULTI_ISA
void BM_bf16_avx512(benchmark::State& state) { run_bf16(state, kh::detail::gemm_bf16_avx512); }
#endif

// m, n, k, trans_a, trans_b: y = x w^T, dx = dy w, dw = dy^T x of [1024 x 384] x [384 x 1536] and
// [1024 x 128] x [128 x 512].
constexpr Extent kBf16Sizes[][5] = {{1024, 1536, 384, 0, 1}, {1024, 384, 1536, 0, 0}, {1536, 384, 1024, 1, 0},
                                    {1024, 512, 128, 0, 1},  {1024, 128, 512, 0, 0},  {512, 128, 1024, 1, 0}};

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
  const auto cpu = kh::detail::cpu_blas_features();
  for (const auto& s : kBf16Sizes) {
    const std::vector<int64_t> args{s[0], s[1], s[2], s[3], s[4]};
    benchmark::RegisterBenchmark("BM_bf16_gemm", BM_bf16_gemm)
        ->Args(args)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
#if DTENSOR_HOST_MULTI_ISA
    if (cpu.level == kh::detail::BlasLevel::avx512 && cpu.avx512_bf16)
      benchmark::RegisterBenchmark("BM_bf16_avx512", BM_bf16_avx512)
          ->Args(args)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
#endif
    benchmark::RegisterBenchmark("BM_bf16_widen_sgemm", BM_bf16_widen_sgemm)
        ->Args(args)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  (void)cpu;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
