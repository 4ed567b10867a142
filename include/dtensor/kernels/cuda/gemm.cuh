// dtensor/kernels/cuda/gemm.cuh — row-major GEMM through cuBLAS, and the matrix products of
// kernels/host/matmul.hpp on CudaTensor.
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
// widens bf16 to float, multiplies in float and rounds once, the same contract. TF32 is not
// enabled (the default math mode), so float GEMMs are full fp32 like the host's.
#pragma once

#include <climits>
#include <type_traits>

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/cuda/elementwise.cuh"
#include "dtensor/kernels/host/matmul.hpp"  // op_extents, check_gemm_args

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

inline void check_int_sizes(const char* op, Extent m, Extent n, Extent k, Extent lda, Extent ldb, Extent ldc) {
  check(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX, op,
        "sizes exceed cuBLAS's 32-bit interface: m=", m, " n=", n, " k=", k);
}
}  // namespace detail

/// Strided batched form: `batch` products, operand i at A + i * stride_a (likewise B, C).
template <FloatElement T>
void gemm_batched(bool trans_a, bool trans_b, T alpha, const T* A, Extent stride_a, const T* B, Extent stride_b, T beta,
                  T* C, Extent stride_c, Extent batch, Extent m, Extent n, Extent k, Extent lda, Extent ldb, Extent ldc) {
  host::detail::check_gemm_args(trans_a, trans_b, A, B, C, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0 || batch == 0) return;
  detail::check_int_sizes("gemm", m, n, k, lda, ldb, ldc);
  using G = detail::GemmTypes<T>;
  const typename G::scalar a = typename G::scalar(alpha), b = typename G::scalar(beta);
  const auto ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // k == 0: cuBLAS scales C by beta (beta == 0 writes zeros), as the host twin does.
  DTENSOR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(detail::blas(), tb, ta, int(n), int(m), int(k), &a, B, G::data,
                                                  int(ldb), stride_b, A, G::data, int(lda), stride_a, &b, C, G::data,
                                                  int(ldc), stride_c, int(batch), G::compute, CUBLAS_GEMM_DEFAULT));
}

/// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, row-major, device pointers.
template <FloatElement T>
void gemm(bool trans_a, bool trans_b, T alpha, const T* A, const T* B, T beta, T* C, Extent m, Extent n, Extent k,
          Extent lda, Extent ldb, Extent ldc) {
  gemm_batched(trans_a, trans_b, alpha, A, 0, B, 0, beta, C, 0, 1, m, n, k, lda, ldb, ldc);
}

template <FloatElement T>
void matmul_into(CudaTensor<T, 2>& c, const CudaTensor<T, 2>& a, const CudaTensor<T, 2>& b, bool trans_a = false,
                 bool trans_b = false, T alpha = T(1), T beta = T(0)) {
  const auto [m, ka] = host::detail::op_extents(a.shape(), trans_a);
  const auto [kb, n] = host::detail::op_extents(b.shape(), trans_b);
  detail::check(ka == kb && c.extent(0) == m && c.extent(1) == n, "matmul", "op(a) of ", to_string(a.shape()),
                trans_a ? " (transposed)" : "", " times op(b) of ", to_string(b.shape()),
                trans_b ? " (transposed)" : "", " into c of ", to_string(c.shape()),
                ": inner or outer extents do not match");
  gemm<T>(trans_a, trans_b, alpha, a.data(), b.data(), beta, c.data(), m, n, ka, std::max<Extent>(1, a.extent(1)),
          std::max<Extent>(1, b.extent(1)), std::max<Extent>(1, n));
}

template <FloatElement T>
CudaTensor<T, 2> matmul(const CudaTensor<T, 2>& a, const CudaTensor<T, 2>& b, bool trans_a = false,
                        bool trans_b = false) {
  const Extent m = host::detail::op_extents(a.shape(), trans_a).first;
  const Extent n = host::detail::op_extents(b.shape(), trans_b).second;
  auto c = CudaTensor<T, 2>::uninitialized(Shape<2>{m, n});
  matmul_into(c, a, b, trans_a, trans_b);
  return c;
}

