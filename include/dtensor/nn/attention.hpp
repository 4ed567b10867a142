// dtensor/nn/attention.hpp — causal multi-head self-attention: fused qkv projection, exact
// attention, output projection.
//
//   nn::CausalSelfAttention<float, Mesh> attn("attn", mesh, {.dim = 64, .heads = 4, .seq = 32}, /*seed=*/7);
//   nn::CausalSelfAttention<float, Mesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>> tp(...);
//   auto [y, saved] = attn.forward(x);      // x [B, T, C] -> [B, T, C]
//   auto [dx, wctx] = attn.backward_input(std::move(saved), dy);  attn.backward_weight(std::move(wctx));
//
// qkv is one Linear [3C, C] whose rows are grouped by head: rows [h*3D, (h+1)*3D) hold head h's
// query, key and value (D = C / heads each). A column-wise qkv therefore gives every rank of the
// tensor dimension whole heads with their q, k and v when heads % tp == 0 (Megatron's layout):
// the heads are split, attention runs on this rank's heads, and the row-wise out projection
// [C, C] reduces. Locally: [B, T, 3C] -reshape-> [B, T, H, 3D] -split-> q, k, v -transpose->
// [B, H, T, D] (ops::reshape, split, transpose: no communication), ops::attention, and back.
// Saved: the two projections' saved states, q, k, v, the attention output and its statistics.
// Collectives: those of the qkv and out styles only (Megatron's pair: one all-reduce each way;
// all-gather + reduce-scatter each way under sequence parallelism).
// Context parallelism: on a mesh with a context dimension the positions are split on it
// (nn::tokens), q, k, v are Shard<2> there, and parallel::context_attention (ring, all-gather-KV
// or Ulysses, config.context) replaces ops::attention, with its collectives on the context
// group; the projections are row-wise and run on this rank's positions unchanged.
#pragma once

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/nn/linear.hpp"
#include "dtensor/ops/attention.hpp"
#include "dtensor/ops/shape.hpp"
#include "dtensor/parallel/context_parallel.hpp"

namespace dtensor::nn {

struct AttentionConfig {
  Extent dim = 0;    // C
  Extent heads = 1;  // H; D = C / H
  Extent seq = 0;    // T: the longest sequence the module takes
  parallel::ContextAttentionOptions context{};  // used on a mesh with a context dimension
};

template <kernels::host::FloatElement T, MeshType Mesh, class QkvStyle = Replicated<>, class OutStyle = Replicated<>>
class CausalSelfAttention {
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
  static constexpr bool context_split = has_role<Mesh, Role::context>;  // positions split: context attention

 public:
  struct Saved {
    typename Qkv::Saved qkv;
    Heads q, k, v, out;
    ops::BasicAttentionStats<mesh_space_t<Mesh>> stats;  // without a context dimension
    parallel::ContextAttentionSaved<T> context;   // with one
    typename Proj::Saved proj;
  };
  using WeightCtx = std::tuple<typename Qkv::WeightCtx, typename Proj::WeightCtx>;  // children() order

  CausalSelfAttention() = default;
  CausalSelfAttention(std::string name, const Mesh& mesh, AttentionConfig c, std::uint64_t seed, double init_std = 0.02,
                      double out_std = 0.02)
      : name_(std::move(name)), c_(c) {
    detail::check(c.dim > 0 && c.heads > 0 && c.seq > 0 && c.dim % c.heads == 0, "nn::CausalSelfAttention", mesh, name_,
                  ": dim ", c.dim, " must be a positive multiple of heads ", c.heads, ", seq ", c.seq, " > 0");
    const int tp = tensor_size(mesh);
    detail::check(!heads_split || c.heads % tp == 0, "nn::CausalSelfAttention", mesh, name_, ": ", c.heads,
                  " heads cannot be split evenly over the tensor dimension of size ", tp, " (each rank needs whole heads)");
    qkv_ = Qkv(name_ + ".qkv", mesh, c.dim, 3 * c.dim, seed, {.bias = true, .init_std = init_std});
    proj_ = Proj(name_ + ".proj", mesh, c.dim, c.dim, seed + 1, {.bias = true, .init_std = out_std});
  }

