// dtensor/kernels/host/gemm_bf16.hpp — bf16 x bf16 GEMMs with fp32 accumulation on x86 hosts:
// AMX tile dot products and AVX512-BF16 dot products (gemm<bfloat16> picks one, gemm.hpp).
//
//   // C[m,n] = alpha * op(A) * op(B) + beta * C, as gemm (gemm.hpp): row-major, pitches, transposes
//   detail::gemm_bf16_amx(trans_a, trans_b, alpha, A, B, beta, C, m, n, k, lda, ldb, ldc);
//   detail::gemm_bf16_avx512(...);   // the same with vdpbf16ps (AVX512-BF16)
//   bf16_gemm_kernel()               // which one gemm<bfloat16> runs (blas_core.hpp)
//
// Both sum each output in fp32 over k and round C to bf16 once, after alpha and beta
// (beta == 0 does not read C; alpha == 0 or k == 0 only scales C). The caller has checked the
// arguments and that the CPU (and, for AMX, the OS) runs the kernel: bf16_gemm_kernel().
//
// Layout (docs/host-kernels.md): op(A) is packed in panels of 16 rows by 32 k (one AMX A tile,
// 1 KiB: 16 rows of 32 consecutive k), op(B) in panels of 16 columns by 32 k in the VNNI layout
// (one AMX B tile: row q holds, for each of the 16 columns, the pair k = 2q, 2q+1 side by side —
// which is also the operand vdpbf16ps takes). Sizes are padded with zeros to 32 rows, 32
// columns and 32 k, which adds nothing to the sums. Each output's sum runs over k in the same
// order whatever m, n and its position (no k blocking), so a row's values do not depend on how the
// rows were split over ranks. Loops: B is packed once per call for as many columns as fit
// kPackedBBytes (the models' weights fit whole), then op(A) 32 rows at a time, then a 32 x 32
// block of C per micro-kernel (AMX: four C tiles, two A tiles, two B tiles; AVX512: 8 rows x 32
// columns in 16 zmm registers). The packing is vector code writing each tile row with one 64-byte
// store, zeros included (no zero fill first): a tile row is a load zero-padded past k (op(A) untransposed) or
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

// No x86 intrinsics header: it declares every intrinsic, and parsing them cost each program that
// includes this header ~100 MiB of GCC's memory (docs/benchmarks.md, "A user's FSDP x TP program").
// The packing and the kernels use GCC/Clang vector types instead (the arithmetic intrinsics are
// these same operations on them, __builtin_shufflevector the unpacks and lane shuffles; loads and
// stores are memcpy, a partial load a zeroed vector filled with the valid elements) and inline asm
// for the instructions that have no such form: vdpbf16ps and the AMX ones (GCC's AMX intrinsics
// are asm too). The same bits as the intrinsics gave, on GCC 12 and Clang 14 and 19.
using F32x16 = float __attribute__((vector_size(64)));
using U32x16 = std::uint32_t __attribute__((vector_size(64)));
using U16x16 = std::uint16_t __attribute__((vector_size(32)));
using U64x8 = std::uint64_t __attribute__((vector_size(64)));

/// The vector V of the first `count` bf16 at p (count <= 0: none), the lanes past them zero; reads
/// no element past them (a tile row's or edge's end may be the end of the operand). The whole and
/// the partial load fill separate vectors: one shared would live in memory, and every whole load
/// would go through it (a store and a reload per tile row).
template <class V>
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline V load_first_bf16(const bfloat16* p, Extent count) {
  constexpr Extent lanes = Extent(sizeof(V) / sizeof(bfloat16));
  if (count >= lanes) {
    V whole;
    std::memcpy(&whole, static_cast<const void*>(p), sizeof whole);
    return whole;
  }
  V part{};
  if (count > 0) std::memcpy(&part, static_cast<const void*>(p), std::size_t(count) * sizeof(bfloat16));
  return part;
}

/// Per 128-bit lane, the low (unpack_lo_64) or high (unpack_hi_64) 64-bit halves of x and y side
/// by side (on 64-bit lanes: GCC lowers the same shuffle on 32-bit lanes to vpermt2d, not vpunpck*).
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline U32x16 unpack_lo_64(const U32x16& x, const U32x16& y) {
  return (U32x16)__builtin_shufflevector((U64x8)x, (U64x8)y, 0, 8, 2, 10, 4, 12, 6, 14);
}
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline U32x16 unpack_hi_64(const U32x16& x, const U32x16& y) {
  return (U32x16)__builtin_shufflevector((U64x8)x, (U64x8)y, 1, 9, 3, 11, 5, 13, 7, 15);
}
/// The 128-bit lanes 0 and 2 of x, then those of y (even_lanes_128), and lanes 1 and 3 (odd_lanes_128).
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline U32x16 even_lanes_128(const U32x16& x, const U32x16& y) {
  return __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
}
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline U32x16 odd_lanes_128(const U32x16& x, const U32x16& y) {
  return __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}

