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
// which is also the operand _mm512_dpbf16_ps takes). Sizes are padded with zeros to 32 rows, 32
// columns and 32 k, which adds nothing to the sums. Each output's sum runs over k in the same
// order whatever m, n and its position (no k blocking), so a row's values do not depend on how the
// rows were split over ranks. Loops: B is packed for as many columns as fit kPackedBBytes (the
// models' weights fit whole), then op(A) 32 rows at a time, then a 32 x 32 block of C per
// micro-kernel (AMX: four C tiles, two A tiles, two B tiles; AVX512: 8 rows x 32 columns in 16
// zmm registers).
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

/// Packs op(A)[i0 : i0+32, 0 : k] into two 16-row panels of kp/32 tiles each, zero-padded:
/// out[((g * kp/32 + c) * 16 + r) * 32 + t] = op(A)(i0 + 16 g + r, 32 c + t).
inline void pack_a_bf16(bool trans, const bfloat16* A, Extent lda, Extent m, Extent k, Extent kp, Extent i0,
                        std::uint16_t* out) {
  const Extent chunks = kp / kBf16TileK;
  std::fill_n(out, kBf16Block * kp, std::uint16_t(0));
  const Extent rows = std::min(kBf16Block, m - i0);
  const Extent panel_size = chunks * kBf16TileRows * kBf16TileK;
  const auto at = [&](Extent r, Extent p) -> std::uint16_t& {  // where op(A)(i0 + r, p) goes
    return out[(r / kBf16TileRows) * panel_size + (p / kBf16TileK) * kBf16TileRows * kBf16TileK +
               (r % kBf16TileRows) * kBf16TileK + p % kBf16TileK];
  };
  if (!trans) {  // a row of op(A) is a row of A: 32 k at a time
    for (Extent r = 0; r < rows; ++r)
      for (Extent p0 = 0; p0 < k; p0 += kBf16TileK)
        std::memcpy(&at(r, p0), A + (i0 + r) * lda + p0, std::size_t(std::min(kBf16TileK, k - p0)) * 2);
  } else {  // op(A)'s rows are A's columns: read 4 rows of A (contiguous), store 4 k of a row at once
    Extent p = 0;
    for (; p + 4 <= k; p += 4) {  // 4 k never straddle a tile (32 k)
      const bfloat16* a = A + p * lda + i0;
      for (Extent r = 0; r < rows; ++r) {
        const std::uint64_t four = std::uint64_t(a[r].bits) | std::uint64_t(a[lda + r].bits) << 16 |
                                   std::uint64_t(a[2 * lda + r].bits) << 32 | std::uint64_t(a[3 * lda + r].bits) << 48;
        std::memcpy(&at(r, p), &four, 8);
      }
    }
    for (; p < k; ++p)
      for (Extent r = 0; r < rows; ++r) at(r, p) = A[p * lda + i0 + r].bits;
  }
}

/// Packs op(B)[0 : k, j0 : j0+nb] (nb a multiple of 32 at most, zero-padded) into 16-column VNNI
/// panels of kp/32 tiles each: out[((h * kp/32 + c) * 16 + q) * 32 + 2 j + e] = op(B)(32 c + 2 q + e, j0 + 16 h + j).
inline void pack_b_bf16(bool trans, const bfloat16* B, Extent ldb, Extent n, Extent k, Extent kp, Extent j0, Extent nb,
                        std::uint16_t* out) {
  const Extent chunks = kp / kBf16TileK;
  std::fill_n(out, nb * kp, std::uint16_t(0));
  const Extent cols = std::min(nb, n - j0);
  const Extent panel_size = chunks * kBf16TileRows * kBf16TileK;
  // op(B)(p, j0 + j): pair p / 2 of k is row p / 2 of the panel's tiles, at 2 (j % 16) + p % 2
  const auto at = [&](Extent p, Extent j) -> std::uint16_t& {
    return out[(j / kBf16TileRows) * panel_size + (p / 2) * kBf16TileK + (j % kBf16TileRows) * 2 + p % 2];
  };
  if (trans) {  // op(B)'s columns are B's rows: a pair of k is two adjacent elements
    for (Extent j = 0; j < cols; ++j) {
      const bfloat16* b = B + (j0 + j) * ldb;
      Extent p = 0;
      for (; p + 2 <= k; p += 2) std::memcpy(&at(p, j), b + p, 4);
      if (p < k) at(p, j) = b[p].bits;
    }
  } else {  // two rows of B (contiguous) interleaved: 16 columns' pairs are 64 contiguous bytes
    Extent p = 0;
    for (; p + 2 <= k; p += 2) {
      const bfloat16* b = B + p * ldb + j0;
      for (Extent j = 0; j < cols; ++j) {
        const std::uint32_t pair = std::uint32_t(b[j].bits) | std::uint32_t(b[ldb + j].bits) << 16;
        std::memcpy(&at(p, j), &pair, 4);
      }
    }
    if (p < k)
      for (Extent j = 0; j < cols; ++j) at(p, j) = B[p * ldb + j0 + j].bits;
  }
}

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

