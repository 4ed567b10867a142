// Host kernels of a GPT step (kernels/host/*) on the trainer's shapes, each on the dispatched
// instruction set (simd.hpp) and on the x86-64 baseline in the same run; bench/bench_kernels_torch.py
// times PyTorch's ops on the same shapes and bench/compare_kernels.py prints the ratios.
//
//   build-rel/bench/bench_kernels_host --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Names: BM_<kernel>/<isa>/<extents...>; isa 0 = baseline, 1 = the dispatched one. Shapes: the
// default model (batch 16, seq 64, dim 128, 4 heads, MLP 512) and dim 384 (6 heads of 64).
//   layer_norm     forward + backward of x [16, 64, dim]
//   gelu           forward + backward of x [16, 64, 4 dim]
//   softmax        forward of x [16 * heads * 64, 64] (attention-shaped rows)
//   attention      forward + backward, causal, q/k/v [16, heads, 64, dim / heads]; BM_attention_bf16:
//                  the same in bfloat16 (each head widened to float, outputs rounded once), against
//                  the float one in the same run: the cost of the widening
//   adamw          one update of a flat float buffer of n parameters
//   linear         a Linear's three GEMMs without bias, 1024 tokens (batch 16 x seq 64): y = x W^T,
//                  dx = dy W, dW = dy^T x, x [1024, in], W [out, in] (kernels/host/gemm.hpp: OpenBLAS
//                  when built with it, whatever the ISA flag; registered with flag 1 only). The
//                  shapes of both models' qkv, out projection, fc1 and fc2: PyTorch's MKL against
//                  the BLAS dtensor links, at the trainer's sizes
//
// DTENSOR_INTRA_OP_THREADS=N runs every kernel on N intra-op threads (kernels/host/parallel.hpp,
// train_gpt --intra-op-threads N); the CPU column is the process's CPU time (all threads), the
// real-time column the wall clock: run with 1 and 2 for the per-op figures of docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "dtensor/core/factories.hpp"
#include "dtensor/kernels/host/activations.hpp"
#include "dtensor/kernels/host/attention.hpp"
#include "dtensor/kernels/host/gemm.hpp"
#include "dtensor/kernels/host/norm.hpp"
#include "dtensor/kernels/host/optim.hpp"
#include "dtensor/kernels/host/parallel.hpp"
#include "dtensor/kernels/host/simd.hpp"
#include "dtensor/kernels/host/softmax.hpp"

namespace kh = dtensor::kernels::host;
using dtensor::Extent;
using dtensor::Shape;

