// dtensor/nn/latent_attention.hpp — DeepSeek's multi-head latent attention (MLA; DeepSeek-V2
// §2.1, DeepSeek-V3 §2.1.1): queries, keys and values through low-rank latents, the rotary part
// of the key one head shared by every head.
//
//   nn::AttentionConfig c{.dim = 64, .heads = 4, .seq = 32, .rope_theta = 10000, .bias = false,
//                         .mla = {.q_lora_rank = 48, .kv_lora_rank = 32, .qk_nope_head_dim = 16,
//                                 .qk_rope_head_dim = 8, .v_head_dim = 16}};
//   nn::MultiHeadLatentAttention<float, Mesh> mla("attn", mesh, c, /*seed=*/7);
//   nn::MultiHeadLatentAttention<float, Mesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>> tp(...);
//   auto [y, saved] = mla.forward(x);      // x [B, T, C] -> [B, T, C]
//   auto [dx, wctx] = mla.backward_input(std::move(saved), dy);  mla.backward_weight(std::move(wctx));
//
// Per token h (n = qk_nope_head_dim, r = qk_rope_head_dim, v = v_head_dim, H heads), with
// Hugging Face's DeepSeek-V3 names as the parameters' (name.q_a_proj.weight, ...):
//   c_Q = q_a_layernorm(q_a_proj h)                      [q_lora_rank]   (q_lora_rank 0: no c_Q,
//   [q_C ; q_R'] = q_b_proj c_Q   per head [n ; r]                          q_proj h directly)
//   [c_KV ; k_R'] = kv_a_proj_with_mqa h                 [kv_lora_rank + r]
//   [k_C ; v] = kv_b_proj kv_a_layernorm(c_KV)  per head [n ; v]
//   q = [q_C ; RoPE(q_R')], k = [k_C ; RoPE(k_R')]  (k_R: ONE head, the same in every head's key)
//   o = softmax(q k^T / sqrt(n + r) (+ causal mask)) v  per head [v], y = o_proj [o_1 .. o_H]
// The attention runs with a value head (v) other than the query/key head (n + r): the kernels
// take q, k [B, H, T, n + r] and v [B, H, T, v] on every space (kernels/host/attention.hpp).
// RoPE turns the feature pairs (i, i + r/2) of the r rotary features (ops::rotary, as Llama's);
// DeepSeek's checkpoints interleave the pairs, a permutation of the weights' rows. No yarn: the
// rotary scaling and mscale of DeepSeek's long-context checkpoints are left out (the base is
// rope_theta, Llama 3.1's rope_scaling applies if set). The latent norms are RMSNorm (eps norm_eps).
// Biases (bias): q_a_proj, kv_a_proj_with_mqa and o_proj as DeepSeek's attention_bias; q_b_proj
// and kv_b_proj never.
//
// Tensor parallelism (UpStyle column-wise, OutStyle row-wise: DeepSeek's and Megatron's split):
// q_a_proj, kv_a_proj_with_mqa and the two latent norms are replicated over the tensor
// dimension (nn::Replicated on the residual stream's layout: under sequence parallelism each rank
// projects its own positions, and their weight gradients are Partial<sum> there, reduced by
// parallel::sequence_parallel_grads as the norms' are); q_b_proj and kv_b_proj are column-wise
// (whole heads per rank: heads % tp == 0), o_proj row-wise. The shared rotary key k_R is needed by
// every rank's heads: it is made whole on the tensor dimension (sequence parallelism: an
// all-gather of [B, T, r]) and broadcast to this rank's heads locally; its gradient, summed over
// this rank's heads, is each rank's share (Partial<sum>) and all-reduced over the tensor
// dimension ([B, T, r]). Collectives per call on the tensor dimension, tp > 1:
//   without SP  forward: o_proj's all-reduce (1 AR);
//               backward: q_b_proj's and kv_b_proj's input-gradient all-reduces and k_R's (3 AR)
//   with SP     forward: the all-gathers of c_Q, c_KV (the column-wise entries) and k_R, o_proj's
//               reduce-scatter (3 AG + 1 RS);
//               backward: o_proj's all-gather of dy, q_b_proj's and kv_b_proj's re-gathers of
//               their saved inputs and their input-gradient reduce-scatters, k_R's all-reduce
//               (3 AG + 2 RS + 1 AR)
// (q_lora_rank 0: q_proj is the column-wise entry from h itself, the same counts). The latents are
// what sequence parallelism gathers (q_lora_rank + kv_lora_rank + r per token against GQA's
// dim): DeepSeek-V3's 1536 + 512 + 64 against 7168.
// Context parallelism: the Core (nn/attention_core.hpp; parallel::ContextAttention on a mesh with
// a context dimension: ring, all-gather-KV, Ulysses) runs the attention, the rotary positions are
// the original ones, as nn::SelfAttention's. Selective recomputation (set_recompute_core) as
// nn::SelfAttention's.
// Saved: the Linears' and norms' states (kv_a_proj_with_mqa's input is not kept twice: the query
// side's first Linear keeps h, copied back for kv_a_proj_with_mqa's backward), q, k, v (k with
// k_R in every head, as the attention read it), the positions, the core's output and statistics.
// KV cache (forward_cached, models/generate.hpp): every head's k and v as attention reads them,
// with a core that does not split the sequence; not the latent c_KV with W_UK absorbed into the
// query (DeepSeek's inference trick, not done). With a core that splits the sequence (a mesh
// with a context dimension, even of size 1: the trainers' stage meshes): an Error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/core/rope.hpp"
#include "dtensor/kernels/repeat.hpp"
#include "dtensor/nn/attention.hpp"
#include "dtensor/nn/attention_core.hpp"
#include "dtensor/nn/linear.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/nn/positions.hpp"
#include "dtensor/ops/attention.hpp"
#include "dtensor/ops/pointwise.hpp"
#include "dtensor/ops/rotary.hpp"
#include "dtensor/ops/shape.hpp"

