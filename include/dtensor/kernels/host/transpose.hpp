// dtensor/kernels/host/transpose.hpp — moving elements between layouts: permute, transpose,
// split, concat.
//
//   auto y = permute(x, {0, 2, 1, 3});        // y(i,j,k,l) = x(i,k,j,l)
//   auto y = transpose(x, 1, 2);              // [B,T,H,D] -> [B,H,T,D]
//   auto parts = split(x, 2, {64, 64, 64});   // along dimension 2, extents given
//   auto parts = split(x, 2, 3);              // three equal parts (the extent must divide)
//   auto y = concat(parts, 2);                // the inverse
//   auto [q, k, v] = split_heads(qkv, G, D);  // attention's heads from qkv [B, T, K, (G+2) D], one pass
//   auto dqkv = merge_heads(dq, dk, dv);      // the inverse
//
// Pure data movement: results are bit-exact for every element type. Split and concat are box
// copies (core/tensor.hpp's copy_box: one memcpy per contiguous run).
#pragma once

#include <algorithm>
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

/// Attention's heads out of the fused qkv projection, in one pass: qkv [B, T, K, (G+2) D], whose
/// last dimension holds KV head g's G queries, then its key, then its value (nn/attention.hpp),
/// becomes q [B, K G, T, D] and k, v [B, K, T, D] — what split along dimension 3 into
/// {G D, D, D} (q reshaped to [B, T, K G, D]) and transposing dimensions 1 and 2 give, without
/// the split's copies in between (the pair was ~4 % of a 1-rank GPT step). Bit-exact.
template <Element T>
struct SplitHeads {
  HostTensor<T, 4> q, k, v;
};
template <Element T>
SplitHeads<T> split_heads(const HostTensor<T, 4>& qkv, Extent group, Extent head_dim) {
  const Extent b = qkv.extent(0), t = qkv.extent(1), kv = qkv.extent(2), d = head_dim;
  detail::check(group > 0 && head_dim > 0 && qkv.extent(3) == (group + 2) * head_dim, "split_heads", "qkv ",
                to_string(qkv.shape()), " does not hold ", group, " queries, a key and a value of ", head_dim,
                " features per KV head");
  SplitHeads<T> out{HostTensor<T, 4>::uninitialized(Shape<4>{b, kv * group, t, d}),
                    HostTensor<T, 4>::uninitialized(Shape<4>{b, kv, t, d}),
                    HostTensor<T, 4>::uninitialized(Shape<4>{b, kv, t, d})};
  const T* in = qkv.data();
  T *q = out.q.data(), *k = out.k.data(), *v = out.v.data();
  const Extent row = (group + 2) * d;  // one KV head's features
  // One (batch, position) row of qkv per iteration: its K (G + 2) runs of D go to their heads.
  detail::parallel_for(b * t, detail::grain_for(2 * kv * row), [&](Extent r0, Extent r1) {
    for (Extent r = r0; r < r1; ++r) {
      const Extent bi = r / t, ti = r % t;
      for (Extent g = 0; g < kv; ++g) {
        const T* src = in + (r * kv + g) * row;
        for (Extent i = 0; i < group; ++i)
          std::copy_n(src + i * d, d, q + ((bi * kv * group + g * group + i) * t + ti) * d);
        std::copy_n(src + group * d, d, k + ((bi * kv + g) * t + ti) * d);
        std::copy_n(src + (group + 1) * d, d, v + ((bi * kv + g) * t + ti) * d);
      }
    }
  });
  return out;
}

/// The inverse of split_heads (attention's backward): dq [B, K G, T, D], dk, dv [B, K, T, D] ->
/// dqkv [B, T, K, (G+2) D], what transposing each back and concatenating along dimension 3 give.
template <Element T>
HostTensor<T, 4> merge_heads(const HostTensor<T, 4>& q, const HostTensor<T, 4>& k, const HostTensor<T, 4>& v) {
  const Extent b = k.extent(0), kv = k.extent(1), t = k.extent(2), d = k.extent(3);
  detail::check(kv > 0 && v.shape() == k.shape() && q.extent(0) == b && q.extent(2) == t && q.extent(3) == d &&
                    q.extent(1) % kv == 0,
                "merge_heads", "q ", to_string(q.shape()), ", k ", to_string(k.shape()), ", v ", to_string(v.shape()),
                ": k and v must agree, and q must have a whole number of heads per KV head with their other extents");
  const Extent group = q.extent(1) / kv, row = (group + 2) * d;
  auto out = HostTensor<T, 4>::uninitialized(Shape<4>{b, t, kv, row});
  const T *pq = q.data(), *pk = k.data(), *pv = v.data();
  T* dst0 = out.data();
  detail::parallel_for(b * t, detail::grain_for(2 * kv * row), [&](Extent r0, Extent r1) {
    for (Extent r = r0; r < r1; ++r) {
      const Extent bi = r / t, ti = r % t;
      for (Extent g = 0; g < kv; ++g) {
        T* dst = dst0 + (r * kv + g) * row;
        for (Extent i = 0; i < group; ++i)
          std::copy_n(pq + ((bi * kv * group + g * group + i) * t + ti) * d, d, dst + i * d);
        std::copy_n(pk + ((bi * kv + g) * t + ti) * d, d, dst + group * d);
        std::copy_n(pv + ((bi * kv + g) * t + ti) * d, d, dst + (group + 1) * d);
      }
    }
  });
  return out;
}

}  // namespace dtensor::kernels::host
