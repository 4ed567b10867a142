// dtensor/kernels/cuda/gemm_fp8.cuh — the FP8 GEMM on the GPU through cuBLASLt (sm_89/sm_90
// tensor cores), and the device's satfinite FP8 cast; the host twin is kernels/host/gemm_fp8.hpp.
//
//   // C[m,n] = *a_scale_inv * *b_scale_inv * A[m,k] B[n,k]^T   (device pointers, row-major)
//   kernels::cuda::gemm_fp8(qa, a_scale_inv, qb, b_scale_inv, c, m, n, k, lda, ldb, ldc);
//   kernels::cuda::quantize(x, n, scale, q);       // q = F8(x * scale), x float (device)
//
// The call: cublasLtMatmul with A and B CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2 (not both E5M2),
// CUBLAS_COMPUTE_32F, scale type fp32, the inverse scales as CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER
// (device floats, read when the GEMM runs: a delayed-scaling step needs no host round trip; a
// scale not 16-byte aligned is first copied to an aligned slot, as cuBLASLt refuses it otherwise),
// output fp32 or bf16 (C of the same type; accumulate adds C with beta = 1), fast accumulation
// off (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0: the tensor core's partial sums are promoted to fp32;
// within each promotion interval Hopper adds with ~14 mantissa bits, so the host emulation's fp32
// accumulation matches it to ~1e-2, not bit for bit: docs/fp8.md).
//
// Layout: cuBLASLt's FP8 GEMMs on Hopper take only the "TN" form — in row-major terms both
// operands k-contiguous, C = A B^T with A [m,k] and B [n,k] — and need k, lda and ldb multiples
// of 16 and 16-byte aligned pointers: checked here (an Error naming the extents), not
// transposed behind the caller's back (Transformer Engine keeps transposed FP8 copies for the
// backward GEMMs; the Linear forward x W^T is already this form). Row-major C = A B^T is the
// column-major C^T = B A^T: the call passes B as cuBLASLt's A (op T) and A as its B (op N).
//
// A GPU before sm_89 has no FP8 tensor cores: cuBLASLt answers CUBLAS_STATUS_NOT_SUPPORTED,
// which comes back as an Error with that name. Not wired into ops/nn yet (docs/fp8.md).
#pragma once

#include <cublasLt.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "dtensor/core/float8.hpp"
#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/cuda/gemm.cuh"  // check_int_sizes
#include "dtensor/kernels/cuda/profile.cuh"
#include "dtensor/kernels/host/gemm.hpp"      // check_gemm_args
#include "dtensor/kernels/host/gemm_fp8.hpp"  // Fp8Element

