// dtensor/ops/shape.hpp — moving elements of DTensors: transpose, reshape, split, concat.
//
//   auto y = ops::transpose<1, 2>(x);                         // [B, T, H, D] -> [B, H, T, D]
//   auto dx = ops::transpose<1, 2>(dy);                       // its own backward
//   auto h = ops::reshape<Layout<Shard<1>>>(x, Shape<3>{N, H, D});   // [N, C] split on C -> split on H
//   auto dx = ops::reshape_backward(dh, x);                   // back to x's extents and shards
//   auto parts = ops::split<1>(x, {64, 64});                  // along an unsplit dimension
//   auto y = ops::concat<1>(parts);                           // the inverse (each other's backward)
//
// Sharding:
//   transpose<D0, D1> (rules::Transpose): Shard<D0> <-> Shard<D1>; everything else unchanged
//   (pure data movement commutes with every placement, Partial included).
//   split / concat along Dim (rules::AlongDim): Dim must not be split; other placements stay.
//   reshape<To>(x, shape) (rules::Reshape): the caller names the output layout; Replicate and
//   Partial must stay as they are, Shard may move to another dimension when this rank's piece is
//   still one block of the new extents in the same order (e.g. [N, C] split on C over ranks that
//   hold whole heads -> [N, H, D] split on H; or merging [B, T, C] split on B into [B*T, C] split
//   on 0). That is checked at run time on every rank, with an error naming the rank, the extents
//   and the layouts.
//
// No communication: every rank moves its own elements.
#pragma once

#include <initializer_list>
#include <type_traits>
#include <utility>
#include <span>
#include <vector>

#include "dtensor/kernels/transpose.hpp"
#include "dtensor/ops/common.hpp"

