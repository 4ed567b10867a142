// dtensor/kernels/cuda/attention_gemm.cuh — exact (causal) attention on CudaTensor through cuBLAS:
// the scores of a chunk of query rows materialised, the products as strided-batched GEMMs over
// (batch, head), the softmax by a row kernel. The same results and options as attention_fused.cuh
// (causal, scale, q/k offsets for ring attention; lse output, backward from the saved lse).
//
//   auto f = kernels::cuda::attention_gemm(q, k, v, opts);            // f.out, f.lse
//   auto g = kernels::cuda::attention_gemm_backward(q, k, v, f.out, f.lse, dout, opts);
//
// Why: cuBLAS's GEMMs run at a large fraction of the GPU's peak (tensor cores under TF32), the
// fused CUDA-core kernels at a small one (docs/benchmarks.md, bench_attention_cuda). The price is
// a workspace of one chunk's scores ([B*H, rows, keys] in the compute type; two in the backward),
// bounded by attention_workspace_bytes(): the chunk's rows are as many as fit it, and under a
// causal mask at most a quarter of the queries (256 rows at least), so that each chunk multiplies
// only the keys its last row sees (a causal pass costs about (n + 1) / 2n of the full square over
// n chunks; more chunks cost launches: bench_attention_cuda's gemm_causal_rows measured 128, 256,
// 512 and T rows, docs/benchmarks.md).
//
// Per chunk of query rows [i0, i0 + rows), keys [0, n) with n what its last row sees:
//   forward:  S = scale Q K^T;  lse_i, P = exp(S - lse) (masked: 0 where j >= visible(i));  O = P V
//   backward: S, P again from the saved lse;  dV += P^T dO;  dP = dO V^T;  dS = P (dP - delta);
//             dQ = scale dS K;  dK += scale dS^T Q        (delta_i = dout_i . out_i, in double)
// Types as the fused kernels and the host: float and double compute in themselves; bfloat16
// computes in float and rounds the results once: the GEMMs of two bf16 operands (S = Q K^T and
// dP = dO V^T) run on bf16 tensor cores with fp32 accumulation and a float result
// (gemm_batched_widening: each product exact in float), the others multiply a float P or dS by a
// widened copy (of v in the forward; of q, k and dout in the backward: O(T D) each). The
// statistics (lse, delta) are double. TF32 applies to the float GEMMs when allow_tf32(true) —
// the caller's opt-in, as for every float GEMM.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <type_traits>

#include "dtensor/kernels/cuda/attention_fused.cuh"  // AttentionShape, attention_shape, delta kernel
#include "dtensor/kernels/cuda/cast.cuh"
#include "dtensor/kernels/cuda/gemm.cuh"

