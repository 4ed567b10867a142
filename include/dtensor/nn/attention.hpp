// dtensor/nn/attention.hpp — self-attention: fused qkv projection, exact attention, output
// projection; multi-head (GPT) or grouped-query with rotary positions (Llama).
//
//   nn::SelfAttention<float, Mesh> attn("attn", mesh, {.dim = 64, .heads = 4, .seq = 32}, /*seed=*/7);
//   nn::SelfAttention<float, CpMesh, Qkv, Out, parallel::ContextAttention> cp(...);   // a context dimension
//   nn::CausalSelfAttention<...>                                        // the same class (its former name)
//   nn::CausalSelfAttention<float, Mesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>> tp(...);
//   nn::CausalSelfAttention<float, Mesh> gqa("attn", mesh, {.dim = 64, .heads = 8, .seq = 32, .kv_heads = 2,
//                                                           .rope_theta = 500000, .bias = false}, 7);   // Llama
//   auto [y, saved] = attn.forward(x);      // x [B, T, C] -> [B, T, C]
//   auto [dx, wctx] = attn.backward_input(std::move(saved), dy);  attn.backward_weight(std::move(wctx));
//
// qkv is one Linear [(H + 2K) D, C] whose rows are grouped by KV head (K = kv_heads, H = heads,
// G = H / K query heads per KV head, D = C / H): rows [g (G+2) D, (g+1) (G+2) D) hold the G
// queries of group g, then its key and value (Megatron's layout). With K = H (multi-head) that is
// head h's query, key and value in rows [h*3D, (h+1)*3D). A column-wise qkv therefore gives every
// rank of the tensor dimension whole groups when kv_heads % tp == 0: the heads are split,
// attention runs on this rank's heads, and the row-wise out projection [C, C] reduces. Locally:
// [B, T, (H+2K) D] -reshape-> [B, T, K, (G+2) D] -split-> q, k, v (q reshaped to [B, T, H, D])
// -rotary (ops::rotary, when rope_theta > 0)-> -transpose-> [B, *, T, D]; k and v repeated G
// times (ops::repeat_interleave, whose adjoint sums the G gradients) in front of ops::attention,
// so grouped-query attention runs on the multi-head attention kernels; and back. The rotary
// positions are nn::positions of the [B, T] tokens, the same global indices GPT's position table
// looks up (under context parallelism with load balancing: the original order).
// Saved: the two projections' saved states, q, k and v (rotated, k and v not repeated: G times
// less memory; repeated again in backward), the positions, the attention output and statistics.
// Collectives: those of the qkv and out styles only (Megatron's pair: one all-reduce each way;
// all-gather + reduce-scatter each way under sequence parallelism, and backward's re-gather of
// qkv's saved input shard). set_recompute_core(true): the core's output and statistics are not
// kept; backward runs the core again from q, k, v (Korthikanti's selective recomputation).
// The attention itself is the Core's (nn/attention_core.hpp), a type chosen from outside:
// nn::LocalAttention (ops::attention over the whole sequence) by default. Context parallelism:
// on a mesh with a context dimension the positions are split on it (nn::tokens), q, k, v are
// Shard<2> there, and the core must be parallel::ContextAttention (parallel/context_parallel.hpp;
// parallel::attention_core_for<Mesh> picks it, and the models do), which runs ring,
// all-gather-KV or Ulysses attention (config.context) with its collectives on the context group;
// the projections are row-wise and run on this rank's positions unchanged. With grouped-query
// attention K and V go to the core unrepeated (kv_repeat = G): the ring and the all-gather move
// the KV heads, as Llama 3's context parallelism does, and each rank repeats them where its
// attention computes. KV cache (forward_cached, models/generate.hpp): whole K/V in the module's
// KvCache with a core that does not split the sequence; under context parallelism the core's
// own split cache (parallel::ContextAttention::prefill / decode: each context rank keeps its
// rows; a decode step all-gathers the new q, k, v and merges the ranks' partial outputs).
#pragma once

