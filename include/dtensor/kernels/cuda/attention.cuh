// dtensor/kernels/cuda/attention.cuh — the twin of kernels/host/attention.hpp on CudaTensor: exact
// (causal) attention with the log-sum-exp output, its backward from the saved lse, and
// merge_attention_blocks; the host's options (causal, scale, q/k offsets for ring attention).
//
//   auto f = kernels::cuda::attention(q, k, v, opts);      // f.out [B,H,Tq,Dv], f.lse [B,H,Tq]
//   auto g = kernels::cuda::attention_backward(q, k, v, f.out, f.lse, dout, opts);
//   kernels::cuda::set_attention_algorithm(kernels::cuda::AttentionAlgorithm::fused);  // process-wide
//
// Three implementations with the same contract (each checked against the host in test_kernels_cuda):
// attention_fused.cuh (FlashAttention-style kernels on CUDA cores, no workspace),
// attention_gemm.cuh (cuBLAS GEMMs over chunks of materialised scores, a bounded workspace) and,
// for bfloat16 where the program includes attention_cudnn.cuh in one of its units (cuDNN's fused
// flash attention on tensor cores; it registers itself in the hooks below). `automatic` (the
// default) runs cuDNN for the bf16 cases it takes, else the GEMMs from
// 128 keys on, where they were faster on the H100 and H200 at every size measured
// (bench_attention_cuda; docs/gpu.md), else the fused kernels (a decoding step's or a short ring
// block's few keys: three launches instead of a dozen). `gemm` and `fused` force those two.
#pragma once

#include <atomic>
#include <optional>
#include <type_traits>
#include <utility>

#include "dtensor/kernels/cuda/attention_fused.cuh"
#include "dtensor/kernels/cuda/attention_gemm.cuh"
#include "dtensor/kernels/cuda/profile.cuh"

namespace dtensor::kernels::cuda {

enum class AttentionAlgorithm { automatic, fused, gemm };

namespace detail {
inline std::atomic<AttentionAlgorithm>& attention_algorithm_switch() {
  static std::atomic<AttentionAlgorithm> a{AttentionAlgorithm::automatic};
  return a;
}
/// bf16 attention on cuDNN where attention_cudnn.cuh registered it (null: not in this program).
/// Each returns std::nullopt for a case cuDNN does not take.
struct AttentionHooks {
  using Forward = std::optional<AttentionForward<bfloat16>> (*)(const CudaTensor<bfloat16, 4>&,
                                                                const CudaTensor<bfloat16, 4>&,
                                                                const CudaTensor<bfloat16, 4>&,
                                                                const AttentionOptions&);
  using Backward = std::optional<AttentionBackward<bfloat16>> (*)(
      const CudaTensor<bfloat16, 4>&, const CudaTensor<bfloat16, 4>&, const CudaTensor<bfloat16, 4>&,
      const CudaTensor<bfloat16, 4>&, const CudaTensor<Stat, 3>&, const CudaTensor<bfloat16, 4>&,
      const AttentionOptions&);
  std::atomic<Forward> forward{nullptr};
  std::atomic<Backward> backward{nullptr};
};
inline AttentionHooks& attention_hooks() {
  static AttentionHooks h;
  return h;
}
inline bool use_attention_cudnn() {
  return attention_algorithm_switch().load(std::memory_order_relaxed) == AttentionAlgorithm::automatic;
}
/// Whether the GEMM path runs for this shape under the current setting.
inline bool use_attention_gemm(Extent tk) {
  const AttentionAlgorithm a = attention_algorithm_switch().load(std::memory_order_relaxed);
  return a == AttentionAlgorithm::gemm || (a == AttentionAlgorithm::automatic && tk >= 128);
}
}  // namespace detail

/// Which implementation attention and attention_backward run (process-wide; automatic by default).
inline void set_attention_algorithm(AttentionAlgorithm a) {
  detail::attention_algorithm_switch().store(a, std::memory_order_relaxed);
}
inline AttentionAlgorithm attention_algorithm() {
  return detail::attention_algorithm_switch().load(std::memory_order_relaxed);
}

/// Whether this program's bf16 attention may run on cuDNN (a unit included attention_cudnn.cuh
/// in a build with cuDNN): what `automatic` tries first for bf16.
inline bool cudnn_attention_registered() { return detail::attention_hooks().forward.load() != nullptr; }

template <FloatElement T>
AttentionForward<T> attention(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k, const CudaTensor<T, 4>& v,
                              const AttentionOptions& opts = {}) {
  const detail::ProfiledKernel profiled(KernelClass::attention);
  if constexpr (std::is_same_v<T, bfloat16>)
    if (const auto hook = detail::attention_hooks().forward.load(); hook && detail::use_attention_cudnn())
      if (auto f = hook(q, k, v, opts)) return std::move(*f);
  if (detail::use_attention_gemm(k.extent(2))) return attention_gemm(q, k, v, opts);
  return attention_fused(q, k, v, opts);
}

template <FloatElement T>
AttentionBackward<T> attention_backward(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k, const CudaTensor<T, 4>& v,
                                        const CudaTensor<T, 4>& out, const CudaTensor<Stat, 3>& lse,
                                        const CudaTensor<T, 4>& dout, const AttentionOptions& opts = {}) {
  const detail::ProfiledKernel profiled(KernelClass::attention);
  if constexpr (std::is_same_v<T, bfloat16>)
    if (const auto hook = detail::attention_hooks().backward.load(); hook && detail::use_attention_cudnn())
      if (auto g = hook(q, k, v, out, lse, dout, opts)) return std::move(*g);
  if (detail::use_attention_gemm(k.extent(2))) return attention_gemm_backward(q, k, v, out, lse, dout, opts);
  return attention_fused_backward(q, k, v, out, lse, dout, opts);
}

}  // namespace dtensor::kernels::cuda
