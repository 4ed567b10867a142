// dtensor/kernels/cuda/attention.cuh — the twin of kernels/host/attention.hpp on CudaTensor: exact
// (causal) attention as fused, memory-efficient kernels with the log-sum-exp output, its backward
// from the saved lse, and merge_attention_blocks; the host's options (causal, scale, q/k offsets
// for ring attention).
//
// No T x T matrix exists at any point. Forward: one warp per query row streams the keys it may
// see in tiles of 32 through shared memory (shared by the block's 8 rows), each lane scoring one
// key of the tile, with an online softmax over tiles (running max and sum, FlashAttention's
// recurrence); each lane holds D / 32 elements of the output accumulator. Backward
// (FlashAttention-2's split, without atomics, so deterministic): delta_i = dout_i . out_i; one
// warp per query row accumulates dq_i = scale sum_j p_ij (dp_ij - delta_i) k_j over key tiles;
// one warp per key row accumulates dv_j = sum_i p_ij dout_i and dk_j = scale sum_i ds_ij q_i over
// query tiles, recomputing p_ij = exp(s_ij - lse_i).
// Statistics (running max and sum, lse, delta) are in double (the host's Stat); scores and
// accumulators in float for float and bf16, double for double; head dimensions up to 256.
// bfloat16 inputs are widened on load and the outputs rounded once on store (the same contract as
// the host kernel and cuBLAS's bf16 GEMM), and the lse stays double: a bf16 model's ring
// attention merges blocks with the statistics of an fp32 run.
// The scores are CUDA-core FMAs, not tensor-core MMAs: slower than a materialised cuBLAS
// version at large T (bench/bench_attention_cuda.cu measures it;
// docs/gpu.md has the figures).
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
/// rather than one per key; the block's `tile_rows` warps (one row each) share every tile read
/// from global memory. The per-element math (scores, p, ds, the accumulators) runs in the compute
/// type C: float for float and bf16 (bf16 widens exactly; the host forms these in float GEMMs too),
/// double for double; the softmax statistics (running max and sum, lse) stay double. Tiles and a
/// warp's own q (or k) and dout (or v) rows sit in shared memory in C.
inline constexpr int tile = warp;
inline constexpr int tile_rows = 8;  // warps, hence rows, per block

