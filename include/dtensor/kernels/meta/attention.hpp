// dtensor/kernels/meta/attention.hpp — the meta twin of kernels/host/attention.hpp: attention,
// attention_backward, merge_attention_blocks, with the host's options (causal, scale, offsets).
//
// FLOPs count the (query, key) pairs a fused kernel computes: P = the unmasked pairs per batch
// and head (T (T + 1) / 2 for causal square attention, Tq Tk without a mask). Forward:
// 2 P D (scores) + 2 P Dv (P V). Backward: 2 P D (scores again, from the saved lse) + 2 P Dv (dV)
// + 2 P Dv (dP) + 2 P D (dQ) + 2 P D (dK) = P (6 D + 4 Dv). Softmax arithmetic is not counted (as
// FlashAttention's papers count). Bytes: q, k, v (and out, lse, dout backward) read once,
// out and lse (dq, dk, dv) written once: what a memory-efficient kernel moves, no T x T matrix.
#pragma once

#include "dtensor/kernels/host/attention.hpp"  // AttentionOptions, visible_keys
#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

using host::AttentionOptions;

template <class T>
struct AttentionForward {
  MetaTensor<T, 4> out;     // [B, H, Tq, Dv]
  MetaTensor<Stat, 3> lse;  // [B, H, Tq]
};

template <class T>
struct AttentionBackward {
  MetaTensor<T, 4> dq, dk, dv;
};

/// Unmasked (query, key) pairs of one batch entry and head.
inline std::int64_t attention_pairs(const AttentionOptions& o, Extent tq, Extent tk) {
  std::int64_t pairs = 0;
  for (Extent i = 0; i < tq; ++i) pairs += host::detail::visible_keys(o, i, tk);
  return pairs;
}


template <host::FloatElement T>
AttentionForward<T> attention(const MetaTensor<T, 4>& q, const MetaTensor<T, 4>& k, const MetaTensor<T, 4>& v,
                              const AttentionOptions& opts = {}) {
  const Extent bh = q.extent(0) * q.extent(1), tq = q.extent(2), d = q.extent(3), dv = v.extent(3);
  const std::int64_t pairs = attention_pairs(opts, tq, k.extent(2));
  const Shape<4> os{q.extent(0), q.extent(1), tq, dv};
  detail::cost("attention", bh * pairs * 2 * (d + dv), detail::bytes<T>(q.numel() + k.numel() + v.numel()),
               detail::bytes<T>(numel(os)) + detail::bytes<Stat>(bh * tq));
  return {detail::result<T>(os), detail::result<Stat>(Shape<3>{q.extent(0), q.extent(1), tq})};
}

template <host::FloatElement T>
AttentionBackward<T> attention_backward(const MetaTensor<T, 4>& q, const MetaTensor<T, 4>& k, const MetaTensor<T, 4>& v,
                                        const MetaTensor<T, 4>& out, const MetaTensor<Stat, 3>& lse,
                                        const MetaTensor<T, 4>& dout, const AttentionOptions& opts = {}) {
  const Extent B = q.extent(0), H = q.extent(1), tq = q.extent(2), d = q.extent(3), dv = v.extent(3);
  const std::int64_t pairs = attention_pairs(opts, tq, k.extent(2));
  detail::cost("attention_backward", B * H * pairs * (6 * d + 4 * dv),
               detail::bytes<T>(q.numel() + k.numel() + v.numel() + out.numel() + dout.numel()) +
                   detail::bytes<Stat>(lse.numel()),
               detail::bytes<T>(q.numel() + k.numel() + v.numel()));
  return {detail::result<T>(q.shape()), detail::result<T>(k.shape()), detail::result<T>(v.shape())};
}

template <host::FloatElement T>
AttentionForward<T> merge_attention_blocks(const MetaTensor<T, 4>& out_a, const MetaTensor<Stat, 3>& /*lse_a*/,
                                           const MetaTensor<T, 4>& /*out_b*/, const MetaTensor<Stat, 3>& /*lse_b*/) {
  const auto& s = out_a.shape();
  const Shape<3> ls{s[0], s[1], s[2]};
  detail::cost("merge_attention_blocks", 3 * out_a.numel(),
               2 * detail::bytes<T>(out_a.numel()) + 2 * detail::bytes<Stat>(numel(ls)),
               detail::bytes<T>(out_a.numel()) + detail::bytes<Stat>(numel(ls)));
  return {detail::result<T>(s), detail::result<Stat>(ls)};
}

}  // namespace dtensor::kernels::meta
