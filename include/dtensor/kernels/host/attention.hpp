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
// Per (batch, head), blocked: tiles of detail::attention_tile queries against tiles of as many
// keys, an online softmax across the key tiles of the forward, no [Tq, Tk] matrix (the scratch
// is two tiles); tiles wholly above the causal diagonal are skipped. The tiles' products go
// through gemm.hpp, their rows through softmax.hpp's routines (vectorized for float, simd.hpp).
// bfloat16 (the element type of a bf16 model): each head's q, k, v (and out, dout) are widened
// to float, the head runs the float kernel (float GEMMs and tiles, double statistics: the lse is
// the float run's, not a rounded bf16 one), and out (dq, dk, dv) is rounded to bf16 once — the
// contract of gemm.hpp. The scratch is a head's rows in float, not a tensor-sized copy.
// With a rank's intra-op threads (parallel.hpp), blocks of (batch, head) pairs run in parallel:
// the same bits for any thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/gemm.hpp"
#include "dtensor/kernels/host/parallel.hpp"
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

namespace detail {

/// Number of keys of the block that query row i may see.
inline Extent visible_keys(const AttentionOptions& o, Extent i, Extent tk) {
  if (!o.causal) return tk;
  return std::clamp<Extent>(o.q_offset + i - o.k_offset + 1, 0, tk);
}

inline double attention_scale(const AttentionOptions& o, Extent d) {
  return o.scale != 0 ? o.scale : 1.0 / std::sqrt(double(std::max<Extent>(d, 1)));
}

/// Queries and keys per tile of the blocked attention: a [128, 128] float score tile is 64 KiB
/// (L2-resident), and the trainer's sequences (64 to 256) take one to four tiles per side.
inline constexpr Extent attention_tile = 128;

/// Row i of a score tile whose first query is i0 and first key j0: its visible keys in the tile.
inline Extent visible_in_tile(const AttentionOptions& o, Extent i0, Extent i, Extent j0, Extent bk, Extent tk) {
  return std::clamp<Extent>(visible_keys(o, i0 + i, tk) - j0, 0, bk);
}

/// s[bq, bk] = scale * q[i0 .. i0 + bq) k[j0 .. j0 + bk)^T for one head.
template <class T>
void score_tile(const T* q, const T* k, Extent d, T scale, Extent i0, Extent bq, Extent j0, Extent bk, T* s) {
  const Extent ld = std::max<Extent>(1, d);
  gemm<T>(false, true, scale, q + i0 * d, k + j0 * d, T(0), s, bq, bk, d, ld, ld, std::max<Extent>(1, bk));
}

/// The forward of one head, blocked (FlashAttention's recipe): for each query tile, the key
/// tiles it sees in order, with a running row max m and sum l (online softmax) — the output
/// accumulated unnormalised and rescaled by exp(m_old - m_new) when the max grows, divided by l
/// at the end; lse = m + log l. No [Tq, Tk] matrix: two tiles of scores and one of outputs.
template <class T>
void attention_head(const T* q, const T* k, const T* v, T* out, Stat* lse, Extent tq, Extent tk, Extent d, Extent dv,
                    const AttentionOptions& o, std::vector<T>& scores, std::vector<Stat>& row_max_sum) {
  const T scale = T(attention_scale(o, d));
  const Extent tile = attention_tile;
  for (Extent i0 = 0; i0 < tq; i0 += tile) {
    const Extent bq = std::min(tile, tq - i0);
    Stat* m = row_max_sum.data();
    Stat* l = m + bq;
    std::fill_n(m, bq, neg_inf);
    std::fill_n(l, bq, 0.0);
    T* acc = out + i0 * dv;
    std::fill_n(acc, bq * dv, T(0));
    const Extent keys = visible_keys(o, i0 + bq - 1, tk);  // the tile's last row sees the most
    for (Extent j0 = 0; j0 < keys; j0 += tile) {
      const Extent bk = std::min(tile, keys - j0);
      T* s = scores.data();
      score_tile(q, k, d, scale, i0, bq, j0, bk, s);
      for (Extent i = 0; i < bq; ++i) {
        T* row = s + i * bk;
        const Extent c = visible_in_tile(o, i0, i, j0, bk, tk);
        const Stat tile_max = c > 0 ? row_max(row, c) : neg_inf;
        const Stat new_max = std::max(m[i], tile_max);
        if (new_max == neg_inf) {  // nothing visible yet
          std::fill_n(row, bk, T(0));
          continue;
        }
        const Stat rescale = m[i] == neg_inf ? 0.0 : std::exp(m[i] - new_max);
        l[i] = l[i] * rescale + row_sum_exp(row, c, new_max);
        row_softmax(row, row, c, new_max);  // exp(s - new_max)
        std::fill(row + c, row + bk, T(0));
        if (rescale != 1.0)
          for (Extent j = 0; j < dv; ++j) acc[i * dv + j] = T(Stat(acc[i * dv + j]) * rescale);
        m[i] = new_max;
      }
      gemm<T>(false, false, T(1), s, v + j0 * dv, T(1), acc, bq, dv, bk, std::max<Extent>(1, bk), std::max<Extent>(1, dv),
              std::max<Extent>(1, dv));
    }
    for (Extent i = 0; i < bq; ++i) {
      lse[i0 + i] = lse_of(m[i], l[i]);
      const Stat inv = m[i] == neg_inf ? 0.0 : 1.0 / l[i];
      for (Extent j = 0; j < dv; ++j) acc[i * dv + j] = T(Stat(acc[i * dv + j]) * inv);
    }
  }
}

/// The backward of one head, blocked: per (query tile, key tile) the probabilities recomputed as
/// exp(s - lse), then dV += P^T dO, dP = dO V^T, dS = P (dP - delta), dQ += scale dS K,
/// dK += scale dS^T Q (delta = rowsum(dO * O), once per query). dq, dk, dv start at zero.
template <class T>
void attention_head_backward(const T* q, const T* k, const T* v, const T* out, const Stat* lse, const T* dout, T* dq,
                             T* dk, T* dv_out, Extent tq, Extent tk, Extent d, Extent dv, const AttentionOptions& o,
                             std::vector<T>& tiles, std::vector<Stat>& delta) {
  const T scale = T(attention_scale(o, d));
  const Extent tile = attention_tile, ld = std::max<Extent>(1, d), ldv = std::max<Extent>(1, dv);
  if constexpr (std::is_same_v<T, float>) {
    with_isa([&](auto) DTENSOR_SIMD_BODY {
      for (Extent i = 0; i < tq; ++i) delta[std::size_t(i)] = lane_dot(dout + i * dv, out + i * dv, dv);
    });
  } else {
    for (Extent i = 0; i < tq; ++i) {
      Stat sum = 0;
      for (Extent j = 0; j < dv; ++j) sum += Stat(dout[i * dv + j]) * Stat(out[i * dv + j]);
      delta[std::size_t(i)] = sum;
    }
  }
  T* p = tiles.data();
  T* ds = p + tile * tile;
  for (Extent i0 = 0; i0 < tq; i0 += tile) {
    const Extent bq = std::min(tile, tq - i0);
    const Extent keys = visible_keys(o, i0 + bq - 1, tk);
    for (Extent j0 = 0; j0 < keys; j0 += tile) {
      const Extent bk = std::min(tile, keys - j0), ldk = std::max<Extent>(1, bk);
      score_tile(q, k, d, scale, i0, bq, j0, bk, p);
      for (Extent i = 0; i < bq; ++i) {
        T* row = p + i * bk;
        const Extent c = lse[i0 + i] == neg_inf ? 0 : visible_in_tile(o, i0, i, j0, bk, tk);
        row_softmax(row, row, c, lse[i0 + i]);
        std::fill(row + c, row + bk, T(0));
      }
      // dV += P^T dO;  dP = dO V^T (into ds)
      gemm<T>(true, false, T(1), p, dout + i0 * dv, T(1), dv_out + j0 * dv, bk, dv, bq, ldk, ldv, ldv);
      gemm<T>(false, true, T(1), dout + i0 * dv, v + j0 * dv, T(0), ds, bq, bk, dv, ldv, ldv, ldk);
      // dS = P * (dP - delta)
      if constexpr (std::is_same_v<T, float>) {
        with_isa([&](auto) DTENSOR_SIMD_BODY {
          for (Extent i = 0; i < bq; ++i)
            for (Extent j = 0; j < bk; ++j)
              ds[i * bk + j] = float(Stat(p[i * bk + j]) * (Stat(ds[i * bk + j]) - delta[std::size_t(i0 + i)]));
        });
      } else {
        for (Extent i = 0; i < bq; ++i)
          for (Extent j = 0; j < bk; ++j)
            ds[i * bk + j] = T(Stat(p[i * bk + j]) * (Stat(ds[i * bk + j]) - delta[std::size_t(i0 + i)]));
      }
      // dQ += scale dS K;  dK += scale dS^T Q
      gemm<T>(false, false, scale, ds, k + j0 * d, T(1), dq + i0 * d, bq, d, bk, ldk, ld, ld);
      gemm<T>(true, false, scale, ds, q + i0 * d, T(1), dk + j0 * d, bk, d, bq, ldk, ld, ld);
    }
  }
}

/// One head's block of a tensor in the compute type (compute_t<T>): the tensor's own memory for
/// float and double; for bfloat16 a float copy, widened on read() and rounded once by store()
/// (both vectorized, simd.hpp).
template <class T>
class HeadRows {
  using C = compute_t<T>;
  static constexpr bool widened = !std::is_same_v<T, C>;

