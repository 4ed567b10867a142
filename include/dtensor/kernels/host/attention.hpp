// dtensor/kernels/host/attention.hpp — (causal) multi-head scaled-dot-product attention, exact,
// with query/key offsets for blockwise (ring / context-parallel) use.
//
//   auto f = attention(q, k, v);                 // q[B,H,Tq,D] k[B,H,Tk,D] v[B,H,Tk,Dv], causal
//   f.out                                        // [B,H,Tq,Dv]
//   f.lse                                        // [B,H,Tq]: log-sum-exp of each row of scores
//   auto g = attention_backward(q, k, v, f.out, f.lse, dout);   // g.dq, g.dk, g.dv
//
//   // Context parallel: this query block sits at global position q0, the key block at k0.
//   AttentionOptions o{.q_offset = q0, .k_offset = k0};
//   auto a = attention(q, k_blk1, v_blk1, o1);  auto b = attention(q, k_blk2, v_blk2, o2);
//   auto m = merge_attention_blocks(a.out, a.lse, b.out, b.lse);   // == attention over both blocks
//   // backward of one block: pass the merged out and lse (and the full dout); the results are
//   // that block's dk, dv and its share of dq (sum the dq shares over blocks).
//   auto gb = attention_backward(q, k_blk1, v_blk1, m.out, m.lse, dout, o1);
//
// Scores are scale * q k^T with scale = 1/sqrt(D) unless given. Causal: query i (global q_offset
// + i) sees key j (global k_offset + j) iff k_offset + j <= q_offset + i. A query that sees no key
// of the block outputs zeros with lse = -inf, which merging treats as an empty block.
// The backward recomputes the probabilities as exp(s - lse) from the saved lse (no T x T tensor
// is kept), the recipe of FlashAttention, which is what makes the block decomposition exact.
// Per (batch, head): GEMMs through gemm.hpp, rows through softmax.hpp's routines (vectorized for
// float, simd.hpp). The whole [Tq, Tk] score tile of a head is formed at once: at the trainer's
// sequence lengths (64 to 256) it stays in L1/L2, so a flash-style key tiling would add passes
// without saving traffic; long sequences are what the blocked form (open work) is for.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/gemm.hpp"
#include "dtensor/kernels/host/simd.hpp"
#include "dtensor/kernels/host/softmax.hpp"