namespace dtensor::ops {

/// Swaps dimensions D0 and D1. No communication.
template <int D0, int D1, AnyDTensor X>
auto transpose(const X& x) {
  static_assert(D0 >= 0 && D1 >= 0 && D0 < int(X::rank) && D1 < int(X::rank),
                "transpose: both dimensions must be dimensions of x");
  using L = rules::transpose_t<typename X::layout, D0, D1>;
  auto s = x.shape();
  std::swap(s[std::size_t(D0)], s[std::size_t(D1)]);
  return detail::make<typename X::value_type, X::rank, L>(
      x.mesh(), s, kernels::transpose(x.to_local(), std::size_t(D0), std::size_t(D1)));
}

namespace detail {

/// A box of a row-major tensor as the sequence of flat indices it visits, in canonical form:
/// a base and (count, stride) runs, inner runs merged. Two boxes visit the same indices in the
/// same order iff their forms are equal.
struct Runs {
  Extent base = 0;
  int n = 0;
  std::array<Extent, 16> count{}, stride{};
  friend bool operator==(const Runs& a, const Runs& b) {
    if (a.base != b.base || a.n != b.n) return false;
    for (int i = 0; i < a.n; ++i)
      if (a.count[std::size_t(i)] != b.count[std::size_t(i)] || a.stride[std::size_t(i)] != b.stride[std::size_t(i)])
        return false;
    return true;
  }
};

template <std::size_t R>
Runs runs_of(const Shape<R>& global, const Box<R>& box) {
  Runs r;
  const Shape<R> st = row_major_strides(global);
  if (numel(box.extent) == 0) {
    r.base = -1;  // every empty box is the same (no elements)
    return r;
  }
  for (std::size_t d = 0; d < R; ++d) r.base += box.offset[d] * st[d];
  for (std::size_t d = 0; d < R; ++d) {
    if (box.extent[d] == 1) continue;  // a constant index
    if (r.n > 0 && r.stride[std::size_t(r.n - 1)] == box.extent[d] * st[d]) {
      // merge with the outer run: the inner run fills the outer one's stride exactly
      r.count[std::size_t(r.n - 1)] *= box.extent[d];
      r.stride[std::size_t(r.n - 1)] = st[d];
    } else {
      r.count[std::size_t(r.n)] = box.extent[d];
      r.stride[std::size_t(r.n)] = st[d];
      ++r.n;
    }
  }
  return r;
}

/// Checks that this rank's piece of x (layout LX over x's extents) and its piece of the result
/// (layout LY over `to`) are the same elements in the same order.
template <LayoutType LX, LayoutType LY, std::size_t RX, std::size_t RY, class Mesh>
void check_reshape(const char* op, const Mesh& mesh, const Shape<RX>& from, const Shape<RY>& to) {
  check(numel(from) == numel(to), op, mesh, "cannot reshape ", to_string(from), " (", numel(from), " elements) to ",
        to_string(to), " (", numel(to), ")");
  const auto bx = local_box(LX::desc, mesh.shape(), mesh.coordinate(), from);
  const auto by = local_box(LY::desc, mesh.shape(), mesh.coordinate(), to);
  check(runs_of(from, bx) == runs_of(to, by), op, mesh, "reshaping ", to_string(from), " under layout ",
        to_string(LX::desc), " to ", to_string(to), " under layout ", to_string(LY::desc),
        ": this rank's piece (offset ", to_string(bx.offset), ", extents ", to_string(bx.extent),
        ") is not its piece of the result (offset ", to_string(by.offset), ", extents ", to_string(by.extent),
        ") in the same order; split whole blocks (e.g. whole heads) or redistribute first");
}

}  // namespace detail

/// The same elements with extents `shape`, in the output layout To (see the synopsis).
/// No communication. A temporary x gives its storage to the result (no copy).
template <LayoutType To, class XRef, std::size_t R2>
  requires AnyDTensor<std::remove_cvref_t<XRef>>
auto reshape(XRef&& x, const Shape<R2>& shape) {
  using X = std::remove_cvref_t<XRef>;
  static_assert(To::mesh_ndim == X::mesh_type::ndim, "reshape: the layout needs one placement per mesh dimension");
  static_assert(To::desc.max_shard_dim() < int(R2), "reshape: the layout shards a dimension the result does not have");
  detail::require_rule_hint<"reshape", "Replicate and Partial must stay as they are; only a Shard may move", rules::Reshape{},
                            typename X::mesh_type, typename X::layout, To>();
  using L = rules::reshape_t<typename X::layout, To>;
  detail::check_reshape<typename X::layout, L>("reshape", x.mesh(), x.shape(), shape);
  const auto box = local_box(L::desc, x.mesh().shape(), x.mesh().coordinate(), shape);
  const auto& mesh = x.mesh();  // not moved from: only the local part goes
  auto local = std::forward<XRef>(x).to_local().template reshape<R2>(box.extent);
  return detail::make<typename X::value_type, R2, L>(mesh, shape, std::move(local));
}

/// The gradient of reshape: dy back to x's extents, x's shards, dy's Replicate / Partial.
template <AnyDTensor DY, AnyDTensor X>
auto reshape_backward(const DY& dy, const X& x) {
  detail::require_same_mesh_type<DY, X>();
  detail::require_rule<"reshape_backward", rules::ReshapeBackward{}, typename X::mesh_type, typename X::layout,
                       typename DY::layout>();
  using L = rules::reshape_grad_t<typename X::layout, typename DY::layout>;
  detail::check_reshape<typename DY::layout, L>("reshape_backward", x.mesh(), dy.shape(), x.shape());
  const auto box = local_box(L::desc, x.mesh().shape(), x.mesh().coordinate(), x.shape());
  return detail::make<typename DY::value_type, X::rank, L>(x.mesh(), x.shape(),
                                                           dy.to_local().template reshape<X::rank>(box.extent));
}

/// Pieces of x along Dim with the given extents (adding up to x's). No communication.
template <int Dim, AnyDTensor X>
auto split(const X& x, std::span<const Extent> sizes) {
  static_assert(Dim >= 0 && Dim < int(X::rank), "split: Dim must be a dimension of x");
  detail::require_rule_hint<"split", "the split dimension must not be split across ranks", rules::AlongDim{Dim},
                            typename X::mesh_type, typename X::layout>();
  using L = rules::along_dim_t<typename X::layout, Dim>;
  Extent total = 0;
  bool nonnegative = true;
  for (Extent s : sizes) total += s, nonnegative = nonnegative && s >= 0;
  detail::check(nonnegative && total == x.extent(std::size_t(Dim)), "split", x.mesh(), "sizes ", to_string(sizes),
                " do not add up to extent ", x.extent(std::size_t(Dim)), " of dimension ", Dim, " of ",
                to_string(x.shape()));
  auto local = kernels::split(x.to_local(), std::size_t(Dim), sizes);
  std::vector<dtensor_t<X, L>> out;
  out.reserve(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    auto s = x.shape();
    s[std::size_t(Dim)] = sizes[i];
    out.push_back(detail::make<typename X::value_type, X::rank, L>(x.mesh(), s, std::move(local[i])));
  }
  return out;
}
template <int Dim, AnyDTensor X>
auto split(const X& x, std::initializer_list<Extent> sizes) {
  return split<Dim>(x, std::span<const Extent>(sizes.begin(), sizes.size()));
}

/// Joins DTensors of one type along Dim (which must not be split). No communication.
template <int Dim, AnyDTensor X>
auto concat(std::span<const X> parts) {
  static_assert(Dim >= 0 && Dim < int(X::rank), "concat: Dim must be a dimension of the parts");
  detail::require_rule_hint<"concat", "the joined dimension must not be split across ranks", rules::AlongDim{Dim},
                            typename X::mesh_type, typename X::layout>();
  using L = rules::along_dim_t<typename X::layout, Dim>;
  if (parts.empty()) throw Error("concat", "no tensors to join");
  auto s = parts[0].shape();
  s[std::size_t(Dim)] = 0;
  std::vector<Tensor<typename X::value_type, X::rank, typename X::space>> local;
  local.reserve(parts.size());
  for (const auto& p : parts) {
    auto a = p.shape(), b = parts[0].shape();
    a[std::size_t(Dim)] = b[std::size_t(Dim)] = 0;
    detail::check(a == b, "concat", p.mesh(), "extents ", to_string(p.shape()), " and ", to_string(parts[0].shape()),
                  " differ outside dimension ", Dim);
    s[std::size_t(Dim)] += p.extent(std::size_t(Dim));
    local.push_back(p.to_local());
  }
  return detail::make<typename X::value_type, X::rank, L>(parts[0].mesh(), s,
                                                          kernels::concat(local, std::size_t(Dim)));
}
template <int Dim, AnyDTensor X>
auto concat(const std::vector<X>& parts) {
  return concat<Dim>(std::span<const X>(parts));
}

}  // namespace dtensor::ops