namespace dtensor::kernels::cuda {

namespace detail {

template <class F8>
inline constexpr cudaDataType_t fp8_type = std::is_same_v<F8, float8_e4m3> ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
template <class F8>
inline constexpr __nv_fp8_interpretation_t fp8_interpretation = std::is_same_v<F8, float8_e4m3> ? __NV_E4M3 : __NV_E5M2;

/// This thread's cuBLASLt handle (one per thread and device, as blas()).
inline cublasLtHandle_t blas_lt() {
  return per_thread_device(
      [] {
        cublasLtHandle_t made = nullptr;
        DTENSOR_CUBLAS_CHECK(cublasLtCreate(&made));
        return made;
      },
      [](cublasLtHandle_t old) { cublasLtDestroy(old); });
}

/// A cuBLASLt workspace of this thread and device (32 MiB, NVIDIA's recommendation for Hopper).
inline constexpr std::size_t lt_workspace_bytes = std::size_t(32) << 20;
inline void* lt_workspace() {
  return per_thread_device(
      [] {
        void* made = nullptr;
        DTENSOR_CUDA_CHECK(cudaMalloc(&made, lt_workspace_bytes));
        return made;
      },
      [](void* old) { cudaFree(old); });
}

/// 16-byte aligned device slots for the two scales, when the caller's pointers are not (a scale
/// is often one element of a small tensor: `scales.data() + 1`); per thread and device.
inline float* lt_scale_slots() {
  return per_thread_device(
      [] {
        void* made = nullptr;
        DTENSOR_CUDA_CHECK(cudaMalloc(&made, 256));
        return static_cast<float*>(made);
      },
      [](float* old) { cudaFree(old); });
}

/// Owns the descriptors of one call (destroyed on every path, errors included).
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <class F8, class T>
__global__ void quantize_kernel(const T* x, std::size_t n, float scale, std::uint8_t* out) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __nv_cvt_float_to_fp8(float(x[i]) * scale, __NV_SATFINITE, fp8_interpretation<F8>);
}

/// The tile of quantize_padded_kernel: 32 x 32 values through shared memory, so that both the
/// reads (rows of the source) and the writes (rows of the destination) are coalesced when the
/// destination is the source transposed.
inline constexpr unsigned fp8_tile = 32, fp8_tile_rows = 8;

/// out [rows_pad, cols_pad] (pitch cols_pad) = F8(x' * scale) where x' [rows, cols] is x (pitch ld)
/// or, when transposed, x^T (x [cols, rows]); zeros outside [rows, cols] (a padded FP8 operand
/// adds nothing to the GEMM's sums). Block (32, 8), grid over 32 x 32 tiles of out.
template <class F8, class T>
__global__ void quantize_padded_kernel(const T* x, Extent ld, Extent rows, Extent cols, bool transposed, float scale,
                                       std::uint8_t* out, Extent rows_pad, Extent cols_pad) {
  __shared__ float tile[fp8_tile][fp8_tile + 1];
  const Extent i0 = Extent(blockIdx.y) * fp8_tile, j0 = Extent(blockIdx.x) * fp8_tile;
  for (unsigned r = threadIdx.y; r < fp8_tile; r += fp8_tile_rows) {
    // Read: x's row-major order, consecutive threads on consecutive addresses.
    if (!transposed) {
      const Extent i = i0 + r, j = j0 + threadIdx.x;
      tile[r][threadIdx.x] = i < rows && j < cols ? float(x[i * ld + j]) : 0.f;
    } else {
      const Extent j = j0 + r, i = i0 + threadIdx.x;  // x [cols, rows]: its row j holds column j of x'
      tile[threadIdx.x][r] = i < rows && j < cols ? float(x[j * ld + i]) : 0.f;
    }
  }
  __syncthreads();
  for (unsigned r = threadIdx.y; r < fp8_tile; r += fp8_tile_rows) {
    const Extent i = i0 + r, j = j0 + threadIdx.x;
    if (i < rows_pad && j < cols_pad)
      out[i * cols_pad + j] =
          __nv_cvt_float_to_fp8(tile[r][threadIdx.x] * scale, __NV_SATFINITE, fp8_interpretation<F8>);
  }
}

/// partial[b] = max |x| over block b's grid-stride slice, a NaN as +inf (so that max keeps it).
template <class T>
__global__ void amax_kernel(float* partial, const T* x, Extent n) {
  double m = 0;
  for (Extent i = gidx(); i < n; i += gstride()) {
    const float a = fabsf(float(x[i]));
    m = fmax(m, isnan(a) ? double(INFINITY) : double(a));
  }
  m = block_max(m);
  if (threadIdx.x == 0) partial[blockIdx.x] = float(m);
}
inline constexpr unsigned amax_blocks = 256;
__global__ inline void max_partials_kernel(float* out, const float* partial, unsigned count) {
  const double m = block_max(threadIdx.x < count ? double(partial[threadIdx.x]) : 0.0);
  if (threadIdx.x == 0) *out = float(m);
}
__global__ inline void store_inverse_scales_kernel(float* out, float a_scale_inv, float b_scale_inv) {
  out[0] = a_scale_inv;
  out[4] = b_scale_inv;  // 16 bytes apart: cuBLASLt wants each scale pointer 16-byte aligned
}

inline Extent round_up(Extent x, Extent to) { return (x + to - 1) / to * to; }

}  // namespace detail

/// q[i] = F8(x[i] * scale) on the device (cvt.rn.satfinite, the host's float8 conversion bit for bit).
template <host::Fp8Element F8, class T>
  requires(std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, double>)