 public:
  const C* read(const T* src, Extent n) {
    if constexpr (!widened) return src;
    else {
      buffer_.resize(std::size_t(n));
      with_isa([&](auto) DTENSOR_SIMD_BODY { float_row(src, buffer_.data(), n); });
      return buffer_.data();
    }
  }
  /// n elements to write (zeros for the widened copy: the backward accumulates into them).
  C* write(T* dst, Extent n) {
    if constexpr (!widened) return dst;
    else {
      target_ = dst;
      buffer_.assign(std::size_t(n), C(0));
      return buffer_.data();
    }
  }
  /// Rounds what write() handed out into its destination.
  void store() {
    if constexpr (widened)
      with_isa([&](auto) DTENSOR_SIMD_BODY { round_row(buffer_.data(), target_, Extent(buffer_.size())); });
  }

 private:
  std::vector<C> buffer_;
  T* target_ = nullptr;
};

}  // namespace detail

template <FloatElement T>
AttentionForward<T> attention(const HostTensor<T, 4>& q, const HostTensor<T, 4>& k, const HostTensor<T, 4>& v,
                              const AttentionOptions& opts = {}) {
  const Extent B = q.extent(0), H = q.extent(1), tq = q.extent(2), d = q.extent(3), tk = k.extent(2), dv = v.extent(3);
  AttentionForward<T> f{HostTensor<T, 4>::uninitialized(Shape<4>{B, H, tq, dv}),
                        HostTensor<Stat, 3>::uninitialized(Shape<3>{B, H, tq})};
  const Extent tile = detail::attention_tile;
  // Heads are independent: blocks of (batch, head) pairs run on the rank's intra-op threads
  // (parallel.hpp), each with its own scratch; a head's arithmetic is the same on any thread.
  detail::parallel_for(B * H, detail::grain_for(tq * std::min(tk, tq) * (d + dv)), [&](Extent bh0, Extent bh1) {
    std::vector<compute_t<T>> scores(std::size_t(tile * tile));
    std::vector<Stat> row_max_sum(std::size_t(2 * tile));
    detail::HeadRows<T> qh, kh, vh, oh;
    for (Extent bh = bh0; bh < bh1; ++bh) {
      detail::attention_head(qh.read(q.data() + bh * tq * d, tq * d), kh.read(k.data() + bh * tk * d, tk * d),
                             vh.read(v.data() + bh * tk * dv, tk * dv), oh.write(f.out.data() + bh * tq * dv, tq * dv),
                             f.lse.data() + bh * tq, tq, tk, d, dv, opts, scores, row_max_sum);
      oh.store();
    }
  });
  return f;
}

