// dtensor/kernels/cuda/gemm.cuh — row-major GEMM through cuBLAS, and the matrix products of
// kernels/products.hpp on CudaTensor (through SpaceGemm<cuda_space>).
//
//   // C[m,n] = alpha * op(A) * op(B) + beta * C   (device pointers; same arguments as host::gemm)
//   kernels::cuda::gemm(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc);
//   auto c = matmul(a, b);  matmul_into(c, a, b, ta, tb, alpha, beta);  bmm(a, b, ta, tb);
//   auto y = linear(x, w, &b);  linear_backward_input(dy, w);  linear_backward_weight(x, dy, dw, &db, acc);
//
// cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
// so the call swaps the operands (and m, n) and keeps the transpose flags. float uses
// CUBLAS_COMPUTE_32F, double CUBLAS_COMPUTE_64F, bfloat16 bf16 inputs and output with fp32
// accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F), alpha and beta in float — the host twin
// widens bf16 to float, multiplies in float and rounds once, the same contract. TF32 is off by
// default, so float GEMMs are full fp32 like the host's; allow_tf32(true) (PyTorch's
// torch.backends.cuda.matmul.allow_tf32) runs them on tensor cores with inputs rounded to TF32's
// 10-bit mantissa and fp32 accumulation — about 1e-3 relative per product, not the host's result.
#pragma once

#include <atomic>
#include <climits>
#include <type_traits>

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/cuda/elementwise.cuh"
#include "dtensor/kernels/cuda/profile.cuh"
#include "dtensor/kernels/host/gemm.hpp"  // check_gemm_args
#include "dtensor/kernels/products.hpp"

namespace dtensor::kernels::cuda {

namespace detail {
template <class T>
struct GemmTypes;
template <>
struct GemmTypes<float> {
  static constexpr cudaDataType_t data = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using scalar = float;
};
template <>
struct GemmTypes<double> {
  static constexpr cudaDataType_t data = CUDA_R_64F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
  using scalar = double;
};
template <>
struct GemmTypes<bfloat16> {
  static constexpr cudaDataType_t data = CUDA_R_16BF;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using scalar = float;
};

inline std::atomic<bool>& tf32_switch() {
  static std::atomic<bool> on{false};
  return on;
}

inline void check_int_sizes(const char* op, Extent m, Extent n, Extent k, Extent lda, Extent ldb, Extent ldc) {
  check(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX, op,
        "sizes exceed cuBLAS's 32-bit interface: m=", m, " n=", n, " k=", k);
}
}  // namespace detail

/// Whether float GEMMs may use TF32 tensor cores (process-wide; off by default).
inline void allow_tf32(bool on) { detail::tf32_switch().store(on, std::memory_order_relaxed); }
inline bool tf32_allowed() { return detail::tf32_switch().load(std::memory_order_relaxed); }

namespace detail {
/// The one cuBLAS call of the GEMMs below: row-major C = op(A) op(B) as column-major
/// C^T = op(B)^T op(A)^T (operands and m, n swapped). alpha and beta point to the scalar type.
inline void cublas_gemm_batched(bool trans_a, bool trans_b, Extent m, Extent n, Extent k, const void* alpha,
                                const void* A, cudaDataType_t a_type, Extent lda, Extent stride_a, const void* B,
                                cudaDataType_t b_type, Extent ldb, Extent stride_b, const void* beta, void* C,
                                cudaDataType_t c_type, Extent ldc, Extent stride_c, Extent batch,
                                cublasComputeType_t compute) {
  const detail::ProfiledKernel profiled(KernelClass::gemm);
  check_int_sizes("gemm", m, n, k, lda, ldb, ldc);
  const auto ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // k == 0: cuBLAS scales C by beta (beta == 0 writes zeros), as the host twin does.
  DTENSOR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas(), tb, ta, int(n), int(m), int(k), alpha, B, b_type, int(ldb),
                                                  stride_b, A, a_type, int(lda), stride_a, beta, C, c_type, int(ldc),
                                                  stride_c, int(batch), compute, CUBLAS_GEMM_DEFAULT));
}
}  // namespace detail

