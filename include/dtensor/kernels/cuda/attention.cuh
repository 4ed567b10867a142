// dtensor/kernels/cuda/attention.cuh — the twin of kernels/host/attention.hpp on CudaTensor: exact
// (causal) attention as fused, memory-efficient kernels with the log-sum-exp output, its backward
// from the saved lse, and merge_attention_blocks; the host's options (causal, scale, q/k offsets
// for ring attention).
//
// No T x T matrix exists at any point. Forward: one warp per query row streams the keys it may
// see with an online softmax (running max and sum, FlashAttention's recurrence), each lane
// holding D / 32 elements of q and of the output accumulator. Backward (FlashAttention-2's
// split, without atomics, so deterministic): delta_i = dout_i . out_i; one warp per query row
// accumulates dq_i = scale sum_j p_ij (dp_ij - delta_i) k_j; one warp per key row accumulates
// dv_j = sum_i p_ij dout_i and dk_j = scale sum_i ds_ij q_i, recomputing p_ij = exp(s_ij - lse_i).
// Scores, accumulators and statistics are in double (the host's Stat); head dimensions up to 256.
// bfloat16 inputs are widened on load and the outputs rounded once on store (the same contract as
// the host kernel and cuBLAS's bf16 GEMM), and the lse stays double: a bf16 model's ring
// attention merges blocks with the statistics of an fp32 run.
// These kernels do not yet tile K/V through shared memory (every warp reads its keys from
// global memory / L2); docs/gpu.md says so and bench/bench_attention_cuda.cu measures them.
#pragma once

#include <cmath>

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
inline constexpr int attention_warps = 4;  // rows per block
inline constexpr int per_lane = int(attention_max_head_dim) / warp;

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

/// Loads row[0, n) into per-lane registers (element lane + warp * c).
template <class T>
__device__ void load_row(double (&r)[per_lane], const T* row, Extent n, int lane) {
  for (int c = 0; c < per_lane; ++c) {
    const Extent e = lane + Extent(c) * warp;
    r[c] = e < n ? double(row[e]) : 0.0;
  }
}
template <class T>
__device__ double dot_row(const double (&r)[per_lane], const T* row, Extent n, int lane) {
  double s = 0;
  for (int c = 0; c < per_lane; ++c) {
    const Extent e = lane + Extent(c) * warp;
    if (e < n) s += r[c] * double(row[e]);
  }
  return warp_sum(s);
}

template <class T>
__global__ void attention_forward_kernel(T* out, Stat* lse, const T* q, const T* k, const T* v, AttentionShape s) {
  const int lane = threadIdx.x % warp;
  const Extent i = Extent(blockIdx.x) * attention_warps + threadIdx.x / warp, bh = blockIdx.y;
  if (i >= s.tq) return;  // a whole warp leaves together
  const T* kb = k + bh * s.tk * s.d;
  const T* vb = v + bh * s.tk * s.dv;
  double qr[per_lane], acc[per_lane] = {};
  load_row(qr, q + (bh * s.tq + i) * s.d, s.d, lane);
  double m = neg_inf, l = 0;
  const Extent n = visible_keys(s, i);
  for (Extent j = 0; j < n; ++j) {
    const double score = s.scale * dot_row(qr, kb + j * s.d, s.d, lane);
    const double m_new = fmax(m, score), corr = ::exp(m - m_new), p = ::exp(score - m_new);
    l = l * corr + p;
    for (int c = 0; c < per_lane; ++c) {
      const Extent e = lane + Extent(c) * warp;
      acc[c] = acc[c] * corr + (e < s.dv ? p * double(vb[j * s.dv + e]) : 0.0);
    }
    m = m_new;
  }
  T* o = out + (bh * s.tq + i) * s.dv;
  for (int c = 0; c < per_lane; ++c) {
    const Extent e = lane + Extent(c) * warp;
    if (e < s.dv) o[e] = T(n > 0 ? acc[c] / l : 0.0);
  }
  if (lane == 0) lse[bh * s.tq + i] = n > 0 ? m + ::log(l) : neg_inf;
}

/// delta_i = dout_i . out_i (one warp per row).
template <class T>
__global__ void attention_delta_kernel(Stat* delta, const T* out, const T* dout, Extent rows, Extent dv) {
  const int lane = threadIdx.x % warp;
  const Extent r = Extent(blockIdx.x) * attention_warps + threadIdx.x / warp;
  if (r >= rows) return;
  double g[per_lane];
  load_row(g, dout + r * dv, dv, lane);
  const double d = dot_row(g, out + r * dv, dv, lane);
  if (lane == 0) delta[r] = d;
}

