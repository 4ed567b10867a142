// dtensor/kernels/meta/transpose.hpp — the meta twin of kernels/host/transpose.hpp: permute,
// transpose, split, concat. Data movement: no FLOPs, every element read and written once.
#pragma once

#include <array>
#include <initializer_list>
#include <span>
#include <vector>

#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

template <Element T, std::size_t R>
MetaTensor<T, R> permute(const MetaTensor<T, R>& x, const std::array<std::size_t, R>& perm) {
  std::array<bool, R> seen{};
  for (std::size_t p : perm) {
    detail::check(p < R && !seen[p], "permute", "invalid permutation ", to_string(perm), " of ", to_string(x.shape()));
    seen[p] = true;
  }
  Shape<R> ys{};
  for (std::size_t i = 0; i < R; ++i) ys[i] = x.extent(perm[i]);
  detail::cost("permute", 0, detail::bytes<T>(x.numel()), detail::bytes<T>(x.numel()));
  return detail::result<T>(ys);
}

template <Element T, std::size_t R>
MetaTensor<T, R> transpose(const MetaTensor<T, R>& x, std::size_t d0, std::size_t d1) {
  detail::check(d0 < R && d1 < R, "transpose", "dimensions ", d0, " and ", d1, " out of range for ",
                to_string(x.shape()));
  std::array<std::size_t, R> perm{};
  for (std::size_t i = 0; i < R; ++i) perm[i] = i;
  std::swap(perm[d0], perm[d1]);
  return permute(x, perm);
}

template <Element T, std::size_t R>
std::vector<MetaTensor<T, R>> split(const MetaTensor<T, R>& x, std::size_t dim, std::span<const Extent> sizes) {
  detail::check_dim("split", dim, x.shape());
  Extent total = 0;
  for (Extent s : sizes) {
    detail::check(s >= 0, "split", "negative size in ", to_string(sizes));
    total += s;
  }
  detail::check(total == x.extent(dim), "split", "sizes ", to_string(sizes), " add up to ", total, ", not to extent ",
                x.extent(dim), " of dimension ", dim, " of ", to_string(x.shape()));
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
  detail::check(!parts.empty(), "concat", "no tensors to join");
  detail::check_dim("concat", dim, parts[0].shape());
  Shape<R> s = parts[0].shape();
  s[dim] = 0;
  for (const auto& p : parts) {
    Shape<R> a = p.shape(), b = parts[0].shape();
    a[dim] = b[dim] = 0;
    detail::check(a == b, "concat", "extents ", to_string(p.shape()), " and ", to_string(parts[0].shape()),
                  " differ outside dimension ", dim);
    s[dim] += p.extent(dim);
  }
  detail::cost("concat", 0, detail::bytes<T>(numel(s)), detail::bytes<T>(numel(s)));
  return detail::result<T>(s);
}
template <Element T, std::size_t R>
MetaTensor<T, R> concat(const std::vector<MetaTensor<T, R>>& parts, std::size_t dim) {
  return concat(std::span<const MetaTensor<T, R>>(parts), dim);
}

}  // namespace dtensor::kernels::meta
