// dtensor/kernels/meta/embedding.hpp — the meta twin of kernels/host/embedding.hpp: embedding,
// embedding_shard and their backwards. The lookup moves rows (no FLOPs: it reads the ids and one
// row per id, writes the output); the backward adds one row per id (one FLOP per element). Ids
// are not checked against the vocabulary: meta ids have no values.
#pragma once

#include "dtensor/kernels/generic/embedding.hpp"  // embedding_out_shape
#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

namespace detail {
template <class T, std::size_t R, class Id>
MetaTensor<T, R + 1> embedding_lookup(const char* op, const MetaTensor<T, 2>& table, const MetaTensor<Id, R>& ids) {
  const auto s = generic::embedding_out_shape(ids.shape(), table.extent(1));
  cost(op, 0, bytes<Id>(ids.numel()) + bytes<T>(numel(s)), bytes<T>(numel(s)));
  return result<T>(s);
}
template <class T, std::size_t R, class Id>
void embedding_scatter(const char* op, const MetaTensor<T, 2>& /*dtable*/, const MetaTensor<Id, R>& ids,
                       const MetaTensor<T, R + 1>& dy) {
  cost(op, dy.numel(), bytes<Id>(ids.numel()) + 2 * bytes<T>(dy.numel()), bytes<T>(dy.numel()));
}
}  // namespace detail

template <FloatElement T, IndexElement Id, std::size_t R>
MetaTensor<T, R + 1> embedding(const MetaTensor<T, 2>& table, const MetaTensor<Id, R>& ids) {
  return detail::embedding_lookup("embedding", table, ids);
}
template <FloatElement T, IndexElement Id, std::size_t R>
MetaTensor<T, R + 1> embedding_shard(const MetaTensor<T, 2>& table, const MetaTensor<Id, R>& ids, Extent) {
  return detail::embedding_lookup("embedding_shard", table, ids);
}
template <FloatElement T, IndexElement Id, std::size_t R>
void embedding_backward(MetaTensor<T, 2>& dtable, const MetaTensor<Id, R>& ids, const MetaTensor<T, R + 1>& dy) {
  detail::embedding_scatter("embedding_backward", dtable, ids, dy);
}
template <FloatElement T, IndexElement Id, std::size_t R>
void embedding_shard_backward(MetaTensor<T, 2>& dtable, const MetaTensor<Id, R>& ids, const MetaTensor<T, R + 1>& dy,
                              Extent) {
  detail::embedding_scatter("embedding_shard_backward", dtable, ids, dy);
}

}  // namespace dtensor::kernels::meta
