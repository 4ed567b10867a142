// dtensor/kernels/host/gemm_fp8.hpp — FP8 GEMM on the host: an exact emulation of cuBLASLt's
// FP8 matmul (per-tensor scales, fp32 accumulation), with the amax and quantization it needs.
//
//   const float sa = ..., sb = ...;                        // nn/fp8_recipe.hpp: AmaxHistory::scale
//   std::vector<float8_e4m3> qa(m * k), qb(n * k);
//   quantize(a, m * k, sa, qa.data());                     // qa = e4m3(a * sa), satfinite
//   quantize(b, n * k, sb, qb.data());
//   gemm_fp8(false, true, qa.data(), 1 / sa, qb.data(), 1 / sb, c, m, n, k, k, k, n);
//   // c[m,n] = (1/sa)(1/sb) * sum_p qa[i,p] qb[j,p], rounded once to c's type (float, bfloat16)
//   float m = amax(a, m * k);                              // max |a| (NaN if a holds one)
//
// What it computes, and why that is cuBLASLt's result: cublasLtMatmul with CUDA_R_8F_E4M3 /
// CUDA_R_8F_E5M2 inputs, CUBLAS_COMPUTE_32F and the A/B scale pointers (the inverse scales,
// "scale_inv" in Transformer Engine) computes D = alpha * scale_a * scale_b * sum_p a_p b_p in
// fp32 and rounds D once to its type. Every FP8 value is a float exactly, and so is the product
// of two (at most 4 + 4 significant bits, exponents within float's range), so the products here
// are the tensor core's to the bit; the sum is in fp32 (CBLAS sgemm or the portable loop), like
// cuBLASLt's, in another order. So the emulation equals the GPU up to the order of the fp32
// summation (and the rounding of the combined factor scale_a * scale_b * alpha), which is what
// the tests and docs/fp8.md claim. Caveat: cuBLASLt's "fast accumulation" mode
// (CUBLASLT_MATMUL_DESC_FAST_ACCUM, which TE uses for the forward GEMM) keeps fewer bits in the
// tensor core's accumulator between promotions; kernels/cuda/gemm_fp8.cuh leaves it off.
//
// The conversions are core/float8.hpp's (round to nearest even, saturate to +-max).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "dtensor/core/float8.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/gemm.hpp"

namespace dtensor::kernels::host {

/// One of the two FP8 storage types.
template <class T>
concept Fp8Element = std::is_same_v<T, float8_e4m3> || std::is_same_v<T, float8_e5m2>;

/// max |x[i]| over n values (0 for none). A NaN anywhere gives NaN (unlike fmaxf, which would
/// drop it): the recipe then keeps the previous scale rather than scale by a partial amax.
template <FloatElement T>
float amax(const T* x, Extent n) {
  detail::check(n >= 0 && (n == 0 || x), "amax", "n=", n, " with a null pointer or a negative count");
  float m = 0;
  for (Extent i = 0; i < n; ++i) {
    const float a = std::abs(float(x[i]));
    if (std::isnan(a)) return a;
    m = std::max(m, a);
  }
  return m;
}

/// out[i] = F8(float(x[i]) * scale): the product in fp32, then the satfinite conversion (TE's cast).
template <Fp8Element F8, FloatElement T>
void quantize(const T* x, Extent n, float scale, F8* out) {
  detail::check(n >= 0 && (n == 0 || (x && out)), "quantize", "n=", n, " with a null pointer or a negative count");
  detail::check(std::isfinite(scale) && scale > 0, "quantize", "scale ", scale, " is not finite and > 0");
  for (Extent i = 0; i < n; ++i) out[i] = F8(float(float(x[i]) * scale));
}

/// C[m,n] = a_scale_inv * b_scale_inv * op(A) op(B) (+ C when accumulate), A and B in FP8, the
/// products and the sum in fp32, rounded once to C's type; row-major with pitches as gemm.hpp.
template <Fp8Element FA, Fp8Element FB, FloatElement TC>
void gemm_fp8(bool trans_a, bool trans_b, const FA* A, float a_scale_inv, const FB* B, float b_scale_inv, TC* C,
              Extent m, Extent n, Extent k, Extent lda, Extent ldb, Extent ldc, bool accumulate = false) {
  // gemm.hpp's checks (sizes, pitches, null pointers) on the operands' bytes.
  const auto bytes = [](const auto* p) { return static_cast<const void*>(p); };
  detail::check_gemm_args<const void>(trans_a, trans_b, bytes(A), bytes(B), bytes(C), m, n, k, lda, ldb, ldc);
  detail::check(std::isfinite(a_scale_inv) && std::isfinite(b_scale_inv), "gemm_fp8", "inverse scales ", a_scale_inv,
                ", ", b_scale_inv, " are not finite (m=", m, " n=", n, " k=", k, ")");
  if (m == 0 || n == 0) return;
  // Widen to dense float: exact (every FP8 value is a float).
  const Extent ar = trans_a ? k : m, ac = trans_a ? m : k, br = trans_b ? n : k, bc = trans_b ? k : n;
  std::vector<float> a(std::size_t(ar * ac)), b(std::size_t(br * bc)), c(std::size_t(m * n));
  for (Extent i = 0; i < ar; ++i)
    for (Extent j = 0; j < ac; ++j) a[std::size_t(i * ac + j)] = float(A[i * lda + j]);
  for (Extent i = 0; i < br; ++i)
    for (Extent j = 0; j < bc; ++j) b[std::size_t(i * bc + j)] = float(B[i * ldb + j]);
  const float alpha = a_scale_inv * b_scale_inv;
  gemm<float>(trans_a, trans_b, alpha, a.data(), b.data(), 0.f, c.data(), m, n, k, std::max<Extent>(1, ac),
              std::max<Extent>(1, bc), std::max<Extent>(1, n));
  for (Extent i = 0; i < m; ++i)
    for (Extent j = 0; j < n; ++j) {
      const float v = c[std::size_t(i * n + j)];
      C[i * ldc + j] = accumulate ? TC(float(C[i * ldc + j]) + v) : TC(v);
    }
}

/// The FP8 GEMM of unquantized operands: A [ra, ca] quantized to FA by the scale sa, B [rb, cb]
/// to FB by sb (quantize), then C = op(A) op(B) by gemm_fp8 with the inverse scales; dense
/// row-major operands, C [m, n] dense. ops::matmul_fp8 and nn::Linear's FP8 GEMMs
/// (nn/fp8_recipe.hpp) are this on this rank's pieces.
template <Fp8Element FA, Fp8Element FB, FloatElement T>
void gemm_fp8_quantizing(bool trans_a, bool trans_b, const T* a, Extent ra, Extent ca, float sa, const T* b, Extent rb,
                         Extent cb, float sb, T* c) {
  const Extent m = trans_a ? ca : ra, k = trans_a ? ra : ca, n = trans_b ? rb : cb;
  std::vector<FA> qa(std::size_t(ra * ca));
  std::vector<FB> qb(std::size_t(rb * cb));
  quantize(a, ra * ca, sa, qa.data());
  quantize(b, rb * cb, sb, qb.data());
  gemm_fp8(trans_a, trans_b, qa.data(), 1.f / sa, qb.data(), 1.f / sb, c, m, n, k, std::max<Extent>(1, ca),
           std::max<Extent>(1, cb), std::max<Extent>(1, n));
}

}  // namespace dtensor::kernels::host
