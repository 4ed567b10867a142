// dtensor/nn/attention.hpp — causal multi-head self-attention: fused qkv projection, exact
// attention, output projection.
//
//   nn::CausalSelfAttention<float, Mesh> attn("attn", mesh, {.dim = 64, .heads = 4, .seq = 32}, /*seed=*/7);
//   nn::CausalSelfAttention<float, Mesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>> tp(...);
//   auto y = attn.forward(x);      // x [B*T, C] tokens -> [B*T, C]
//   auto dx = attn.backward_input(dy);  attn.backward_weight();
//
// qkv is one Linear [3C, C] whose rows are grouped by head: rows [h*3D, (h+1)*3D) hold head h's
// query, key and value (D = C / heads each). A column-wise qkv therefore gives every rank of
// "tp" whole heads with their q, k and v when heads % tp == 0 (Megatron's layout): the heads
// are split, attention runs on this rank's heads, and the row-wise out projection [C, C]
// reduces. Locally: [B*T, 3C] -reshape-> [B, T, H, 3D] -split-> q, k, v -transpose-> [B, H, T, D]
// (ops::reshape, split, transpose: no communication), ops::attention, and back.
// Collectives: those of the qkv and out styles only (Megatron's pair: one all-reduce each way;
// all-gather + reduce-scatter each way under sequence parallelism).
#pragma once

#include <cmath>
#include <string>

#include "dtensor/nn/linear.hpp"
#include "dtensor/ops/attention.hpp"
#include "dtensor/ops/shape.hpp"

namespace dtensor::nn {

struct AttentionConfig {
  Extent dim = 0;    // C
  Extent heads = 1;  // H; D = C / H
  Extent seq = 0;    // T: the rows of an input are B*T tokens, sequence after sequence
};

template <kernels::host::FloatElement T, MeshType Mesh, class QkvStyle = Replicated<>, class OutStyle = Replicated<>>
class CausalSelfAttention {
 public:
  using Qkv = Linear<T, Mesh, QkvStyle>;
  using Proj = Linear<T, Mesh, OutStyle>;
  using In = typename Qkv::In;
  using Out = typename Proj::Out;

  CausalSelfAttention() = default;
  CausalSelfAttention(std::string name, const Mesh& mesh, AttentionConfig c, std::uint64_t seed, double init_std = 0.02,
                      double out_std = 0.02)
      : name_(std::move(name)), c_(c) {
    detail::check(c.dim > 0 && c.heads > 0 && c.seq > 0 && c.dim % c.heads == 0, "nn::CausalSelfAttention", mesh, name_,
                  ": dim ", c.dim, " must be a positive multiple of heads ", c.heads, ", seq ", c.seq, " > 0");
    const int tp = mesh.template size<"tp">();
    detail::check(!tp_split || c.heads % tp == 0, "nn::CausalSelfAttention", mesh, name_, ": ", c.heads,
                  " heads cannot be split evenly over \"tp\" of size ", tp, " (each rank needs whole heads)");
    qkv_ = Qkv(name_ + ".qkv", mesh, c.dim, 3 * c.dim, seed, {.bias = true, .init_std = init_std});
    proj_ = Proj(name_ + ".proj", mesh, c.dim, c.dim, seed + 1, {.bias = true, .init_std = out_std});
  }

