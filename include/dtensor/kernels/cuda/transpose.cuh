// dtensor/kernels/cuda/transpose.cuh — the twin of kernels/host/transpose.hpp on CudaTensor:
// permute, transpose (one thread per output element, reading x at the permuted offset), split
// and concat (box copies through cuda_space: cudaMemcpy2DAsync per contiguous run). Pure data
// movement: bit-exact with the host.
#pragma once

#include <array>
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
}  // namespace detail

template <Element T, std::size_t R>
CudaTensor<T, R> permute(const CudaTensor<T, R>& x, const std::array<std::size_t, R>& perm) {
  const auto [ys, st] = host::detail::permuted(x.shape(), perm);  // st: x's stride for each dimension of y
  auto y = CudaTensor<T, R>::uninitialized(ys);
  if (y.numel() == 0) return y;
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
