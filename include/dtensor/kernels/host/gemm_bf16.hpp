// dtensor/kernels/host/gemm_bf16.hpp — bf16 x bf16 GEMMs with fp32 accumulation on x86 hosts:
// AMX tile dot products and AVX512-BF16 dot products (gemm<bfloat16> picks one, gemm.hpp).
//
//   // C[m,n] = alpha * op(A) * op(B) + beta * C, as gemm (gemm.hpp): row-major, pitches, transposes
//   detail::gemm_bf16_amx(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc);
//   detail::gemm_bf16_avx512(...);   // the same with _mm512_dpbf16_ps
//   bf16_gemm_kernel()               // which one gemm<bfloat16> runs (blas_core.hpp)
//
// Both sum each output in fp32 over k and round C to bf16 once, after alpha and beta
// (beta == 0 does not read C; alpha == 0 or k == 0 only scales C). The caller has checked the
// arguments and that the CPU (and, for AMX, the OS) runs the kernel: bf16_gemm_kernel().
//
// Layout (docs/host-kernels.md): op(A) is packed in panels of 16 rows by 32 k (one AMX A tile,
// 1 KiB: 16 rows of 32 consecutive k), op(B) in panels of 16 columns by 32 k in the VNNI layout
// (one AMX B tile: row q holds, for each of the 16 columns, the pair k = 2q, 2q+1 side by side —
// which is also the operand _mm512_dpbf16_ps takes). Sizes are padded with zeros to 32 rows, 32
// columns and 32 k, which adds nothing to the sums. Each output's sum runs over k in the same
// order whatever m, n and its position (no k blocking), so a row's values do not depend on how the
// rows were split over ranks. Loops: B is packed once per call for as many columns as fit
// kPackedBBytes (the models' weights fit whole), then op(A) 32 rows at a time, then a 32 x 32
// block of C per micro-kernel (AMX: four C tiles, two A tiles, two B tiles; AVX512: 8 rows x 32
// columns in 16 zmm registers). The packing is vector code writing each tile row with one 64-byte
// store, zeros included (no zero fill first): a tile row is a masked load (op(A) untransposed) or
// two rows of B interleaved (op(B) untransposed); transposed operands go through a 16 x 16
// transpose of 32-bit lanes (op(A): rows of A interleaved in pairs of k first; op(B): 16 rows of
// B's 32 k). Element by element, the packing was 13-18 % of the bf16 step.
//
// Threads: ranks are threads; each keeps its own packing buffers (thread_local) and loads its
// own tile configuration at each call (the configuration is per thread, and other code on the
// thread may load another), releasing the tiles at the end. A rank with intra-op threads
// (parallel.hpp: train_gpt --intra-op-threads N) splits C's 32-row blocks over them, each thread
// with its own A buffer and tile configuration; the same bits for any thread count. Other
// compilers and non-x86 targets compile no kernel (bf16_gemm_kernel() never picks one).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtensor/core/bfloat16.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/parallel.hpp"
#include "dtensor/kernels/host/simd.hpp"

#if DTENSOR_HOST_MULTI_ISA
#include <immintrin.h>
#endif