namespace dtensor::nn {

template <kernels::host::FloatElement T, MeshType Mesh, class UpStyle = Replicated<>, class OutStyle = Replicated<>,
          AttentionCore Core = LocalAttention>
class MultiHeadLatentAttention {
  static_assert(Core::splits_sequence || !has_role<Mesh, Role::context>,
                "nn::MultiHeadLatentAttention on a mesh with a context dimension needs a context-parallel core "
                "(parallel::attention_core_for<Mesh>)");

 public:
  using Up = Linear<T, Mesh, UpStyle>;     // q_b_proj (or q_proj) and kv_b_proj: column-wise by heads under TP
  using Proj = Linear<T, Mesh, OutStyle>;  // o_proj: row-wise under TP
  using In = typename Up::In;
  using Out = typename Proj::Out;

 private:
  static constexpr std::size_t tensor_index = tensor_dim<Mesh>;
  static constexpr PlacementDesc up_tensor_placement =
      tensor_index < Mesh::ndim ? Up::OutL::desc.placements[tensor_index] : PlacementDesc::replicate();
  static constexpr bool heads_split = up_tensor_placement.is_shard();
  static constexpr bool sequence_split =
      tensor_index < Mesh::ndim && Up::InL::desc.placements[tensor_index].is_shard(1);
  static_assert(up_tensor_placement.is_replicate() || up_tensor_placement.is_shard(2),
                "nn::MultiHeadLatentAttention: the up-projections' output must be Replicate or split on features "
                "(column-wise) on the tensor dimension");
  static_assert(Up::OutL::desc == Proj::InL::desc,
                "nn::MultiHeadLatentAttention: the up-projections' output and o_proj's input must have the same "
                "layout (column-wise then row-wise, or both Replicated)");
  using Between = std::conditional_t<sequence_split, SeqSplit, Replicate>;  // the residual stream's placement

 public:
  using Down = Linear<T, Mesh, Replicated<Between>>;  // q_a_proj, kv_a_proj_with_mqa: replicated weights
  using LatentNorm = RMSNorm<T, Mesh, Between>;       // q_a_layernorm, kv_a_layernorm
  static_assert(std::is_same_v<typename Down::In, In> && std::is_same_v<typename Down::Out, In>,
                "nn::MultiHeadLatentAttention: the up-projections must take the residual stream's layout");

