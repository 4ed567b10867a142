// dtensor/ops/embedding.hpp — row lookup in an embedding table, and its backward.
//
//   auto h = ops::embedding(wte, ids);                 // wte[V, C], ids[B, T] (int32/int64) -> [B, T, C]
//   auto dw = ops::embedding_backward(dh, ids, wte);   // a new gradient, zeros + scatter-add
//   ops::embedding_backward_into(dw, dh, ids);         // accumulates into an existing gradient
//
// Sharding (rules::Embedding, operands (weight, ids)):
//   (Replicate, Shard<d>)  -> Shard<d>       ids split (data / sequence parallel)
//   (Replicate, Replicate) -> Replicate
//   (Shard<0>, Replicate)  -> Partial<sum>   vocabulary parallel: an id outside this rank's rows
//                                            gives a zero row, so the pieces add up to the lookup
//   (Shard<1>, Replicate)  -> Shard<last>    the embedding dimension split
// Backward (rules::EmbeddingBackward, operands (weight, ids, dy)): ids split -> Partial<sum>
// (each rank scatters its tokens into a full-size gradient); vocabulary split -> Shard<0> (dy is
// Replicate, each rank keeps its rows); embedding dimension split -> Shard<1>; all Replicate ->
// dy's placement. The scatter-add runs in token order: deterministic.
//
// Ids are checked against the global vocabulary [0, V) on every rank (dtensor::Error).
// No communication.
#pragma once

#include "dtensor/distributed/redistribute.hpp"  // grad_layout
#include "dtensor/kernels/embedding.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

namespace detail {
/// Every id in [0, V) (on a device: through a copy to the host; on meta there are no ids to check).
template <class W, class I>
void check_ids(const char* op, const W& weight, const I& ids) {
  const auto readable = detail::readable(ids.to_local());
  if (!readable) return;
  const Tensor<typename I::value_type, I::rank>& l = *readable;
  const Extent v = weight.extent(0);
  for (Extent t = 0; t < l.numel(); ++t)
    check(l[t] >= 0 && Extent(l[t]) < v, op, weight.mesh(), "id ", Extent(l[t]), " at local position ", t,
          " is outside the vocabulary [0, ", v, ") of weight ", to_string(weight.shape()));
}
}  // namespace detail

/// weight[ids[...], :] -> [..., C]. No communication.
template <FloatDTensor W, IndexDTensor I>
auto embedding(const W& weight, const I& ids) {
  using T = typename W::value_type;
  constexpr std::size_t RI = I::rank;
  static_assert(W::rank == 2, "embedding: the weight is [V, C]");
  detail::require_same_mesh_type<W, I>();
  constexpr rules::Embedding rule{int(RI)};
  detail::require_rule_hint<"embedding",
                            "split the ids, or the weight's vocabulary or embedding dimension, not both on one mesh "
                            "dimension",
                            rule, typename W::mesh_type, typename W::layout, typename I::layout>();
  using L = rules::embedding_t<typename W::layout, typename I::layout, RI>;
  detail::check_same_mesh("embedding", weight, ids);
  detail::check_ids("embedding", weight, ids);
  Shape<RI + 1> global{};
  for (std::size_t i = 0; i < RI; ++i) global[i] = ids.extent(i);
  global[RI] = weight.extent(1);
  // One path for every rule: this rank's rows [v0, v0 + V_local) of the table; ids outside give 0.
  const Extent v0 = weight.local_box().offset[0];
  return detail::make<T, RI + 1, L>(weight.mesh(), global,
                                    kernels::embedding_shard(weight.to_local(), ids.to_local(), v0));
}

/// Accumulates the weight gradient of embedding into dweight (whose layout must be the one the
/// rule gives: rules::embedding_grad_t). No communication.
template <FloatDTensor DW, FloatDTensor DY, IndexDTensor I>
void embedding_backward_into(DW& dweight, const DY& dy, const I& ids) {
  constexpr std::size_t RI = I::rank;
  static_assert(DW::rank == 2 && DY::rank == RI + 1, "embedding_backward: dweight [V, C], dy [ids..., C]");
  detail::require_same_mesh_type<DW, DY, I>();
  // The forward weight's layout is dweight's with Partial read as Replicate (a Partial<sum>
  // gradient belongs to a Replicate weight).
  using LW = typename grad_layout<typename DW::layout>::type;
  constexpr rules::EmbeddingBackward rule{int(RI)};
  detail::require_rule<"embedding_backward", rule, typename DW::mesh_type, LW, typename I::layout, typename DY::layout>();
  using L = rules::embedding_grad_t<LW, typename I::layout, typename DY::layout, RI>;
  static_assert(!rules::outcome<rule, LW, typename I::layout, typename DY::layout>.ok || L::desc == DW::layout::desc,
                "embedding_backward_into: dweight's layout is not the gradient layout of these ids and dy "
                "(see rules::embedding_grad_t)");
  detail::check_same_mesh("embedding_backward", dweight, dy, ids);
  Shape<RI + 1> want{};
  for (std::size_t i = 0; i < RI; ++i) want[i] = ids.extent(i);
  want[RI] = dweight.extent(1);
  detail::check(dy.shape() == want, "embedding_backward", dy.mesh(), "dy ", to_string(dy.shape()), " does not match ids ",
                to_string(ids.shape()), " and dweight ", to_string(dweight.shape()));
  detail::check_ids("embedding_backward", dweight, ids);
  const Extent v0 = dweight.local_box().offset[0];
  kernels::embedding_shard_backward(dweight.local(), ids.to_local(), dy.to_local(), v0);
}

/// The weight gradient of h = embedding(weight, ids): zeros, then embedding_backward_into.
template <FloatDTensor DY, IndexDTensor I, FloatDTensor W>
auto embedding_backward(const DY& dy, const I& ids, const W& weight) {
  using T = typename W::value_type;
  constexpr std::size_t RI = I::rank;
  detail::require_same_mesh_type<DY, I, W>();
  constexpr rules::EmbeddingBackward rule{int(RI)};
  detail::require_rule<"embedding_backward", rule, typename W::mesh_type, typename W::layout, typename I::layout,
                       typename DY::layout>();
  using L = rules::embedding_grad_t<typename W::layout, typename I::layout, typename DY::layout, RI>;
  const Box<2> box = local_box(L::desc, weight.mesh().shape(), weight.mesh().coordinate(), weight.shape());
  auto dw = detail::make<T, 2, L>(weight.mesh(), weight.shape(), Tensor<T, 2, typename W::space>(box.extent));
  embedding_backward_into(dw, dy, ids);
  return dw;
}

}  // namespace dtensor::ops
