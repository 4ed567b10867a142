// dtensor/kernels/cuda/transpose.cuh — the twin of kernels/host/transpose.hpp on CudaTensor:
// permute, transpose (one thread per output element, reading x at the permuted offset; whole rows
// in words of up to 16 bytes when the last dimension stays last), split
// and concat (box copies through cuda_space: cudaMemcpy2DAsync per contiguous run). Pure data
// movement: bit-exact with the host.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/detail/split_concat.hpp"
#include "dtensor/kernels/host/transpose.hpp"  // permuted, swap_dims

namespace dtensor::kernels::cuda {

namespace detail {
template <class T>
__global__ void permute_kernel(T* y, const T* x, Extent n, Dims y_dims, Dims x_strides) {
  for (Extent i = gidx(); i < n; i += gstride()) y[i] = x[offset_of(i, y_dims, x_strides)];
}

/// A permutation that keeps the last dimension moves whole rows: words W of each row copied
/// together, the row's source found once per word rather than per element (the attention's head
/// split [B,T,H,D] -> [B,H,T,D] in bf16: 57 us per GPT-2-sized call on an H200 with the kernel
/// above, per-element 64-bit divisions over four dimensions; docs/benchmarks.md).
template <class W>
__global__ void permute_rows_kernel(W* y, const W* x, Extent words, Extent row_words, Dims rows, Dims x_row_strides) {
  for (Extent e = gidx(); e < words; e += gstride()) {
    const Extent r = e / row_words;
    y[e] = x[offset_of(r, rows, x_row_strides) * row_words + (e - r * row_words)];
  }
}

/// Launches permute_rows_kernel with the widest word (16, 8, 4 or 2 bytes) that divides a row
/// and aligns both buffers; false when none does (1-byte rows: the element kernel runs).
template <std::size_t R>
bool permute_rows(void* y, const void* x, const Shape<R>& ys, const Shape<R>& st, std::size_t elem) {
  static_assert(R >= 2);
  const std::size_t row_bytes = std::size_t(ys[R - 1]) * elem;
  const std::uint32_t align = std::min(alignment_of(y), alignment_of(x));
  Dims rows, from;
  rows.rank = from.rank = int(R - 1);
  Extent n_rows = 1;
  for (std::size_t i = 0; i + 1 < R; ++i) {
    rows.extent[i] = ys[i];
    from.stride[i] = st[i] / ys[R - 1];  // x is contiguous and keeps its last dimension: a multiple
    n_rows *= ys[i];
  }
  const auto launch = [&](auto word) {
    using W = decltype(word);
    if (row_bytes % sizeof(W) != 0 || align < sizeof(W)) return false;
    const Extent row_words = Extent(row_bytes / sizeof(W)), words = n_rows * row_words;
    permute_rows_kernel<W><<<grid_for(words), block, 0, stream()>>>(static_cast<W*>(y), static_cast<const W*>(x), words,
                                                                    row_words, rows, from);
    launched("permute_rows_kernel");
    return true;
  };
  return launch(uint4{}) || launch(uint2{}) || launch(unsigned{}) || launch((unsigned short)0);
}
}  // namespace detail

template <Element T, std::size_t R>
CudaTensor<T, R> permute(const CudaTensor<T, R>& x, const std::array<std::size_t, R>& perm) {
  const auto [ys, st] = host::detail::permuted(x.shape(), perm);  // st: x's stride for each dimension of y
  auto y = CudaTensor<T, R>::uninitialized(ys);
  if (y.numel() == 0) return y;
  if constexpr (R >= 2)
    if (perm[R - 1] == R - 1 && detail::permute_rows(y.data(), x.data(), ys, st, sizeof(T))) return y;
  detail::permute_kernel<<<detail::grid_for(y.numel()), detail::block, 0, detail::stream()>>>(
      y.data(), x.data(), y.numel(), detail::dims_of(ys, row_major_strides(ys)), detail::dims_of(ys, st));
  detail::launched("permute_kernel");
  return y;
}

template <Element T, std::size_t R>
CudaTensor<T, R> transpose(const CudaTensor<T, R>& x, std::size_t d0, std::size_t d1) {
  return permute(x, host::detail::swap_dims(x.shape(), d0, d1));
}

template <Element T, std::size_t R>
std::vector<CudaTensor<T, R>> split(const CudaTensor<T, R>& x, std::size_t dim, std::span<const Extent> sizes) {
  return kernels::detail::split_boxes(x, dim, sizes);
}
template <Element T, std::size_t R>
std::vector<CudaTensor<T, R>> split(const CudaTensor<T, R>& x, std::size_t dim, std::initializer_list<Extent> sizes) {
  return split(x, dim, std::span<const Extent>(sizes.begin(), sizes.size()));
}
template <Element T, std::size_t R>
CudaTensor<T, R> concat(std::span<const CudaTensor<T, R>> parts, std::size_t dim) {
  return kernels::detail::concat_boxes(parts, dim);
}
template <Element T, std::size_t R>
CudaTensor<T, R> concat(const std::vector<CudaTensor<T, R>>& parts, std::size_t dim) {
  return concat(std::span<const CudaTensor<T, R>>(parts), dim);
}

}  // namespace dtensor::kernels::cuda
