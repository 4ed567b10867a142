// dtensor/kernels/meta/transpose.hpp — the meta twin of kernels/host/transpose.hpp: permute,
// transpose, split, concat. Data movement: no FLOPs, every element read and written once.
#pragma once

#include <array>
#include <initializer_list>
#include <span>
#include <vector>

#include "dtensor/kernels/detail/split_concat.hpp"  // check_split, concat_shape
#include "dtensor/kernels/host/transpose.hpp"  // permuted, swap_dims
#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

template <Element T, std::size_t R>
MetaTensor<T, R> permute(const MetaTensor<T, R>& x, const std::array<std::size_t, R>& perm) {
  const Shape<R> ys = host::detail::permuted(x.shape(), perm).first;
  detail::cost("permute", 0, detail::bytes<T>(x.numel()), detail::bytes<T>(x.numel()));
  return detail::result<T>(ys);
}

template <Element T, std::size_t R>
MetaTensor<T, R> transpose(const MetaTensor<T, R>& x, std::size_t d0, std::size_t d1) {
  return permute(x, host::detail::swap_dims(x.shape(), d0, d1));
}

template <Element T, std::size_t R>
std::vector<MetaTensor<T, R>> split(const MetaTensor<T, R>& x, std::size_t dim, std::span<const Extent> sizes) {
  kernels::detail::check_split(x.shape(), dim, sizes);
  std::vector<MetaTensor<T, R>> parts;
  for (Extent s : sizes) {
    auto e = x.shape();
    e[dim] = s;
    parts.push_back(detail::result<T>(e));
  }
  detail::cost("split", 0, detail::bytes<T>(x.numel()), detail::bytes<T>(x.numel()));
  return parts;
}
template <Element T, std::size_t R>
std::vector<MetaTensor<T, R>> split(const MetaTensor<T, R>& x, std::size_t dim, std::initializer_list<Extent> sizes) {
  return split(x, dim, std::span<const Extent>(sizes.begin(), sizes.size()));
}

template <Element T, std::size_t R>
MetaTensor<T, R> concat(std::span<const MetaTensor<T, R>> parts, std::size_t dim) {
  const Shape<R> s = kernels::detail::concat_shape(parts, dim);
  detail::cost("concat", 0, detail::bytes<T>(numel(s)), detail::bytes<T>(numel(s)));
  return detail::result<T>(s);
}
template <Element T, std::size_t R>
MetaTensor<T, R> concat(const std::vector<MetaTensor<T, R>>& parts, std::size_t dim) {
  return concat(std::span<const MetaTensor<T, R>>(parts), dim);
}

}  // namespace dtensor::kernels::meta
