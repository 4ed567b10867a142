// dtensor/kernels/host/transpose.hpp — moving elements between layouts: permute, transpose,
// split, concat.
//
//   auto y = permute(x, {0, 2, 1, 3});        // y(i,j,k,l) = x(i,k,j,l)
//   auto y = transpose(x, 1, 2);              // [B,T,H,D] -> [B,H,T,D]
//   auto parts = split(x, 2, {64, 64, 64});   // along dimension 2, extents given
//   auto parts = split(x, 2, 3);              // three equal parts (the extent must divide)
//   auto y = concat(parts, 2);                // the inverse
//
// Pure data movement: results are bit-exact for every element type. Split and concat are box
// copies (core/tensor.hpp's copy_box: one memcpy per contiguous run).
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "dtensor/kernels/detail/split_concat.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/parallel.hpp"

namespace dtensor::kernels::host {

namespace detail {
/// The extents of y = permute(x, perm) and, for each dimension of y, x's stride (after checking
/// that perm is a permutation). Shapes only: every space's permute uses it.
template <std::size_t R>
std::pair<Shape<R>, Shape<R>> permuted(const Shape<R>& x, const std::array<std::size_t, R>& perm) {
  std::array<bool, R> seen{};
  for (std::size_t p : perm) {
    check(p < R && !seen[p], "permute", "invalid permutation ", to_string(perm), " of ", to_string(x));
    seen[p] = true;
  }
  Shape<R> ys{}, st{};
  const Shape<R> xs = row_major_strides(x);
  for (std::size_t i = 0; i < R; ++i) ys[i] = x[perm[i]], st[i] = xs[perm[i]];
  return {ys, st};
}
/// The permutation that swaps d0 and d1 (checked against x's rank).
template <std::size_t R>
std::array<std::size_t, R> swap_dims(const Shape<R>& x, std::size_t d0, std::size_t d1) {
  check(d0 < R && d1 < R, "transpose", "dimensions ", d0, " and ", d1, " out of range for ", to_string(x));
  std::array<std::size_t, R> perm{};
  for (std::size_t i = 0; i < R; ++i) perm[i] = i;
  std::swap(perm[d0], perm[d1]);
  return perm;
}
}  // namespace detail

/// y has extents x.shape()[perm[i]] and y(i...) = x at the permuted index.
template <Element T, std::size_t R>
HostTensor<T, R> permute(const HostTensor<T, R>& x, const std::array<std::size_t, R>& perm) {
  // Named copies, not structured bindings: clang 14 cannot capture those in the lambda below.
  const auto perm_info = detail::permuted(x.shape(), perm);
  const auto& ys = perm_info.first;   // y's extents
  const auto& st = perm_info.second;  // x's stride for each dimension of y
  auto y = HostTensor<T, R>::uninitialized(ys);
  const Extent n = y.numel();
  if (n == 0) return y;
  // Walk y in row-major order; the inner dimension is a strided read of x. Blocks of y's rows
  // run on a rank's intra-op threads (parallel.hpp): pure data movement, exact on any count.
  const Extent inner = ys[R - 1], inner_st = st[R - 1];
  T* out = y.data();
  const T* in = x.data();
  detail::parallel_for(n / inner, detail::grain_for(2 * inner), [&](Extent row0, Extent row1) {
    Shape<R> idx{};  // y's index of row row0, and its offset in x
    Extent off = 0;
    Extent rest = row0;
    for (std::size_t dd = R - 1; dd-- > 0;) {
      idx[dd] = rest % ys[dd];
      rest /= ys[dd];
      off += idx[dd] * st[dd];
    }
    for (Extent base = row0 * inner; base < row1 * inner; base += inner) {
      for (Extent j = 0; j < inner; ++j) out[base + j] = in[off + j * inner_st];
      for (std::size_t dd = R - 1; dd-- > 0;) {
        off += st[dd];
        if (++idx[dd] < ys[dd]) break;
        off -= st[dd] * ys[dd];
        idx[dd] = 0;
      }
    }
  });
  return y;
}

/// Swaps dimensions d0 and d1.
template <Element T, std::size_t R>
HostTensor<T, R> transpose(const HostTensor<T, R>& x, std::size_t d0, std::size_t d1) {
  return permute(x, detail::swap_dims(x.shape(), d0, d1));
}

/// Pieces of x along dim with the given extents (they must add up to x's extent).
template <Element T, std::size_t R>
std::vector<HostTensor<T, R>> split(const HostTensor<T, R>& x, std::size_t dim, std::span<const Extent> sizes) {
  return kernels::detail::split_boxes(x, dim, sizes);
}
template <Element T, std::size_t R>
std::vector<HostTensor<T, R>> split(const HostTensor<T, R>& x, std::size_t dim, std::initializer_list<Extent> sizes) {
  return split(x, dim, std::span<const Extent>(sizes.begin(), sizes.size()));
}

/// n equal pieces of x along dim.
template <Element T, std::size_t R>
std::vector<HostTensor<T, R>> split(const HostTensor<T, R>& x, std::size_t dim, int n) {
  detail::check_dim("split", dim, x.shape());
  detail::check(n > 0 && x.extent(dim) % n == 0, "split", "extent ", x.extent(dim), " of dimension ", dim, " of ",
                to_string(x.shape()), " does not split into ", n, " equal parts");
  const std::vector<Extent> sizes(std::size_t(n), x.extent(dim) / n);
  return split(x, dim, std::span<const Extent>(sizes));
}

/// Joins tensors along dim; every other extent must agree.
template <Element T, std::size_t R>
HostTensor<T, R> concat(std::span<const HostTensor<T, R>> parts, std::size_t dim) {
  return kernels::detail::concat_boxes(parts, dim);
}
template <Element T, std::size_t R>
HostTensor<T, R> concat(const std::vector<HostTensor<T, R>>& parts, std::size_t dim) {
  return concat(std::span<const HostTensor<T, R>>(parts), dim);
}

}  // namespace dtensor::kernels::host