void quantize(const T* x, Extent n, float scale, F8* q) {
  detail::check(n >= 0 && (n == 0 || (x && q)), "cuda::quantize", "n=", n, " with a null pointer or a negative count");
  detail::check(std::isfinite(scale) && scale > 0, "cuda::quantize", "scale ", scale, " is not finite and > 0");
  if (n == 0) return;
  detail::quantize_kernel<F8, T><<<detail::grid_for(n), detail::block, 0, detail::stream()>>>(
      x, std::size_t(n), scale, reinterpret_cast<std::uint8_t*>(q));
  detail::launched("cuda::quantize");
}

/// max |x[i]| over n device values (0 for none), a NaN as +inf: the host's kernels::host::amax with
/// its NaN widened, as the FP8 recipe reads it (nn/fp8_recipe.hpp). Waits for the result (a host
/// value: the delayed-scaling history is kept on the host).
template <class T>
  requires(std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, double>)
float amax(const T* x, Extent n) {
  detail::check(n >= 0 && (n == 0 || x), "cuda::amax", "n=", n, " with a null pointer or a negative count");
  if (n == 0) return 0.f;
  static_assert(detail::amax_blocks <= detail::block, "one block takes the partial maxima");
  CudaTensor<float, 1> partial(Shape<1>{detail::amax_blocks}), total(Shape<1>{1});
  detail::amax_kernel<<<detail::amax_blocks, detail::block, 0, detail::stream()>>>(partial.data(), x, n);
  detail::launched("cuda::amax");
  detail::max_partials_kernel<<<1, detail::block, 0, detail::stream()>>>(total.data(), partial.data(),
                                                                         detail::amax_blocks);
  detail::launched("cuda::amax (partials)");
  return to_space<host_space>(total)[0];
}

/// C[m,n] = *a_scale_inv * *b_scale_inv * A B^T (+ C when accumulate): A [m,k], B [n,k] FP8 row-major
/// with pitches lda, ldb; C fp32 or bf16 with pitch ldc; the scales device pointers (see the synopsis).
template <host::Fp8Element FA, host::Fp8Element FB, class TC>
  requires(std::is_same_v<TC, float> || std::is_same_v<TC, bfloat16>)