 private:
  using HeadsL = tokens<Mesh, std::conditional_t<heads_split, Shard<2>, Replicate>>;  // [B, T, H, d]
  using Heads4 = DTensor<T, 4, Mesh, HeadsL>;
  using Heads = decltype(ops::transpose<1, 2>(std::declval<Heads4>()));  // [B, H, T, d]
  using WholeL = tokens<Mesh>;  // the shared rotary key [B, T, 1, r]: whole on the tensor dimension
  using SharedKey = DTensor<T, 4, Mesh, WholeL>;
  using Positions = DTensor<std::int32_t, 2, Mesh, tokens<Mesh>>;

 public:
  struct Saved {
    std::optional<typename Down::Saved> q_a;  // with q_lora_rank > 0
    std::optional<typename LatentNorm::Saved> q_norm;
    typename Up::Saved q_b;
    typename Down::Saved kv_a;  // its input dropped: saved_input() holds it
    typename LatentNorm::Saved kv_norm;
    typename Up::Saved kv_b;
    Heads q, k, v, out;
    Positions positions;
    typename Core::template Saved<T, mesh_space_t<Mesh>> core;
    typename Proj::Saved proj;
    bool core_recomputed = false;
    auto tensors() { return std::tie(q_a, q_norm, q_b, kv_a, kv_norm, kv_b, q, k, v, out, positions, core, proj); }
  };
  // children() order: q_a, q_norm, q_b, kv_a, kv_norm, kv_b, o_proj
  using WeightCtx = std::tuple<std::optional<typename Down::WeightCtx>, std::optional<typename LatentNorm::WeightCtx>,
                               typename Up::WeightCtx, typename Down::WeightCtx, typename LatentNorm::WeightCtx,
                               typename Up::WeightCtx, typename Proj::WeightCtx>;

  MultiHeadLatentAttention() = default;
  MultiHeadLatentAttention(std::string name, const Mesh& mesh, AttentionConfig c, std::uint64_t seed,
                           double init_std = 0.02, double out_std = 0.02)
      : name_(std::move(name)), c_(c) {
    constexpr const char* op = "nn::MultiHeadLatentAttention";
    const auto& m = c.mla;
    detail::check(c.dim > 0 && c.heads > 0 && c.seq > 0, op, mesh, name_, ": dim ", c.dim, ", heads ", c.heads,
                  " and seq ", c.seq, " must be > 0");
    detail::check(m.kv_lora_rank > 0 && m.q_lora_rank >= 0 && m.qk_nope_head_dim > 0 && m.qk_rope_head_dim > 0 &&
                      m.qk_rope_head_dim % 2 == 0 && m.v_head_dim > 0,
                  op, mesh, name_, ": kv_lora_rank ", m.kv_lora_rank, ", qk_nope_head_dim ", m.qk_nope_head_dim,
                  " and v_head_dim ", m.v_head_dim, " must be > 0, qk_rope_head_dim ", m.qk_rope_head_dim,
                  " > 0 and even (rotary pairs), q_lora_rank ", m.q_lora_rank, " >= 0 (0: no query latent)");
    detail::check(c.rope_theta > 0 && c.rope_scaling.valid() && c.norm_eps > 0, op, mesh, name_, ": rope_theta ",
                  c.rope_theta, " must be > 0 (MLA's keys carry rotary positions), norm_eps ", c.norm_eps,
                  " > 0, rope scaling off or valid");
    detail::check(c.kv_heads == 0 || c.kv_heads == c.heads, op, mesh, name_, ": kv_heads ", c.kv_heads,
                  ": multi-head latent attention has one key and value per head (kv_heads 0 or heads ", c.heads, ")");
    const int tp = tensor_size(mesh);
    detail::check(!heads_split || c.heads % tp == 0, op, mesh, name_, ": ", c.heads,
                  " heads cannot be split evenly over the tensor dimension of size ", tp,
                  " (q_b_proj and kv_b_proj are column-wise by whole heads: heads % tp == 0)");
    const Extent qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const LinearOptions latent{.bias = c.bias, .init_std = init_std}, up{.bias = false, .init_std = init_std};
    if (m.q_lora_rank > 0) {
      q_a_.emplace_back(name_ + ".q_a_proj", mesh, c.dim, m.q_lora_rank, seed_of(seed, 0), latent);
      q_norm_.emplace_back(name_ + ".q_a_layernorm", mesh, m.q_lora_rank, c.norm_eps);
      q_b_ = Up(name_ + ".q_b_proj", mesh, m.q_lora_rank, c.heads * qk, seed_of(seed, 1), up);
    } else {
      q_b_ = Up(name_ + ".q_proj", mesh, c.dim, c.heads * qk, seed_of(seed, 1), up);
    }
    kv_a_ =
        Down(name_ + ".kv_a_proj_with_mqa", mesh, c.dim, m.kv_lora_rank + m.qk_rope_head_dim, seed_of(seed, 2), latent);
    kv_norm_ = LatentNorm(name_ + ".kv_a_layernorm", mesh, m.kv_lora_rank, c.norm_eps);
    kv_b_ = Up(name_ + ".kv_b_proj", mesh, m.kv_lora_rank, c.heads * (m.qk_nope_head_dim + m.v_head_dim),
               seed_of(seed, 3), up);
    proj_ = Proj(name_ + ".o_proj", mesh, c.heads * m.v_head_dim, c.dim, seed_of(seed, 4),
                 {.bias = c.bias, .init_std = out_std});
  }

