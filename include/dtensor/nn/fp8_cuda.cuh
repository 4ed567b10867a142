// dtensor/nn/fp8_cuda.cuh — FP8 Linears (and grouped experts) on GPU tensors: the GPU's table of
// nn/fp8_recipe.hpp's detail::Fp8LinearKernels, registered for the whole program by including this
// header in one of its CUDA translation units (as kernels/cuda/attention_cudnn.cuh registers cuDNN).
//
//   #include "dtensor/nn/fp8_cuda.cuh"           // in one .cu of the program
//   const nn::Fp8Autocast fp8;                   // then nn::Linear on cuda tensors computes in FP8
//
// What runs, per Linear and step (nn/linear.hpp's sequence, the host emulation's numerics):
// - the scale of each tensor role: max |x| of this rank's piece on the device (kernels::cuda::amax,
//   a NaN as +inf), brought back to the host, max-all-reduced over the mesh dimensions that split
//   the tensor (one float, host memory), then the delayed-scaling history on the host
//   (nn::AmaxHistory). The amaxes are exact, so the scales and histories are the host emulation's
//   bit for bit. The read-back waits for the stream: one synchronisation per role and use (x and
//   W in the forward, dy in the backward); Transformer Engine keeps the amax and the history on
//   the device and has none (not done here yet).
// - the three GEMMs: kernels::cuda::gemm_fp8_quantizing — the operands quantized on the device
//   into cuBLASLt's TN form (transposed where the GEMM transposes, k padded to 16), cuBLASLt's FP8
//   GEMM with fp32 accumulation, output in the model's type (float or bfloat16; double is refused).
//   Equal to the emulation up to Hopper's FP8 accumulation (~1e-2 relative: docs/fp8.md).
//
// Why a registration and not an include in nn/linear.hpp: nn/linear.hpp is host code (every program
// compiles it); cuBLASLt and the device casts only compile under nvcc.
#pragma once

#include <type_traits>

#include "dtensor/core/cuda_space.cuh"
#include "dtensor/kernels/cuda/gemm_fp8.cuh"
#include "dtensor/nn/fp8_recipe.hpp"

namespace dtensor::nn::detail {

/// kernels::cuda::gemm_fp8_quantizing for fp8_linear_gemm.
struct CudaFp8Gemm {
  template <class FA, class FB, class T>
  static void run(bool ta, bool tb, const T* a, Extent ra, Extent ca, float sa, const T* b, Extent rb, Extent cb,
                  float sb, T* c) {
    kernels::cuda::gemm_fp8_quantizing<FA, FB>(ta, tb, a, ra, ca, sa, b, rb, cb, sb, c);
  }
};

template <kernels::host::FloatElement T>
float cuda_amax(const T* x, Extent n) {
  return kernels::cuda::amax(x, n);
}

template <kernels::host::FloatElement T>
inline constexpr Fp8LinearKernels<T> fp8_linear_kernels_cuda{&fp8_linear_scale<T, &cuda_amax<T>>,
                                                             &fp8_linear_gemm<T, CudaFp8Gemm>, &cuda_amax<T>};

/// The registration (once per program, whichever units include this header). double is
/// registered too: its GEMM is refused by name (kernels::cuda::gemm_fp8_quantizing).
inline const bool fp8_cuda_registered = [] {
  fp8_linear_kernels_set<float, cuda_space>.store(&fp8_linear_kernels_cuda<float>, std::memory_order_release);
  fp8_linear_kernels_set<double, cuda_space>.store(&fp8_linear_kernels_cuda<double>, std::memory_order_release);
  fp8_linear_kernels_set<bfloat16, cuda_space>.store(&fp8_linear_kernels_cuda<bfloat16>, std::memory_order_release);
  return true;
}();

}  // namespace dtensor::nn::detail
