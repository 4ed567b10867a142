// dtensor/kernels/cuda/attention_fused.cuh — exact (causal) attention on CudaTensor as fused,
// memory-efficient kernels with the log-sum-exp output, its backward from the saved lse, and
// merge_attention_blocks; the host's options (causal, scale, q/k offsets for ring attention).
// kernels::cuda::attention (attention.cuh) chooses between these and attention_gemm.cuh's.
//
// No T x T matrix exists at any point. Forward: each warp owns R query rows (4, or 1 at large
// head dimensions) and streams the keys they may see in tiles of 32 through shared memory (shared
// by the block's 8 warps), each lane scoring one key of the tile for all R rows, with an online
// softmax over tiles (running max and sum, FlashAttention's recurrence); each lane holds D / 32
// elements of each row's output accumulator. Backward (FlashAttention-2's split, without atomics,
// so deterministic): delta_i = dout_i . out_i; a warp per R query rows accumulates
// dq_i = scale sum_j p_ij (dp_ij - delta_i) k_j over key tiles; a warp per R key rows accumulates
// dv_j = sum_i p_ij dout_i and dk_j = scale sum_i ds_ij q_i over query tiles, recomputing
// p_ij = exp(s_ij - lse_i).
// Statistics (running max and sum, lse, delta) are in double (the host's Stat); scores and
// accumulators in float for float and bf16, double for double; head dimensions up to 256.
// bfloat16 inputs are widened on load and the outputs rounded once on store (the same contract as
// the host kernel and cuBLAS's bf16 GEMM), and the lse stays double: a bf16 model's ring
// attention merges blocks with the statistics of an fp32 run.
// The scores are CUDA-core FMAs, not tensor-core MMAs: slower than attention_gemm.cuh's cuBLAS
// chunks at large T (bench/bench_attention_cuda.cu measures both; docs/gpu.md has the figures),
// but they need no workspace and launch three kernels in all.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/cuda/softmax.cuh"      // neg_inf
#include "dtensor/kernels/host/attention.hpp"    // AttentionOptions, attention_scale