/// The loops shared by the kernels: B packed by column blocks (by the calling thread), then blocks
/// of 32 rows of C, in parallel over the rank's intra-op threads (parallel.hpp) where it has them:
/// each thread packs its 32 rows of op(A) into its own buffer and `block(a, b, i0, j0)` computes
/// C[i0 : i0+32, j0 : j0+32] from the packed panels (a: 32 rows, b: 32 columns). `enter()` and
/// `leave()` run on each thread around its share (AMX: its tile configuration). A block of C is
/// computed the same way on any thread, so every thread count gives the same bits.
template <class Enter, class Block, class Leave>
void gemm_bf16_blocks(bool trans_a, bool trans_b, const bfloat16* A, const bfloat16* B, Extent m, Extent n, Extent k,
                      Extent lda, Extent ldb, Extent kp, Enter&& enter, Block&& block, Leave&& leave) {
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
          block(packed_a.data(), packed_b.data() + jb * kp, ib * kBf16Block, j0 + jb);
      }
      leave();
    });
  }
}

#if DTENSOR_HOST_MULTI_ISA

#define DTENSOR_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#define DTENSOR_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,amx-tile,amx-bf16")))

// No <immintrin.h>: it declares every x86 intrinsic, and parsing them cost each program that
// includes this header ~100 MiB of GCC's memory (docs/benchmarks.md, "A user's FSDP x TP program").
// The kernels use GCC/Clang vector types instead (the arithmetic intrinsics are these same
// operations on them; loads and stores are memcpy, whole rows only) and inline asm for the
// instructions that have no such form: vdpbf16ps and the AMX ones (GCC's AMX intrinsics are asm
// too). The same bits as the intrinsics gave, on GCC 12 and Clang 14 and 19.
using F32x16 = float __attribute__((vector_size(64)));
using U32x16 = std::uint32_t __attribute__((vector_size(64)));
using U16x16 = std::uint16_t __attribute__((vector_size(32)));

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
    const F32x16 scaled_old = beta * (F32x16)(__builtin_convertvector(old_bits, U32x16) << 16);
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
/// of a and b summed into the fp32 lane (vdpbf16ps; _mm512_dpbf16_ps(acc, a, b)).
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
  if (m == 0 || n == 0) return;
  if (k == 0 || float(alpha) == 0.f) return scale_bf16(C, m, n, ldc, float(beta));
  const Extent kp = round_up(k, kBf16TileK);
  const float al = float(alpha), be = float(beta);
  gemm_bf16_blocks(
      trans_a, trans_b, A, B, m, n, k, lda, ldb, kp, [] {},
      [&](const std::uint16_t* a, const std::uint16_t* b, Extent i0, Extent j0) {
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
  if (m == 0 || n == 0) return;
  if (k == 0 || float(alpha) == 0.f) return scale_bf16(C, m, n, ldc, float(beta));
  const Extent kp = round_up(k, kBf16TileK);
  const float al = float(alpha), be = float(beta);
  gemm_bf16_blocks(
      trans_a, trans_b, A, B, m, n, k, lda, ldb, kp, [] { amx_load_config(); },
      [&](const std::uint16_t* a, const std::uint16_t* b, Extent i0, Extent j0) {
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