namespace dtensor::kernels::host::detail {

/// Elements of a packed panel: 16 rows (or VNNI pair rows) x 32 bf16 = one 1 KiB AMX tile.
inline constexpr Extent kBf16TileRows = 16, kBf16TileK = 32;
/// Rows and columns of C per micro-kernel call (sizes are padded to it).
inline constexpr Extent kBf16Block = 32;
/// The bytes of packed op(B) held at once: the models' weights ([384 x 1536] in bf16, 1.2 MB) fit whole.
inline constexpr Extent kPackedBBytes = Extent(4) << 20;

inline Extent round_up(Extent x, Extent to) { return (x + to - 1) / to * to; }

/// C = beta * C rounded to bf16 (beta == 0: zeros, C not read): alpha == 0 or k == 0.
inline void scale_bf16(bfloat16* C, Extent m, Extent n, Extent ldc, float beta) {
  for (Extent i = 0; i < m; ++i)
    for (Extent j = 0; j < n; ++j)
      C[i * ldc + j] = beta == 0.f ? bfloat16(0.f) : bfloat16(beta * float(C[i * ldc + j]));
}

/// The packing buffers of this thread: op(A)'s 32 rows and op(B)'s columns (reused across calls).
struct Bf16GemmBuffers {
  std::vector<std::uint16_t> a, b;
};
inline Bf16GemmBuffers& bf16_gemm_buffers() {
  thread_local Bf16GemmBuffers buffers;
  return buffers;
}

#if DTENSOR_HOST_MULTI_ISA

#define DTENSOR_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#define DTENSOR_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,amx-tile,amx-bf16")))

/// Transposes a 16 x 16 matrix of 32-bit lanes in place: rows[i] lane j <-> rows[j] lane i (four
/// rounds of two-register shuffles: 32-bit, 64-bit, then 128-bit lanes twice).
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline void transpose_16x16_epi32(__m512i rows[16]) {
  // The maskz_ forms with every lane set: GCC 12's plain ones pass an "undefined" vector that
  // -Wmaybe-uninitialized reports once inlined (as in store_bf16_row).
  constexpr __mmask16 all = 0xffff;
  constexpr __mmask8 all8 = 0xff;
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(all, rows[i], rows[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(all, rows[i], rows[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    rows[i] = _mm512_maskz_unpacklo_epi64(all8, t[i], t[i + 2]);
    rows[i + 1] = _mm512_maskz_unpackhi_epi64(all8, t[i], t[i + 2]);
    rows[i + 2] = _mm512_maskz_unpacklo_epi64(all8, t[i + 1], t[i + 3]);
    rows[i + 3] = _mm512_maskz_unpackhi_epi64(all8, t[i + 1], t[i + 3]);
  }
  for (int s = 0; s < 4; ++s) {
    t[s] = _mm512_maskz_shuffle_i32x4(all, rows[s], rows[4 + s], 0x88);
    t[4 + s] = _mm512_maskz_shuffle_i32x4(all, rows[s], rows[4 + s], 0xdd);
    t[8 + s] = _mm512_maskz_shuffle_i32x4(all, rows[8 + s], rows[12 + s], 0x88);
    t[12 + s] = _mm512_maskz_shuffle_i32x4(all, rows[8 + s], rows[12 + s], 0xdd);
  }
  for (int s = 0; s < 4; ++s) {
    rows[s] = _mm512_maskz_shuffle_i32x4(all, t[s], t[8 + s], 0x88);
    rows[8 + s] = _mm512_maskz_shuffle_i32x4(all, t[s], t[8 + s], 0xdd);
    rows[4 + s] = _mm512_maskz_shuffle_i32x4(all, t[4 + s], t[12 + s], 0x88);
    rows[12 + s] = _mm512_maskz_shuffle_i32x4(all, t[4 + s], t[12 + s], 0xdd);
  }
}

/// The first `n` of 16 lanes (n <= 0: none), and of 32.
inline __mmask16 first_lanes16(Extent n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << unsigned(n)) - 1u);
}
inline __mmask32 first_lanes32(Extent n) {
  return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? __mmask32(0) : __mmask32((1u << unsigned(n)) - 1u);
}

/// 16 pairs (lo[j], hi[j]) as 32-bit lanes, lo in the low half (the VNNI pair of two k); lanes past
/// `lanes` and a null row are zero.
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline __m512i pair_rows_bf16(const bfloat16* lo, const bfloat16* hi,
                                                                                 Extent lanes) {
  constexpr __mmask16 all = 0xffff;
  const __mmask16 mask = first_lanes16(lanes);
  const __m512i l = _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(mask, lo));
  if (!hi) return l;
  const __m512i h = _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(mask, hi));
  return _mm512_or_si512(l, _mm512_maskz_slli_epi32(all, h, 16));
}

/// Packs op(A)[i0 : i0+32, 0 : k] into two 16-row panels of kp/32 tiles each, zero-padded:
/// out[((g * kp/32 + c) * 16 + r) * 32 + t] = op(A)(i0 + 16 g + r, 32 c + t). Every tile is written
/// whole (no zero fill first): a tile row is one 64-byte store.
DTENSOR_BF16_TARGET inline void pack_a_bf16(bool trans, const bfloat16* A, Extent lda, Extent m, Extent k, Extent kp,
                                            Extent i0, std::uint16_t* out) {
  const Extent chunks = kp / kBf16TileK, tile = kBf16TileRows * kBf16TileK;
  for (Extent g = 0; g < 2; ++g) {
    const Extent r0 = i0 + g * kBf16TileRows, rows = std::min(kBf16TileRows, m - r0);  // rows <= 0: all zero
    for (Extent c = 0; c < chunks; ++c) {
      std::uint16_t* o = out + (g * chunks + c) * tile;
      const Extent p0 = c * kBf16TileK;
      if (!trans) {  // a tile row is 32 consecutive k of a row of A
        const __mmask32 mk = first_lanes32(k - p0);
        for (Extent r = 0; r < kBf16TileRows; ++r)
          _mm512_storeu_si512(o + r * kBf16TileK, r < rows ? _mm512_maskz_loadu_epi16(mk, A + (r0 + r) * lda + p0)
                                                           : _mm512_setzero_si512());
        continue;
      }
      // op(A)'s rows are A's columns: 16 pairs of k (two rows of A, paired per column), transposed
      __m512i v[16];
      for (Extent q = 0; q < 16; ++q) {
        const Extent p = p0 + 2 * q;
        v[q] = p < k && rows > 0 ? pair_rows_bf16(A + p * lda + r0, p + 1 < k ? A + (p + 1) * lda + r0 : nullptr, rows)
                                 : _mm512_setzero_si512();
      }
      transpose_16x16_epi32(v);
      for (Extent r = 0; r < kBf16TileRows; ++r) _mm512_storeu_si512(o + r * kBf16TileK, v[r]);
    }
  }
}