template <class T>
using Compute = std::conditional_t<std::is_same_v<T, double>, double, float>;

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
/// A warp's own row [0, n) into shared memory.
template <class C, class T>
__device__ void load_own_row(C* dst, const T* row, Extent n, int lane) {
  for (Extent e = lane; e < n; e += warp) dst[e] = C(row[e]);
}
template <class C>
__device__ C dot_shared(const C* x, const C* row, Extent n) {
  C s = 0;
  for (Extent e = 0; e < n; ++e) s += x[e] * row[e];
  return s;
}
/// acc[c] (element lane + warp * c) += sum over t < count of w_t * tile[t][element], where lane t holds w_t.
template <int PL, class C>
__device__ void accumulate_tile(C (&acc)[PL], C w, const C* tile_rows_, Extent width, int count, int lane) {
  const Extent stride = width + 1;
  for (int t = 0; t < count; ++t) {
    const C wt = __shfl_sync(0xffffffffu, w, t);
    const C* r = tile_rows_ + t * stride;
    for (int c = 0; c < PL; ++c) {
      const Extent e = lane + Extent(c) * warp;
      if (e < width) acc[c] += wt * r[e];
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

/// Shared memory of a kernel: the tile's statistics (lse and delta, if any), own rows of
/// `own_width` per warp, then two tiles of the given widths.
template <class T>
std::size_t tile_bytes(Extent own_width, Extent tile_width_a, Extent tile_width_b, bool stats) {
  return (stats ? std::size_t(2 * tile) * sizeof(double) : 0) +
         std::size_t(tile_rows * own_width + tile * (tile_width_a + 1 + tile_width_b + 1)) * sizeof(Compute<T>);
}

template <class T, int PL>
__global__ void attention_forward_kernel(T* out, Stat* lse, const T* q, const T* k, const T* v, AttentionShape s) {
  using C = Compute<T>;
  extern __shared__ double attention_smem[];
  const int lane = threadIdx.x % warp, w = threadIdx.x / warp;
  const Extent i0 = Extent(blockIdx.x) * tile_rows, i = i0 + w, bh = blockIdx.y;
  const bool active = i < s.tq;
  C* qw = reinterpret_cast<C*>(attention_smem) + w * s.d;
  C* kt = reinterpret_cast<C*>(attention_smem) + tile_rows * s.d;
  C* vt = kt + tile * (s.d + 1);
  if (active) load_own_row(qw, q + (bh * s.tq + i) * s.d, s.d, lane);
  const Extent n = active ? visible_keys(s, i) : 0;
  const Extent n_block = visible_keys(s, (i0 + tile_rows < s.tq ? i0 + tile_rows : s.tq) - 1);  // grows with i
  const C scale = C(s.scale);
  C acc[PL] = {};
  double m = neg_inf, l = 0;
  for (Extent j0 = 0; j0 < n_block; j0 += tile) {
    __syncthreads();  // the previous tile is consumed (and qw written)
    load_tile(kt, k + bh * s.tk * s.d, j0, s.tk, s.d);
    load_tile(vt, v + bh * s.tk * s.dv, j0, s.tk, s.dv);
    __syncthreads();
    if (j0 >= n) continue;  // uniform in the warp
    const bool valid = j0 + lane < n;
    const C score = valid ? scale * dot_shared(qw, kt + lane * (s.d + 1), s.d) : C(neg_inf);
    const double m_new = fmax(m, warp_max(double(score))), corr = ::exp(m - m_new);
    const C p = valid ? exp_c(C(score - m_new)) : C(0);
    l = l * corr + warp_sum(double(p));
    for (int c = 0; c < PL; ++c) acc[c] *= C(corr);
    accumulate_tile(acc, p, vt, s.dv, int(n - j0 < tile ? n - j0 : tile), lane);
    m = m_new;
  }
  if (!active) return;
  store_row(out + (bh * s.tq + i) * s.dv, acc, n > 0 ? 1.0 / l : 0.0, s.dv, lane);
  if (lane == 0) lse[bh * s.tq + i] = n > 0 ? m + ::log(l) : neg_inf;
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

template <class T, int PL>
__global__ void attention_dq_kernel(T* dq, const T* q, const T* k, const T* v, const Stat* lse, const Stat* delta,
                                    const T* dout, AttentionShape s) {
  using C = Compute<T>;
  extern __shared__ double attention_smem[];
  const int lane = threadIdx.x % warp, w = threadIdx.x / warp;
  const Extent i0 = Extent(blockIdx.x) * tile_rows, i = i0 + w, bh = blockIdx.y, row = bh * s.tq + i;
  const bool active = i < s.tq;
  C* qw = reinterpret_cast<C*>(attention_smem) + w * (s.d + s.dv);
  C* gw = qw + s.d;
  C* kt = reinterpret_cast<C*>(attention_smem) + tile_rows * (s.d + s.dv);
  C* vt = kt + tile * (s.d + 1);
  if (active) {
    load_own_row(qw, q + row * s.d, s.d, lane);
    load_own_row(gw, dout + row * s.dv, s.dv, lane);
  }
  const double l = active ? lse[row] : neg_inf;
  const C lc = C(l), dl = C(active ? delta[row] : 0.0), scale = C(s.scale);
  const Extent n = l == neg_inf ? 0 : visible_keys(s, i);
  const Extent n_block = visible_keys(s, (i0 + tile_rows < s.tq ? i0 + tile_rows : s.tq) - 1);
  C acc[PL] = {};
  for (Extent j0 = 0; j0 < n_block; j0 += tile) {
    __syncthreads();
    load_tile(kt, k + bh * s.tk * s.d, j0, s.tk, s.d);
    load_tile(vt, v + bh * s.tk * s.dv, j0, s.tk, s.dv);
    __syncthreads();
    if (j0 >= n) continue;
    const bool valid = j0 + lane < n;
    const C p = valid ? exp_c(scale * dot_shared(qw, kt + lane * (s.d + 1), s.d) - lc) : C(0);
    const C ds = valid ? p * (dot_shared(gw, vt + lane * (s.dv + 1), s.dv) - dl) : C(0);
    accumulate_tile(acc, ds, kt, s.d, int(n - j0 < tile ? n - j0 : tile), lane);
  }
  if (active) store_row(dq + row * s.d, acc, s.scale, s.d, lane);
}

template <class T, int PL>
__global__ void attention_dkdv_kernel(T* dk, T* dv, const T* q, const T* k, const T* v, const Stat* lse,
                                      const Stat* delta, const T* dout, AttentionShape s) {
  using C = Compute<T>;
  extern __shared__ double attention_smem[];
  const int lane = threadIdx.x % warp, w = threadIdx.x / warp;
  const Extent j0 = Extent(blockIdx.x) * tile_rows, j = j0 + w, bh = blockIdx.y, key = bh * s.tk + j;
  const bool active = j < s.tk;
  double* lt = attention_smem;  // the tile's lse and delta
  double* dt = lt + tile;
  C* kw = reinterpret_cast<C*>(dt + tile) + w * (s.d + s.dv);
  C* vw = kw + s.d;
  C* qt = reinterpret_cast<C*>(dt + tile) + tile_rows * (s.d + s.dv);
  C* gt = qt + tile * (s.d + 1);
  if (active) {
    load_own_row(kw, k + key * s.d, s.d, lane);
    load_own_row(vw, v + key * s.dv, s.dv, lane);
  }
  const Extent first = active ? first_query(s, j) : s.tq;
  const C scale = C(s.scale);
  C dk_acc[PL] = {}, dv_acc[PL] = {};
  for (Extent i0 = first_query(s, j0) / tile * tile; i0 < s.tq; i0 += tile) {  // first_query grows with j
    __syncthreads();
    load_tile(qt, q + bh * s.tq * s.d, i0, s.tq, s.d);
    load_tile(gt, dout + bh * s.tq * s.dv, i0, s.tq, s.dv);
    for (Extent t = threadIdx.x; t < tile; t += blockDim.x) {
      lt[t] = i0 + t < s.tq ? lse[bh * s.tq + i0 + t] : neg_inf;
      dt[t] = i0 + t < s.tq ? delta[bh * s.tq + i0 + t] : 0.0;
    }
    __syncthreads();
    if (i0 + tile <= first) continue;  // uniform in the warp
    const Extent i = i0 + lane;
    const bool valid = i >= first && i < s.tq && lt[lane] != neg_inf;
    const C p = valid ? exp_c(scale * dot_shared(kw, qt + lane * (s.d + 1), s.d) - C(lt[lane])) : C(0);
    const C ds = valid ? p * (dot_shared(vw, gt + lane * (s.dv + 1), s.dv) - C(dt[lane])) : C(0);
    const int count = int(s.tq - i0 < tile ? s.tq - i0 : tile);
    accumulate_tile(dv_acc, p, gt, s.dv, count, lane);
    accumulate_tile(dk_acc, ds, qt, s.d, count, lane);
  }
  if (!active) return;
  store_row(dv + key * s.dv, dv_acc, 1.0, s.dv, lane);
  store_row(dk + key * s.d, dk_acc, s.scale, s.d, lane);
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
  host::detail::check_attention(op, q, k, v);
  const auto &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  check(qs[3] <= attention_max_head_dim && vs[3] <= attention_max_head_dim, op, "head dimensions ", qs[3], " and ",
        vs[3], " exceed the ", attention_max_head_dim, " the CUDA kernels take");
  check(qs[0] * qs[1] <= 65535, op, "batch x heads = ", qs[0] * qs[1], " exceeds the grid's 65535");
  return {qs[0] * qs[1], qs[2], ks[2], qs[3], vs[3], o.causal, o.q_offset, o.k_offset,
          host::detail::attention_scale(o, qs[3])};
}

inline dim3 attention_grid(Extent rows, Extent bh) {
  return dim3(unsigned((rows + tile_rows - 1) / tile_rows), unsigned(bh));
}
inline constexpr unsigned attention_threads = tile_rows * warp;

/// Calls f(std::integral_constant<int, PL>{}) with PL = the elements per lane that cover `width`
/// (the accumulators live in registers, so their count is a template parameter).
template <class F>
void with_per_lane(Extent width, F&& f) {
  if (width <= warp) f(std::integral_constant<int, 1>{});
  else if (width <= 2 * warp) f(std::integral_constant<int, 2>{});
  else if (width <= 4 * warp) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 8>{});
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
AttentionForward<T> attention(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k, const CudaTensor<T, 4>& v,
                              const AttentionOptions& opts = {}) {
  const auto s = detail::attention_shape("attention", q, k, v, opts);
  AttentionForward<T> f{CudaTensor<T, 4>::uninitialized(Shape<4>{q.extent(0), q.extent(1), s.tq, s.dv}),
                        CudaTensor<Stat, 3>::uninitialized(Shape<3>{q.extent(0), q.extent(1), s.tq})};
  if (s.bh * s.tq == 0) return f;
  detail::with_per_lane(std::max(s.d, s.dv), [&](auto per_lane) {
    auto* kernel = detail::attention_forward_kernel<T, decltype(per_lane)::value>;
    const std::size_t bytes = detail::tile_bytes<T>(s.d, s.d, s.dv, false);
    detail::reserve_shared(kernel, bytes, "attention", s);
    kernel<<<detail::attention_grid(s.tq, s.bh), detail::attention_threads, bytes, detail::stream()>>>(
        f.out.data(), f.lse.data(), q.data(), k.data(), v.data(), s);
  });
  detail::launched("attention_forward_kernel");
  return f;
}

template <FloatElement T>
AttentionBackward<T> attention_backward(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k, const CudaTensor<T, 4>& v,
                                        const CudaTensor<T, 4>& out, const CudaTensor<Stat, 3>& lse,
                                        const CudaTensor<T, 4>& dout, const AttentionOptions& opts = {}) {
  const auto s = detail::attention_shape("attention_backward", q, k, v, opts);
  host::detail::check_attention_saved(q, v, out, lse, dout);
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
  detail::with_per_lane(std::max(s.d, s.dv), [&](auto per_lane) {
    constexpr int PL = decltype(per_lane)::value;
    auto* dq_kernel = detail::attention_dq_kernel<T, PL>;
    const std::size_t dq_bytes = detail::tile_bytes<T>(s.d + s.dv, s.d, s.dv, false);
    detail::reserve_shared(dq_kernel, dq_bytes, "attention_backward", s);
    dq_kernel<<<detail::attention_grid(s.tq, s.bh), detail::attention_threads, dq_bytes, detail::stream()>>>(
        g.dq.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), dout.data(), s);
    detail::launched("attention_dq_kernel");
    if (s.tk == 0) return;
    auto* dkdv_kernel = detail::attention_dkdv_kernel<T, PL>;
    const std::size_t dkdv_bytes = detail::tile_bytes<T>(s.d + s.dv, s.d, s.dv, true);
    detail::reserve_shared(dkdv_kernel, dkdv_bytes, "attention_backward", s);
    dkdv_kernel<<<detail::attention_grid(s.tk, s.bh), detail::attention_threads, dkdv_bytes, detail::stream()>>>(
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
  detail::check(out_b.shape() == s && lse_a.shape() == ls && lse_b.shape() == ls, "merge_attention_blocks", "out_a ",
                to_string(s), ", lse_a ", to_string(lse_a.shape()), ", out_b ", to_string(out_b.shape()), ", lse_b ",
                to_string(lse_b.shape()), ": blocks must have the same extents");
  AttentionForward<T> m{CudaTensor<T, 4>::uninitialized(s), CudaTensor<Stat, 3>::uninitialized(ls)};
  if (out_a.numel() == 0) return m;
  detail::merge_blocks_kernel<<<detail::grid_for(out_a.numel()), detail::block, 0, detail::stream()>>>(
      m.out.data(), m.lse.data(), out_a.data(), lse_a.data(), out_b.data(), lse_b.data(), numel(ls), s[3]);
  detail::launched("merge_blocks_kernel");
  return m;
}

}  // namespace dtensor::kernels::cuda
