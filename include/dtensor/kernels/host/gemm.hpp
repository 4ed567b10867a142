// dtensor/kernels/host/gemm.hpp — row-major GEMM on host memory: CBLAS when built with it,
// else a cache-blocked portable loop.
//
//   // C[m,n] = alpha * op(A) * op(B) + beta * C;  op(A) is [m,k], op(B) is [k,n]
//   gemm(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc);
//   detail::gemm_portable(...)            // the loop, also with DTENSOR_HAS_CBLAS (tests, bench)
//   set_blas_threads(4);                  // threads of the BLAS library (default: 1)
//
// Storage is row-major: without trans_a, A holds op(A) = [m,k] with row pitch lda >= k; with
// trans_a it holds [k,m] with lda >= m (likewise B). As in BLAS, beta == 0 means C is not read
// (NaN in C does not leak) and alpha == 0 or k == 0 only scales C.
//
// Backends: with DTENSOR_HAS_CBLAS (target dtensor::blas) float and double go to
// cblas_sgemm/cblas_dgemm. bfloat16 runs dtensor's bf16 kernels (gemm_bf16.hpp: AMX tiles or
// AVX512-BF16, fp32 sums), chosen by the CPU's features (bf16_gemm_kernel(), blas_core.hpp);
// without them it is widened to float, multiplied in float (sgemm), and rounded once.
// The portable loop has a fixed order, so it is deterministic; OpenBLAS with one thread is too.
//
// Threads: ranks of the threads backend are threads of one process, each calling GEMM on its
// shard, so the BLAS library's own thread pool would oversubscribe the cores. The first CBLAS
// call therefore sets the BLAS library to one thread, unless set_blas_threads() was called
// before (or DTENSOR_BLAS_THREADS in the environment names another count). set_blas_threads reaches OpenBLAS through openblas_set_num_threads, declared as a weak
// symbol (GCC/Clang on ELF): when the linked BLAS is not OpenBLAS the symbol is null and the call
// reports false (set OPENBLAS_NUM_THREADS / MKL_NUM_THREADS in the environment instead).
//
// Intra-op threads (parallel.hpp, train_gpt --intra-op-threads) with a one-thread BLAS: a large
// float or double GEMM is split over the calling rank's pool, one single-threaded BLAS call per
// block of C's rows (op(B) is packed again by each block). Each element of C is still one BLAS sum
// over all of k in the same order, so the bits do not depend on the thread count
// (tests/unit/test_kernels_host_gemm.cpp; examples/test_intra_op.sh).
// Where the BLAS has threads of its own (set_blas_threads(n > 1), DTENSOR_BLAS_THREADS) it splits
// the GEMM itself and the pool is not used: OpenBLAS's idle workers spin with sched_yield for
// 2^28 cycles after each call (OPENBLAS_THREAD_TIMEOUT), beside the pool's (docs/benchmarks.md).
//
// Kernels: the same first call makes OpenBLAS run the widest kernels the CPU's features allow
// when it chose narrower ones by the CPU's model number (blas_core.hpp; DTENSOR_BLAS_CORETYPE or
// OPENBLAS_CORETYPE pin them).
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <type_traits>
#include <vector>

#include "dtensor/core/parse.hpp"
#include "dtensor/kernels/host/blas_core.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/gemm_bf16.hpp"
#include "dtensor/kernels/host/parallel.hpp"

#ifdef DTENSOR_HAS_CBLAS
#include <cblas.h>
#if (defined(__GNUC__) || defined(__clang__)) && defined(__ELF__)
#define DTENSOR_DETAIL_WEAK_OPENBLAS 1
extern "C" void openblas_set_num_threads(int) __attribute__((weak));
#endif
#endif