/// Packs op(B)[0 : k, j0 : j0+nb] (nb a multiple of 32 at most, zero-padded) into 16-column VNNI
/// panels of kp/32 tiles each: out[((h * kp/32 + c) * 16 + q) * 32 + 2 j + e] = op(B)(32 c + 2 q + e, j0 + 16 h + j).
/// Every tile is written whole: a tile row is 16 columns' pairs of k, one 64-byte store.
DTENSOR_BF16_TARGET inline void pack_b_bf16(bool trans, const bfloat16* B, Extent ldb, Extent n, Extent k, Extent kp,
                                            Extent j0, Extent nb, std::uint16_t* out) {
  const Extent chunks = kp / kBf16TileK, tile = kBf16TileRows * kBf16TileK;
  for (Extent h = 0; h < nb / kBf16TileRows; ++h) {
    const Extent c0 = j0 + h * kBf16TileRows, cols = std::min(kBf16TileRows, n - c0);  // cols <= 0: all zero
    for (Extent c = 0; c < chunks; ++c) {
      std::uint16_t* o = out + (h * chunks + c) * tile;
      const Extent p0 = c * kBf16TileK;
      __m512i v[16];
      if (!trans) {  // a tile row: rows 2q and 2q + 1 of B, paired per column
        for (Extent q = 0; q < 16; ++q) {
          const Extent p = p0 + 2 * q;
          v[q] = p < k && cols > 0
                     ? pair_rows_bf16(B + p * ldb + c0, p + 1 < k ? B + (p + 1) * ldb + c0 : nullptr, cols)
                     : _mm512_setzero_si512();
        }
      } else {  // op(B)'s columns are B's rows: a row's 32 k are its 16 pairs; 16 rows transposed
        const __mmask32 mk = first_lanes32(k - p0);
        for (Extent j = 0; j < 16; ++j)
          v[j] = j < cols ? _mm512_maskz_loadu_epi16(mk, B + (c0 + j) * ldb + p0) : _mm512_setzero_si512();
        transpose_16x16_epi32(v);
      }
      for (Extent q = 0; q < 16; ++q) _mm512_storeu_si512(o + q * kBf16TileK, v[q]);
    }
  }
}

/// The loops shared by the kernels, and their common cases: nothing to do for an empty C; alpha ==
/// 0 or k == 0 only scale C. Else B is packed by column blocks (by the calling thread), then blocks
/// of 32 rows of C run in parallel over the rank's intra-op threads (parallel.hpp) where it has
/// them: each thread packs its 32 rows of op(A) into its own buffer and `block(a, b, kp, i0, j0)`
/// computes C[i0 : i0+32, j0 : j0+32] from the packed panels (a: 32 rows, b: 32 columns; kp: k
/// padded to 32). `enter()` and `leave()` run on each thread around its share (AMX: its tile
/// configuration). A block of C is computed the same way on any thread, so every thread count
/// gives the same bits.
template <class Enter, class Block, class Leave>
void gemm_bf16_blocks(bool trans_a, bool trans_b, bfloat16 alpha, const bfloat16* A, const bfloat16* B, bfloat16 beta,
                      bfloat16* C, Extent m, Extent n, Extent k, Extent lda, Extent ldb, Extent ldc, Enter&& enter,
                      Block&& block, Leave&& leave) {
  if (m == 0 || n == 0) return;
  if (k == 0 || float(alpha) == 0.f) return scale_bf16(C, m, n, ldc, float(beta));
  const Extent kp = round_up(k, kBf16TileK);
  std::vector<std::uint16_t>& packed_b = bf16_gemm_buffers().b;
  const Extent nb_max = std::max(kBf16Block, kPackedBBytes / (2 * kp) / kBf16Block * kBf16Block);
  const Extent nb_all = std::min(nb_max, round_up(n, kBf16Block));
  packed_b.resize(std::size_t(nb_all * kp));
  const Extent row_blocks = (m + kBf16Block - 1) / kBf16Block;
  for (Extent j0 = 0; j0 < n; j0 += nb_all) {
    const Extent nb = std::min(nb_all, round_up(n - j0, kBf16Block));
    pack_b_bf16(trans_b, B, ldb, n, k, kp, j0, nb, packed_b.data());
    // A row block does 32 x nb x kp multiply-adds, ~64 a cycle: worth a wake-up from a few k up.
    const Extent grain = grain_for(kBf16Block * nb * kp / 64);
    parallel_for(row_blocks, grain, [&](Extent b0, Extent b1) {
      enter();
      std::vector<std::uint16_t>& packed_a = bf16_gemm_buffers().a;  // this thread's
      packed_a.resize(std::size_t(kBf16Block * kp));
      for (Extent ib = b0; ib < b1; ++ib) {
        pack_a_bf16(trans_a, A, lda, m, k, kp, ib * kBf16Block, packed_a.data());
        for (Extent jb = 0; jb < nb && j0 + jb < n; jb += kBf16Block)
          block(packed_a.data(), packed_b.data() + jb * kp, kp, ib * kBf16Block, j0 + jb);
      }
      leave();
    });
  }
}

