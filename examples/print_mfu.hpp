// examples/print_mfu.hpp — train_gpt's MFU line for a model on a GPU (train_gpt.hpp's finish):
// the analytic FLOPs per token x tokens/s over the GPU's rated dense peak (docs/gpu.md), then
// --profile-kernels' breakdown (Options::kernel_report, set by train_gpt_cuda.cuh).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "dtensor/sim/analytic.hpp"
#include "dtensor/sim/device.hpp"
#include "dtensor/train/loop.hpp"

namespace examples::gpt {

/// --device cuda: the model FLOP utilisation of the timed steps after the first (rank 0 prints
/// it). The FLOPs are the analytic count per token (sim::ModelShape::model_flops_per_token, PaLM's
/// as MFU is quoted: 6 x the parameters a token multiplies + 12 L h s for attention, the
/// vocabulary's head included), the peak the GPU's rated dense one (sim/device.hpp's H100, H200 or
/// A100, by the CUDA device's name) for the GEMMs' dtype: bf16's for bf16 (and fp8, whose other
/// kernels stay bf16), half of it with --tf32, the fp32 non-tensor peak for fp32. The ranks of the
/// threads backend share one GPU; under NCCL each has its own.
template <class Options>
void print_mfu(const Options& o, std::int64_t vocab, const dtensor::train::FitReport& r, int ranks) {
  if (o.gpu.empty() || r.rank != 0) return;
  const auto has = [&](const char* part) { return o.gpu.find(part) != std::string::npos; };
  const char* device = has("H200") ? "h200" : has("H100") ? "h100" : has("A100") ? "a100" : nullptr;
  if (device == nullptr) {
    std::printf("MFU: no rated peak for the GPU '%s' (sim/device.hpp has the H100, H200 and A100)\n", o.gpu.c_str());
    if (o.kernel_report) o.kernel_report(r);
    return;
  }
  const dtensor::sim::Hardware hw = dtensor::sim::device(device);
  const bool f32 = o.dtype == "f32";
  const double peak = !f32 ? hw.peak_bf16_flops : o.tf32 ? hw.peak_bf16_flops / 2 : hw.peak_fp32_flops;
  const char* peak_name = !f32 ? "bf16" : o.tf32 ? "TF32" : "fp32";
  const dtensor::sim::ModelShape m{.layers = o.layers,
                                   .dim = o.dim,
                                   .heads = o.heads,
                                   .kv_heads = o.kv_heads,
                                   .ffn = o.ffn,
                                   .vocab = vocab,
                                   .seq = o.seq,
                                   .llama = o.arch == "llama",
                                   .experts = o.experts,
                                   .topk = o.topk,
                                   .moe_every = o.moe_every,
                                   .shared_experts = o.experts > 0 ? o.shared : 0,
                                   .dense_first = o.experts > 0 ? o.dense_first : 0};
  const double tokens = r.tokens_per_second_after_first > 0 ? r.tokens_per_second_after_first : r.tokens_per_second;
  const int gpus = o.backend == "nccl" ? ranks : 1;
  const double flops = m.model_flops_per_token();
  std::printf(
      "MFU %.1f %%: %.3g GFLOP per token (analytic) x %.0f tokens/s%s over %d x %s's rated dense %s peak, "
      "%.0f TFLOP/s ('%s')\n",
      100 * flops * tokens / (gpus * peak), flops / 1e9, tokens,
      r.tokens_per_second_after_first > 0 ? " after the first step" : "", gpus, hw.name.c_str(), peak_name, peak / 1e12,
      o.gpu.c_str());
  if (o.kernel_report) o.kernel_report(r);  // --profile-kernels: where the GPU's time went
}

}  // namespace examples::gpt