namespace dtensor::kernels::cuda {

using host::AttentionOptions;

template <class T>
struct AttentionForward {
  CudaTensor<T, 4> out;     // [B, H, Tq, Dv]
  CudaTensor<Stat, 3> lse;  // [B, H, Tq]
};

template <class T>
struct AttentionBackward {
  CudaTensor<T, 4> dq, dk, dv;
};

/// The largest head dimension (of q/k and of v) the kernels take.
inline constexpr Extent attention_max_head_dim = 256;

namespace detail {

inline constexpr int warp = 32;

struct AttentionShape {
  Extent bh = 0, tq = 0, tk = 0, d = 0, dv = 0;
  bool causal = true;
  Extent q_offset = 0, k_offset = 0;
  double scale = 1;
};

__device__ inline double warp_sum(double v) {
  for (int o = warp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Keys [0, n) of the block that query row i sees.
__device__ inline Extent visible_keys(const AttentionShape& s, Extent i) {
  if (!s.causal) return s.tk;
  const Extent n = s.q_offset + i - s.k_offset + 1;
  return n < 0 ? 0 : (n > s.tk ? s.tk : n);
}
/// The first query row that sees key j.
__device__ inline Extent first_query(const AttentionShape& s, Extent j) {
  if (!s.causal) return 0;
  const Extent i = j + s.k_offset - s.q_offset;
  return i < 0 ? 0 : i;
}

/// Shared-memory tiles: `tile` keys (forward, dq) or query rows (dk/dv) at a time, one per lane,
/// so a lane forms a whole score by itself and a warp needs two shuffle reductions per tile
/// rather than one per key; the block's `tile_rows` warps share every tile read from global
/// memory. Each warp owns R rows (register blocking): their own q (or k) and dout (or v) rows sit
/// in shared memory as Packs, the R rows' values of one element side by side, so one wide load
/// feeds R FMAs; the tile's p (and ds) values are passed the same way. R = 4 where the Packs fit
/// (head dimensions up to 128 in float, 64 in double), 1 above. The per-element math (scores, p,
/// ds, the accumulators) runs in the compute type C: float for float and bf16 (bf16 widens
/// exactly; the host forms these in float GEMMs too), double for double; the softmax statistics
/// (running max and sum, lse) stay double.
inline constexpr int tile = warp;
inline constexpr int tile_rows = 8;  // warps per block

template <class T>
using Compute = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// One element of a warp's R rows, side by side (at most 16-byte aligned: the widest shared load).
template <class C, int R>
struct alignas(sizeof(C) * R < 16 ? sizeof(C) * R : 16) Pack {
  C v[R];
};

__device__ inline float exp_c(float x) { return ::expf(x); }
__device__ inline double exp_c(double x) { return ::exp(x); }

__device__ inline double warp_max(double v) {
  for (int o = warp / 2; o > 0; o /= 2) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Rows [r0, r0 + tile) of a [rows, width] matrix into `dst` with row stride width + 1 (an odd
/// stride, so lanes reading one column of different rows hit different banks); rows past the end
/// read as zeros.
template <class S, class T>
__device__ void load_tile(S* dst, const T* src, Extent r0, Extent rows, Extent width) {
  const Extent stride = width + 1;
  for (Extent e = threadIdx.x; e < tile * width; e += blockDim.x) {
    const Extent r = e / width, c = e - r * width;
    dst[r * stride + c] = r0 + r < rows ? S(src[(r0 + r) * width + c]) : S(0);
  }
}
/// A warp's own rows [r0, r0 + R) of a [rows, width] matrix as Packs; rows past the end are zeros.
template <class C, int R, class T>
__device__ void load_own_rows(Pack<C, R>* dst, const T* src, Extent r0, Extent rows, Extent width, int lane) {
  for (Extent e = lane; e < width; e += warp) {
    Pack<C, R> p;
    for (int r = 0; r < R; ++r) p.v[r] = r0 + r < rows ? C(src[(r0 + r) * width + e]) : C(0);
    dst[e] = p;
  }
}
/// out[r] = rows[.][r] . x over [0, n): the R rows' dot products with one shared row.
template <class C, int R>
__device__ void dot_rows(C (&out)[R], const Pack<C, R>* rows, const C* x, Extent n) {
  for (int r = 0; r < R; ++r) out[r] = 0;
  for (Extent e = 0; e < n; ++e) {
    const Pack<C, R> a = rows[e];
    const C b = x[e];
    for (int r = 0; r < R; ++r) out[r] += a.v[r] * b;
  }
}
/// acc[r][c] (element lane + warp * c) += sum over t < count of w[t][r] * tile[t][element].
template <int R, int PL, class C>
__device__ void accumulate_rows(C (&acc)[R][PL], const Pack<C, R>* w, const C* tile_, Extent width, int count,
                                int lane) {
  const Extent stride = width + 1;
  for (int t = 0; t < count; ++t) {
    const Pack<C, R> wt = w[t];
    const C* row = tile_ + t * stride;
    for (int c = 0; c < PL; ++c) {
      const Extent e = lane + Extent(c) * warp;
      if (e < width) {
        const C x = row[e];
        for (int r = 0; r < R; ++r) acc[r][c] += wt.v[r] * x;
      }
    }
  }
}
template <int PL, class T, class C>
__device__ void store_row(T* row, const C (&acc)[PL], double factor, Extent n, int lane) {
  for (int c = 0; c < PL; ++c) {
    const Extent e = lane + Extent(c) * warp;
    if (e < n) row[e] = T(factor * acc[c]);
  }
}

/// Shared memory of a kernel, in this order: the tile's statistics (lse and delta, if any), each
/// warp's own rows (`own_width` Packs) and `pack_buffers` tiles of Packs (p, ds), then two tiles of
/// the given widths.
template <class T, int R>
std::size_t tile_bytes(Extent own_width, int pack_buffers, Extent tile_width_a, Extent tile_width_b, bool stats) {
  return (stats ? std::size_t(2 * tile) * sizeof(double) : 0) +
         std::size_t(tile_rows) * std::size_t(own_width + pack_buffers * tile) * sizeof(Pack<Compute<T>, R>) +
         std::size_t(tile * (tile_width_a + 1 + tile_width_b + 1)) * sizeof(Compute<T>);
}
/// Carves a kernel's shared memory as tile_bytes lays it out.
template <class C, int R>
struct SharedLayout {
  Pack<C, R>* own;     // this warp's own rows
  Pack<C, R>* packs;   // this warp's pack buffers, `tile` each
  C* tile_a;
  C* tile_b;
  __device__ SharedLayout(unsigned char* base, int w, Extent own_width, int pack_buffers, Extent width_a) {
    auto* all = reinterpret_cast<Pack<C, R>*>(base);
    own = all + w * own_width;
    packs = all + tile_rows * own_width + w * pack_buffers * tile;
    tile_a = reinterpret_cast<C*>(all + tile_rows * (own_width + pack_buffers * tile));
    tile_b = tile_a + tile * (width_a + 1);
  }
};

template <class T, int PL, int R>
__global__ void attention_forward_kernel(T* out, Stat* lse, const T* q, const T* k, const T* v, AttentionShape s) {
  using C = Compute<T>;
  extern __shared__ __align__(16) unsigned char attention_smem[];
  const int lane = threadIdx.x % warp, w = threadIdx.x / warp;
  const Extent block0 = Extent(blockIdx.x) * tile_rows * R, i0 = block0 + Extent(w) * R, bh = blockIdx.y;
  const SharedLayout<C, R> sm(attention_smem, w, s.d, 1, s.d);
  load_own_rows(sm.own, q + bh * s.tq * s.d, i0, s.tq, s.d, lane);
  Extent n[R], n_warp = 0;  // keys each row sees; the most any row of the warp sees
  for (int r = 0; r < R; ++r) {
    n[r] = i0 + r < s.tq ? visible_keys(s, i0 + r) : 0;
    n_warp = n[r] > n_warp ? n[r] : n_warp;
  }
  const Extent n_block = visible_keys(s, (block0 + tile_rows * R < s.tq ? block0 + tile_rows * R : s.tq) - 1);
  const C scale = C(s.scale);
  C acc[R][PL] = {};
  double m[R], l[R];
  for (int r = 0; r < R; ++r) m[r] = neg_inf, l[r] = 0;
  for (Extent j0 = 0; j0 < n_block; j0 += tile) {
    __syncthreads();  // the previous tile is consumed (and the own rows written)
    load_tile(sm.tile_a, k + bh * s.tk * s.d, j0, s.tk, s.d);
    load_tile(sm.tile_b, v + bh * s.tk * s.dv, j0, s.tk, s.dv);
    __syncthreads();
    if (j0 >= n_warp) continue;  // uniform in the warp
    C score[R];
    dot_rows(score, sm.own, sm.tile_a + lane * (s.d + 1), s.d);
    Pack<C, R> p;
    for (int r = 0; r < R; ++r) {
      p.v[r] = 0;
      if (j0 >= n[r]) continue;  // uniform in the warp: this row sees none of the tile
      const bool valid = j0 + lane < n[r];
      const C sc = valid ? scale * score[r] : C(neg_inf);
      const double m_new = fmax(m[r], warp_max(double(sc))), corr = ::exp(m[r] - m_new);
      p.v[r] = valid ? exp_c(C(sc - m_new)) : C(0);
      l[r] = l[r] * corr + warp_sum(double(p.v[r]));
      for (int c = 0; c < PL; ++c) acc[r][c] *= C(corr);
      m[r] = m_new;
    }
    sm.packs[lane] = p;
    __syncwarp();
    accumulate_rows(acc, sm.packs, sm.tile_b, s.dv, int(n_warp - j0 < tile ? n_warp - j0 : tile), lane);
  }
  for (int r = 0; r < R; ++r) {
    if (i0 + r >= s.tq) break;
    const Extent row = bh * s.tq + i0 + r;
    store_row(out + row * s.dv, acc[r], n[r] > 0 ? 1.0 / l[r] : 0.0, s.dv, lane);
    if (lane == 0) lse[row] = n[r] > 0 ? m[r] + ::log(l[r]) : neg_inf;
  }
}

/// delta_i = dout_i . out_i (one warp per row).
template <class T>
__global__ void attention_delta_kernel(Stat* delta, const T* out, const T* dout, Extent rows, Extent dv) {
  const int lane = threadIdx.x % warp;
  const Extent r = Extent(blockIdx.x) * tile_rows + threadIdx.x / warp;
  if (r >= rows) return;
  double s = 0;
  for (Extent e = lane; e < dv; e += warp) s += double(dout[r * dv + e]) * double(out[r * dv + e]);
  s = warp_sum(s);
  if (lane == 0) delta[r] = s;
}

template <class T, int PL, int R>
__global__ void attention_dq_kernel(T* dq, const T* q, const T* k, const T* v, const Stat* lse, const Stat* delta,
                                    const T* dout, AttentionShape s) {
  using C = Compute<T>;
  extern __shared__ __align__(16) unsigned char attention_smem[];
  const int lane = threadIdx.x % warp, w = threadIdx.x / warp;
  const Extent block0 = Extent(blockIdx.x) * tile_rows * R, i0 = block0 + Extent(w) * R, bh = blockIdx.y;
  const SharedLayout<C, R> sm(attention_smem, w, s.d + s.dv, 1, s.d);
  Pack<C, R>* qw = sm.own;
  Pack<C, R>* gw = sm.own + s.d;
  load_own_rows(qw, q + bh * s.tq * s.d, i0, s.tq, s.d, lane);
  load_own_rows(gw, dout + bh * s.tq * s.dv, i0, s.tq, s.dv, lane);
  C lc[R], dl[R];
  Extent n[R], n_warp = 0;
  for (int r = 0; r < R; ++r) {
    const bool active = i0 + r < s.tq;
    const double l = active ? lse[bh * s.tq + i0 + r] : neg_inf;
    lc[r] = C(l);
    dl[r] = C(active ? delta[bh * s.tq + i0 + r] : 0.0);
    n[r] = l == neg_inf ? 0 : visible_keys(s, i0 + r);
    n_warp = n[r] > n_warp ? n[r] : n_warp;
  }
  const Extent n_block = visible_keys(s, (block0 + tile_rows * R < s.tq ? block0 + tile_rows * R : s.tq) - 1);
  const C scale = C(s.scale);
  C acc[R][PL] = {};
  for (Extent j0 = 0; j0 < n_block; j0 += tile) {
    __syncthreads();
    load_tile(sm.tile_a, k + bh * s.tk * s.d, j0, s.tk, s.d);
    load_tile(sm.tile_b, v + bh * s.tk * s.dv, j0, s.tk, s.dv);
    __syncthreads();
    if (j0 >= n_warp) continue;
    C qk[R], gv[R];
    dot_rows(qk, qw, sm.tile_a + lane * (s.d + 1), s.d);
    dot_rows(gv, gw, sm.tile_b + lane * (s.dv + 1), s.dv);
    Pack<C, R> ds;
    for (int r = 0; r < R; ++r) {
      const bool valid = j0 + lane < n[r];
      const C p = valid ? exp_c(scale * qk[r] - lc[r]) : C(0);
      ds.v[r] = valid ? p * (gv[r] - dl[r]) : C(0);
    }
    sm.packs[lane] = ds;
    __syncwarp();
    accumulate_rows(acc, sm.packs, sm.tile_a, s.d, int(n_warp - j0 < tile ? n_warp - j0 : tile), lane);
  }
  for (int r = 0; r < R; ++r)
    if (i0 + r < s.tq) store_row(dq + (bh * s.tq + i0 + r) * s.d, acc[r], s.scale, s.d, lane);
}

template <class T, int PL, int R>
__global__ void attention_dkdv_kernel(T* dk, T* dv, const T* q, const T* k, const T* v, const Stat* lse,
                                      const Stat* delta, const T* dout, AttentionShape s) {
  using C = Compute<T>;
  extern __shared__ __align__(16) unsigned char attention_smem[];
  const int lane = threadIdx.x % warp, w = threadIdx.x / warp;
  const Extent block0 = Extent(blockIdx.x) * tile_rows * R, j0 = block0 + Extent(w) * R, bh = blockIdx.y;
  auto* lt = reinterpret_cast<double*>(attention_smem);  // the tile's lse and delta
  double* dt = lt + tile;
  const SharedLayout<C, R> sm(reinterpret_cast<unsigned char*>(dt + tile), w, s.d + s.dv, 2, s.d);
  Pack<C, R>* kw = sm.own;
  Pack<C, R>* vw = sm.own + s.d;
  load_own_rows(kw, k + bh * s.tk * s.d, j0, s.tk, s.d, lane);
  load_own_rows(vw, v + bh * s.tk * s.dv, j0, s.tk, s.dv, lane);
  Extent first[R];  // the first query row each key meets (s.tq: none)
  for (int r = 0; r < R; ++r) first[r] = j0 + r < s.tk ? first_query(s, j0 + r) : s.tq;
  const C scale = C(s.scale);
  C dk_acc[R][PL] = {}, dv_acc[R][PL] = {};
  for (Extent i0 = first_query(s, block0) / tile * tile; i0 < s.tq; i0 += tile) {  // first_query grows with j
    __syncthreads();
    load_tile(sm.tile_a, q + bh * s.tq * s.d, i0, s.tq, s.d);
    load_tile(sm.tile_b, dout + bh * s.tq * s.dv, i0, s.tq, s.dv);
    for (Extent t = threadIdx.x; t < tile; t += blockDim.x) {
      lt[t] = i0 + t < s.tq ? lse[bh * s.tq + i0 + t] : neg_inf;
      dt[t] = i0 + t < s.tq ? delta[bh * s.tq + i0 + t] : 0.0;
    }
    __syncthreads();
    if (i0 + tile <= first[0]) continue;  // uniform in the warp; first[0] is the warp's least
    const Extent i = i0 + lane;
    const bool seen = i < s.tq && lt[lane] != neg_inf;
    C kq[R], vg[R];
    dot_rows(kq, kw, sm.tile_a + lane * (s.d + 1), s.d);
    dot_rows(vg, vw, sm.tile_b + lane * (s.dv + 1), s.dv);
    Pack<C, R> p, ds;
    for (int r = 0; r < R; ++r) {
      const bool valid = seen && i >= first[r];
      p.v[r] = valid ? exp_c(scale * kq[r] - C(lt[lane])) : C(0);
      ds.v[r] = valid ? p.v[r] * (vg[r] - C(dt[lane])) : C(0);
    }
    sm.packs[lane] = p;
    sm.packs[tile + lane] = ds;
    __syncwarp();
    const int count = int(s.tq - i0 < tile ? s.tq - i0 : tile);
    accumulate_rows(dv_acc, sm.packs, sm.tile_b, s.dv, count, lane);
    accumulate_rows(dk_acc, sm.packs + tile, sm.tile_a, s.d, count, lane);
  }
  for (int r = 0; r < R; ++r) {
    if (j0 + r >= s.tk) break;
    const Extent key = bh * s.tk + j0 + r;
    store_row(dv + key * s.dv, dv_acc[r], 1.0, s.dv, lane);
    store_row(dk + key * s.d, dk_acc[r], s.scale, s.d, lane);
  }
}

template <class T>
__global__ void merge_blocks_kernel(T* out, Stat* lse, const T* out_a, const Stat* lse_a, const T* out_b,
                                    const Stat* lse_b, Extent rows, Extent dv) {
  for (Extent e = gidx(); e < rows * dv; e += gstride()) {
    const Extent r = e / dv;
    const double la = lse_a[r], lb = lse_b[r], mx = fmax(la, lb);
    const double l = mx == neg_inf ? neg_inf : mx + ::log(::exp(la - mx) + ::exp(lb - mx));
    const double wa = l == neg_inf ? 0.0 : ::exp(la - l), wb = l == neg_inf ? 0.0 : ::exp(lb - l);
    out[e] = T(wa * double(out_a[e]) + wb * double(out_b[e]));
    if (e % dv == 0) lse[r] = l;
  }
}

template <class T>
AttentionShape attention_shape(const char* op, const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k,
                               const CudaTensor<T, 4>& v, const AttentionOptions& o) {
  const auto &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  check(qs[3] <= attention_max_head_dim && vs[3] <= attention_max_head_dim, op, "head dimensions ", qs[3], " and ",
        vs[3], " exceed the ", attention_max_head_dim, " the CUDA kernels take");
  check(qs[0] * qs[1] <= 65535, op, "batch x heads = ", qs[0] * qs[1], " exceeds the grid's 65535");
  return {qs[0] * qs[1], qs[2], ks[2], qs[3], vs[3], o.causal, o.q_offset, o.k_offset,
          host::detail::attention_scale(o, qs[3])};
}

/// Blocks of tile_rows warps, R rows each, over `rows` rows of each of bh heads.
inline dim3 attention_grid(Extent rows, Extent bh, int rows_per_warp) {
  const Extent per_block = Extent(tile_rows) * rows_per_warp;
  return dim3(unsigned((rows + per_block - 1) / per_block), unsigned(bh));
}
inline constexpr unsigned attention_threads = tile_rows * warp;

/// Calls f(std::integral_constant<int, PL>{}, std::integral_constant<int, R>{}) with PL the
/// elements per lane that cover `width` (the accumulators live in registers, so their count is a
/// template parameter) and R the rows per warp: 4 while a warp's Packs of its own rows stay small
/// (width x 4 x sizeof(C) <= 2 KiB: head dimensions up to 128 in float, 64 in double), else 1.
template <class T, class F>
void with_blocking(Extent width, F&& f) {
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  using I8 = std::integral_constant<int, 8>;
  if (width * Extent(sizeof(Compute<T>)) <= 512) {
    if (width <= warp) f(I1{}, I4{});
    else if (width <= 2 * warp) f(I2{}, I4{});
    else f(I4{}, I4{});
  } else if (width <= 4 * warp) {
    f(I4{}, I1{});
  } else {
    f(I8{}, I1{});
  }
}

/// Above 48 KiB a kernel's dynamic shared memory must be asked for; a GPU that cannot grant it
/// (double at head dimensions past ~200 before Hopper) is a clear error, not a failed launch.
template <class Kernel>
void reserve_shared(Kernel* kernel, std::size_t bytes, const char* op, const AttentionShape& s) {
  if (bytes <= 48 * 1024) return;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) (void)cudaGetLastError();
  check(e == cudaSuccess, op, "head dimensions ", s.d, " and ", s.dv, " need ", bytes,
        " bytes of shared memory per block, which this GPU does not grant (", cudaGetErrorString(e), ")");
}

}  // namespace detail

template <FloatElement T>
AttentionForward<T> attention_fused(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k,
                                    const CudaTensor<T, 4>& v, const AttentionOptions& opts = {}) {
  const auto s = detail::attention_shape("attention", q, k, v, opts);
  AttentionForward<T> f{CudaTensor<T, 4>::uninitialized(Shape<4>{q.extent(0), q.extent(1), s.tq, s.dv}),
                        CudaTensor<Stat, 3>::uninitialized(Shape<3>{q.extent(0), q.extent(1), s.tq})};
  if (s.bh * s.tq == 0) return f;
  detail::with_blocking<T>(std::max(s.d, s.dv), [&](auto per_lane, auto rows) {
    constexpr int PL = decltype(per_lane)::value, R = decltype(rows)::value;
    auto* kernel = detail::attention_forward_kernel<T, PL, R>;
    const std::size_t bytes = detail::tile_bytes<T, R>(s.d, 1, s.d, s.dv, false);
    detail::reserve_shared(kernel, bytes, "attention", s);
    kernel<<<detail::attention_grid(s.tq, s.bh, R), detail::attention_threads, bytes, detail::stream()>>>(
        f.out.data(), f.lse.data(), q.data(), k.data(), v.data(), s);
  });
  detail::launched("attention_forward_kernel");
  return f;
}

template <FloatElement T>
AttentionBackward<T> attention_fused_backward(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k,
                                              const CudaTensor<T, 4>& v, const CudaTensor<T, 4>& out,
                                              const CudaTensor<Stat, 3>& lse, const CudaTensor<T, 4>& dout,
                                              const AttentionOptions& opts = {}) {
  const auto s = detail::attention_shape("attention_backward", q, k, v, opts);
  AttentionBackward<T> g{CudaTensor<T, 4>::uninitialized(q.shape()), CudaTensor<T, 4>(k.shape()),
                         CudaTensor<T, 4>(v.shape())};
  if (s.bh * s.tq == 0) {
    g.dq = CudaTensor<T, 4>(q.shape());
    return g;
  }
  auto delta = CudaTensor<Stat, 1>::uninitialized(Shape<1>{s.bh * s.tq});
  detail::attention_delta_kernel<<<unsigned((s.bh * s.tq + detail::tile_rows - 1) / detail::tile_rows),
                                   detail::attention_threads, 0, detail::stream()>>>(delta.data(), out.data(),
                                                                                     dout.data(), s.bh * s.tq, s.dv);
  detail::launched("attention_delta_kernel");
  detail::with_blocking<T>(std::max(s.d, s.dv), [&](auto per_lane, auto rows) {
    constexpr int PL = decltype(per_lane)::value, R = decltype(rows)::value;
    auto* dq_kernel = detail::attention_dq_kernel<T, PL, R>;
    const std::size_t dq_bytes = detail::tile_bytes<T, R>(s.d + s.dv, 1, s.d, s.dv, false);
    detail::reserve_shared(dq_kernel, dq_bytes, "attention_backward", s);
    dq_kernel<<<detail::attention_grid(s.tq, s.bh, R), detail::attention_threads, dq_bytes, detail::stream()>>>(
        g.dq.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), dout.data(), s);
    detail::launched("attention_dq_kernel");
    if (s.tk == 0) return;
    auto* dkdv_kernel = detail::attention_dkdv_kernel<T, PL, R>;
    const std::size_t dkdv_bytes = detail::tile_bytes<T, R>(s.d + s.dv, 2, s.d, s.dv, true);
    detail::reserve_shared(dkdv_kernel, dkdv_bytes, "attention_backward", s);
    dkdv_kernel<<<detail::attention_grid(s.tk, s.bh, R), detail::attention_threads, dkdv_bytes, detail::stream()>>>(
        g.dk.data(), g.dv.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), dout.data(), s);
    detail::launched("attention_dkdv_kernel");
  });
  return g;
}

template <FloatElement T>
AttentionForward<T> merge_attention_blocks(const CudaTensor<T, 4>& out_a, const CudaTensor<Stat, 3>& lse_a,
                                           const CudaTensor<T, 4>& out_b, const CudaTensor<Stat, 3>& lse_b) {
  const auto& s = out_a.shape();
  const Shape<3> ls{s[0], s[1], s[2]};
  AttentionForward<T> m{CudaTensor<T, 4>::uninitialized(s), CudaTensor<Stat, 3>::uninitialized(ls)};
  if (out_a.numel() == 0) return m;
  detail::merge_blocks_kernel<<<detail::grid_for(out_a.numel()), detail::block, 0, detail::stream()>>>(
      m.out.data(), m.lse.data(), out_a.data(), lse_a.data(), out_b.data(), lse_b.data(), numel(ls), s[3]);
  detail::launched("merge_blocks_kernel");
  return m;
}

}  // namespace dtensor::kernels::cuda