/// C[0 : cols] = bf16(alpha * acc + beta * C) for up to 16 columns (beta == 0: C not read), rounded
/// as bfloat16(float) rounds (to nearest even, NaN kept quiet).
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline void store_bf16_row(const float* acc, bfloat16* c, int cols,
                                                                              float alpha, float beta) {
  // The maskz_ forms with every lane set: GCC 12's plain ones pass an "undefined" vector that
  // -Wmaybe-uninitialized reports once inlined.
  constexpr __mmask16 all = 0xffff;
  const __mmask16 mask = __mmask16((1u << cols) - 1u);
  __m512 v = _mm512_mul_ps(_mm512_set1_ps(alpha), _mm512_maskz_loadu_ps(mask, acc));
  if (beta != 0.f) {
    const __m512i old =
        _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(mask, c)), 16);
    v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_castsi512_ps(old)));
  }
  const __m512i u = _mm512_castps_si512(v);
  const __m512i high = _mm512_maskz_srli_epi32(all, u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_maskz_srli_epi32(all, _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  _mm256_mask_storeu_epi16(c, mask, _mm512_maskz_cvtepi32_epi16(all, _mm512_mask_blend_epi32(nan, rounded, quiet)));
}

/// C[0 : rows, 0 : cols] = bf16(alpha * out + beta * C), out a [rows][32] fp32 block (cols <= 32).
DTENSOR_BF16_TARGET inline void store_bf16_block(const float* out, bfloat16* C, Extent ldc, Extent rows, Extent cols,
                                                 float alpha, float beta) {
  for (Extent r = 0; r < rows; ++r) {
    store_bf16_row(out + r * kBf16Block, C + r * ldc, int(std::min<Extent>(cols, 16)), alpha, beta);
    if (cols > 16) store_bf16_row(out + r * kBf16Block + 16, C + r * ldc + 16, int(cols - 16), alpha, beta);
  }
}

/// The AVX512-BF16 micro-kernel: out[8][32] = rows r0 .. r0+8 of the packed A (32 rows) times the
/// packed B's 32 columns, in fp32.
DTENSOR_BF16_TARGET inline void bf16_block_avx512(const std::uint16_t* a, const std::uint16_t* b, Extent kp, Extent r0,
                                                  float* out) {
  const Extent chunks = kp / kBf16TileK, tile = kBf16TileRows * kBf16TileK;
  const std::uint16_t* ap = a + (r0 / kBf16TileRows) * chunks * tile + (r0 % kBf16TileRows) * kBf16TileK;
  __m512 acc[8][2];
  for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
  for (Extent c = 0; c < chunks; ++c) {
    const std::uint16_t* at = ap + c * tile;
    const std::uint16_t* b0 = b + c * tile;
    const std::uint16_t* b1 = b + (chunks + c) * tile;
    for (Extent q = 0; q < kBf16TileK / 2; ++q) {
      const __m512bh vb0 = (__m512bh)_mm512_loadu_si512(b0 + q * kBf16TileK);
      const __m512bh vb1 = (__m512bh)_mm512_loadu_si512(b1 + q * kBf16TileK);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        std::int32_t pair;  // op(A)(r, 2q) and (r, 2q + 1), broadcast to every column's pair
        std::memcpy(&pair, at + r * kBf16TileK + 2 * q, 4);
        const __m512bh va = (__m512bh)_mm512_set1_epi32(pair);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], va, vb0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], va, vb1);
      }
    }
  }
  for (int r = 0; r < 8; ++r) {
    _mm512_storeu_ps(out + r * kBf16Block, acc[r][0]);
    _mm512_storeu_ps(out + r * kBf16Block + 16, acc[r][1]);
  }
}