template <class T>
__global__ void attention_dq_kernel(T* dq, const T* q, const T* k, const T* v, const Stat* lse, const Stat* delta,
                                    const T* dout, AttentionShape s) {
  const int lane = threadIdx.x % warp;
  const Extent i = Extent(blockIdx.x) * attention_warps + threadIdx.x / warp, bh = blockIdx.y;
  if (i >= s.tq) return;
  const Extent row = bh * s.tq + i;
  const T* kb = k + bh * s.tk * s.d;
  const T* vb = v + bh * s.tk * s.dv;
  double qr[per_lane], gr[per_lane], acc[per_lane] = {};
  load_row(qr, q + row * s.d, s.d, lane);
  load_row(gr, dout + row * s.dv, s.dv, lane);
  const double l = lse[row], dl = delta[row];
  const Extent n = l == neg_inf ? 0 : visible_keys(s, i);
  for (Extent j = 0; j < n; ++j) {
    const double p = ::exp(s.scale * dot_row(qr, kb + j * s.d, s.d, lane) - l);
    const double ds = p * (dot_row(gr, vb + j * s.dv, s.dv, lane) - dl);
    for (int c = 0; c < per_lane; ++c) {
      const Extent e = lane + Extent(c) * warp;
      if (e < s.d) acc[c] += ds * double(kb[j * s.d + e]);
    }
  }
  for (int c = 0; c < per_lane; ++c) {
    const Extent e = lane + Extent(c) * warp;
    if (e < s.d) dq[row * s.d + e] = T(s.scale * acc[c]);
  }
}

template <class T>
__global__ void attention_dkdv_kernel(T* dk, T* dv, const T* q, const T* k, const T* v, const Stat* lse,
                                      const Stat* delta, const T* dout, AttentionShape s) {
  const int lane = threadIdx.x % warp;
  const Extent j = Extent(blockIdx.x) * attention_warps + threadIdx.x / warp, bh = blockIdx.y;
  if (j >= s.tk) return;
  const Extent key = bh * s.tk + j;
  const T* qb = q + bh * s.tq * s.d;
  const T* gb = dout + bh * s.tq * s.dv;
  double kr[per_lane], vr[per_lane], dk_acc[per_lane] = {}, dv_acc[per_lane] = {};
  load_row(kr, k + key * s.d, s.d, lane);
  load_row(vr, v + key * s.dv, s.dv, lane);
  for (Extent i = first_query(s, j); i < s.tq; ++i) {
    const double l = lse[bh * s.tq + i];
    if (l == neg_inf) continue;
    const double p = ::exp(s.scale * dot_row(kr, qb + i * s.d, s.d, lane) - l);
    const double ds = p * (dot_row(vr, gb + i * s.dv, s.dv, lane) - delta[bh * s.tq + i]);
    for (int c = 0; c < per_lane; ++c) {
      const Extent e = lane + Extent(c) * warp;
      if (e < s.dv) dv_acc[c] += p * double(gb[i * s.dv + e]);
      if (e < s.d) dk_acc[c] += ds * double(qb[i * s.d + e]);
    }
  }
  for (int c = 0; c < per_lane; ++c) {
    const Extent e = lane + Extent(c) * warp;
    if (e < s.dv) dv[key * s.dv + e] = T(dv_acc[c]);
    if (e < s.d) dk[key * s.d + e] = T(s.scale * dk_acc[c]);
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
  host::detail::check_attention(op, q, k, v);
  const auto &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  check(qs[3] <= attention_max_head_dim && vs[3] <= attention_max_head_dim, op, "head dimensions ", qs[3], " and ",
        vs[3], " exceed the ", attention_max_head_dim, " the CUDA kernels take");
  check(qs[0] * qs[1] <= 65535, op, "batch x heads = ", qs[0] * qs[1], " exceeds the grid's 65535");
  return {qs[0] * qs[1], qs[2], ks[2], qs[3], vs[3], o.causal, o.q_offset, o.k_offset,
          host::detail::attention_scale(o, qs[3])};
}

inline dim3 attention_grid(Extent rows, Extent bh) {
  return dim3(unsigned((rows + attention_warps - 1) / attention_warps), unsigned(bh));
}

}  // namespace detail

template <FloatElement T>
AttentionForward<T> attention(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k, const CudaTensor<T, 4>& v,
                              const AttentionOptions& opts = {}) {
  const auto s = detail::attention_shape("attention", q, k, v, opts);
  AttentionForward<T> f{CudaTensor<T, 4>::uninitialized(Shape<4>{q.extent(0), q.extent(1), s.tq, s.dv}),
                        CudaTensor<Stat, 3>::uninitialized(Shape<3>{q.extent(0), q.extent(1), s.tq})};
  if (s.bh * s.tq == 0) return f;
  detail::attention_forward_kernel<<<detail::attention_grid(s.tq, s.bh), detail::attention_warps * detail::warp, 0,
                                     detail::stream()>>>(f.out.data(), f.lse.data(), q.data(), k.data(), v.data(), s);
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
  const unsigned threads = detail::attention_warps * detail::warp;
  auto delta = CudaTensor<Stat, 1>::uninitialized(Shape<1>{s.bh * s.tq});
  detail::attention_delta_kernel<<<unsigned((s.bh * s.tq + detail::attention_warps - 1) / detail::attention_warps),
                                   threads, 0, detail::stream()>>>(delta.data(), out.data(), dout.data(), s.bh * s.tq,
                                                                   s.dv);
  detail::launched("attention_delta_kernel");
  detail::attention_dq_kernel<<<detail::attention_grid(s.tq, s.bh), threads, 0, detail::stream()>>>(
      g.dq.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), dout.data(), s);
  detail::launched("attention_dq_kernel");
  if (s.tk > 0) {
    detail::attention_dkdv_kernel<<<detail::attention_grid(s.tk, s.bh), threads, 0, detail::stream()>>>(
        g.dk.data(), g.dv.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), dout.data(), s);
    detail::launched("attention_dkdv_kernel");
  }
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