#include <cmath>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/core/rope.hpp"
#include "dtensor/nn/attention_core.hpp"
#include "dtensor/nn/context_options.hpp"
#include "dtensor/nn/linear.hpp"
#include "dtensor/nn/positions.hpp"
#include "dtensor/ops/attention.hpp"
#include "dtensor/ops/repeat.hpp"
#include "dtensor/ops/rotary.hpp"
#include "dtensor/ops/shape.hpp"

namespace dtensor::nn {

/// DeepSeek's multi-head latent attention (nn/latent_attention.hpp): kv_lora_rank > 0 selects it
/// (nn::GqaOrMla, the Llama blocks' attention); all zero: none. Hugging Face's DeepSeek-V3 names.
struct LatentAttentionConfig {
  Extent q_lora_rank = 0;       // the queries' latent rank; 0: q straight from the input (V2-Lite)
  Extent kv_lora_rank = 0;      // the keys' and values' latent rank (> 0: MLA)
  Extent qk_nope_head_dim = 0;  // per head: the query/key features without rotary positions
  Extent qk_rope_head_dim = 0;  // per head: the rotary features (the key's are one head shared by all)
  Extent v_head_dim = 0;        // per head: the value's features (the attention output's)
  constexpr bool enabled() const { return kv_lora_rank > 0; }
  friend constexpr bool operator==(const LatentAttentionConfig&, const LatentAttentionConfig&) = default;
};

struct AttentionConfig {
  Extent dim = 0;    // C
  Extent heads = 1;  // H; D = C / H
  Extent seq = 0;    // T: the longest sequence the module takes
  ContextAttentionOptions context{};  // a context core's (parallel::ContextAttention), on a mesh with a context dimension
  Extent kv_heads = 0;    // K: 0 or H multi-head; fewer (dividing H): grouped-query attention
  double rope_theta = 0;  // > 0: rotary position embedding of q and k with this base; 0: none
  bool bias = true;       // biases in the qkv and out projections
  bool causal = true;     // a causal mask (decoder); false: every position sees every other (encoder).
                          // Honoured on every mesh: the core is told (the module does not read context.causal)
  RopeScaling rope_scaling{};  // with rope_theta > 0: Llama 3.1's frequency remap when on (core/rope.hpp)
  LatentAttentionConfig mla{};  // enabled: nn::MultiHeadLatentAttention's shape (nn::SelfAttention refuses it)
  double norm_eps = 1e-6;       // MLA's latent norms' epsilon (nn::SelfAttention has none)
};

namespace detail {
/// The KV cache of a core that splits the sequence (Core::KvCache<T, Space>), or nothing.
struct NoSplitKvCache {};
template <class Core, class T, class Space>
struct core_kv_cache {
  using type = NoSplitKvCache;
};
template <class Core, class T, class Space>
  requires requires { typename Core::template KvCache<T, Space>; }
struct core_kv_cache<Core, T, Space> {
  using type = typename Core::template KvCache<T, Space>;
};
}  // namespace detail

template <kernels::host::FloatElement T, MeshType Mesh, class QkvStyle = Replicated<>, class OutStyle = Replicated<>,
          AttentionCore Core = LocalAttention>
class SelfAttention {
  static_assert(Core::splits_sequence || !has_role<Mesh, Role::context>,
                "nn::SelfAttention on a mesh with a context dimension needs a context-parallel core: "
                "nn::SelfAttention<T, Mesh, QkvStyle, OutStyle, parallel::ContextAttention> "
                "(parallel/context_parallel.hpp; parallel::attention_core_for<Mesh> picks the core a mesh needs)");

 public:
  using Qkv = Linear<T, Mesh, QkvStyle>;
  using Proj = Linear<T, Mesh, OutStyle>;
  using In = typename Qkv::In;
  using Out = typename Proj::Out;