  /// Collectives: the qkv style's entry and the out style's exit.
  Fwd<Out, Saved> forward(const In& x) const {
    detail::check(x.extent(1) <= c_.seq, "nn::CausalSelfAttention::forward", x.mesh(), name_, ": ", x.extent(1),
                  " positions, more than the configured sequence length ", c_.seq);
    const Extent batch = x.extent(0), len = x.extent(1), heads = c_.heads, head_dim = c_.dim / c_.heads;
    Saved s;
    auto [qkv_out, qkv_saved] = qkv_.forward(x);
    s.qkv = std::move(qkv_saved);
    // [B, T, 3C] -> [B, T, H, 3D] -> q, k, v [B, T, H, D] -> [B, H, T, D]
    auto parts = ops::split<3>(ops::reshape<HeadsL>(qkv_out, Shape<4>{batch, len, heads, 3 * head_dim}),
                             {head_dim, head_dim, head_dim});
    s.q = ops::transpose<1, 2>(parts[0]);
    s.k = ops::transpose<1, 2>(parts[1]);
    s.v = ops::transpose<1, 2>(parts[2]);
    if constexpr (context_split) {
      auto r = parallel::context_attention(s.q, s.k, s.v, c_.context);
      s.out = std::move(r.out);
      s.context = std::move(r.saved);
    } else {
      auto r = ops::attention(s.q, s.k, s.v);
      s.out = std::move(r.out);
      s.stats = std::move(r.stats);
    }
    // [B, H, T, D] -> [B, T, H, D] -> [B, T, C]
    auto merged = ops::reshape<typename Proj::InL>(ops::transpose<1, 2>(s.out), Shape<3>{batch, len, c_.dim});
    auto [y, proj_saved] = proj_.forward(merged);
    s.proj = std::move(proj_saved);
    return {std::move(y), std::move(s)};
  }

  /// Collectives: the adjoints of the out style's exit and of the qkv style's entry.
  Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    const Extent batch = dy.extent(0), len = dy.extent(1), heads = c_.heads, head_dim = c_.dim / c_.heads;
    auto [dmerged, proj_w] = proj_.backward_input(std::move(s.proj), dy);
    auto dout = ops::transpose<1, 2>(ops::reshape<HeadsL>(dmerged, Shape<4>{batch, len, heads, head_dim}));
    auto g = [&] {
      if constexpr (context_split) return parallel::context_attention_backward(dout, s.q, s.k, s.v, s.out, s.context, c_.context);
      else return ops::attention_backward(dout, s.q, s.k, s.v, s.out, s.stats);
    }();
    std::vector<decltype(ops::transpose<1, 2>(g.dq))> parts;
    parts.push_back(ops::transpose<1, 2>(g.dq));
    parts.push_back(ops::transpose<1, 2>(g.dk));
    parts.push_back(ops::transpose<1, 2>(g.dv));
    auto dqkv = ops::reshape<typename Qkv::OutL>(ops::concat<3>(parts), Shape<3>{batch, len, 3 * c_.dim});
    auto [dx, qkv_w] = qkv_.backward_input(std::move(s.qkv), dqkv);
    return {std::move(dx), WeightCtx{std::move(qkv_w), std::move(proj_w)}};
  }

  void backward_weight(WeightCtx w) { backward_weight_children(*this, std::move(w)); }

  auto children() { return std::tie(qkv_, proj_); }
  Qkv& qkv() noexcept { return qkv_; }
  Proj& proj() noexcept { return proj_; }

 private:
  std::string name_;
  AttentionConfig c_;
  Qkv qkv_;
  Proj proj_;
};

}  // namespace dtensor::nn