namespace dtensor::kernels::host {

namespace detail {

inline std::atomic<bool>& blas_threads_chosen() {
  static std::atomic<bool> chosen{false};
  return chosen;
}

/// The BLAS library's threads as dtensor last set them (1 until then): above 1 the BLAS splits a
/// GEMM itself and gemm() does not split it over the intra-op pool.
inline std::atomic<int>& blas_thread_count() {
  static std::atomic<int> n{1};
  return n;
}

inline bool set_blas_threads_raw(int n) {
  blas_thread_count().store(n);
#ifdef DTENSOR_DETAIL_WEAK_OPENBLAS
  if (&openblas_set_num_threads != nullptr) {
    openblas_set_num_threads(n);
    return true;
  }
#endif
  return false;
}

/// The most BLAS threads DTENSOR_BLAS_THREADS may ask for (per rank).
inline constexpr int max_blas_threads = 4096;

/// DTENSOR_BLAS_THREADS=n: a per-rank BLAS pool where cores outnumber ranks (docs/host-kernels.md);
/// 1 when unset. A value that is not a whole number in 1 .. max_blas_threads ("4x", "0", "1e3",
/// "") is an Error naming the variable: atoi read "4x" as 4 and "abc" as 1 without a word.
inline int blas_threads_from_env() {
  const char* text = std::getenv("DTENSOR_BLAS_THREADS");
  if (!text) return 1;
  const auto n = parse_integer<int>(text);
  if (!n || *n < 1 || *n > max_blas_threads)
    throw Error("DTENSOR_BLAS_THREADS", dtensor::detail::cat("'", text, "' is not a whole number of threads in 1 .. ",
                                                             max_blas_threads));
  return *n;
}

/// Before the first CBLAS call, once: the kernels by CPU features (blas_core.hpp), then the
/// one-thread default (or DTENSOR_BLAS_THREADS).
inline void blas_default_threads_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    (void)blas_kernels();
    if (blas_threads_chosen().load()) return;
    set_blas_threads_raw(blas_threads_from_env());
  });
}

}  // namespace detail

/// True when GEMMs go through CBLAS (built with dtensor::blas).
constexpr bool has_cblas() {
#ifdef DTENSOR_HAS_CBLAS
  return true;
#else
  return false;
#endif
}

/// Sets the number of threads of the BLAS library (process-wide). Returns whether it took effect:
/// false without CBLAS or when the BLAS is not OpenBLAS.
inline bool set_blas_threads(int n) {
  detail::check(n >= 1, "set_blas_threads", "thread count must be >= 1, got ", n);
  detail::blas_threads_chosen().store(true);
  return detail::set_blas_threads_raw(n);
}