  /// Collectives: the qkv style's entry and the out style's exit.
  Out forward(const In& x) {
    detail::check(x.extent(0) % c_.seq == 0, "nn::CausalSelfAttention::forward", x.mesh(), name_, ": ", x.extent(0),
                  " tokens are not whole sequences of ", c_.seq);
    const Extent B = x.extent(0) / c_.seq, H = c_.heads, D = c_.dim / c_.heads;
    qkv_out_ = qkv_.forward(x);
    // [B*T, 3C] -> [B, T, H, 3D] -> q, k, v [B, T, H, D] -> [B, H, T, D]
    auto y4 = ops::reshape<L4>(qkv_out_, Shape<4>{B, c_.seq, H, 3 * D});
    auto parts = ops::split<3>(y4, {D, D, D});
    q_ = ops::transpose<1, 2>(parts[0]);
    k_ = ops::transpose<1, 2>(parts[1]);
    v_ = ops::transpose<1, 2>(parts[2]);
    auto r = ops::attention(q_, k_, v_);
    out_ = std::move(r.out);
    stats_ = std::move(r.stats);
    // [B, H, T, D] -> [B, T, H, D] -> [B*T, C]
    out_t_ = ops::transpose<1, 2>(out_);
    return proj_.forward(ops::reshape<typename Proj::InL>(out_t_, Shape<2>{B * c_.seq, c_.dim}));
  }

  /// Collectives: the adjoints of the out style's exit and of the qkv style's entry.
  In backward_input(const Out& dy) {
    detail::check(out_.numel() > 0, "nn::CausalSelfAttention::backward_input", dy.mesh(), name_, ": no forward before it");
    auto dmerged = proj_.backward_input(dy);
    auto dout = ops::transpose<1, 2>(ops::reshape_backward(dmerged, out_t_));
    auto g = ops::attention_backward(dout, q_, k_, v_, out_, stats_);
    std::vector<decltype(ops::transpose<1, 2>(g.dq))> parts;
    parts.push_back(ops::transpose<1, 2>(g.dq));
    parts.push_back(ops::transpose<1, 2>(g.dk));
    parts.push_back(ops::transpose<1, 2>(g.dv));
    auto dqkv = ops::reshape_backward(ops::concat<3>(parts), qkv_out_);
    release_activations();
    return qkv_.backward_input(dqkv);
  }

  void backward_weight() {
    proj_.backward_weight();
    qkv_.backward_weight();
  }
  In backward(const Out& dy) {
    auto dx = backward_input(dy);
    backward_weight();
    return dx;
  }
  /// Frees what forward kept for the backward (activation checkpointing recomputes it).
  void release() {
    release_activations();
    qkv_.release();
    proj_.release();
  }

  template <class U>
  void collect(ParamList<U, Mesh::ndim>& out) {
    qkv_.collect(out);
    proj_.collect(out);
  }
  Qkv& qkv() noexcept { return qkv_; }
  Proj& proj() noexcept { return proj_; }

 private:
  // The qkv output's "tp" placement: Shard<1> (heads split: column-wise) or Replicate.
  static constexpr std::size_t tp_index = Mesh::template index_of<"tp">();
  static constexpr PlacementDesc qkv_tp = Qkv::OutL::desc.placements[tp_index];
  static constexpr bool tp_split = qkv_tp.is_shard();
  static_assert(qkv_tp.is_replicate() || qkv_tp.is_shard(1),
                "CausalSelfAttention: the qkv projection's output must be Replicate or split on features (column-wise) "
                "on \"tp\"");
  static_assert(Qkv::OutL::desc == Proj::InL::desc,
                "CausalSelfAttention: the qkv output and the out projection's input must have the same layout "
                "(column-wise then row-wise, or both Replicated)");
  // [B, T, H, 3D]: the tokens' split moves to the batch, the features' split to the heads.
  using L4 = layout_on<Mesh, Shard<0>, On<"tp", std::conditional_t<tp_split, Shard<2>, Replicate>>>;
  using Heads = decltype(ops::transpose<1, 2>(std::declval<DTensor<T, 4, Mesh, L4>>()));

  void release_activations() {
    qkv_out_ = {};
    q_ = {};
    k_ = {};
    v_ = {};
    out_ = {};
    out_t_ = {};
    stats_ = {};
  }

  std::string name_;
  AttentionConfig c_;
  Qkv qkv_;
  Proj proj_;
  typename Qkv::Out qkv_out_;
  Heads q_, k_, v_, out_;
  DTensor<T, 4, Mesh, L4> out_t_;  // [B, T, H, D]
  ops::AttentionStats stats_;
};

}  // namespace dtensor::nn