namespace {

/// DTENSOR_INTRA_OP_THREADS (1 when unset): the main thread's pool, for the whole run.
int intra_op_threads_of_run() {
  const char* text = std::getenv("DTENSOR_INTRA_OP_THREADS");
  return text ? std::atoi(text) : 1;
}
const kh::IntraOpThreads intra_op_scope(intra_op_threads_of_run());

/// Arguments start with the ISA flag: 0 caps at the baseline, 1 runs the detected ISA.
void set_isa(benchmark::State& state) {
  kh::set_host_isa_cap(state.range(0) == 0 ? kh::Isa::baseline : kh::Isa::avx512);
  state.SetLabel(kh::isa_name(kh::host_isa()));
}

void BM_layer_norm(benchmark::State& state) {
  set_isa(state);
  const Shape<3> s{16, 64, state.range(1)};
  const auto x = dtensor::uniform<float>(s, 1, -2, 2), dy = dtensor::uniform<float>(s, 2, -1, 1);
  const auto w = dtensor::uniform<float>(Shape<1>{s[2]}, 3, 0.5, 1.5), b = dtensor::uniform<float>(Shape<1>{s[2]}, 4, -1, 1);
  for (auto _ : state) {
    auto f = kh::layer_norm(x, w, b, 1e-5);
    auto g = kh::layer_norm_backward(x, w, f.mean, f.rstd, dy);
    benchmark::DoNotOptimize(g.dx.data());
  }
  state.SetBytesProcessed(state.iterations() * s[0] * s[1] * s[2] * 4 * 5);  // x, y; x, dy, dx
}

void BM_gelu(benchmark::State& state) {
  set_isa(state);
  const Shape<3> s{16, 64, 4 * state.range(1)};
  const auto x = dtensor::uniform<float>(s, 1, -4, 4), dy = dtensor::uniform<float>(s, 2, -1, 1);
  for (auto _ : state) {
    auto y = kh::gelu(x);
    auto dx = kh::gelu_backward(x, dy);
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(dx.data());
  }
  state.SetBytesProcessed(state.iterations() * s[0] * s[1] * s[2] * 4 * 5);
}

void BM_softmax(benchmark::State& state) {
  set_isa(state);
  const Shape<2> s{16 * state.range(1) * 64, 64};
  const auto x = dtensor::uniform<float>(s, 1, -8, 8);
  for (auto _ : state) {
    auto y = kh::softmax(x);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * s[0] * s[1] * 4 * 2);
}

template <class T>
void BM_attention(benchmark::State& state) {
  set_isa(state);
  const Extent heads = state.range(1), dim = state.range(2);
  const Shape<4> s{16, heads, 64, dim / heads};
  const auto q = dtensor::uniform<T>(s, 1, -1, 1), k = dtensor::uniform<T>(s, 2, -1, 1),
             v = dtensor::uniform<T>(s, 3, -1, 1), dout = dtensor::uniform<T>(s, 4, -1, 1);
  for (auto _ : state) {
    auto f = kh::attention(q, k, v);
    auto g = kh::attention_backward(q, k, v, f.out, f.lse, dout);
    benchmark::DoNotOptimize(g.dq.data());
  }
}

void BM_adamw(benchmark::State& state) {
  set_isa(state);
  const Shape<1> s{state.range(1)};
  auto p = dtensor::uniform<float>(s, 1, -1, 1), m = dtensor::Tensor<float, 1>(s), v = dtensor::Tensor<float, 1>(s);
  const auto g = dtensor::uniform<float>(s, 2, -1, 1);
  long step = 0;
  for (auto _ : state) {
    kh::adamw_update(p, g, m, v, {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = ++step});
    benchmark::DoNotOptimize(p.data());
  }
  state.SetBytesProcessed(state.iterations() * s[0] * 4 * 7);  // read p, g, m, v; write p, m, v
}

void BM_linear(benchmark::State& state) {
  set_isa(state);
  const Extent tokens = 16 * 64, in = state.range(1), out = state.range(2);
  const auto x = dtensor::uniform<float>(Shape<2>{tokens, in}, 1, -1, 1),
             w = dtensor::uniform<float>(Shape<2>{out, in}, 2, -1, 1),
             dy = dtensor::uniform<float>(Shape<2>{tokens, out}, 3, -1, 1);
  auto y = dtensor::Tensor<float, 2>(Shape<2>{tokens, out}), dx = dtensor::Tensor<float, 2>(Shape<2>{tokens, in}),
       dw = dtensor::Tensor<float, 2>(Shape<2>{out, in});
  for (auto _ : state) {
    kh::gemm<float>(false, true, 1.f, x.data(), w.data(), 0.f, y.data(), tokens, out, in, in, in, out);     // y = x W^T
    kh::gemm<float>(false, false, 1.f, dy.data(), w.data(), 0.f, dx.data(), tokens, in, out, out, in, in);  // dx = dy W
    kh::gemm<float>(true, false, 1.f, dy.data(), x.data(), 0.f, dw.data(), out, in, tokens, out, in,
                    in);  // dW = dy^T x
    benchmark::DoNotOptimize(dw.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(double(state.iterations()) * 6.0 * double(tokens * in * out),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

}  // namespace

BENCHMARK(BM_layer_norm)->ArgsProduct({{0, 1}, {128, 384}})->MeasureProcessCPUTime();
BENCHMARK(BM_gelu)->ArgsProduct({{0, 1}, {128, 384}})->MeasureProcessCPUTime();
BENCHMARK(BM_softmax)->ArgsProduct({{0, 1}, {4}})->MeasureProcessCPUTime();
BENCHMARK(BM_attention<float>)->Name("BM_attention")->Args({0, 4, 128})->Args({1, 4, 128})->Args({0, 6, 384})->Args({1, 6, 384})->MeasureProcessCPUTime();
BENCHMARK(BM_attention<dtensor::bfloat16>)->Name("BM_attention_bf16")->Args({1, 4, 128})->Args({1, 6, 384})->MeasureProcessCPUTime();
BENCHMARK(BM_adamw)->ArgsProduct({{0, 1}, {427008}})->MeasureProcessCPUTime();
BENCHMARK(BM_linear)
    ->Args({1, 128, 384})
    ->Args({1, 128, 128})
    ->Args({1, 128, 512})
    ->Args({1, 512, 128})
    ->Args({1, 384, 1152})
    ->Args({1, 384, 384})
    ->Args({1, 384, 1536})
    ->Args({1, 1536, 384})
    ->MeasureProcessCPUTime();

BENCHMARK_MAIN();
