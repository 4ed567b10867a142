// dtensor/nn/attention_core.hpp — what computes attention from q, k, v inside the attention
// module: a type parameter of nn::SelfAttention, so that how attention looks across positions
// is chosen from outside the module.
//
//   nn::SelfAttention<float, Mesh> a(...);                                     // nn::LocalAttention
//   nn::SelfAttention<float, CpMesh, Qkv, Out, parallel::ContextAttention> cp(...);   // parallel/context_parallel.hpp
//   parallel::attention_core_for<Mesh>                                         // the one a mesh needs
//
// A core provides (nn::AttentionCore states it):
//   template <class T, class Space> using Saved = ...;                 // what its backward needs
//   static constexpr bool splits_sequence;                             // handles a context dimension
//   forward(q, k, v, options) -> {out, saved}                          // q [B, H, T, D], k, v [B, K, T, D]
//   backward(dout, q, k, v, out, saved, options) -> ops::AttentionGrads (dk, dv in the K heads)
//   original_order(mesh, seq, options) -> the original index of each stored position ({}: stored order)
// and, where it keeps a KV cache of its own split (parallel::ContextAttention):
//   template <class T, class Space> using KvCache = ...;               // this rank's part of the cache
//   prefill(q, k, v, cache, options), decode(q, k, v, cache, options) -> out   // nn::SelfAttention::forward_cached
// (a core without them and without splits_sequence caches whole K/V in the module).
// with k and v given in the KV heads (options.kv_repeat query heads per KV head). LocalAttention
// runs ops::attention on the whole sequence (no communication); parallel::ContextAttention runs
// ring, all-gather-KV or Ulysses attention over the context dimension. Both honour
// options.causal: a causal mask, or none (an encoder).
#pragma once

#include <utility>
#include <vector>

#include "dtensor/nn/context_options.hpp"
#include "dtensor/ops/attention.hpp"
#include "dtensor/ops/repeat.hpp"

namespace dtensor::nn {

/// What the attention module tells its core on each call.
struct AttentionCoreOptions {
  bool causal = true;                  // a causal mask (decoder) or none (encoder)
  int kv_repeat = 1;                   // query heads per KV head (grouped-query attention)
  ContextAttentionOptions context{};   // a context core's: kind, load balancing, overlap
};

/// What a core's forward returns.
template <class O, class S>
struct AttentionCoreResult {
  O out;
  S saved;
};

/// Attention over the whole sequence on this rank: ops::attention (K/V repeated for grouped-query
/// attention, and the repeat's adjoint summing their gradients back). No communication.
struct LocalAttention {
  static constexpr bool splits_sequence = false;
  template <class T, class Space>
  using Saved = ops::BasicAttentionStats<Space>;

  template <class H>
  static auto forward(const H& q, const H& k, const H& v, const AttentionCoreOptions& o) {
    const Extent group = Extent(o.kv_repeat);
    const ops::AttentionOptions a{.causal = o.causal};
    auto r = group > 1 ? ops::attention(q, ops::repeat_interleave<1>(k, group), ops::repeat_interleave<1>(v, group), a)
                       : ops::attention(q, k, v, a);
    return AttentionCoreResult<decltype(r.out), decltype(r.stats)>{std::move(r.out), std::move(r.stats)};
  }

  template <class H, class S>
  static auto backward(const H& dout, const H& q, const H& k, const H& v, const H& out, const S& saved,
                       const AttentionCoreOptions& o) {
    const Extent group = Extent(o.kv_repeat);
    const ops::AttentionOptions a{.causal = o.causal};
    if (group == 1) return ops::attention_backward(dout, q, k, v, out, saved, a);
    auto g = ops::attention_backward(dout, q, ops::repeat_interleave<1>(k, group), ops::repeat_interleave<1>(v, group),
                                     out, saved, a);  // attention saw them repeated
    g.dk = ops::repeat_interleave_backward<1>(g.dk, group);
    g.dv = ops::repeat_interleave_backward<1>(g.dv, group);
    return g;
  }

  template <class Mesh>
  static std::vector<Extent> original_order(const Mesh&, Extent /*seq*/, const AttentionCoreOptions&) {
    return {};  // the whole sequence, in its own order
  }
};

/// What nn::SelfAttention needs of its Core (see the top of this file).
template <class C>
concept AttentionCore = requires {
  { C::splits_sequence } -> std::convertible_to<bool>;
  typename C::template Saved<float, host_space>;
};

}  // namespace dtensor::nn