  /// Collectives: see the top of this file.
  Fwd<Out, Saved> forward(const In& x) const { return forward_impl(x); }
  /// The same for a temporary input (a block's norm output): the query side's saved input, no copy.
  Fwd<Out, Saved> forward(In&& x) const { return forward_impl(std::move(x)); }

  /// Collectives: the adjoints of forward's (see the top of this file).
  Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    const Extent batch = dy.extent(0), len = dy.extent(1), heads = c_.heads;
    const auto& m = c_.mla;
    const Extent n = m.qk_nope_head_dim, r = m.qk_rope_head_dim, dv = m.v_head_dim;
    auto [dmerged, proj_w] = proj_.backward_input(std::move(s.proj), dy);
    if (s.core_recomputed) {  // the core's forward again, from the saved q, k, v
      auto f = Core::forward(s.q, s.k, s.v, core_options());
      s.out = std::move(f.out);
      s.core = std::move(f.saved);
    }
    auto dout = ops::transpose<1, 2>(ops::reshape<HeadsL>(std::move(dmerged), Shape<4>{batch, len, heads, dv}));
    auto g = Core::backward(dout, s.q, s.k, s.v, s.out, s.core, core_options());
    s.q = s.k = s.v = s.out = Heads{};
    // Keys and values: [dk_C ; dv] into kv_b_proj, dk_R summed over the heads into kv_a_proj_with_mqa.
    auto dk = ops::split<3>(ops::transpose<1, 2>(g.dk), {n, r});
    std::vector<Heads4> dkv{std::move(dk[0]), ops::transpose<1, 2>(g.dv)};
    auto [dckv, kv_b_w] = kv_b_.backward_input(
        std::move(s.kv_b),
        ops::reshape<typename Up::OutL>(ops::concat<3>(dkv), Shape<3>{batch, len, heads * (n + dv)}));
    auto [dc, kv_norm_w] = kv_norm_.backward_input(std::move(s.kv_norm), dckv);
    auto dkr = ops::rotary_backward(s.positions, shared_key_grad(dk[1]), rope());
    auto dkr_mine = redistribute_backward<typename Down::OutL>(
        ops::reshape<WholeL>(std::move(dkr), Shape<3>{batch, len, r}));  // SP: this rank's positions
    s.kv_a.x = saved_input(s);
    auto [dx_kv, kv_a_w] =
        kv_a_.backward_input(std::move(s.kv_a), ops::concat<2>(std::vector<In>{std::move(dc), std::move(dkr_mine)}));
    // Queries: [dq_C ; RoPE^T dq_R] into q_b_proj (or q_proj), then the latent's norm and q_a_proj.
    auto dq = ops::split<3>(ops::transpose<1, 2>(g.dq), {n, r});
    dq[1] = ops::rotary_backward(s.positions, dq[1], rope());
    auto dq_out = ops::reshape<typename Up::OutL>(ops::concat<3>(dq), Shape<3>{batch, len, heads * (n + r)});
    WeightCtx w;
    auto [dcq, q_b_w] = q_b_.backward_input(std::move(s.q_b), dq_out);
    In dx;
    if (!q_a_.empty()) {
      auto [dcq_in, q_norm_w] = q_norm_[0].backward_input(std::move(*s.q_norm), dcq);
      auto [dx_q, q_a_w] = q_a_[0].backward_input(std::move(*s.q_a), dcq_in);
      std::get<0>(w) = std::move(q_a_w);
      std::get<1>(w) = std::move(q_norm_w);
      dx = ops::add(dx_q, dx_kv);
    } else {
      dx = ops::add(dcq, dx_kv);
    }
    std::get<2>(w) = std::move(q_b_w);
    std::get<3>(w) = std::move(kv_a_w);
    std::get<4>(w) = std::move(kv_norm_w);
    std::get<5>(w) = std::move(kv_b_w);
    std::get<6>(w) = std::move(proj_w);
    return {std::move(dx), std::move(w)};
  }