 private:
  // The qkv output's placement on the tensor dimension: FeatureSplit (heads split: column-wise)
  // or Replicate.
  static constexpr std::size_t tensor_index = tensor_dim<Mesh>;
  static constexpr PlacementDesc qkv_tensor_placement =
      tensor_index < Mesh::ndim ? Qkv::OutL::desc.placements[tensor_index] : PlacementDesc::replicate();
  static constexpr bool heads_split = qkv_tensor_placement.is_shard();
  static_assert(qkv_tensor_placement.is_replicate() || qkv_tensor_placement.is_shard(2),
                "CausalSelfAttention: the qkv projection's output must be Replicate or split on features (column-wise) "
                "on the tensor dimension: attention needs every position of a sequence");
  static_assert(Qkv::OutL::desc == Proj::InL::desc,
                "CausalSelfAttention: the qkv output and the out projection's input must have the same layout "
                "(column-wise then row-wise, or both Replicated)");
  // [B, T, H, 3D] and [B, T, H, D]: the batch split stays, the features' split moves to the heads.
  using HeadsL = tokens<Mesh, std::conditional_t<heads_split, Shard<2>, Replicate>>;
  using Heads = decltype(ops::transpose<1, 2>(std::declval<DTensor<T, 4, Mesh, HeadsL>>()));  // [B, H, T, D]
  // The rotary positions [B, T]: split like the tokens, Replicate over the heads' split.
  using Positions = DTensor<std::int32_t, 2, Mesh, tokens<Mesh>>;

 public:
  struct Saved {
    typename Qkv::Saved qkv;
    Heads q, k, v, out;  // k, v: [B, K, T, D], not repeated
    Positions positions;  // with rope_theta > 0
    typename Core::template Saved<T, mesh_space_t<Mesh>> core;  // what the core's backward needs
    typename Proj::Saved proj;
    bool core_recomputed = false;  // out and core dropped: the core runs again in backward (nn/recompute.hpp)
    auto tensors() { return std::tie(qkv, q, k, v, out, positions, core, proj); }  // nn/activation_offload.hpp
  };
  using WeightCtx = std::tuple<typename Qkv::WeightCtx, typename Proj::WeightCtx>;  // children() order

  SelfAttention() = default;
  SelfAttention(std::string name, const Mesh& mesh, AttentionConfig c, std::uint64_t seed, double init_std = 0.02,
                      double out_std = 0.02)
      : name_(std::move(name)), c_(c) {
    if (c_.kv_heads == 0) c_.kv_heads = c.heads;
    detail::check(c.dim > 0 && c.heads > 0 && c.seq > 0 && c.dim % c.heads == 0, "nn::CausalSelfAttention", mesh, name_,
                  ": dim ", c.dim, " must be a positive multiple of heads ", c.heads, ", seq ", c.seq, " > 0");
    detail::check(c_.kv_heads > 0 && c.heads % c_.kv_heads == 0 && c.rope_theta >= 0 &&
                      (c.rope_theta == 0 || (c.dim / c.heads) % 2 == 0) && c.rope_scaling.valid(),
                  "nn::CausalSelfAttention", mesh, name_, ": kv_heads ", c_.kv_heads, " must divide heads ", c.heads,
                  "; rope_theta ", c.rope_theta, " must be >= 0 and, when > 0, the head dimension ", c.dim / c.heads,
                  " even; llama3 rope scaling (factor ", c.rope_scaling.factor,
                  ") off or with high_freq_factor > low_freq_factor > 0 and original_max_position > 0");
    detail::check(!c.mla.enabled(), "nn::CausalSelfAttention", mesh, name_, ": kv_lora_rank ", c.mla.kv_lora_rank,
                  " configures multi-head latent attention, which this module is not (nn::MultiHeadLatentAttention, "
                  "nn::GqaOrMla: the Llama blocks' attention)");
    const int tp = tensor_size(mesh);
    detail::check(!heads_split || c_.kv_heads % tp == 0, "nn::CausalSelfAttention", mesh, name_, ": ", c_.kv_heads,
                  " KV heads (", c.heads, " heads) cannot be split evenly over the tensor dimension of size ", tp,
                  " (each rank needs whole groups of a KV head and its query heads: kv_heads % tp == 0)");
    const Extent qkv_features = (c.heads + 2 * c_.kv_heads) * (c.dim / c.heads);
    qkv_ = Qkv(name_ + ".qkv", mesh, c.dim, qkv_features, seed, {.bias = c.bias, .init_std = init_std});
    proj_ = Proj(name_ + ".proj", mesh, c.dim, c.dim, seed + 1, {.bias = c.bias, .init_std = out_std});
  }

