// dtensor/kernels/cuda/embedding.cuh — the twin of kernels/host/embedding.hpp on CudaTensor:
// embedding, embedding_shard and their backwards. The lookup is one thread per output element.
// The backward scatter-adds in token order, as the host does, to stay deterministic without
// atomics: one thread per embedding column walks the tokens in order (parallel over columns).
// Ids out of range throw the host twin's error in strict mode (a flag read back after the launch).
#pragma once

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/host/embedding.hpp"  // embedding_out_shape

namespace dtensor::kernels::cuda {

namespace detail {

template <class T, class Id>
__global__ void embedding_lookup_kernel(T* y, const T* table, const Id* ids, Extent tokens, Extent d, Extent v0,
                                        Extent rows, bool strict, unsigned long long* bad) {
  for (Extent e = gidx(); e < tokens * d; e += gstride()) {
    const Extent t = e / d, j = e % d, r = Extent(ids[t]) - v0;
    if (r >= 0 && r < rows) {
      y[e] = table[r * d + j];
    } else {
      y[e] = T(0);
      if (strict && j == 0) report_bad(bad, t);
    }
  }
}

template <class T, class Id>
__global__ void embedding_scatter_kernel(T* dtable, const Id* ids, const T* dy, Extent tokens, Extent d, Extent v0,
                                         Extent rows, bool strict, unsigned long long* bad) {
  using C = compute_t<T>;
  for (Extent j = gidx(); j < d; j += gstride())
    for (Extent t = 0; t < tokens; ++t) {
      const Extent r = Extent(ids[t]) - v0;
      if (r >= 0 && r < rows) dtable[r * d + j] = T(C(dtable[r * d + j]) + C(dy[t * d + j]));
      else if (strict && j == 0) report_bad(bad, t);
    }
}

using host::detail::embedding_out_shape;

template <class T, std::size_t R, class Id>
CudaTensor<T, R + 1> embedding_lookup(const char* op, const CudaTensor<T, 2>& table, const CudaTensor<Id, R>& ids,
                                      Extent v0, bool strict) {
  const Extent d = table.extent(1);
  auto y = CudaTensor<T, R + 1>::uninitialized(embedding_out_shape(ids.shape(), d));
  if (y.numel() == 0) return y;
  BadValueFlag bad;
  embedding_lookup_kernel<<<grid_for(y.numel()), block, 0, stream()>>>(y.data(), table.data(), ids.data(), ids.numel(),
                                                                       d, v0, table.extent(0), strict, bad.data());
  launched("embedding_lookup_kernel");
  if (strict) {
    const Extent at = bad.position();
    check(at < 0, op, "id at position ", at, " out of range [", v0, ", ", v0 + table.extent(0), ")");
  }
  return y;
}

template <class T, std::size_t R, class Id>
void embedding_scatter(const char* op, CudaTensor<T, 2>& dtable, const CudaTensor<Id, R>& ids,
                       const CudaTensor<T, R + 1>& dy, Extent v0, bool strict) {
  const Extent d = dtable.extent(1);
  if (d == 0 || ids.numel() == 0) return;
  BadValueFlag bad;
  embedding_scatter_kernel<<<grid_for(d), block, 0, stream()>>>(dtable.data(), ids.data(), dy.data(), ids.numel(), d,
                                                                v0, dtable.extent(0), strict, bad.data());
  launched("embedding_scatter_kernel");
  if (strict) {
    const Extent at = bad.position();
    check(at < 0, op, "id at position ", at, " out of range [", v0, ", ", v0 + dtable.extent(0), ")");
  }
}

}  // namespace detail

template <FloatElement T, IndexElement Id, std::size_t R>
CudaTensor<T, R + 1> embedding(const CudaTensor<T, 2>& table, const CudaTensor<Id, R>& ids) {
  return detail::embedding_lookup("embedding", table, ids, 0, true);
}
template <FloatElement T, IndexElement Id, std::size_t R>
CudaTensor<T, R + 1> embedding_shard(const CudaTensor<T, 2>& table, const CudaTensor<Id, R>& ids, Extent row_begin) {
  return detail::embedding_lookup("embedding_shard", table, ids, row_begin, false);
}
template <FloatElement T, IndexElement Id, std::size_t R>
void embedding_backward(CudaTensor<T, 2>& dtable, const CudaTensor<Id, R>& ids, const CudaTensor<T, R + 1>& dy) {
  detail::embedding_scatter("embedding_backward", dtable, ids, dy, 0, true);
}
template <FloatElement T, IndexElement Id, std::size_t R>
void embedding_shard_backward(CudaTensor<T, 2>& dtable, const CudaTensor<Id, R>& ids, const CudaTensor<T, R + 1>& dy,
                              Extent row_begin) {
  detail::embedding_scatter("embedding_shard_backward", dtable, ids, dy, row_begin, false);
}

}  // namespace dtensor::kernels::cuda