/// Gradients given the (merged, for a block) output and lse of the forward and dout.
template <FloatElement T>
AttentionBackward<T> attention_backward(const HostTensor<T, 4>& q, const HostTensor<T, 4>& k, const HostTensor<T, 4>& v,
                                        const HostTensor<T, 4>& out, const HostTensor<Stat, 3>& lse,
                                        const HostTensor<T, 4>& dout, const AttentionOptions& opts = {}) {
  const Extent B = q.extent(0), H = q.extent(1), tq = q.extent(2), d = q.extent(3), tk = k.extent(2), dv = v.extent(3);
  AttentionBackward<T> g{HostTensor<T, 4>(q.shape()), HostTensor<T, 4>(k.shape()), HostTensor<T, 4>(v.shape())};
  const Extent tile = detail::attention_tile;
  // As the forward: blocks of heads on the intra-op threads, scratch per block.
  detail::parallel_for(B * H, detail::grain_for(2 * tq * std::min(tk, tq) * (d + dv)), [&](Extent bh0, Extent bh1) {
    std::vector<compute_t<T>> tiles(std::size_t(2 * tile * tile));
    std::vector<Stat> delta(static_cast<std::size_t>(tq));
    detail::HeadRows<T> qh, kh, vh, oh, douth, dqh, dkh, dvh;
    for (Extent bh = bh0; bh < bh1; ++bh) {
      detail::attention_head_backward(
          qh.read(q.data() + bh * tq * d, tq * d), kh.read(k.data() + bh * tk * d, tk * d),
          vh.read(v.data() + bh * tk * dv, tk * dv), oh.read(out.data() + bh * tq * dv, tq * dv), lse.data() + bh * tq,
          douth.read(dout.data() + bh * tq * dv, tq * dv), dqh.write(g.dq.data() + bh * tq * d, tq * d),
          dkh.write(g.dk.data() + bh * tk * d, tk * d), dvh.write(g.dv.data() + bh * tk * dv, tk * dv), tq, tk, d, dv,
          opts, tiles, delta);
      dqh.store(), dkh.store(), dvh.store();
    }
  });
  return g;
}

/// Attention over the union of two key blocks from the attention over each (log-sum-exp merge).
template <FloatElement T>
AttentionForward<T> merge_attention_blocks(const HostTensor<T, 4>& out_a, const HostTensor<Stat, 3>& lse_a,
                                           const HostTensor<T, 4>& out_b, const HostTensor<Stat, 3>& lse_b) {
  const auto& s = out_a.shape();
  const Shape<3> ls{s[0], s[1], s[2]};
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