namespace dtensor::kernels::cuda {

namespace detail {

inline std::atomic<std::size_t>& attention_workspace_switch() {
  static std::atomic<std::size_t> bytes{std::size_t(256) << 20};
  return bytes;
}

/// Row softmax of one chunk's scores in place, masked to the keys each row sees; one warp per row.
/// Forward (lse_in == nullptr): writes the row's lse (double: max, then the sum of exp in double);
/// backward: p = exp(s - lse_in). Rows that see no key get p = 0 (and lse = -inf).
template <class C>
__global__ void attention_probs_kernel(C* s, Stat* lse_out, const Stat* lse_in, AttentionShape sh, Extent i0,
                                       Extent rows, Extent keys) {
  const int lane = threadIdx.x % warp;
  const Extent r = Extent(blockIdx.x) * tile_rows + threadIdx.x / warp, bh = blockIdx.y;
  if (r >= rows) return;
  const Extent i = i0 + r;
  C* row = s + (bh * rows + r) * keys;
  const Extent seen = visible_keys(sh, i), n = seen < keys ? seen : keys;
  double lse = neg_inf;
  if (lse_in) {
    lse = lse_in[bh * sh.tq + i];
  } else if (n > 0) {
    double m = neg_inf;
    for (Extent j = lane; j < n; j += warp) m = fmax(m, double(row[j]));
    m = warp_max(m);
    double l = 0;
    for (Extent j = lane; j < n; j += warp) l += double(exp_c(C(double(row[j]) - m)));
    lse = m + ::log(warp_sum(l));
  }
  if (!lse_in && lane == 0) lse_out[bh * sh.tq + i] = lse;
  const bool any = n > 0 && lse != neg_inf;
  for (Extent j = lane; j < keys; j += warp) row[j] = any && j < n ? exp_c(C(double(row[j]) - lse)) : C(0);
}

/// dS = P (dP - delta) in place over one chunk ([bh, rows, keys]); the host's order of operations.
template <class C>
__global__ void attention_ds_kernel(C* ds, const C* p, const Stat* delta, Extent tq, Extent i0, Extent rows,
                                    Extent keys, Extent total) {
  for (Extent e = gidx(); e < total; e += gstride()) {
    const Extent row = e / keys, bh = row / rows;
    ds[e] = C(double(p[e]) * (double(ds[e]) - delta[bh * tq + i0 + (row - bh * rows)]));
  }
}

/// A tensor's elements in the compute type: its own memory for float and double, a widened copy
/// for bfloat16.
template <class T>
class Widened {
 public:
  using C = Compute<T>;
  explicit Widened(const CudaTensor<T, 4>& x) {
    if constexpr (std::is_same_v<T, C>) {
      p_ = x.data();
    } else {
      copy_ = CudaTensor<C, 4>::uninitialized(x.shape());
      cast_into(copy_, x);
      p_ = copy_.data();
    }
  }
  const C* data() const { return p_; }

 private:
  CudaTensor<C, 4> copy_;
  const C* p_ = nullptr;
};

/// An output in the compute type: the result tensor itself where the types agree, else a buffer
/// rounded into it by finish().
template <class T>
class ComputeOut {
 public:
  using C = Compute<T>;
  explicit ComputeOut(CudaTensor<T, 4>& out) : out_(out) {
    if constexpr (std::is_same_v<T, C>) {
      p_ = out.data();
    } else {
      buf_ = CudaTensor<C, 4>(out.shape());  // zeros: the backward accumulates dK and dV into it
      p_ = buf_.data();
    }
  }
  C* data() { return p_; }
  void finish() {
    if constexpr (!std::is_same_v<T, C>) cast_into(out_, buf_);
  }