  /// Collectives: the qkv style's entry and the out style's exit.
  Fwd<Out, Saved> forward(const In& x) const { return forward_impl(x); }
  /// The same for a temporary input (a block's ln1 output), which becomes the qkv projection's
  /// saved input without a copy.
  Fwd<Out, Saved> forward(In&& x) const { return forward_impl(std::move(x)); }

 private:
  template <class X>
  Fwd<Out, Saved> forward_impl(X&& x) const {
    detail::check(x.extent(1) <= c_.seq, "nn::CausalSelfAttention::forward", x.mesh(), name_, ": ", x.extent(1),
                  " positions, more than the configured sequence length ", c_.seq);
    const Extent batch = x.extent(0), len = x.extent(1), heads = c_.heads, head_dim = c_.dim / c_.heads;
    const Extent kv = c_.kv_heads, group = heads / kv;
    const Mesh mesh = x.mesh();
    Saved s;
    auto [qkv_out, qkv_saved] = qkv_.forward(std::forward<X>(x));  // x is not read after this
    s.qkv = std::move(qkv_saved);
    // [B, T, (H+2K) D] -> [B, T, K, (G+2) D] -> q [B, T, H, D], k, v [B, T, K, D] -> [B, *, T, D]
    {
      auto parts =
          ops::split<3>(ops::reshape<HeadsL>(std::move(qkv_out), Shape<4>{batch, len, kv, (group + 2) * head_dim}),
                        {group * head_dim, head_dim, head_dim});
      if (group > 1) parts[0] = ops::reshape<HeadsL>(std::move(parts[0]), Shape<4>{batch, len, heads, head_dim});
      if (c_.rope_theta > 0) {
        s.positions = nn::positions<tokens<Mesh>, std::int32_t>(mesh, {batch, len},
                                                                Core::original_order(mesh, len, core_options()));
        parts[0] = ops::rotary(parts[0], s.positions, rope());
        parts[1] = ops::rotary(parts[1], s.positions, rope());
      }
      s.q = ops::transpose<1, 2>(parts[0]);
      s.k = ops::transpose<1, 2>(parts[1]);
      s.v = ops::transpose<1, 2>(parts[2]);
    }
    {  // K/V go as KV heads; the core repeats them where attention computes
      auto r = Core::forward(s.q, s.k, s.v, core_options());
      s.out = std::move(r.out);
      s.core = std::move(r.saved);
    }
    // [B, H, T, D] -> [B, T, H, D] -> [B, T, C]
    auto merged = ops::reshape<typename Proj::InL>(ops::transpose<1, 2>(s.out), Shape<3>{batch, len, c_.dim});
    auto [y, proj_saved] = proj_.forward(std::move(merged));  // saved without a copy
    s.proj = std::move(proj_saved);
    if (recompute_core_) {  // selective recomputation: keep q, k, v only (proj keeps the merged heads)
      s.out = Heads{};
      s.core = {};
      s.core_recomputed = true;
    }
    return {std::move(y), std::move(s)};
  }

 public:
  /// The keys and values (rotated; the KV heads, not repeated) of the positions decoded so far:
  /// inference's KV cache (models/generate.hpp). k, v [B, K, length, D], split like the heads.
  /// Under a core that splits the sequence (parallel::ContextAttention) k and v stay empty and
  /// `split` holds this rank's rows only (the core's KvCache: parallel::ContextKvCache).
  struct KvCache {
    Heads k, v;
    typename detail::core_kv_cache<Core, T, mesh_space_t<Mesh>>::type split;
    Extent length = 0;  // positions held; the next input's first position
    Extent batch = 0;   // the prefill's batch: every later input's
  };
  /// Whether forward_cached exists for this core: a core that does not split the sequence, or
  /// one with a split cache (prefill and decode: parallel::ContextAttention).
  static constexpr bool kv_cacheable =
      !Core::splits_sequence || !std::is_same_v<decltype(KvCache::split), detail::NoSplitKvCache>;

