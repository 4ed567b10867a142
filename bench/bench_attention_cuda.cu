// bench_attention_cuda — attention forward + backward on one GPU, same run, float: the fused,
// memory-efficient kernels (kernels/cuda/attention_fused.cuh: no T x T matrix), the cuBLAS chunks
// (kernels/cuda/attention_gemm.cuh: masked, exact, a bounded workspace; also with TF32 allowed),
// causal and full, against a naive materialised baseline built from the public bmm and softmax
// kernels (S = scale Q K^T, P = softmax(S), O = P V and the matching backward GEMMs; full only:
// it has no mask). Counter "flops" is the analytic count of kernels/meta/attention.hpp (forward
// 2 P (D + Dv), backward P (6 D + 4 Dv), P the unmasked pairs), so flops / peak is the fraction
// of the GPU's peak (docs/benchmarks.md). bf16: cuDNN's fused attention (attention_cudnn.cuh, builds
// with cuDNN) against the cuBLAS chunks on the same bf16 inputs, causal and full, T up to 4096.
// Without a GPU it prints the skip line and exits 0.
//
//   bench_attention_cuda [--benchmark_filter=gemm]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>

#include "dtensor/core/cuda_space.cuh"
#include "dtensor/core/factories.hpp"
#include "dtensor/kernels/cuda/all.cuh"
#include "dtensor/kernels/cuda/attention_cudnn.cuh"
#include "dtensor/kernels/meta/attention.hpp"