/// Strided batched form: `batch` products, operand i at A + i * stride_a (likewise B, C).
template <FloatElement T>
void gemm_batched(bool trans_a, bool trans_b, T alpha, const T* A, Extent stride_a, const T* B, Extent stride_b, T beta,
                  T* C, Extent stride_c, Extent batch, Extent m, Extent n, Extent k, Extent lda, Extent ldb, Extent ldc) {
  host::detail::check_gemm_args(trans_a, trans_b, A, B, C, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0 || batch == 0) return;
  using G = detail::GemmTypes<T>;
  const typename G::scalar a = typename G::scalar(alpha), b = typename G::scalar(beta);
  const cublasComputeType_t compute =
      std::is_same_v<T, float> && tf32_allowed() ? CUBLAS_COMPUTE_32F_FAST_TF32 : G::compute;
  detail::cublas_gemm_batched(trans_a, trans_b, m, n, k, &a, A, G::data, lda, stride_a, B, G::data, ldb, stride_b, &b,
                              C, G::data, ldc, stride_c, batch, compute);
}

/// The scalar type a GEMM of T accumulates in: float for float and bfloat16, double for double.
template <FloatElement T>
using gemm_scalar_t = typename detail::GemmTypes<T>::scalar;

/// gemm_batched with the result in the scalar type: operands in T, C in gemm_scalar_t<T>. For
/// bfloat16 the product of the widened operands without widening them — each product of two bf16
/// values is exact in float and cuBLAS accumulates in fp32 on bf16 tensor cores, so this is what
/// a float GEMM of widened copies gives, up to the order of the sums; float and double are
/// gemm_batched itself.
template <FloatElement T>
void gemm_batched_widening(bool trans_a, bool trans_b, gemm_scalar_t<T> alpha, const T* A, Extent stride_a, const T* B,
                           Extent stride_b, gemm_scalar_t<T> beta, gemm_scalar_t<T>* C, Extent stride_c, Extent batch,
                           Extent m, Extent n, Extent k, Extent lda, Extent ldb, Extent ldc) {
  if constexpr (std::is_same_v<T, gemm_scalar_t<T>>) {
    gemm_batched<T>(trans_a, trans_b, alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch, m, n, k, lda, ldb, ldc);
  } else {
    // The checks read C only for null: seen as a T* for the one-type signature.
    host::detail::check_gemm_args(trans_a, trans_b, A, B, static_cast<const T*>(static_cast<const void*>(C)), m, n, k,
                                  lda, ldb, ldc);
    if (m == 0 || n == 0 || batch == 0) return;
    using G = detail::GemmTypes<T>;
    detail::cublas_gemm_batched(trans_a, trans_b, m, n, k, &alpha, A, G::data, lda, stride_a, B, G::data, ldb, stride_b,
                                &beta, C, detail::GemmTypes<gemm_scalar_t<T>>::data, ldc, stride_c, batch, G::compute);
  }
}

/// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, row-major, device pointers.
template <FloatElement T>
void gemm(bool trans_a, bool trans_b, T alpha, const T* A, const T* B, T beta, T* C, Extent m, Extent n, Extent k,
          Extent lda, Extent ldb, Extent ldc) {
  gemm_batched(trans_a, trans_b, alpha, A, 0, B, 0, beta, C, 0, 1, m, n, k, lda, ldb, ldc);
}

}  // namespace dtensor::kernels::cuda

namespace dtensor::kernels {

/// CUDA memory: cuBLAS, the batch in one strided-batched call.
template <>
struct SpaceGemm<cuda_space> {
  template <class T>
  static void gemm_batched(bool trans_a, bool trans_b, T alpha, const T* A, Extent stride_a, const T* B,
                           Extent stride_b, T beta, T* C, Extent stride_c, Extent batch, Extent m, Extent n, Extent k,
                           Extent lda, Extent ldb, Extent ldc) {
    cuda::gemm_batched<T>(trans_a, trans_b, alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch, m, n, k, lda,
                          ldb, ldc);
  }
  template <class T, std::size_t R>
  static void add_bias_(cuda::CudaTensor<T, R>& y, const cuda::CudaTensor<T, 1>& b) {
    cuda::add_bias_(y, b);
  }
  template <class T, std::size_t R>
  static void bias_grad_into(cuda::CudaTensor<T, 1>& db, const cuda::CudaTensor<T, R>& dy, bool accumulate) {
    cuda::bias_grad_into(db, dy, accumulate);
  }
};

namespace cuda {
using kernels::bmm;
using kernels::linear;
using kernels::linear_backward_input;
using kernels::linear_backward_weight;
using kernels::matmul;
using kernels::matmul_into;
}  // namespace cuda

}  // namespace dtensor::kernels