void gemm_fp8(const FA* A, const float* a_scale_inv, const FB* B, const float* b_scale_inv, TC* C, Extent m, Extent n,
              Extent k, Extent lda, Extent ldb, Extent ldc, bool accumulate = false) {
  const detail::ProfiledKernel profiled(KernelClass::gemm);
  static_assert(!(std::is_same_v<FA, float8_e5m2> && std::is_same_v<FB, float8_e5m2>),
                "cuBLASLt has no E5M2 x E5M2 GEMM (HYBRID: one operand E4M3)");
  const auto bytes = [](const auto* p) { return static_cast<const void*>(p); };
  host::detail::check_gemm_args<const void>(false, true, bytes(A), bytes(B), bytes(C), m, n, k, lda, ldb, ldc);
  const auto aligned = [](const void* p) { return detail::alignment_of(p) >= 16; };
  detail::check(k > 0 && k % 16 == 0 && lda % 16 == 0 && ldb % 16 == 0 && aligned(A) && aligned(B), "cuda::gemm_fp8",
                "cuBLASLt's FP8 GEMM needs k > 0 and k, lda, ldb multiples of 16 and 16-byte aligned A, B: m=", m,
                " n=", n, " k=", k, " lda=", lda, " ldb=", ldb);
  // C's rows 16-byte aligned as well: cuBLASLt's heuristic refuses an FP8 GEMM otherwise
  // (CUBLAS_STATUS_NOT_SUPPORTED for n = 17 in fp32, seen on an H200).
  detail::check(std::size_t(ldc) * sizeof(TC) % 16 == 0 && aligned(C), "cuda::gemm_fp8",
                "cuBLASLt's FP8 GEMM needs C's rows 16-byte aligned (ldc a multiple of ", 16 / sizeof(TC),
                " elements) and C 16-byte aligned: m=", m, " n=", n, " k=", k, " ldc=", ldc);
  detail::check(a_scale_inv && b_scale_inv, "cuda::gemm_fp8", "null scale pointer (m=", m, " n=", n, " k=", k, ")");
  if (m == 0 || n == 0) return;
  // cuBLASLt refuses misaligned scale pointers at cublasLtMatmul (CUBLAS_STATUS_NOT_SUPPORTED for
  // every shape on an H200 with a scale at `scales.data() + 1`): such scales are copied, in stream
  // order, into aligned slots first.
  if (!aligned(a_scale_inv) || !aligned(b_scale_inv)) {
    float* slots = detail::lt_scale_slots();
    DTENSOR_CUDA_CHECK(cudaMemcpyAsync(slots, a_scale_inv, sizeof(float), cudaMemcpyDeviceToDevice, detail::stream()));
    DTENSOR_CUDA_CHECK(
        cudaMemcpyAsync(slots + 4, b_scale_inv, sizeof(float), cudaMemcpyDeviceToDevice, detail::stream()));
    a_scale_inv = slots;
    b_scale_inv = slots + 4;
  }
  detail::check_int_sizes("cuda::gemm_fp8", m, n, k, lda, ldb, ldc);
  constexpr cudaDataType_t c_type = std::is_same_v<TC, float> ? CUDA_R_32F : CUDA_R_16BF;
  detail::LtDescs d;
  DTENSOR_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  const std::int8_t fast_accum = 0;
  // cuBLASLt's A is our B (its scale b_scale_inv), its B our A.
  DTENSOR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  DTENSOR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  DTENSOR_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof(b_scale_inv)));
  DTENSOR_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof(a_scale_inv)));
  DTENSOR_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)));
  // Column-major: cuBLASLt's A = B^T stored [k rows, n cols] (ld ldb), its B = A^T [k, m] (ld lda),
  // C^T [n, m] (ld ldc).
  DTENSOR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, detail::fp8_type<FB>, std::uint64_t(k), std::uint64_t(n), ldb));
  DTENSOR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, detail::fp8_type<FA>, std::uint64_t(k), std::uint64_t(m), lda));
  DTENSOR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, c_type, std::uint64_t(n), std::uint64_t(m), ldc));
  DTENSOR_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const std::size_t ws = detail::lt_workspace_bytes;
  DTENSOR_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The buffers' actual alignment (as PyTorch's cuBLASLt calls state it): the heuristic otherwise
  // assumes 256 bytes and may pick an algorithm that cublasLtMatmul then refuses for these
  // pointers (CUBLAS_STATUS_NOT_SUPPORTED, seen on an H200).
  const std::uint32_t align_a = detail::alignment_of(B), align_b = detail::alignment_of(A),
                      align_c = detail::alignment_of(C);  // cuBLASLt's A is our B
  DTENSOR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                            &align_a, sizeof(align_a)));
  DTENSOR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                            &align_b, sizeof(align_b)));
  DTENSOR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                            &align_c, sizeof(align_c)));
  DTENSOR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                            &align_c, sizeof(align_c)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const auto lt = detail::blas_lt();
  DTENSOR_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found));
  detail::check(found > 0, "cuda::gemm_fp8", "cuBLASLt found no FP8 algorithm for m=", m, " n=", n, " k=", k);
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  DTENSOR_CUBLAS_CHECK(cublasLtMatmul(lt, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c, &heuristic.algo,
                                      detail::lt_workspace(), ws, detail::stream()));
}