namespace detail {

// Register blocking of the micro-kernel: MR rows of op(A) times NR columns of op(B), kept in an
// MR x NR accumulator that the compiler holds in vector registers (NR spans 32 bytes).
template <class T>
struct GemmBlocking {
  static constexpr Extent MR = 4;
  static constexpr Extent NR = 32 / Extent(sizeof(T));
  static constexpr Extent KC = 256;  // a KC x NR panel of B stays in L1
  static constexpr Extent MC = 64;   // an MC x KC block of A stays in L2
  static constexpr Extent NC = 1024; // a KC x NC block of B stays in L2/L3
};

/// C = beta * C over an m x n block (beta == 0 writes zeros without reading C).
template <class T>
void scale_matrix(T* C, Extent m, Extent n, Extent ldc, T beta) {
  if (beta == T(1)) return;
  for (Extent i = 0; i < m; ++i) {
    T* c = C + i * ldc;
    if (beta == T(0)) std::fill_n(c, n, T(0));
    else
      for (Extent j = 0; j < n; ++j) c[j] *= beta;
  }
}

/// Packs op(A)[i0:i0+mc, p0:p0+kc] into MR-row panels, each stored [kc][MR], zero-padded.
template <class T>
void pack_a(bool trans, const T* A, Extent lda, Extent i0, Extent p0, Extent mc, Extent kc, T* out) {
  constexpr Extent MR = GemmBlocking<T>::MR;
  for (Extent ib = 0; ib < mc; ib += MR) {
    const Extent rows = std::min(MR, mc - ib);
    for (Extent p = 0; p < kc; ++p) {
      for (Extent r = 0; r < rows; ++r) {
        const Extent i = i0 + ib + r, q = p0 + p;
        out[p * MR + r] = trans ? A[q * lda + i] : A[i * lda + q];
      }
      for (Extent r = rows; r < MR; ++r) out[p * MR + r] = T(0);
    }
    out += kc * MR;
  }
}

/// Packs op(B)[p0:p0+kc, j0:j0+nc] into NR-column panels, each stored [kc][NR], zero-padded.
template <class T>
void pack_b(bool trans, const T* B, Extent ldb, Extent p0, Extent j0, Extent kc, Extent nc, T* out) {
  constexpr Extent NR = GemmBlocking<T>::NR;
  for (Extent jb = 0; jb < nc; jb += NR) {
    const Extent cols = std::min(NR, nc - jb);
    for (Extent p = 0; p < kc; ++p) {
      const Extent q = p0 + p;
      for (Extent c = 0; c < cols; ++c) {
        const Extent j = j0 + jb + c;
        out[p * NR + c] = trans ? B[j * ldb + q] : B[q * ldb + j];
      }
      for (Extent c = cols; c < NR; ++c) out[p * NR + c] = T(0);
    }
    out += kc * NR;
  }
}

/// C[rows, cols] += alpha * Ap[kc][MR] * Bp[kc][NR] (rows <= MR, cols <= NR).
template <class T>
inline void micro_kernel(Extent kc, const T* __restrict Ap, const T* __restrict Bp, T alpha, T* C, Extent ldc,
                         Extent rows, Extent cols) {
  constexpr Extent MR = GemmBlocking<T>::MR, NR = GemmBlocking<T>::NR;
  T acc[MR][NR] = {};
  for (Extent p = 0; p < kc; ++p) {
    const T* a = Ap + p * MR;
    const T* b = Bp + p * NR;
    for (Extent r = 0; r < MR; ++r)
      for (Extent c = 0; c < NR; ++c) acc[r][c] += a[r] * b[c];
  }
  for (Extent r = 0; r < rows; ++r)
    for (Extent c = 0; c < cols; ++c) C[r * ldc + c] += alpha * acc[r][c];
}

/// The portable GEMM (float or double): Goto-style blocking, packed panels, fixed loop order.
template <class T>
  requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
void gemm_portable(bool trans_a, bool trans_b, T alpha, const T* A, const T* B, T beta, T* C, Extent m, Extent n,
                   Extent k, Extent lda, Extent ldb, Extent ldc) {
  using Bk = GemmBlocking<T>;
  if (m == 0 || n == 0) return;
  scale_matrix(C, m, n, ldc, beta);
  if (k == 0 || alpha == T(0)) return;
  // One packing buffer per thread, reused across calls (ranks are threads; no sharing).
  thread_local std::vector<T> a_pack, b_pack;
  a_pack.resize(std::size_t(Bk::MC + Bk::MR) * Bk::KC);
  b_pack.resize(std::size_t(Bk::NC + Bk::NR) * Bk::KC);
  for (Extent j0 = 0; j0 < n; j0 += Bk::NC) {
    const Extent nc = std::min(Bk::NC, n - j0);
    for (Extent p0 = 0; p0 < k; p0 += Bk::KC) {
      const Extent kc = std::min(Bk::KC, k - p0);
      pack_b(trans_b, B, ldb, p0, j0, kc, nc, b_pack.data());
      for (Extent i0 = 0; i0 < m; i0 += Bk::MC) {
        const Extent mc = std::min(Bk::MC, m - i0);
        pack_a(trans_a, A, lda, i0, p0, mc, kc, a_pack.data());
        for (Extent jb = 0; jb < nc; jb += Bk::NR)
          for (Extent ib = 0; ib < mc; ib += Bk::MR)
            micro_kernel<T>(kc, a_pack.data() + ib * kc, b_pack.data() + jb * kc, alpha,
                            C + (i0 + ib) * ldc + (j0 + jb), ldc, std::min(Bk::MR, mc - ib),
                            std::min(Bk::NR, nc - jb));
      }
    }
  }
}

template <class T>
void check_gemm_args(bool trans_a, bool trans_b, const T* A, const T* B, const T* C, Extent m, Extent n, Extent k,
                     Extent lda, Extent ldb, Extent ldc) {
  check(m >= 0 && n >= 0 && k >= 0, "gemm", "negative size m=", m, " n=", n, " k=", k);
  const Extent a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  check(lda >= std::max<Extent>(1, a_cols) && ldb >= std::max<Extent>(1, b_cols) && ldc >= std::max<Extent>(1, n),
        "gemm", "leading dimensions too small: m=", m, " n=", n, " k=", k, " trans_a=", trans_a,
        " trans_b=", trans_b, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
  check((m * n == 0 || C) && (m * n * k == 0 || (A && B)), "gemm", "null pointer for a non-empty operand");
}

}  // namespace detail

template <FloatElement T>
void gemm(bool trans_a, bool trans_b, T alpha, const T* A, const T* B, T beta, T* C, Extent m, Extent n, Extent k,
          Extent lda, Extent ldb, Extent ldc);

namespace detail {

/// gemm<bfloat16> where the CPU has no bf16 dot products: A and B widened to float (dense, no
/// pitch), one float GEMM, C rounded once.
inline void gemm_bf16_widen(bool trans_a, bool trans_b, bfloat16 alpha, const bfloat16* A, const bfloat16* B,
                            bfloat16 beta, bfloat16* C, Extent m, Extent n, Extent k, Extent lda, Extent ldb,
                            Extent ldc) {
  std::vector<float> a(std::size_t(m * k)), b(std::size_t(k * n)), c(std::size_t(m * n));
  const Extent ar = trans_a ? k : m, ac = trans_a ? m : k, br = trans_b ? n : k, bc = trans_b ? k : n;
  for (Extent i = 0; i < ar; ++i)
    for (Extent j = 0; j < ac; ++j) a[std::size_t(i * ac + j)] = float(A[i * lda + j]);
  for (Extent i = 0; i < br; ++i)
    for (Extent j = 0; j < bc; ++j) b[std::size_t(i * bc + j)] = float(B[i * ldb + j]);
  const bool read_c = float(beta) != 0.f;
  for (Extent i = 0; i < m; ++i)
    for (Extent j = 0; j < n; ++j) c[std::size_t(i * n + j)] = read_c ? float(C[i * ldc + j]) : 0.f;
  gemm<float>(trans_a, trans_b, float(alpha), a.data(), b.data(), float(beta), c.data(), m, n, k,
              std::max<Extent>(1, ac), std::max<Extent>(1, bc), std::max<Extent>(1, n));
  for (Extent i = 0; i < m; ++i)
    for (Extent j = 0; j < n; ++j) C[i * ldc + j] = bfloat16(c[std::size_t(i * n + j)]);
}

#ifdef DTENSOR_HAS_CBLAS
/// One CBLAS call (float or double), the sizes already checked.
template <class T>
void cblas_gemm(bool trans_a, bool trans_b, T alpha, const T* A, const T* B, T beta, T* C, Extent m, Extent n, Extent k,
                Extent lda, Extent ldb, Extent ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
  else cblas_dgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

/// The least m * n * k per block of a GEMM split over the intra-op pool (a few tens of
/// microseconds: well above a worker's wake-up), and the least rows per block, both before
/// parallel_for rounds the block bounds up to multiples of split_block_align (so a last block may
/// hold fewer, but at least 96 - 47 rows: 200 rows split 144 + 56). The margins keep every block on
/// OpenBLAS's general path when the whole GEMM is on it: its small-matrix and "direct" kernels,
/// taken below about 10^6 multiply-adds or for up to 16 rows, sum in other orders.
inline constexpr double min_split_block_work = 4e6;
inline constexpr Extent min_split_block_extent = 96;
/// Where a block of C's rows may begin. A row-major C is OpenBLAS's column-major C^T, so C's rows
/// are the columns (N) of its driver, which hands them to the micro-kernel in chunks of 3, 2 or 1
/// times the kernel's N unroll counted from the first (12 for Haswell's and Zen's sgemm, 24 for
/// their dgemm, 12 and 6 on SkylakeX and Cooperlake), and the last columns of a chunk that is not
/// whole are summed by other code, in another order. A block that begins at a multiple of 48 is cut
/// into the same chunks as the whole GEMM. C's columns are never split: they are the driver's M,
/// which it blocks from sizes that depend on all of M (a halving rule around GEMM_P), so no fixed
/// alignment keeps a column block's tiles where the whole GEMM has them. Measured on a Zen 3 with
/// Debian's OpenBLAS 0.3.21: rows split at 512 of a 1024 x 512 x 128 sgemm changed 12,953 of its
/// elements, at any multiple of 12 none; columns split at 528 of 333 x 1025 x 97 changed some.
inline constexpr Extent split_block_align = 48;

/// gemm over the calling thread's intra-op pool (see the synopsis); false where it does not split
/// (one thread, a threaded BLAS, a small GEMM, inside a parallel region), having done nothing.
template <class T>
bool cblas_gemm_split(bool trans_a, bool trans_b, T alpha, const T* A, const T* B, T beta, T* C, Extent m, Extent n,
                      Extent k, Extent lda, Extent ldb, Extent ldc) {
  const int threads = intra_op_threads();
  if (threads < 2 || in_parallel_region || blas_thread_count().load(std::memory_order_relaxed) != 1) return false;
  const Extent blocks = std::min<Extent>(threads, m / min_split_block_extent);
  if (blocks < 2 || double(m) * double(n) * double(k) / double(blocks) < min_split_block_work) return false;
  parallel_for(
      m, m / blocks,
      [&](Extent b0, Extent b1) {
        cblas_gemm(trans_a, trans_b, alpha, trans_a ? A + b0 : A + b0 * lda, B, beta, C + b0 * ldc, b1 - b0, n, k, lda,
                   ldb, ldc);
      },
      split_block_align);
  return true;
}
#endif

}  // namespace detail

/// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, row-major (see the synopsis).
template <FloatElement T>
void gemm(bool trans_a, bool trans_b, T alpha, const T* A, const T* B, T beta, T* C, Extent m, Extent n, Extent k,
          Extent lda, Extent ldb, Extent ldc) {
  detail::check_gemm_args(trans_a, trans_b, A, B, C, m, n, k, lda, ldb, ldc);
  if constexpr (std::is_same_v<T, bfloat16>) {
    switch (bf16_gemm_kernel()) {
#if DTENSOR_HOST_MULTI_ISA
      case Bf16Gemm::amx:
        return detail::gemm_bf16_amx(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc);
      case Bf16Gemm::avx512_bf16:
        return detail::gemm_bf16_avx512(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc);
#endif
      default:
        return detail::gemm_bf16_widen(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc);
    }
  } else {
#ifdef DTENSOR_HAS_CBLAS
    if (m == 0 || n == 0) return;
    if (k == 0 || alpha == T(0)) return detail::scale_matrix(C, m, n, ldc, beta);
    detail::check(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
                  "gemm", "sizes exceed the 32-bit BLAS interface: m=", m, " n=", n, " k=", k);
    detail::blas_default_threads_once();
    if (!detail::cblas_gemm_split(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc))
      detail::cblas_gemm(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc);
#else
    detail::gemm_portable(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc);
#endif
  }
}

}  // namespace dtensor::kernels::host