  /// Inference with a KV cache: x [B, t, C] holds positions cache.length .. cache.length + t - 1;
  /// their keys and values are appended to the cache, and their queries attend to every cached
  /// position. Either the first call (cache empty: causal over the t positions, the prefill) or
  /// one position at a time (t = 1: it sees every cached key, all of them earlier or itself).
  /// The same arithmetic as forward's on the whole prefix, row for row, so logits agree with a
  /// full recomputation to rounding. Nothing is saved (no backward). Collectives: forward's.
  /// Under context parallelism the prefill is forward's (x in stored order, the positions
  /// Core::original_order's) and each rank keeps its shard of K and V; a decode step is the
  /// core's decode (parallel::ContextAttention::decode: three small all-gathers on the context
  /// group per call besides the projections' collectives).
  Out forward_cached(const In& x, KvCache& cache) const {
    static_assert(kv_cacheable, "nn::SelfAttention::forward_cached: this core keeps no KV cache");
    constexpr const char* op = "nn::SelfAttention::forward_cached";
    const Extent batch = x.extent(0), len = x.extent(1), heads = c_.heads, head_dim = c_.dim / c_.heads;
    const Extent kv = c_.kv_heads, group = heads / kv;
    detail::check(cache.length == 0 || len == 1, op, x.mesh(), name_, ": ", len, " positions after ", cache.length,
                  " cached ones; give the prompt first (an empty cache), then one position at a time");
    detail::check(cache.length + len <= c_.seq, op, x.mesh(), name_, ": ", cache.length, " cached + ", len,
                  " new positions exceed the configured sequence length ", c_.seq);
    detail::check(cache.length == 0 || cache.batch == batch, op, x.mesh(), name_, ": batch ", batch,
                  ", the cache's is ", cache.batch);
    auto qkv_out = qkv_.forward(x).y;
    auto parts = ops::split<3>(ops::reshape<HeadsL>(qkv_out, Shape<4>{batch, len, kv, (group + 2) * head_dim}),
                               {group * head_dim, head_dim, head_dim});
    if (group > 1) parts[0] = ops::reshape<HeadsL>(parts[0], Shape<4>{batch, len, heads, head_dim});
    if (c_.rope_theta > 0) {
      // The global positions of these rows: the prefill's as forward's (the stored order's
      // original indices under context parallelism with load balancing), then cache.length.
      std::vector<Extent> at = cache.length == 0 ? Core::original_order(x.mesh(), len, core_options())
                                                 : std::vector<Extent>{};
      if (at.empty())
        for (Extent i = 0; i < len; ++i) at.push_back(cache.length + i);
      const auto positions = nn::positions<tokens<Mesh>, std::int32_t>(x.mesh(), {batch, len}, at);
      parts[0] = ops::rotary(parts[0], positions, rope());
      parts[1] = ops::rotary(parts[1], positions, rope());
    }
    Heads q = ops::transpose<1, 2>(parts[0]), k = ops::transpose<1, 2>(parts[1]), v = ops::transpose<1, 2>(parts[2]);
    Heads out;
    if constexpr (Core::splits_sequence) {  // the cache split over the context ranks: the core's
      out = cache.length == 0 ? Core::prefill(q, k, v, cache.split, core_options())
                              : Core::decode(q, k, v, cache.split, core_options());
    } else {
      if (cache.length == 0) {
        cache.k = std::move(k), cache.v = std::move(v);
      } else {
        cache.k = ops::concat<2>(std::vector<Heads>{std::move(cache.k), std::move(k)});
        cache.v = ops::concat<2>(std::vector<Heads>{std::move(cache.v), std::move(v)});
      }
      // The prefill is causal among its own positions; a single new query sees the whole cache.
      AttentionCoreOptions o = core_options();
      o.causal = c_.causal && len > 1;
      out = Core::forward(q, cache.k, cache.v, o).out;
    }
    cache.length += len;
    cache.batch = batch;
    auto merged = ops::reshape<typename Proj::InL>(ops::transpose<1, 2>(out), Shape<3>{batch, len, c_.dim});
    return proj_.forward(merged).y;
  }

