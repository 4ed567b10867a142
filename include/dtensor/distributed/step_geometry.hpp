// dtensor/distributed/step_geometry.hpp — where the pieces of one redistribution step lie.
//
//   auto g = detail::step_geometry(before, after, first, last, mesh_shape, coord, global);
//   g.member_before[j]   // the piece group rank j holds before the step (global coordinates)
//   g.block              // the shape every block of the step's collective travels in
//
// A step runs over the group of mesh dimensions first..last (ranks that differ only there;
// group rank = the row-major index of the coordinate inside the run, as DeviceMesh splits
// them). Its collective exchanges blocks of one shape, the same on every rank of the group:
// along each tensor dimension the longest piece any rank holds before or after the step
// (whichever is shorter), so uneven chunks travel padded. The executor (redistribute.hpp)
// packs and unpacks with these boxes, and Plan::estimate counts its bytes with them.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "dtensor/placement/layout.hpp"

namespace dtensor::detail {

template <std::size_t R>
struct StepGeometry {
  Box<R> before, after;  // this rank's piece before and after the step
  int group_size = 1;
  int group_rank = 0;
  std::vector<Box<R>> member_before, member_after;  // every rank of the group, by group rank
  Shape<R> block{};

  Extent block_elements() const { return numel(block); }
  /// Elements in the larger buffer of the step's collective (nccl-tests' size): one block per
  /// rank, or this rank's piece for an all-reduce.
  std::size_t collective_elements(bool all_reduce) const {
    return std::size_t(all_reduce ? numel(before.extent) : block_elements() * Extent(group_size));
  }
};

/// The geometry of a step from layout `before` to `after` over mesh dimensions first..last, on
/// the rank at `coord` (see the top of this file).
template <std::size_t N, std::size_t R>
StepGeometry<R> step_geometry(const LayoutDesc<N>& before, const LayoutDesc<N>& after, int first, int last,
                              const std::array<int, N>& mesh_shape, const std::array<int, N>& coord,
                              const Shape<R>& global) {
  StepGeometry<R> g;
  g.before = local_box(before, mesh_shape, coord, global);
  g.after = local_box(after, mesh_shape, coord, global);
  for (int i = first; i <= last; ++i) {
    g.group_rank = g.group_rank * mesh_shape[std::size_t(i)] + coord[std::size_t(i)];
    g.group_size *= mesh_shape[std::size_t(i)];
  }
  g.member_before.resize(std::size_t(g.group_size));
  g.member_after.resize(std::size_t(g.group_size));
  Shape<R> longest_before{}, longest_after{};
  std::array<int, N> member = coord;
  for (int j = 0; j < g.group_size; ++j) {
    for (int i = last, rest = j; i >= first; --i) {  // the coordinate of group rank j
      member[std::size_t(i)] = rest % mesh_shape[std::size_t(i)];
      rest /= mesh_shape[std::size_t(i)];
    }
    const auto b = local_box(before, mesh_shape, member, global);
    const auto a = local_box(after, mesh_shape, member, global);
    for (std::size_t d = 0; d < R; ++d) {
      longest_before[d] = std::max(longest_before[d], b.extent[d]);
      longest_after[d] = std::max(longest_after[d], a.extent[d]);
    }
    g.member_before[std::size_t(j)] = b;
    g.member_after[std::size_t(j)] = a;
  }
  for (std::size_t d = 0; d < R; ++d) g.block[d] = std::min(longest_before[d], longest_after[d]);
  return g;
}

/// The part of box `a` that lies in box `b` (empty extents where they do not meet).
template <std::size_t R>
Box<R> intersect(const Box<R>& a, const Box<R>& b) {
  Box<R> r;
  for (std::size_t d = 0; d < R; ++d) {
    const Extent lo = std::max(a.offset[d], b.offset[d]);
    const Extent hi = std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    r.offset[d] = lo;
    r.extent[d] = hi > lo ? hi - lo : 0;
  }
  return r;
}

/// True when the boxes `parts` (global coordinates, one per block) lie in a row-major tensor
/// holding box `whole` exactly where blocks of shape `block` laid end to end put them: part j
/// starts at element j * numel(block) and has block's layout (only its length along one
/// dimension may be shorter, at its end, or zero). Then a collective's buffer of blocks is the
/// tensor itself plus a tail, and no packing copy is needed.
template <std::size_t R>
bool blocks_in_place(const std::vector<Box<R>>& parts, const Box<R>& whole, const Shape<R>& block) {
  std::size_t split = R - 1;  // the one dimension along which the parts follow each other
  for (std::size_t d = 0; d < R; ++d)
    if (whole.extent[d] != 1) {
      split = d;
      break;
    }
  for (std::size_t d = split + 1; d < R; ++d)
    if (block[d] != whole.extent[d]) return false;
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const Box<R>& p = parts[j];
    if (numel(p.extent) == 0) continue;
    for (std::size_t d = 0; d < R; ++d) {
      const Extent at = d == split ? Extent(j) * block[d] : 0;
      if (p.offset[d] - whole.offset[d] != at) return false;
      if (d == split ? p.extent[d] > block[d] : p.extent[d] != block[d]) return false;
    }
  }
  return true;
}

}  // namespace dtensor::detail
