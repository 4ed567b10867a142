// dtensor/kernels/detail/split_concat.hpp — split and concat for any memory space that holds
// data, as box copies (core/tensor.hpp's copy_box: one pitched copy per contiguous run, through
// the space's copy). kernels::host and kernels::cuda each expose them for their own tensors.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "dtensor/kernels/host/common.hpp"

namespace dtensor::kernels::detail {

/// Checks that sizes are non-negative and add up to extent dim of x.
template <std::size_t R>
void check_split(const Shape<R>& x, std::size_t dim, std::span<const Extent> sizes) {
  host::detail::check_dim("split", dim, x);
  Extent total = 0;
  for (Extent s : sizes) {
    host::detail::check(s >= 0, "split", "negative size in ", to_string(sizes));
    total += s;
  }
  host::detail::check(total == x[dim], "split", "sizes ", to_string(sizes), " add up to ", total, ", not to extent ",
                      x[dim], " of dimension ", dim, " of ", to_string(x));
}

/// The extents of the parts joined along dim (every other extent must agree).
template <class T, std::size_t R, class S>
Shape<R> concat_shape(std::span<const Tensor<T, R, S>> parts, std::size_t dim) {
  host::detail::check(!parts.empty(), "concat", "no tensors to join");
  host::detail::check_dim("concat", dim, parts[0].shape());
  Shape<R> s = parts[0].shape();
  s[dim] = 0;
  for (const auto& p : parts) {
    Shape<R> a = p.shape(), b = parts[0].shape();
    a[dim] = b[dim] = 0;
    host::detail::check(a == b, "concat", "extents ", to_string(p.shape()), " and ", to_string(parts[0].shape()),
                        " differ outside dimension ", dim);
    s[dim] += p.extent(dim);
  }
  return s;
}

/// Pieces of x along dim with the given extents (they must add up to x's extent).
template <class T, std::size_t R, class S>
std::vector<Tensor<T, R, S>> split_boxes(const Tensor<T, R, S>& x, std::size_t dim, std::span<const Extent> sizes) {
  check_split(x.shape(), dim, sizes);
  std::vector<Tensor<T, R, S>> parts;
  parts.reserve(sizes.size());
  Extent start = 0;
  for (Extent s : sizes) {
    parts.push_back(x.slice(dim, start, s));
    start += s;
  }
  return parts;
}

/// Joins tensors along dim; every other extent must agree.
template <class T, std::size_t R, class S>
Tensor<T, R, S> concat_boxes(std::span<const Tensor<T, R, S>> parts, std::size_t dim) {
  auto y = Tensor<T, R, S>::uninitialized(concat_shape(parts, dim));
  Shape<R> at{};
  for (const auto& p : parts) {
    copy_box(p, Shape<R>{}, y, at, p.shape());
    at[dim] += p.extent(dim);
  }
  return y;
}

}  // namespace dtensor::kernels::detail