/// gemm<bfloat16> on AVX512-BF16 (the CPU must have it: bf16_gemm_kernel()).
inline void gemm_bf16_avx512(bool trans_a, bool trans_b, bfloat16 alpha, const bfloat16* A, const bfloat16* B,
                             bfloat16 beta, bfloat16* C, Extent m, Extent n, Extent k, Extent lda, Extent ldb,
                             Extent ldc) {
  const float al = float(alpha), be = float(beta);
  gemm_bf16_blocks(
      trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc, [] {},
      [&](const std::uint16_t* a, const std::uint16_t* b, Extent kp, Extent i0, Extent j0) {
        alignas(64) float out[8 * kBf16Block];
        for (Extent r0 = 0; r0 < kBf16Block && i0 + r0 < m; r0 += 8) {
          bf16_block_avx512(a, b, kp, r0, out);
          store_bf16_block(out, C + (i0 + r0) * ldc + j0, ldc, std::min<Extent>(8, m - i0 - r0),
                           std::min(kBf16Block, n - j0), al, be);
        }
      },
      [] {});
}

/// AMX's tile configuration (palette 1): tiles 0-7 all 16 rows x 64 bytes.
struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

DTENSOR_AMX_TARGET inline void amx_load_config() {
  AmxTileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = std::uint8_t(kBf16TileRows);
    config.bytes_per_row[t] = std::uint16_t(kBf16TileK * 2);
  }
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the configuration (its asm
  // operand is a pointer's worth), so at -O2 the other stores were dropped and the first tile
  // instruction faulted: this barrier makes every store to `config` happen first.
  __asm__ volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

DTENSOR_AMX_TARGET inline void amx_release() { _tile_release(); }

/// The AMX micro-kernel: out[32][32] = the packed A (32 rows) times the packed B (32 columns), in
/// fp32: four C tiles (0-3), two A tiles (4, 5), two B tiles (6, 7). Needs amx_load_config().
DTENSOR_AMX_TARGET inline void bf16_block_amx(const std::uint16_t* a, const std::uint16_t* b, Extent kp, float* out) {
  constexpr long stride = kBf16TileK * 2;  // bytes between a tile's rows
  const Extent chunks = kp / kBf16TileK, tile = kBf16TileRows * kBf16TileK;
  const std::uint16_t *a1 = a + chunks * tile, *b1 = b + chunks * tile;
  __asm__ volatile("" : : : "memory");  // GCC 12's _tile_loadd does not say that it reads memory
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (Extent c = 0; c < chunks; ++c) {
    _tile_loadd(4, a + c * tile, stride);
    _tile_loadd(5, a1 + c * tile, stride);
    _tile_loadd(6, b + c * tile, stride);
    _tile_loadd(7, b1 + c * tile, stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  constexpr long out_stride = kBf16Block * 4;
  _tile_stored(0, out, out_stride);
  _tile_stored(1, out + 16, out_stride);
  _tile_stored(2, out + 16 * kBf16Block, out_stride);
  _tile_stored(3, out + 16 * kBf16Block + 16, out_stride);
}

/// gemm<bfloat16> on AMX tiles (the CPU must have them and the process hold Linux's permission:
/// bf16_gemm_kernel(), amx_permitted()).
inline void gemm_bf16_amx(bool trans_a, bool trans_b, bfloat16 alpha, const bfloat16* A, const bfloat16* B,
                          bfloat16 beta, bfloat16* C, Extent m, Extent n, Extent k, Extent lda, Extent ldb,
                          Extent ldc) {
  const float al = float(alpha), be = float(beta);
  gemm_bf16_blocks(
      trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc, [] { amx_load_config(); },
      [&](const std::uint16_t* a, const std::uint16_t* b, Extent kp, Extent i0, Extent j0) {
        alignas(64) float out[kBf16Block * kBf16Block];
        bf16_block_amx(a, b, kp, out);
        store_bf16_block(out, C + i0 * ldc + j0, ldc, std::min(kBf16Block, m - i0), std::min(kBf16Block, n - j0), al,
                         be);
      },
      [] { amx_release(); });
}

#undef DTENSOR_BF16_TARGET
#undef DTENSOR_AMX_TARGET

#endif  // DTENSOR_HOST_MULTI_ISA

}  // namespace dtensor::kernels::host::detail