  /// Adds the weight gradients, o_proj first (the order backward finishes them). No communication.
  void backward_weight(WeightCtx w) {
    proj_.backward_weight(std::move(std::get<6>(w)));
    kv_b_.backward_weight(std::move(std::get<5>(w)));
    kv_norm_.backward_weight(std::move(std::get<4>(w)));
    kv_a_.backward_weight(std::move(std::get<3>(w)));
    q_b_.backward_weight(std::move(std::get<2>(w)));
    if (!q_a_.empty()) {
      q_norm_[0].backward_weight(std::move(*std::get<1>(w)));
      q_a_[0].backward_weight(std::move(*std::get<0>(w)));
    }
  }

  /// KV cache of inference: every head's rotated keys [B, H, length, n + r] and values
  /// [B, H, length, v], split like the heads (see the top of this file).
  struct KvCache {
    Heads k, v;
    Extent length = 0;
    Extent batch = 0;
  };
  static constexpr bool kv_cacheable = !Core::splits_sequence;

  /// Inference with a KV cache, as nn::SelfAttention::forward_cached: a prefill (an empty cache),
  /// then one position at a time. Nothing is saved. Collectives: forward's.
  Out forward_cached(const In& x, KvCache& cache) const {
    constexpr const char* op = "nn::MultiHeadLatentAttention::forward_cached";
    if constexpr (!kv_cacheable) {
      throw Error(op,
                  name_ +
                      ": no KV cache with a core that splits the sequence (parallel::ContextAttention, on a "
                      "mesh with a context dimension of any size): MLA keeps every head's keys and values whole, "
                      "with nn::LocalAttention",
                  x.mesh().rank());
    } else {
      const Extent batch = x.extent(0), len = x.extent(1);
      detail::check(cache.length == 0 || len == 1, op, x.mesh(), name_, ": ", len, " positions after ", cache.length,
                    " cached ones; give the prompt first (an empty cache), then one position at a time");
      detail::check(cache.length + len <= c_.seq, op, x.mesh(), name_, ": ", cache.length, " cached + ", len,
                    " new positions exceed the configured sequence length ", c_.seq);
      detail::check(cache.length == 0 || cache.batch == batch, op, x.mesh(), name_, ": batch ", batch,
                    ", the cache's is ", cache.batch);
      std::vector<Extent> at;
      for (Extent i = 0; i < len; ++i) at.push_back(cache.length + i);
      const auto positions = nn::positions<tokens<Mesh>, std::int32_t>(x.mesh(), {batch, len}, at);
      auto [k, v] = keys_values(x, positions, nullptr);
      Heads q = queries(x, positions, nullptr);
      if (cache.length == 0) {
        cache.k = std::move(k), cache.v = std::move(v);
      } else {
        cache.k = ops::concat<2>(std::vector<Heads>{std::move(cache.k), std::move(k)});
        cache.v = ops::concat<2>(std::vector<Heads>{std::move(cache.v), std::move(v)});
      }
      AttentionCoreOptions o = core_options();
      o.causal = c_.causal && len > 1;  // a single new query sees the whole cache
      auto out = Core::forward(q, cache.k, cache.v, o).out;
      cache.length += len;
      cache.batch = batch;
      return proj_.forward(merged(std::move(out), batch, len)).y;
    }
  }