template <FloatElement T>
CudaTensor<T, 3> bmm(const CudaTensor<T, 3>& a, const CudaTensor<T, 3>& b, bool trans_a = false, bool trans_b = false) {
  const Shape<2> as{a.extent(1), a.extent(2)}, bs{b.extent(1), b.extent(2)};
  const auto [m, ka] = host::detail::op_extents(as, trans_a);
  const auto [kb, n] = host::detail::op_extents(bs, trans_b);
  detail::check(a.extent(0) == b.extent(0) && ka == kb, "bmm", "a ", to_string(a.shape()),
                trans_a ? " (transposed)" : "", " and b ", to_string(b.shape()), trans_b ? " (transposed)" : "",
                ": batch or inner extents do not match");
  auto c = CudaTensor<T, 3>::uninitialized(Shape<3>{a.extent(0), m, n});
  gemm_batched<T>(trans_a, trans_b, T(1), a.data(), m * ka, b.data(), ka * n, T(0), c.data(), m * n, a.extent(0), m, n,
                  ka, std::max<Extent>(1, as[1]), std::max<Extent>(1, bs[1]), std::max<Extent>(1, n));
  return c;
}

template <FloatElement T, std::size_t R>
CudaTensor<T, R> linear(const CudaTensor<T, R>& x, const CudaTensor<T, 2>& w, const CudaTensor<T, 1>* bias = nullptr) {
  const Extent in = x.extent(R - 1), out = w.extent(0), rows = detail::leading_rows(x.shape());
  detail::check(w.extent(1) == in, "linear", "x ", to_string(x.shape()), " and weight ", to_string(w.shape()),
                ": the weight must be [out, ", in, "]");
  Shape<R> ys = x.shape();
  ys[R - 1] = out;
  auto y = CudaTensor<T, R>::uninitialized(ys);
  gemm<T>(false, true, T(1), x.data(), w.data(), T(0), y.data(), rows, out, in, std::max<Extent>(1, in),
          std::max<Extent>(1, in), std::max<Extent>(1, out));
  if (bias) add_bias_(y, *bias);
  return y;
}

template <FloatElement T, std::size_t R>
CudaTensor<T, R> linear_backward_input(const CudaTensor<T, R>& dy, const CudaTensor<T, 2>& w) {
  const Extent out = dy.extent(R - 1), in = w.extent(1), rows = detail::leading_rows(dy.shape());
  detail::check(w.extent(0) == out, "linear_backward_input", "dy ", to_string(dy.shape()), " and weight ",
                to_string(w.shape()), ": the weight must be [", out, ", in]");
  Shape<R> xs = dy.shape();
  xs[R - 1] = in;
  auto dx = CudaTensor<T, R>::uninitialized(xs);
  gemm<T>(false, false, T(1), dy.data(), w.data(), T(0), dx.data(), rows, in, out, std::max<Extent>(1, out),
          std::max<Extent>(1, in), std::max<Extent>(1, in));
  return dx;
}

template <FloatElement T, std::size_t R>
void linear_backward_weight(const CudaTensor<T, R>& x, const CudaTensor<T, R>& dy, CudaTensor<T, 2>& dw,
                            CudaTensor<T, 1>* dbias = nullptr, bool accumulate = false) {
  const Extent in = x.extent(R - 1), out = dy.extent(R - 1), rows = detail::leading_rows(x.shape());
  detail::check(detail::leading_rows(dy.shape()) == rows && dw.extent(0) == out && dw.extent(1) == in,
                "linear_backward_weight", "x ", to_string(x.shape()), ", dy ", to_string(dy.shape()), " and dw ",
                to_string(dw.shape()), " do not match (dw must be [dy's last, x's last])");
  gemm<T>(true, false, T(1), dy.data(), x.data(), accumulate ? T(1) : T(0), dw.data(), out, in, rows,
          std::max<Extent>(1, out), std::max<Extent>(1, in), std::max<Extent>(1, in));
  if (dbias) bias_grad_into(*dbias, dy, accumulate);
}

}  // namespace dtensor::kernels::cuda