 private:
  CudaTensor<T, 4>& out_;
  CudaTensor<C, 4> buf_;
  C* p_ = nullptr;
};

/// Query rows per chunk: `requested` if given, else as many as `buffers` score chunks of `elem`
/// bytes fit the workspace (a multiple of 64 past 64, for the GEMMs' tiles); causal: at most
/// max(256, tq / 4 rounded up to 64), so that chunks skip the keys above the diagonal.
inline Extent attention_chunk_rows(const AttentionShape& s, Extent requested, int buffers, std::size_t elem) {
  const Extent tq = std::max<Extent>(s.tq, 1);
  if (requested > 0) return std::min(requested, tq);
  const std::size_t per_row = std::size_t(s.bh) * std::size_t(std::max<Extent>(s.tk, 1)) * elem * std::size_t(buffers);
  Extent rows = Extent(std::max<std::size_t>(1, attention_workspace_switch().load() / per_row));
  if (s.causal) rows = std::min(rows, std::max<Extent>(256, (tq / 4 + 63) / 64 * 64));
  if (rows >= tq) return tq;
  return rows > 64 ? rows / 64 * 64 : rows;
}

/// Keys [0, n) that some row of [i0, i0 + rows) sees: its last row's (the host's formula).
inline Extent chunk_keys(const AttentionShape& s, Extent i0, Extent rows) {
  return host::detail::visible_keys({.causal = s.causal, .q_offset = s.q_offset, .k_offset = s.k_offset},
                                    i0 + rows - 1, s.tk);
}

/// Zeros rows [i0, i0 + rows) of every head of a [bh, tq, width] buffer (one 2-D memset).
template <class C>
void zero_rows(C* x, const AttentionShape& s, Extent i0, Extent rows, Extent width) {
  if (rows * width == 0) return;
  const std::size_t pitch = std::size_t(s.tq * width) * sizeof(C);
  DTENSOR_CUDA_CHECK(cudaMemset2DAsync(x + i0 * width, pitch, 0, std::size_t(rows * width) * sizeof(C),
                                       std::size_t(s.bh), stream()));
}

template <class C>
void launch_probs(C* scores, Stat* lse_out, const Stat* lse_in, const AttentionShape& s, Extent i0, Extent rows,
                  Extent keys) {
  attention_probs_kernel<<<attention_grid(rows, s.bh, 1), attention_threads, 0, stream()>>>(scores, lse_out, lse_in,
                                                                                             s, i0, rows, keys);
  launched("attention_probs_kernel");
}

}  // namespace detail

/// The bytes of score chunks attention_gemm may hold at once (default 256 MiB; process-wide).
inline void set_attention_workspace_bytes(std::size_t bytes) {
  detail::attention_workspace_switch().store(std::max<std::size_t>(bytes, 1));
}
inline std::size_t attention_workspace_bytes() { return detail::attention_workspace_switch().load(); }

/// Attention through cuBLAS over chunks of `rows_per_chunk` query rows (0: by the workspace).
template <FloatElement T>
AttentionForward<T> attention_gemm(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k, const CudaTensor<T, 4>& v,
                                   const AttentionOptions& opts = {}, Extent rows_per_chunk = 0) {
  using C = detail::Compute<T>;
  const auto s = detail::attention_shape("attention", q, k, v, opts);
  AttentionForward<T> f{CudaTensor<T, 4>::uninitialized(Shape<4>{q.extent(0), q.extent(1), s.tq, s.dv}),
                        CudaTensor<Stat, 3>::uninitialized(Shape<3>{q.extent(0), q.extent(1), s.tq})};
  if (s.bh * s.tq == 0) return f;
  const detail::Widened<T> vc(v);
  detail::ComputeOut<T> out(f.out);
  const Extent chunk = detail::attention_chunk_rows(s, rows_per_chunk, 1, sizeof(C));
  auto scores = CudaTensor<C, 1>::uninitialized(Shape<1>{s.bh * chunk * std::max<Extent>(s.tk, 1)});
  const Extent d = std::max<Extent>(s.d, 1), dv = std::max<Extent>(s.dv, 1);
  for (Extent i0 = 0; i0 < s.tq; i0 += chunk) {
    const Extent rows = std::min(chunk, s.tq - i0), keys = detail::chunk_keys(s, i0, rows), ldk = std::max<Extent>(keys, 1);
    if (keys > 0)
      gemm_batched_widening<T>(false, true, C(s.scale), q.data() + i0 * s.d, s.tq * s.d, k.data(), s.tk * s.d, C(0),
                               scores.data(), rows * keys, s.bh, rows, keys, s.d, d, d, ldk);
    detail::launch_probs<C>(scores.data(), f.lse.data(), nullptr, s, i0, rows, keys);
    if (keys == 0)
      detail::zero_rows(out.data(), s, i0, rows, s.dv);
    else
      gemm_batched<C>(false, false, C(1), scores.data(), rows * keys, vc.data(), s.tk * s.dv, C(0),
                      out.data() + i0 * s.dv, s.tq * s.dv, s.bh, rows, s.dv, keys, ldk, dv, dv);
  }
  out.finish();
  return f;
}

template <FloatElement T>
AttentionBackward<T> attention_gemm_backward(const CudaTensor<T, 4>& q, const CudaTensor<T, 4>& k,
                                             const CudaTensor<T, 4>& v, const CudaTensor<T, 4>& out,
                                             const CudaTensor<Stat, 3>& lse, const CudaTensor<T, 4>& dout,
                                             const AttentionOptions& opts = {}, Extent rows_per_chunk = 0) {
  using C = detail::Compute<T>;
  const auto s = detail::attention_shape("attention_backward", q, k, v, opts);
  AttentionBackward<T> g{CudaTensor<T, 4>(q.shape()), CudaTensor<T, 4>(k.shape()), CudaTensor<T, 4>(v.shape())};
  if (s.bh * s.tq == 0) return g;
  auto delta = CudaTensor<Stat, 1>::uninitialized(Shape<1>{s.bh * s.tq});
  detail::attention_delta_kernel<<<unsigned((s.bh * s.tq + detail::tile_rows - 1) / detail::tile_rows),
                                   detail::attention_threads, 0, detail::stream()>>>(delta.data(), out.data(),
                                                                                     dout.data(), s.bh * s.tq, s.dv);
  detail::launched("attention_delta_kernel");
  const detail::Widened<T> qc(q), kc(k), doc(dout);
  detail::ComputeOut<T> dq(g.dq), dk(g.dk), dv(g.dv);
  const Extent chunk = detail::attention_chunk_rows(s, rows_per_chunk, 2, sizeof(C));
  const Extent cap = s.bh * chunk * std::max<Extent>(s.tk, 1);
  auto p = CudaTensor<C, 1>::uninitialized(Shape<1>{cap}), ds = CudaTensor<C, 1>::uninitialized(Shape<1>{cap});
  const Extent d = std::max<Extent>(s.d, 1), ldv = std::max<Extent>(s.dv, 1);
  const C scale = C(s.scale);
  for (Extent i0 = 0; i0 < s.tq; i0 += chunk) {
    const Extent rows = std::min(chunk, s.tq - i0), keys = detail::chunk_keys(s, i0, rows);
    if (keys == 0) continue;  // these rows see nothing: dq stays zero, nothing reaches dk, dv
    const Extent ldk = keys, n = s.bh * rows * keys;
    const C* q0 = qc.data() + i0 * s.d;
    const C* do0 = doc.data() + i0 * s.dv;
    gemm_batched_widening<T>(false, true, scale, q.data() + i0 * s.d, s.tq * s.d, k.data(), s.tk * s.d, C(0), p.data(),
                             rows * keys, s.bh, rows, keys, s.d, d, d, ldk);
    detail::launch_probs<C>(p.data(), nullptr, lse.data(), s, i0, rows, keys);
    // dV[:keys] += P^T dO;  dP = dO V^T (into ds)
    gemm_batched<C>(true, false, C(1), p.data(), rows * keys, do0, s.tq * s.dv, C(1), dv.data(), s.tk * s.dv, s.bh,
                    keys, s.dv, rows, ldk, ldv, ldv);
    gemm_batched_widening<T>(false, true, C(1), dout.data() + i0 * s.dv, s.tq * s.dv, v.data(), s.tk * s.dv, C(0),
                             ds.data(), rows * keys, s.bh, rows, keys, s.dv, ldv, ldv, ldk);
    detail::attention_ds_kernel<<<detail::grid_for(n), detail::block, 0, detail::stream()>>>(
        ds.data(), p.data(), delta.data(), s.tq, i0, rows, keys, n);
    detail::launched("attention_ds_kernel");
    // dQ = scale dS K;  dK[:keys] += scale dS^T Q
    gemm_batched<C>(false, false, scale, ds.data(), rows * keys, kc.data(), s.tk * s.d, C(0), dq.data() + i0 * s.d,
                    s.tq * s.d, s.bh, rows, s.d, keys, ldk, d, d);
    gemm_batched<C>(true, false, scale, ds.data(), rows * keys, q0, s.tq * s.d, C(1), dk.data(), s.tk * s.d, s.bh,
                    keys, s.d, rows, ldk, d, d);
  }
  dq.finish();
  dk.finish();
  dv.finish();
  return g;
}

}  // namespace dtensor::kernels::cuda