  /// Selective recomputation (nn::SelfAttention's): forward keeps q, k, v, not the core's output.
  void set_recompute_core(bool on) noexcept { recompute_core_ = on; }
  bool recompute_core() const noexcept { return recompute_core_; }
  /// The saved input h (the query side's first Linear's: q_a_proj, or q_proj), which a block
  /// recomputing its norms drops after forward and restores before backward (nn/block.hpp).
  static In& saved_input(Saved& s) noexcept { return s.q_a ? s.q_a->x : s.q_b.x; }

  auto children() { return std::tie(q_a_, q_norm_, q_b_, kv_a_, kv_norm_, kv_b_, proj_); }
  const AttentionConfig& config() const noexcept { return c_; }
  Up& q_b_proj() noexcept { return q_b_; }  // q_proj with q_lora_rank 0
  Down& kv_a_proj() noexcept { return kv_a_; }
  Up& kv_b_proj() noexcept { return kv_b_; }
  Proj& o_proj() noexcept { return proj_; }

 private:
  /// Each Linear's seed from the module's (the block gives attention one seed; MLA has five Linears).
  static std::uint64_t seed_of(std::uint64_t seed, std::uint64_t k) {
    return seed + k * 0x9E3779B97F4A7C15ull;  // distinct per Linear, the same on every rank
  }

  AttentionCoreOptions core_options() const { return {.causal = c_.causal, .kv_repeat = 1, .context = c_.context}; }
  Rope rope() const { return {c_.rope_theta, c_.rope_scaling}; }

  /// [B, H, T, v] -> [B, T, H v], o_proj's input layout.
  typename Proj::In merged(Heads out, Extent batch, Extent len) const {
    return ops::reshape<typename Proj::InL>(ops::transpose<1, 2>(out),
                                            Shape<3>{batch, len, c_.heads * c_.mla.v_head_dim});
  }

  template <class X>
  Fwd<Out, Saved> forward_impl(X&& x) const {
    detail::check(x.extent(1) <= c_.seq, "nn::MultiHeadLatentAttention::forward", x.mesh(), name_, ": ", x.extent(1),
                  " positions, more than the configured sequence length ", c_.seq);
    const Extent batch = x.extent(0), len = x.extent(1);
    const Mesh mesh = x.mesh();
    Saved s;
    s.positions =
        nn::positions<tokens<Mesh>, std::int32_t>(mesh, {batch, len}, Core::original_order(mesh, len, core_options()));
    std::tie(s.k, s.v) = keys_values(x, s.positions, &s);  // x is read here, then moved into the query side
    s.q = queries(std::forward<X>(x), s.positions, &s);
    auto r = Core::forward(s.q, s.k, s.v, core_options());
    s.out = std::move(r.out);
    s.core = std::move(r.saved);
    auto [y, proj_saved] = proj_.forward(merged(s.out, batch, len));
    s.proj = std::move(proj_saved);
    if (recompute_core_) {
      s.out = Heads{};
      s.core = {};
      s.core_recomputed = true;
    }
    return {std::move(y), std::move(s)};
  }

  /// q [B, H, T, n + r]: [q_C ; RoPE(q_R')] per head. Saves into s when given.
  template <class X>
  Heads queries(X&& x, const Positions& positions, Saved* s) const {
    const Extent batch = x.extent(0), len = x.extent(1);
    const auto& m = c_.mla;
    typename Up::Out q;
    if (!q_a_.empty()) {
      auto [cq, q_a_saved] = q_a_[0].forward(std::forward<X>(x));
      auto [cq_normed, q_norm_saved] = q_norm_[0].forward(cq);
      auto [qb, q_b_saved] = q_b_.forward(std::move(cq_normed));
      q = std::move(qb);
      if (s) s->q_a = std::move(q_a_saved), s->q_norm = std::move(q_norm_saved), s->q_b = std::move(q_b_saved);
    } else {
      auto [qb, q_b_saved] = q_b_.forward(std::forward<X>(x));
      q = std::move(qb);
      if (s) s->q_b = std::move(q_b_saved);
    }
    auto parts = ops::split<3>(
        ops::reshape<HeadsL>(std::move(q), Shape<4>{batch, len, c_.heads, m.qk_nope_head_dim + m.qk_rope_head_dim}),
        {m.qk_nope_head_dim, m.qk_rope_head_dim});
    parts[1] = ops::rotary(parts[1], positions, rope());
    return ops::transpose<1, 2>(ops::concat<3>(parts));
  }