/// Transposes a 16 x 16 matrix of 32-bit lanes in place: rows[i] lane j <-> rows[j] lane i (four
/// rounds of two-register shuffles: 32-bit, 64-bit, then 128-bit lanes twice). The shuffles'
/// indices count the first vector's lanes 0-15 and the second's 16-31.
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline void transpose_16x16_u32(U32x16 rows[16]) {
  U32x16 t[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: 32-bit lanes of the two rows interleaved
    t[i] = __builtin_shufflevector(rows[i], rows[i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
    t[i + 1] =
        __builtin_shufflevector(rows[i], rows[i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
  }
  for (int i = 0; i < 16; i += 4) {  // per 128-bit lane: 64-bit halves of the two rows interleaved
    rows[i] = unpack_lo_64(t[i], t[i + 2]);
    rows[i + 1] = unpack_hi_64(t[i], t[i + 2]);
    rows[i + 2] = unpack_lo_64(t[i + 1], t[i + 3]);
    rows[i + 3] = unpack_hi_64(t[i + 1], t[i + 3]);
  }
  for (int s = 0; s < 4; ++s) {
    t[s] = even_lanes_128(rows[s], rows[4 + s]);
    t[4 + s] = odd_lanes_128(rows[s], rows[4 + s]);
    t[8 + s] = even_lanes_128(rows[8 + s], rows[12 + s]);
    t[12 + s] = odd_lanes_128(rows[8 + s], rows[12 + s]);
  }
  for (int s = 0; s < 4; ++s) {
    rows[s] = even_lanes_128(t[s], t[8 + s]);
    rows[8 + s] = odd_lanes_128(t[s], t[8 + s]);
    rows[4 + s] = even_lanes_128(t[4 + s], t[12 + s]);
    rows[12 + s] = odd_lanes_128(t[4 + s], t[12 + s]);
  }
}

/// The 16 lanes of v zero-extended to 32 bits (a shuffle with zeros rather than
/// __builtin_convertvector, which GCC 12 lowers in two 256-bit halves: one vpmovzxwd either way).
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline U32x16 widen_u16(const U16x16& v) {
  return (U32x16)__builtin_shufflevector(v, U16x16{}, 0, 16, 1, 16, 2, 16, 3, 16, 4, 16, 5, 16, 6, 16, 7, 16, 8, 16, 9,
                                         16, 10, 16, 11, 16, 12, 16, 13, 16, 14, 16, 15, 16);
}

/// 16 pairs (lo[j], hi[j]) as 32-bit lanes, lo in the low half (the VNNI pair of two k); lanes past
/// `lanes` and a null row are zero.
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline U32x16 pair_rows_bf16(const bfloat16* lo, const bfloat16* hi,
                                                                                Extent lanes) {
  const U32x16 l = widen_u16(load_first_bf16<U16x16>(lo, lanes));
  if (!hi) return l;
  return l | (widen_u16(load_first_bf16<U16x16>(hi, lanes)) << 16);
}

/// v[q] = the pairs of rows p0 + 2q and p0 + 2q + 1 of M (pitch ld) over its `lanes` columns from
/// `col` (pair_rows_bf16), for q < 16: a tile's 16 pairs of k; rows at or past k (and all, when
/// lanes <= 0) zero. Untransposed op(B) is packed so, and transposed op(A) before its transpose.
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline void pair_rows_tile(const bfloat16* M, Extent ld, Extent col,
                                                                              Extent p0, Extent k, Extent lanes,
                                                                              U32x16 v[16]) {
  for (Extent q = 0; q < 16; ++q) {
    const Extent p = p0 + 2 * q;
    v[q] = p < k && lanes > 0 ? pair_rows_bf16(M + p * ld + col, p + 1 < k ? M + (p + 1) * ld + col : nullptr, lanes)
                              : U32x16{};
  }
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
        for (Extent r = 0; r < kBf16TileRows; ++r) {
          const U32x16 v = r < rows ? load_first_bf16<U32x16>(A + (r0 + r) * lda + p0, k - p0) : U32x16{};
          std::memcpy(o + r * kBf16TileK, &v, sizeof v);
        }
        continue;
      }
      // op(A)'s rows are A's columns: 16 pairs of k (two rows of A, paired per column), transposed
      U32x16 v[16];
      pair_rows_tile(A, lda, r0, p0, k, rows, v);
      transpose_16x16_u32(v);
      for (Extent r = 0; r < kBf16TileRows; ++r) std::memcpy(o + r * kBf16TileK, &v[r], sizeof v[r]);
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
      U32x16 v[16];
      if (!trans) {  // a tile row: rows 2q and 2q + 1 of B, paired per column
        pair_rows_tile(B, ldb, c0, p0, k, cols, v);
      } else {  // op(B)'s columns are B's rows: a row's 32 k are its 16 pairs; 16 rows transposed
        for (Extent j = 0; j < 16; ++j)
          v[j] = j < cols ? load_first_bf16<U32x16>(B + (c0 + j) * ldb + p0, k - p0) : U32x16{};
        transpose_16x16_u32(v);
      }
      for (Extent q = 0; q < 16; ++q) std::memcpy(o + q * kBf16TileK, &v[q], sizeof v[q]);
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

/// C[0 : 16] = bf16(alpha * acc + beta * C) (beta == 0: C not read), rounded as bfloat16(float)
/// rounds (to nearest even, NaN kept quiet): one 64-byte load and one 32-byte store.
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline void store_bf16_row16(const float* acc, bfloat16* c,
                                                                                float alpha, float beta) {
  F32x16 x;
  std::memcpy(&x, acc, sizeof x);
  F32x16 v = alpha * x;
  if (beta != 0.f) {
    U16x16 old_bits;
    std::memcpy(&old_bits, static_cast<const void*>(c), sizeof old_bits);
    const F32x16 scaled_old = beta * (F32x16)(widen_u16(old_bits) << 16);
    v = v + scaled_old;  // contracted into a fused multiply-add or not, as each compiler did the intrinsics
  }
  const U32x16 u = (U32x16)v;  // a vector cast keeps the bits
  const U32x16 high = u >> 16;
  const U32x16 rounded = (u + ((high & 1u) + 0x7fffu)) >> 16;
  const auto nan = (u & 0x7fffffffu) > 0x7f800000u;  // a lane mask: all ones where NaN
  const U32x16 quiet = high | 0x40u;
  const U16x16 out = __builtin_convertvector(nan ? quiet : rounded, U16x16);
  std::memcpy(static_cast<void*>(c), &out, sizeof out);
}

/// The same for the first cols < 16 columns (the last ones of C), through 16-column copies.
DTENSOR_BF16_TARGET inline void store_bf16_row_part(const float* acc, bfloat16* c, int cols, float alpha, float beta) {
  float acc16[16] = {};
  bfloat16 c16[16];
  std::copy_n(acc, cols, acc16);
  if (beta != 0.f) std::copy_n(c, cols, c16);
  store_bf16_row16(acc16, c16, alpha, beta);
  std::copy_n(c16, cols, c);
}

/// C[0 : rows, 0 : cols] = bf16(alpha * out + beta * C), out a [rows][32] fp32 block (cols <= 32).
/// The whole 16-column rows first, in a loop without calls (so its constants stay in registers),
/// then a partial one's columns (the last of C).
DTENSOR_BF16_TARGET inline void store_bf16_block(const float* out, bfloat16* C, Extent ldc, Extent rows, Extent cols,
                                                 float alpha, float beta) {
  const Extent whole = cols / 16 * 16;
  for (Extent r = 0; r < rows; ++r)
    for (Extent j = 0; j < whole; j += 16) store_bf16_row16(out + r * kBf16Block + j, C + r * ldc + j, alpha, beta);
  if (whole < cols)
    for (Extent r = 0; r < rows; ++r)
      store_bf16_row_part(out + r * kBf16Block + whole, C + r * ldc + whole, int(cols - whole), alpha, beta);
}

/// acc += a . b pair by pair: for each of the 16 lanes, the two bf16 products of the lane's pairs
/// of a and b summed into the fp32 lane (vdpbf16ps).
DTENSOR_BF16_TARGET __attribute__((always_inline)) inline void dot_bf16_pairs(F32x16& acc, const U32x16& a,
                                                                              const U32x16& b) {
  __asm__("{vdpbf16ps\t%2, %1, %0|vdpbf16ps\t%0, %1, %2}" : "+v"(acc) : "v"(a), "v"(b));
}

/// The AVX512-BF16 micro-kernel: out[8][32] = rows r0 .. r0+8 of the packed A (32 rows) times the
/// packed B's 32 columns, in fp32.
DTENSOR_BF16_TARGET inline void bf16_block_avx512(const std::uint16_t* a, const std::uint16_t* b, Extent kp, Extent r0,
                                                  float* out) {
  const Extent chunks = kp / kBf16TileK, tile = kBf16TileRows * kBf16TileK;
  const std::uint16_t* ap = a + (r0 / kBf16TileRows) * chunks * tile + (r0 % kBf16TileRows) * kBf16TileK;
  F32x16 acc[8][2] = {};
  for (Extent c = 0; c < chunks; ++c) {
    const std::uint16_t* at = ap + c * tile;
    const std::uint16_t* b0 = b + c * tile;
    const std::uint16_t* b1 = b + (chunks + c) * tile;
    for (Extent q = 0; q < kBf16TileK / 2; ++q) {
      U32x16 vb0, vb1;
      std::memcpy(&vb0, b0 + q * kBf16TileK, sizeof vb0);
      std::memcpy(&vb1, b1 + q * kBf16TileK, sizeof vb1);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        std::uint32_t pair;  // op(A)(r, 2q) and (r, 2q + 1), broadcast to every column's pair
        std::memcpy(&pair, at + r * kBf16TileK + 2 * q, 4);
        const U32x16 va = U32x16{} + pair;
        dot_bf16_pairs(acc[r][0], va, vb0);
        dot_bf16_pairs(acc[r][1], va, vb1);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {  // unrolled, as the loop above: acc stays in registers
    std::memcpy(out + r * kBf16Block, &acc[r][0], sizeof acc[r][0]);
    std::memcpy(out + r * kBf16Block + 16, &acc[r][1], sizeof acc[r][1]);
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
  // The operand is the whole configuration, so every store to it happens first (GCC 12's
  // _tile_loadconfig named only a pointer's worth of it, and -O2 dropped the other stores).
  __asm__ volatile("ldtilecfg\t%0" : : "m"(config));
}

DTENSOR_AMX_TARGET inline void amx_release() { __asm__ volatile("tilerelease"); }

// The AMX instructions on tile registers named at compile time (%c: the number without its '$').
// Each asm is volatile (the tiles are state the compiler does not see) and the loads and stores
// say that they read or write memory.
template <int Tile>
DTENSOR_AMX_TARGET __attribute__((always_inline)) inline void tile_zero() {
  __asm__ volatile("tilezero\t%%tmm%c0" : : "i"(Tile));
}
template <int Tile>
DTENSOR_AMX_TARGET __attribute__((always_inline)) inline void tile_load(const void* base, long stride) {
  __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm%c2|tileloadd\t%%tmm%c2, [%0+%1*1]}"
                   :
                   : "r"(base), "r"(stride), "i"(Tile)
                   : "memory");
}
template <int Tile>
DTENSOR_AMX_TARGET __attribute__((always_inline)) inline void tile_store(void* base, long stride) {
  __asm__ volatile("{tilestored\t%%tmm%c2, (%0,%1,1)|tilestored\t[%0+%1*1], %%tmm%c2}"
                   :
                   : "r"(base), "r"(stride), "i"(Tile)
                   : "memory");
}
/// Tile C += Tile A . Tile B, bf16 pairs summed in fp32 (tdpbf16ps).
template <int C, int A, int B>
DTENSOR_AMX_TARGET __attribute__((always_inline)) inline void tile_dot_bf16() {
  __asm__ volatile("{tdpbf16ps\t%%tmm%c2, %%tmm%c1, %%tmm%c0|tdpbf16ps\t%%tmm%c0, %%tmm%c1, %%tmm%c2}"
                   :
                   : "i"(C), "i"(A), "i"(B));
}

/// The AMX micro-kernel: out[32][32] = the packed A (32 rows) times the packed B (32 columns), in
/// fp32: four C tiles (0-3), two A tiles (4, 5), two B tiles (6, 7). Needs amx_load_config().
DTENSOR_AMX_TARGET inline void bf16_block_amx(const std::uint16_t* a, const std::uint16_t* b, Extent kp, float* out) {
  constexpr long stride = kBf16TileK * 2;  // bytes between a tile's rows
  const Extent chunks = kp / kBf16TileK, tile = kBf16TileRows * kBf16TileK;
  const std::uint16_t *a1 = a + chunks * tile, *b1 = b + chunks * tile;
  tile_zero<0>();
  tile_zero<1>();
  tile_zero<2>();
  tile_zero<3>();
  for (Extent c = 0; c < chunks; ++c) {
    tile_load<4>(a + c * tile, stride);
    tile_load<5>(a1 + c * tile, stride);
    tile_load<6>(b + c * tile, stride);
    tile_load<7>(b1 + c * tile, stride);
    tile_dot_bf16<0, 4, 6>();
    tile_dot_bf16<1, 4, 7>();
    tile_dot_bf16<2, 5, 6>();
    tile_dot_bf16<3, 5, 7>();
  }
  constexpr long out_stride = kBf16Block * 4;
  tile_store<0>(out, out_stride);
  tile_store<1>(out + 16, out_stride);
  tile_store<2>(out + 16 * kBf16Block, out_stride);
  tile_store<3>(out + 16 * kBf16Block + 16, out_stride);
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