/// The twin of host::gemm_fp8_quantizing on device pointers: c [m, n] (dense) = op(a) op(b), a
/// [ra, ca] quantized to FA by sa and b [rb, cb] to FB by sb, then cuBLASLt's FP8 GEMM with the
/// inverse scales. Any of the three forms a Linear needs (y = x W^T; dx = dy W; dW = dy^T x) and
/// any extents: the operands are quantized into the TN form gemm_fp8 takes, transposed on the way
/// where op transposes (what Transformer Engine's transposed FP8 copies are), k padded with zeros to
/// a multiple of 16 and C's rows to 16 bytes (zeros add nothing: the sums are the unpadded ones),
/// the padded C copied out. T float or bfloat16 (the GEMM's output type); double is refused (the
/// tensor cores' output is fp32 at most). Stream-ordered: no host synchronisation.
template <host::Fp8Element FA, host::Fp8Element FB, class T>
void gemm_fp8_quantizing(bool trans_a, bool trans_b, const T* a, Extent ra, Extent ca, float sa, const T* b, Extent rb,
                         Extent cb, float sb, T* c) {
  const detail::ProfiledKernel profiled(KernelClass::gemm);
  if constexpr (!(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>)) {
    (void)trans_a, (void)trans_b, (void)a, (void)sa, (void)b, (void)sb, (void)c;
    throw Error("cuda::gemm_fp8_quantizing", "FP8 GEMMs on the GPU output float or bfloat16, not double (a [" +
                                                 std::to_string(ra) + ", " + std::to_string(ca) + "], b [" +
                                                 std::to_string(rb) + ", " + std::to_string(cb) + "])");
  } else {
    const Extent m = trans_a ? ca : ra, k = trans_a ? ra : ca, n = trans_b ? rb : cb;
    detail::check((trans_b ? cb : rb) == k && ra >= 0 && ca >= 0 && rb >= 0 && cb >= 0, "cuda::gemm_fp8_quantizing",
                  "op(a) [", m, ", ", k, "] and op(b) [", (trans_b ? cb : rb), ", ", n, "] do not multiply");
    detail::check(std::isfinite(sa) && sa > 0 && std::isfinite(sb) && sb > 0, "cuda::gemm_fp8_quantizing", "scales ",
                  sa, ", ", sb, " are not finite and > 0 (m=", m, " n=", n, " k=", k, ")");
    if (m == 0 || n == 0) return;
    const Extent kp = detail::round_up(std::max<Extent>(k, 1), 16), np = detail::round_up(n, 16 / Extent(sizeof(T)));
    CudaTensor<std::uint8_t, 1> qa(Shape<1>{m * kp}), qb(Shape<1>{np * kp});
    const auto quantize_into = [](auto f8, const T* x, Extent ld, Extent rows, Extent cols, bool transposed,
                                  float scale, std::uint8_t* out, Extent rows_pad, Extent cols_pad) {
      using F8 = decltype(f8);
      const dim3 grid(unsigned((cols_pad + detail::fp8_tile - 1) / detail::fp8_tile),
                      unsigned((rows_pad + detail::fp8_tile - 1) / detail::fp8_tile));
      detail::quantize_padded_kernel<F8, T>
          <<<grid, dim3(detail::fp8_tile, detail::fp8_tile_rows), 0, detail::stream()>>>(
              x, std::max<Extent>(ld, 1), rows, cols, transposed, scale, out, rows_pad, cols_pad);
      detail::launched("cuda::gemm_fp8_quantizing (quantize)");
    };
    // A' [m, kp] = op(a); B' [np, kp] = op(b)^T, both k-contiguous (the TN form).
    quantize_into(FA{}, a, ca, m, k, trans_a, sa, qa.data(), m, kp);
    quantize_into(FB{}, b, cb, n, k, !trans_b, sb, qb.data(), np, kp);
    CudaTensor<float, 1> inverse(Shape<1>{8});
    detail::store_inverse_scales_kernel<<<1, 1, 0, detail::stream()>>>(inverse.data(), 1.f / sa, 1.f / sb);
    detail::launched("cuda::gemm_fp8_quantizing (scales)");
    const auto* A = reinterpret_cast<const FA*>(qa.data());
    const auto* B = reinterpret_cast<const FB*>(qb.data());
    if (np == n && detail::alignment_of(c) >= 16) {
      gemm_fp8(A, inverse.data(), B, inverse.data() + 4, c, m, n, kp, kp, kp, n);
      return;
    }
    CudaTensor<T, 1> padded(Shape<1>{m * np});
    gemm_fp8(A, inverse.data(), B, inverse.data() + 4, padded.data(), m, np, kp, kp, kp, np);
    DTENSOR_CUDA_CHECK(cudaMemcpy2DAsync(c, std::size_t(n) * sizeof(T), padded.data(), std::size_t(np) * sizeof(T),
                                         std::size_t(n) * sizeof(T), std::size_t(m), cudaMemcpyDeviceToDevice,
                                         detail::stream()));
  }
}

}  // namespace dtensor::kernels::cuda