namespace dtensor::kernels::host {

struct AttentionOptions {
  bool causal = true;
  double scale = 0;     // 0: 1 / sqrt(head dimension)
  Extent q_offset = 0;  // global position of the first query row
  Extent k_offset = 0;  // global position of the first key row
};

template <class T>
struct AttentionForward {
  HostTensor<T, 4> out;    // [B, H, Tq, Dv]
  HostTensor<Stat, 3> lse; // [B, H, Tq]
};

template <class T>
struct AttentionBackward {
  HostTensor<T, 4> dq, dk, dv;
};

template <class T>
concept AttentionElement = std::is_same_v<T, float> || std::is_same_v<T, double>;

namespace detail {

// (Shape checks only: meta and cuda kernels use them too.)
template <class T, class S>
void check_attention(const char* op, const Tensor<T, 4, S>& q, const Tensor<T, 4, S>& k, const Tensor<T, 4, S>& v) {
  const auto &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  check(qs[0] == ks[0] && qs[1] == ks[1] && qs[3] == ks[3] && vs[0] == ks[0] && vs[1] == ks[1] && vs[2] == ks[2], op,
        "q ", to_string(qs), ", k ", to_string(ks), ", v ", to_string(vs),
        ": expected q[B,H,Tq,D], k[B,H,Tk,D], v[B,H,Tk,Dv]");
}

/// The backward's saved output, lse and dout against q [B, H, Tq, D] and v [B, H, Tk, Dv].
template <class T, class S>
void check_attention_saved(const Tensor<T, 4, S>& q, const Tensor<T, 4, S>& v, const Tensor<T, 4, S>& out,
                           const Tensor<Stat, 3, S>& lse, const Tensor<T, 4, S>& dout) {
  const Shape<4> os{q.extent(0), q.extent(1), q.extent(2), v.extent(3)};
  const Shape<3> ls{q.extent(0), q.extent(1), q.extent(2)};
  check(out.shape() == os && dout.shape() == os && lse.shape() == ls, "attention_backward", "out ",
        to_string(out.shape()), ", dout ", to_string(dout.shape()), ", lse ", to_string(lse.shape()), ": expected ",
        to_string(os), " and ", to_string(ls));
}

/// Number of keys of the block that query row i may see.
inline Extent visible_keys(const AttentionOptions& o, Extent i, Extent tk) {
  if (!o.causal) return tk;
  return std::clamp<Extent>(o.q_offset + i - o.k_offset + 1, 0, tk);
}

inline double attention_scale(const AttentionOptions& o, Extent d) {
  return o.scale != 0 ? o.scale : 1.0 / std::sqrt(double(std::max<Extent>(d, 1)));
}

/// P[tq, tk] = softmax rows of scale * q k^T under the mask, with lse either computed (and
/// stored) or given. Rows past the visible keys are zero.
template <class T>
void attention_probs(const T* q, const T* k, Extent tq, Extent tk, Extent d, const AttentionOptions& o, T* p,
                     Stat* lse, bool compute_lse) {
  gemm<T>(false, true, T(attention_scale(o, d)), q, k, T(0), p, tq, tk, d, std::max<Extent>(1, d),
          std::max<Extent>(1, d), std::max<Extent>(1, tk));
  for (Extent i = 0; i < tq; ++i) {
    T* row = p + i * tk;
    const Extent c = visible_keys(o, i, tk);
    if (compute_lse) lse[i] = row_logsumexp(row, c);
    if (lse[i] == neg_inf) std::fill_n(row, tk, T(0));
    else {
      row_softmax(row, row, c, lse[i]);
      std::fill(row + c, row + tk, T(0));
    }
  }
}

}  // namespace detail

template <AttentionElement T>
AttentionForward<T> attention(const HostTensor<T, 4>& q, const HostTensor<T, 4>& k, const HostTensor<T, 4>& v,
                              const AttentionOptions& opts = {}) {
  detail::check_attention("attention", q, k, v);
  const Extent B = q.extent(0), H = q.extent(1), tq = q.extent(2), d = q.extent(3), tk = k.extent(2), dv = v.extent(3);
  AttentionForward<T> f{HostTensor<T, 4>::uninitialized(Shape<4>{B, H, tq, dv}),
                        HostTensor<Stat, 3>::uninitialized(Shape<3>{B, H, tq})};
  std::vector<T> p(std::size_t(tq * tk));
  for (Extent bh = 0; bh < B * H; ++bh) {
    Stat* lse = f.lse.data() + bh * tq;
    detail::attention_probs(q.data() + bh * tq * d, k.data() + bh * tk * d, tq, tk, d, opts, p.data(), lse, true);
    gemm<T>(false, false, T(1), p.data(), v.data() + bh * tk * dv, T(0), f.out.data() + bh * tq * dv, tq, dv, tk,
            std::max<Extent>(1, tk), std::max<Extent>(1, dv), std::max<Extent>(1, dv));
  }
  return f;
}

/// Gradients given the (merged, for a block) output and lse of the forward and dout.
template <AttentionElement T>
AttentionBackward<T> attention_backward(const HostTensor<T, 4>& q, const HostTensor<T, 4>& k, const HostTensor<T, 4>& v,
                                        const HostTensor<T, 4>& out, const HostTensor<Stat, 3>& lse,
                                        const HostTensor<T, 4>& dout, const AttentionOptions& opts = {}) {
  detail::check_attention("attention_backward", q, k, v);
  detail::check_attention_saved(q, v, out, lse, dout);
  const Extent B = q.extent(0), H = q.extent(1), tq = q.extent(2), d = q.extent(3), tk = k.extent(2), dv = v.extent(3);
  AttentionBackward<T> g{HostTensor<T, 4>::uninitialized(q.shape()), HostTensor<T, 4>::uninitialized(k.shape()),
                         HostTensor<T, 4>::uninitialized(v.shape())};
  const T scale = T(detail::attention_scale(opts, d));
  std::vector<T> p(std::size_t(tq * tk)), ds(std::size_t(tq * tk));
  std::vector<Stat> lse_row(static_cast<std::size_t>(tq));
  for (Extent bh = 0; bh < B * H; ++bh) {
    const T *qb = q.data() + bh * tq * d, *kb = k.data() + bh * tk * d, *vb = v.data() + bh * tk * dv;
    const T *ob = out.data() + bh * tq * dv, *gb = dout.data() + bh * tq * dv;
    std::copy_n(lse.data() + bh * tq, tq, lse_row.begin());
    detail::attention_probs(qb, kb, tq, tk, d, opts, p.data(), lse_row.data(), false);
    // dV = P^T dO;  dP = dO V^T (into ds)
    gemm<T>(true, false, T(1), p.data(), gb, T(0), g.dv.data() + bh * tk * dv, tk, dv, tq, std::max<Extent>(1, tk),
            std::max<Extent>(1, dv), std::max<Extent>(1, dv));
    gemm<T>(false, true, T(1), gb, vb, T(0), ds.data(), tq, tk, dv, std::max<Extent>(1, dv), std::max<Extent>(1, dv),
            std::max<Extent>(1, tk));
    // dS = P * (dP - rowsum(dO * O))
    if constexpr (std::is_same_v<T, float>) {  // vectorized (simd.hpp), delta summed over fixed lanes
      float* dsp = ds.data();
      const float* pp = p.data();
      detail::with_isa([&](auto) DTENSOR_SIMD_BODY {
        for (Extent i = 0; i < tq; ++i) {
          const Stat delta = detail::lane_dot(gb + i * dv, ob + i * dv, dv);
          for (Extent j = 0; j < tk; ++j)
            dsp[i * tk + j] = float(Stat(pp[i * tk + j]) * (Stat(dsp[i * tk + j]) - delta));
        }
      });
    } else {
      for (Extent i = 0; i < tq; ++i) {
        Stat delta = 0;
        for (Extent j = 0; j < dv; ++j) delta += Stat(gb[i * dv + j]) * Stat(ob[i * dv + j]);
        for (Extent j = 0; j < tk; ++j) ds[std::size_t(i * tk + j)] = T(Stat(p[std::size_t(i * tk + j)]) *
                                                                         (Stat(ds[std::size_t(i * tk + j)]) - delta));
      }
    }
    // dQ = scale dS K;  dK = scale dS^T Q
    gemm<T>(false, false, scale, ds.data(), kb, T(0), g.dq.data() + bh * tq * d, tq, d, tk, std::max<Extent>(1, tk),
            std::max<Extent>(1, d), std::max<Extent>(1, d));
    gemm<T>(true, false, scale, ds.data(), qb, T(0), g.dk.data() + bh * tk * d, tk, d, tq, std::max<Extent>(1, tk),
            std::max<Extent>(1, d), std::max<Extent>(1, d));
  }
  return g;
}

/// Attention over the union of two key blocks from the attention over each (log-sum-exp merge).
template <AttentionElement T>
AttentionForward<T> merge_attention_blocks(const HostTensor<T, 4>& out_a, const HostTensor<Stat, 3>& lse_a,
                                           const HostTensor<T, 4>& out_b, const HostTensor<Stat, 3>& lse_b) {
  const auto& s = out_a.shape();
  const Shape<3> ls{s[0], s[1], s[2]};
  detail::check(out_b.shape() == s && lse_a.shape() == ls && lse_b.shape() == ls, "merge_attention_blocks", "out_a ",
                to_string(s), ", lse_a ", to_string(lse_a.shape()), ", out_b ", to_string(out_b.shape()), ", lse_b ",
                to_string(lse_b.shape()), ": blocks must have the same extents");
  AttentionForward<T> m{HostTensor<T, 4>::uninitialized(s), HostTensor<Stat, 3>::uninitialized(ls)};
  const Extent dv = s[3];
  for (Extent r = 0; r < lse_a.numel(); ++r) {
    const Stat la = lse_a[r], lb = lse_b[r], mx = std::max(la, lb);
    const Stat lse = mx == detail::neg_inf ? detail::neg_inf : mx + std::log(std::exp(la - mx) + std::exp(lb - mx));
    const Stat wa = lse == detail::neg_inf ? 0.0 : std::exp(la - lse), wb = lse == detail::neg_inf ? 0.0 : std::exp(lb - lse);
    m.lse[r] = lse;
    for (Extent j = 0; j < dv; ++j)
      m.out[r * dv + j] = T(wa * Stat(out_a[r * dv + j]) + wb * Stat(out_b[r * dv + j]));
  }
  return m;
}

}  // namespace dtensor::kernels::host