namespace {
using namespace dtensor;
namespace ck = dtensor::kernels::cuda;

constexpr Extent batch = 4, heads = 12, head_dim = 64;

/// Times `op` with CUDA events on the current stream; one iteration = one forward + backward.
template <class Op>
void timed(benchmark::State& st, double flops_per_iteration, Op op) {
  cudaEvent_t a, b;
  DTENSOR_CUDA_CHECK(cudaEventCreate(&a));
  DTENSOR_CUDA_CHECK(cudaEventCreate(&b));
  op();  // warm-up
  for (auto _ : st) {
    DTENSOR_CUDA_CHECK(cudaEventRecord(a, dtensor::cuda::current_stream()));
    op();
    DTENSOR_CUDA_CHECK(cudaEventRecord(b, dtensor::cuda::current_stream()));
    DTENSOR_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DTENSOR_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    st.SetIterationTime(ms / 1e3);
  }
  st.counters["flops"] = benchmark::Counter(flops_per_iteration * double(st.iterations()), benchmark::Counter::kIsRate);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

double attention_flops(Extent t, bool causal) {
  const double pairs = double(kernels::meta::attention_pairs({.causal = causal}, t, t));
  return double(batch * heads) * pairs * (2.0 * (head_dim + head_dim) + (6.0 * head_dim + 4.0 * head_dim));
}

template <class T = float>
struct Inputs {
  ck::CudaTensor<T, 4> q, k, v, dout;
  explicit Inputs(Extent t)
      : q(to_space<cuda_space>(normal<T>(Shape<4>{batch, heads, t, head_dim}, 1))),
        k(to_space<cuda_space>(normal<T>(Shape<4>{batch, heads, t, head_dim}, 2))),
        v(to_space<cuda_space>(normal<T>(Shape<4>{batch, heads, t, head_dim}, 3))),
        dout(to_space<cuda_space>(normal<T>(Shape<4>{batch, heads, t, head_dim}, 4))) {}
};

void BM_fused(benchmark::State& st, bool causal) {
  const Extent t = st.range(0);
  Inputs<> in(t);
  const ck::AttentionOptions o{.causal = causal};
  timed(st, attention_flops(t, causal), [&] {
    auto f = ck::attention_fused(in.q, in.k, in.v, o);
    auto g = ck::attention_fused_backward(in.q, in.k, in.v, f.out, f.lse, in.dout, o);
    benchmark::DoNotOptimize(g.dq.data());
  });
}

void BM_gemm(benchmark::State& st, bool causal, bool tf32) {
  const Extent t = st.range(0);
  Inputs<> in(t);
  const ck::AttentionOptions o{.causal = causal};
  ck::allow_tf32(tf32);
  timed(st, attention_flops(t, causal), [&] {
    auto f = ck::attention_gemm(in.q, in.k, in.v, o);
    auto g = ck::attention_gemm_backward(in.q, in.k, in.v, f.out, f.lse, in.dout, o);
    benchmark::DoNotOptimize(g.dq.data());
  });
  ck::allow_tf32(false);
}

/// The cuBLAS chunks, causal, at a given number of query rows per chunk (range 1): what the
/// automatic chunk size (attention_gemm.cuh's attention_chunk_rows) trades, launches against the
/// keys above the diagonal that a larger chunk multiplies.
void BM_gemm_rows(benchmark::State& st) {
  const Extent t = st.range(0), rows = st.range(1);
  Inputs<> in(t);
  const ck::AttentionOptions o{};
  timed(st, attention_flops(t, true), [&] {
    auto f = ck::attention_gemm(in.q, in.k, in.v, o, rows);
    auto g = ck::attention_gemm_backward(in.q, in.k, in.v, f.out, f.lse, in.dout, o, rows);
    benchmark::DoNotOptimize(g.dq.data());
  });
}

/// bf16: cuDNN's fused attention or the cuBLAS chunks (bf16 products on tensor cores, fp32 scores).
void BM_bf16(benchmark::State& st, bool causal, bool cudnn) {
  const Extent t = st.range(0);
  Inputs<bfloat16> in(t);
  const ck::AttentionOptions o{.causal = causal};
  if (cudnn && !ck::attention_cudnn(in.q, in.k, in.v, o)) {
    st.SkipWithError(("cuDNN refused: " + ck::cudnn_attention_last_refusal()).c_str());
    return;
  }
  timed(st, attention_flops(t, causal), [&] {
    if (cudnn) {
      auto f = *ck::attention_cudnn(in.q, in.k, in.v, o);
      auto g = *ck::attention_cudnn_backward(in.q, in.k, in.v, f.out, f.lse, in.dout, o);
      benchmark::DoNotOptimize(g.dq.data());
    } else {
      auto f = ck::attention_gemm(in.q, in.k, in.v, o);
      auto g = ck::attention_gemm_backward(in.q, in.k, in.v, f.out, f.lse, in.dout, o);
      benchmark::DoNotOptimize(g.dq.data());
    }
  });
}

/// The materialised baseline on [B*H, T, D] views (non-causal).
void BM_naive(benchmark::State& st) {
  const Extent t = st.range(0);
  Inputs<> in(t);
  const Shape<3> s{batch * heads, t, head_dim};
  const auto q = in.q.reshape<3>(s), k = in.k.reshape<3>(s), v = in.v.reshape<3>(s), dout = in.dout.reshape<3>(s);
  const float scale = 1.0f / std::sqrt(float(head_dim));
  timed(st, attention_flops(t, false), [&] {
    auto scores = ck::bmm(q, k, false, true);  // [BH, T, T]
    ck::scale_(scores, scale);
    auto p = ck::softmax(scores);
    auto o = ck::bmm(p, v);
    auto dv = ck::bmm(p, dout, true, false);
    auto dp = ck::bmm(dout, v, false, true);
    auto ds = ck::softmax_backward(p, dp);
    auto dq = ck::bmm(ds, k);
    ck::scale_(dq, scale);
    auto dk = ck::bmm(ds, q, true, false);
    ck::scale_(dk, scale);
    benchmark::DoNotOptimize(o.data());
    benchmark::DoNotOptimize(dv.data());
  });
}

BENCHMARK_CAPTURE(BM_fused, causal, true)->Name("f32/fused_causal")->RangeMultiplier(2)->Range(64, 2048)->UseManualTime();
BENCHMARK_CAPTURE(BM_fused, full, false)->Name("f32/fused_full")->RangeMultiplier(2)->Range(256, 2048)->UseManualTime();
BENCHMARK(BM_naive)->Name("f32/naive_full")->RangeMultiplier(2)->Range(256, 2048)->UseManualTime();
BENCHMARK_CAPTURE(BM_gemm, causal, true, false)->Name("f32/gemm_causal")->RangeMultiplier(2)->Range(64, 2048)->UseManualTime();
BENCHMARK_CAPTURE(BM_gemm, full, false, false)->Name("f32/gemm_full")->RangeMultiplier(2)->Range(256, 2048)->UseManualTime();
BENCHMARK(BM_gemm_rows)->Name("f32/gemm_causal_rows")->ArgsProduct({{512, 1024, 2048}, {128, 256, 512, 2048}})->UseManualTime();
BENCHMARK_CAPTURE(BM_gemm, causal_tf32, true, true)->Name("tf32/gemm_causal")->RangeMultiplier(2)->Range(256, 2048)->UseManualTime();
BENCHMARK_CAPTURE(BM_bf16, cudnn_causal, true, true)
    ->Name("bf16/cudnn_causal")
    ->RangeMultiplier(2)
    ->Range(256, 4096)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_bf16, gemm_causal, true, false)
    ->Name("bf16/gemm_causal")
    ->RangeMultiplier(2)
    ->Range(256, 4096)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_bf16, cudnn_full, false, true)
    ->Name("bf16/cudnn_full")
    ->RangeMultiplier(2)
    ->Range(256, 4096)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_bf16, gemm_full, false, false)
    ->Name("bf16/gemm_full")
    ->RangeMultiplier(2)
    ->Range(256, 4096)
    ->UseManualTime();
}  // namespace

int main(int argc, char** argv) {
  if (dtensor::cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
