// dtensor/kernels/host/embedding.hpp — row lookup in an embedding table, and its backward.
//
//   auto y = embedding(table, ids);                  // table[V, D], ids[...] -> y[..., D]; ids in [0, V)
//   auto y = embedding_shard(table, ids, v0);        // table holds rows [v0, v0 + V) of the full table;
//                                                    // ids outside give zero rows (partial sums)
//   embedding_backward(dtable, ids, dy);             // dtable[id] += dy[...]   (accumulates)
//   embedding_shard_backward(dtable, ids, dy, v0);   // only ids in [v0, v0 + V)
//   embedding_backward_scaled(dtable, ids, dy, s);   // dtable[id] += s[t] * dy[t]  (host only)
//
// Vocabulary parallelism: each rank looks up its shard with embedding_shard; the sum over ranks
// (the Partial<sum> output) is the full lookup, since every id falls in exactly one shard. The
// backward scatter-adds in token order (deterministic) into a gradient the caller zeroed, so
// micro-batches accumulate.
#pragma once

#include <algorithm>
#include <cstddef>

#include "dtensor/kernels/generic/embedding.hpp"
#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels::host {

namespace detail {

using generic::embedding_out_shape;  // kernels/generic/embedding.hpp

/// The table row of id, or -1 when it lies outside [v0, v0 + rows) (strict mode throws).
template <class Id>
Extent embedding_row(const char* op, Id id, Extent v0, Extent rows, bool strict) {
  const Extent r = Extent(id) - v0;
  if (r >= 0 && r < rows) return r;
  check(!strict, op, "id ", Extent(id), " out of range [", v0, ", ", v0 + rows, ")");
  return -1;
}

template <class T, std::size_t R, class Id>
HostTensor<T, R + 1> embedding_lookup(const char* op, const HostTensor<T, 2>& table, const HostTensor<Id, R>& ids,
                                      Extent v0, bool strict) {
  const Extent d = table.extent(1);
  auto y = HostTensor<T, R + 1>::uninitialized(embedding_out_shape(ids.shape(), d));
  for (Extent t = 0; t < ids.numel(); ++t) {
    const Extent r = embedding_row(op, ids[t], v0, table.extent(0), strict);
    T* out = y.data() + t * d;
    if (r < 0) std::fill_n(out, d, T(0));
    else std::copy_n(table.data() + r * d, d, out);
  }
  return y;
}

template <class T, std::size_t R, class Id>
void embedding_scatter(const char* op, HostTensor<T, 2>& dtable, const HostTensor<Id, R>& ids,
                       const HostTensor<T, R + 1>& dy, Extent v0, bool strict) {
  const Extent d = dtable.extent(1);
  for (Extent t = 0; t < ids.numel(); ++t) {
    const Extent r = embedding_row(op, ids[t], v0, dtable.extent(0), strict);
    if (r < 0) continue;
    T* row = dtable.data() + r * d;
    const T* g = dy.data() + t * d;
    for (Extent j = 0; j < d; ++j) row[j] = T(compute_t<T>(row[j]) + compute_t<T>(g[j]));
  }
}

}  // namespace detail

template <FloatElement T, IndexElement Id, std::size_t R>
HostTensor<T, R + 1> embedding(const HostTensor<T, 2>& table, const HostTensor<Id, R>& ids) {
  return detail::embedding_lookup("embedding", table, ids, 0, true);
}

template <FloatElement T, IndexElement Id, std::size_t R>
HostTensor<T, R + 1> embedding_shard(const HostTensor<T, 2>& table, const HostTensor<Id, R>& ids, Extent row_begin) {
  return detail::embedding_lookup("embedding_shard", table, ids, row_begin, false);
}

/// dtable[ids[t]] += dy[t] for every position t (dtable is not zeroed here).
template <FloatElement T, IndexElement Id, std::size_t R>
void embedding_backward(HostTensor<T, 2>& dtable, const HostTensor<Id, R>& ids, const HostTensor<T, R + 1>& dy) {
  detail::embedding_scatter("embedding_backward", dtable, ids, dy, 0, true);
}

/// dtable[ids[t]] += scale[t] * dy[t] for every row t (ids [n], dy [n, D], scale [n, 1]; dtable
/// is not zeroed here): a scaled scatter-add in one pass, the same bits as
/// embedding_backward(dtable, ids, mul_broadcast(dy, scale)) (each product rounded to T before it
/// is added) without the product's [n, D] temporary. The MoE combine's gated sum per unit
/// (parallel/expert_parallel.hpp).
template <FloatElement T, IndexElement Id>
void embedding_backward_scaled(HostTensor<T, 2>& dtable, const HostTensor<Id, 1>& ids, const HostTensor<T, 2>& dy,
                               const HostTensor<T, 2>& scale) {
  const char* op = "embedding_backward_scaled";
  const Extent d = dtable.extent(1), n = ids.numel();
  detail::check(dy.extent(0) == n && dy.extent(1) == d && scale.extent(0) == n && scale.extent(1) == 1, op, "dy ",
                to_string(dy.shape()), " and scale ", to_string(scale.shape()), " do not match ids ",
                to_string(ids.shape()), " and table gradient ", to_string(dtable.shape()));
  for (Extent t = 0; t < n; ++t) {
    T* row = dtable.data() + detail::embedding_row(op, ids[t], 0, dtable.extent(0), true) * d;
    const T* g = dy.data() + t * d;
    const auto s = compute_t<T>(scale[t]);
    for (Extent j = 0; j < d; ++j) row[j] = T(compute_t<T>(row[j]) + compute_t<T>(T(compute_t<T>(g[j]) * s)));
  }
}

template <FloatElement T, IndexElement Id, std::size_t R>
void embedding_shard_backward(HostTensor<T, 2>& dtable, const HostTensor<Id, R>& ids, const HostTensor<T, R + 1>& dy,
                              Extent row_begin) {
  detail::embedding_scatter("embedding_shard_backward", dtable, ids, dy, row_begin, false);
}

}  // namespace dtensor::kernels::host
