// bench_gemm_cuda — the GEMM through ops::matmul on a cuda DTensor (dispatch by memory space,
// a new output each call from the stream-ordered pool), through kernels::cuda::matmul_into, and
// cublasGemmEx called directly, same sizes, same run (float, and bf16 with fp32 accumulation);
// the goal is op / cuBLAS >= 0.95. On sm_89 and later also FP8 (issue 42 item 3): cuBLASLt's FP8
// GEMM of E4M3 operands to bf16 (kernels::cuda::gemm_fp8, "fp8/cublaslt") and the same product from
// bf16 operands through the quantizing GEMM an FP8 Linear runs (gemm_fp8_quantizing: both casts,
// the transposing one included, "fp8/quantizing"), against "bf16/cublas" of the same n (the goal:
// FP8 >= 1.3x bf16). Manual time from CUDA events; counter flops (2 n^3 per iteration). Without a
// GPU it prints the skip line and exits 0.
//
//   bench_gemm_cuda [--benchmark_filter=bf16]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>

#include "dtensor/comm/threads.hpp"
#include "dtensor/core/cuda_space.cuh"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/kernels/cuda/elementwise.cuh"
#include "dtensor/kernels/cuda/gemm.cuh"
#include "dtensor/kernels/cuda/gemm_fp8.cuh"
#include "dtensor/ops/matmul.hpp"

namespace {
using namespace dtensor;
namespace ck = dtensor::kernels::cuda;

/// Times `op` with CUDA events on the current stream; one iteration = one call.
template <class Op>
void timed(benchmark::State& st, Extent n, Op op) {
  cudaEvent_t a, b;
  DTENSOR_CUDA_CHECK(cudaEventCreate(&a));
  DTENSOR_CUDA_CHECK(cudaEventCreate(&b));
  op();  // warm-up (handle creation, heuristics)
  for (auto _ : st) {
    DTENSOR_CUDA_CHECK(cudaEventRecord(a, dtensor::cuda::current_stream()));
    op();
    DTENSOR_CUDA_CHECK(cudaEventRecord(b, dtensor::cuda::current_stream()));
    DTENSOR_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DTENSOR_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    st.SetIterationTime(ms / 1e3);
  }
  st.counters["flops"] =
      benchmark::Counter(2.0 * double(n) * double(n) * double(n) * double(st.iterations()), benchmark::Counter::kIsRate);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

template <class T>
void BM_dtensor_matmul(benchmark::State& st) {
  const Extent n = st.range(0);
  ck::CudaTensor<T, 2> a(Shape<2>{n, n}), b(Shape<2>{n, n}), c(Shape<2>{n, n});
  timed(st, n, [&] { ck::matmul_into(c, a, b); });
}

/// ops::matmul on Replicate DTensors of a one-rank mesh (the rank is a thread: its stream is
/// the one timed).
template <class T>
void BM_op_matmul(benchmark::State& st) {
  const Extent n = st.range(0);
  threads::run(1, [&](CommPtr world) {
    using Mesh = DeviceMesh<"tp">;
    using D = DTensor<T, 2, Mesh, Layout<Replicate>, cuda_space>;
    const Mesh mesh(world, {1});
    const D a(mesh, Shape<2>{n, n}, ck::CudaTensor<T, 2>(Shape<2>{n, n}));
    const D b(mesh, Shape<2>{n, n}, ck::CudaTensor<T, 2>(Shape<2>{n, n}));
    timed(st, n, [&] {
      auto c = ops::matmul(a, b);
      benchmark::DoNotOptimize(c.to_local().data());
    });
  });
}

template <class T>
void BM_cublas_gemm_ex(benchmark::State& st) {
  const Extent n = st.range(0);
  ck::CudaTensor<T, 2> a(Shape<2>{n, n}), b(Shape<2>{n, n}), c(Shape<2>{n, n});
  using G = ck::detail::GemmTypes<T>;
  cublasHandle_t h = nullptr;
  DTENSOR_CUBLAS_CHECK(cublasCreate(&h));
  DTENSOR_CUBLAS_CHECK(cublasSetStream(h, dtensor::cuda::current_stream()));
  const typename G::scalar one = 1, zero = 0;
  timed(st, n, [&] {
    DTENSOR_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n), &one, b.data(), G::data,
                                      int(n), a.data(), G::data, int(n), &zero, c.data(), G::data, int(n), G::compute,
                                      CUBLAS_GEMM_DEFAULT));
  });
  cublasDestroy(h);
}

/// C = A B^T in FP8 (E4M3 x E4M3, fp32 accumulation, bf16 out): cuBLASLt's TN form, unit scales.
void BM_fp8_cublaslt(benchmark::State& st) {
  const Extent n = st.range(0);
  ck::CudaTensor<std::uint8_t, 2> a(Shape<2>{n, n}), b(Shape<2>{n, n});
  ck::CudaTensor<bfloat16, 2> c(Shape<2>{n, n});
  ck::CudaTensor<float, 1> scales(Shape<1>{8});
  ck::fill_(scales, 1.f);
  const auto* qa = reinterpret_cast<const float8_e4m3*>(a.data());
  const auto* qb = reinterpret_cast<const float8_e4m3*>(b.data());
  timed(st, n, [&] { ck::gemm_fp8(qa, scales.data(), qb, scales.data() + 4, c.data(), n, n, n, n, n, n); });
}

/// The FP8 Linear's forward GEMM from bf16 operands: both quantized (one transposed), then FP8.
void BM_fp8_quantizing(benchmark::State& st) {
  const Extent n = st.range(0);
  ck::CudaTensor<bfloat16, 2> a(Shape<2>{n, n}), b(Shape<2>{n, n}), c(Shape<2>{n, n});
  timed(st, n, [&] {
    ck::gemm_fp8_quantizing<float8_e4m3, float8_e4m3>(false, false, a.data(), n, n, 1.f, b.data(), n, n, 1.f, c.data());
  });
}

BENCHMARK(BM_op_matmul<float>)->Name("f32/op")->RangeMultiplier(2)->Range(256, 8192)->UseManualTime();
BENCHMARK(BM_op_matmul<bfloat16>)->Name("bf16/op")->RangeMultiplier(2)->Range(256, 8192)->UseManualTime();
BENCHMARK(BM_dtensor_matmul<float>)->Name("f32/dtensor")->RangeMultiplier(2)->Range(256, 8192)->UseManualTime();
BENCHMARK(BM_cublas_gemm_ex<float>)->Name("f32/cublas")->RangeMultiplier(2)->Range(256, 8192)->UseManualTime();
BENCHMARK(BM_dtensor_matmul<bfloat16>)->Name("bf16/dtensor")->RangeMultiplier(2)->Range(256, 8192)->UseManualTime();
BENCHMARK(BM_cublas_gemm_ex<bfloat16>)->Name("bf16/cublas")->RangeMultiplier(2)->Range(256, 8192)->UseManualTime();
}  // namespace

int main(int argc, char** argv) {
  if (dtensor::cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
  int device = 0, major = 0, minor = 0;
  DTENSOR_CUDA_CHECK(cudaGetDevice(&device));
  DTENSOR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  DTENSOR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major * 10 + minor >= 89) {  // FP8 tensor cores
    benchmark::RegisterBenchmark("fp8/cublaslt", BM_fp8_cublaslt)
        ->RangeMultiplier(2)
        ->Range(256, 8192)
        ->UseManualTime();
    benchmark::RegisterBenchmark("fp8/quantizing", BM_fp8_quantizing)
        ->RangeMultiplier(2)
        ->Range(256, 8192)
        ->UseManualTime();
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