  /// Collectives: the adjoints of the out style's exit and of the qkv style's entry.
  Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    const Extent batch = dy.extent(0), len = dy.extent(1), heads = c_.heads, head_dim = c_.dim / c_.heads;
    const Extent kv = c_.kv_heads, group = heads / kv;
    auto [dmerged, proj_w] = proj_.backward_input(std::move(s.proj), dy);
    if (s.core_recomputed) {  // the core's forward again, from the saved q, k, v (bit for bit the same)
      auto r = Core::forward(s.q, s.k, s.v, core_options());
      s.out = std::move(r.out);
      s.core = std::move(r.saved);
    }
    auto dout = ops::transpose<1, 2>(ops::reshape<HeadsL>(std::move(dmerged), Shape<4>{batch, len, heads, head_dim}));
    auto g = Core::backward(dout, s.q, s.k, s.v, s.out, s.core, core_options());  // dk, dv in the KV heads
    std::vector<decltype(ops::transpose<1, 2>(g.dq))> parts;
    parts.push_back(ops::transpose<1, 2>(g.dq));
    parts.push_back(ops::transpose<1, 2>(g.dk));
    parts.push_back(ops::transpose<1, 2>(g.dv));
    if (c_.rope_theta > 0) {
      parts[0] = ops::rotary_backward(s.positions, parts[0], rope());
      parts[1] = ops::rotary_backward(s.positions, parts[1], rope());
    }
    if (group > 1) parts[0] = ops::reshape<typename decltype(parts)::value_type::layout>(
                       std::move(parts[0]), Shape<4>{batch, len, kv, group * head_dim});
    auto dqkv = ops::reshape<typename Qkv::OutL>(ops::concat<3>(parts),
                                                 Shape<3>{batch, len, (heads + 2 * kv) * head_dim});
    auto [dx, qkv_w] = qkv_.backward_input(std::move(s.qkv), std::move(dqkv));  // kept for dW, not copied
    return {std::move(dx), WeightCtx{std::move(qkv_w), std::move(proj_w)}};
  }

  void backward_weight(WeightCtx w) { backward_weight_children(*this, std::move(w)); }

  /// Selective recomputation (Korthikanti et al. 2022): forward keeps q, k, v but not the core's
  /// output and statistics; backward runs the core again first.
  void set_recompute_core(bool on) noexcept { recompute_core_ = on; }
  bool recompute_core() const noexcept { return recompute_core_; }
  /// The saved input (qkv's: the norm's output in a block), which a block recomputing its norms
  /// drops after forward and restores before backward (nn/block.hpp).
  static In& saved_input(Saved& s) noexcept { return s.qkv.x; }

 private:
  /// What the core is told: the mask, how many query heads share each KV head, the context options.
  AttentionCoreOptions core_options() const {
    return {.causal = c_.causal, .kv_repeat = int(c_.heads / c_.kv_heads), .context = c_.context};
  }
  /// The rotary embedding's parameters (with rope_theta > 0).
  Rope rope() const { return {c_.rope_theta, c_.rope_scaling}; }

 public:

  auto children() { return std::tie(qkv_, proj_); }
  Qkv& qkv() noexcept { return qkv_; }
  Proj& proj() noexcept { return proj_; }

 private:
  std::string name_;
  AttentionConfig c_;
  Qkv qkv_;
  Proj proj_;
  bool recompute_core_ = false;
};

/// The former name of nn::SelfAttention (causal by default, as before).
template <kernels::host::FloatElement T, MeshType Mesh, class QkvStyle = Replicated<>, class OutStyle = Replicated<>,
          AttentionCore Core = LocalAttention>
using CausalSelfAttention = SelfAttention<T, Mesh, QkvStyle, OutStyle, Core>;

}  // namespace dtensor::nn