  /// k [B, H, T, n + r] = [k_C ; RoPE(k_R')] (k_R' shared by the heads) and v [B, H, T, v].
  /// Saves into s when given (kv_a_proj_with_mqa's input dropped: the query side keeps it).
  std::pair<Heads, Heads> keys_values(const In& x, const Positions& positions, Saved* s) const {
    const Extent batch = x.extent(0), len = x.extent(1);
    const auto& m = c_.mla;
    auto [a, kv_a_saved] = kv_a_.forward(x);
    auto latent = ops::split<2>(a, {m.kv_lora_rank, m.qk_rope_head_dim});  // c_KV, k_R'
    auto [ckv, kv_norm_saved] = kv_norm_.forward(latent[0]);
    auto [kv, kv_b_saved] = kv_b_.forward(std::move(ckv));
    auto kv_heads = ops::split<3>(
        ops::reshape<HeadsL>(std::move(kv), Shape<4>{batch, len, c_.heads, m.qk_nope_head_dim + m.v_head_dim}),
        {m.qk_nope_head_dim, m.v_head_dim});
    // The shared rotary key: whole on the tensor dimension (SP: an all-gather), rotated once.
    auto kr =
        ops::rotary(ops::reshape<WholeL>(redistribute<WholeL>(latent[1]), Shape<4>{batch, len, 1, m.qk_rope_head_dim}),
                    positions, rope());
    std::vector<Heads4> k{std::move(kv_heads[0]), shared_key_heads(kr, kv_heads[1])};
    if (s) {
      kv_a_saved.x = In{};
      s->kv_a = std::move(kv_a_saved), s->kv_norm = std::move(kv_norm_saved), s->kv_b = std::move(kv_b_saved);
    }
    return {ops::transpose<1, 2>(ops::concat<3>(k)), ops::transpose<1, 2>(kv_heads[1])};
  }

  /// The shared key [B, T, 1, r] in each of this rank's heads (like: a tensor of those heads):
  /// a local copy per head, no communication.
  static Heads4 shared_key_heads(const SharedKey& kr, const Heads4& like) {
    const Extent local_heads = like.to_local().extent(2);
    const Shape<4> global{kr.extent(0), kr.extent(1), like.extent(2), kr.extent(3)};
    return ops::detail::make<T, 4, HeadsL>(kr.mesh(), global,
                                           kernels::repeat_interleave(kr.to_local(), 2, local_heads));
  }
  /// The adjoint: this rank's heads' gradients summed; with the heads split over the tensor
  /// dimension that sum is this rank's share, all-reduced there (one all-reduce of [B, T, 1, r]).
  static SharedKey shared_key_grad(const Heads4& dk_rope) {
    const auto& local = dk_rope.to_local();
    auto summed = kernels::repeat_interleave_backward(local, 2, local.extent(2));
    const Shape<4> global{dk_rope.extent(0), dk_rope.extent(1), 1, dk_rope.extent(3)};
    if constexpr (heads_split)
      return redistribute<WholeL>(
          ops::detail::make<T, 4, tokens<Mesh, Partial<>>>(dk_rope.mesh(), global, std::move(summed)));
    else return ops::detail::make<T, 4, WholeL>(dk_rope.mesh(), global, std::move(summed));
  }

  std::string name_;
  AttentionConfig c_;
  std::vector<Down> q_a_;  // 0 or 1 (q_lora_rank > 0): a range, so the parameter walks see whichever there is
  std::vector<LatentNorm> q_norm_;
  Up q_b_;
  Down kv_a_;
  LatentNorm kv_norm_;
  Up kv_b_;
  Proj proj_;
  bool recompute_core_ = false;
};

}  // namespace dtensor::nn
