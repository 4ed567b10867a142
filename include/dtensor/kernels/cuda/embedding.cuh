// dtensor/kernels/cuda/embedding.cuh — the twin of kernels/host/embedding.hpp on CudaTensor:
// embedding, embedding_shard and their backwards. The lookup is one thread per output element.
// The backward adds each row's tokens in token order, as the host does, so it is deterministic
// and bit-equal to the host without atomics: a stable radix sort (CUB) of (id, position) groups
// the tokens of one id, and a block per group sums its dy rows in position order, parallel over
// columns. (One thread per column walking all tokens was ~4 ms for a GPT-2 batch on an H200.)
// Ids out of range throw the host twin's error in strict mode (a flag read back after the launch).
#pragma once

#include <algorithm>
#include <climits>

#include <cub/device/device_radix_sort.cuh>

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/cuda/profile.cuh"
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

template <class I>  // a template: a plain __global__ in a header is defined again in every .cu that includes it
__global__ void iota_kernel(I* p, Extent n) {
  for (Extent i = gidx(); i < n; i += gstride()) p[i] = I(i);
}

// One block per run of equal ids in the sorted order (the other blocks skip): its threads take the
// columns and add the run's dy rows in position order, rounding to T after each add like the host.
template <class T, class Id>
__global__ void embedding_runs_kernel(T* dtable, const Id* sorted, const Extent* position, const T* dy, Extent tokens,
                                      Extent d, Extent v0, Extent rows, bool strict, unsigned long long* bad) {
  using C = compute_t<T>;
  for (Extent i = blockIdx.x; i < tokens; i += gridDim.x) {
    if (i > 0 && sorted[i] == sorted[i - 1]) continue;
    Extent end = i + 1;
    while (end < tokens && sorted[end] == sorted[i]) ++end;
    const Extent r = Extent(sorted[i]) - v0;
    if (r < 0 || r >= rows) {
      if (strict && blockIdx.y == 0 && threadIdx.x == 0) report_bad(bad, position[i]);
      continue;
    }
    for (Extent j = Extent(blockIdx.y) * blockDim.x + threadIdx.x; j < d; j += Extent(gridDim.y) * blockDim.x) {
      T acc = dtable[r * d + j];
      for (Extent k = i; k < end; ++k) acc = T(C(acc) + C(dy[position[k] * d + j]));
      dtable[r * d + j] = acc;
    }
  }
}

using host::detail::embedding_out_shape;

template <class T, std::size_t R, class Id>
CudaTensor<T, R + 1> embedding_lookup(const char* op, const CudaTensor<T, 2>& table, const CudaTensor<Id, R>& ids,
                                      Extent v0, bool strict) {
  const detail::ProfiledKernel profiled(KernelClass::embedding);
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
  const detail::ProfiledKernel profiled(KernelClass::embedding);
  const Extent d = dtable.extent(1);
  if (d == 0 || ids.numel() == 0) return;
  const Extent n = ids.numel();
  check(n <= INT_MAX, op, n, " tokens exceed CUB's 32-bit sort");
  auto sorted = CudaTensor<Id, 1>::uninitialized(Shape<1>{n});
  auto order = CudaTensor<Extent, 1>::uninitialized(Shape<1>{n});
  auto position = CudaTensor<Extent, 1>::uninitialized(Shape<1>{n});
  iota_kernel<<<grid_for(n), block, 0, stream()>>>(order.data(), n);
  launched("iota_kernel");
  std::size_t scratch_bytes = 0;
  DTENSOR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, scratch_bytes, ids.data(), sorted.data(), order.data(),
                                                     position.data(), int(n), 0, int(sizeof(Id) * 8), stream()));
  auto scratch = CudaTensor<std::int64_t, 1>::uninitialized(Shape<1>{Extent(scratch_bytes / 8 + 1)});
  DTENSOR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch.data(), scratch_bytes, ids.data(), sorted.data(),
                                                     order.data(), position.data(), int(n), 0, int(sizeof(Id) * 8),
                                                     stream()));
  BadValueFlag bad;
  const dim3 grid(unsigned(std::min<Extent>(n, Extent(1) << 20)), unsigned(std::min<Extent>((d + block - 1) / block, 65535)));
  embedding_runs_kernel<<<grid, block, 0, stream()>>>(dtable.data(), sorted.data(), position.data(), dy.data(), n, d, v0,
                                                      dtable.extent(0), strict, bad.data());
  launched("embedding_runs_kernel");
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
