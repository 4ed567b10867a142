// dtensor/placement/layout.hpp — one placement per mesh dimension: where every element lives.
//
//   using L = Layout<Shard<0>, Replicate>;                // on a ("dp", "tp") mesh
//   using F = Layout<Shard<0>, Shard<0>>::ordered<1, 0>;  // "tp" splits dim 0 first, then "dp"
//   local_box(L::desc, mesh_shape, coord, global_shape)   // offset and extents of a rank's piece
//
// When several mesh dimensions shard the same tensor dimension they split it in an order: by
// default left to right (the leftmost mesh dimension splits first, the next splits each of
// its chunks). `ordered<m...>` lists mesh dimensions in the order they split instead; FSDP over
// tensor parallelism needs "tp" first. This replaces DTensor's _StridedShard.
//
// A layout type lowers to a LayoutDesc<N>, a constexpr value; everything below works on those.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "dtensor/core/shape.hpp"
#include "dtensor/placement/chunk.hpp"
#include "dtensor/placement/placement.hpp"

namespace dtensor {

/// The value form of a layout: placements, and the split priority of each mesh dimension
/// (among mesh dimensions that shard the same tensor dimension, lower priority splits first).
template <std::size_t N>
struct LayoutDesc {
  std::array<PlacementDesc, N> placements{};
  std::array<int, N> priority{};

  /// Whether mesh dimension j splits before i (equal priorities: the lower index first).
  constexpr bool splits_before(std::size_t j, std::size_t i) const {
    return priority[j] < priority[i] || (priority[j] == priority[i] && j < i);
  }
  /// Mesh dimension i shards some tensor dimension and no mesh dimension splits it after i.
  constexpr bool is_innermost(std::size_t i) const {
    if (!placements[i].is_shard()) return false;
    for (std::size_t j = 0; j < N; ++j)
      if (j != i && placements[j] == placements[i] && splits_before(i, j)) return false;
    return true;
  }
  /// A priority that makes a new shard of tensor dimension d the innermost split.
  constexpr int next_priority(int d) const {
    int p = 0;
    for (std::size_t j = 0; j < N; ++j)
      if (placements[j].is_shard(d) && priority[j] >= p) p = priority[j] + 1;
    return p;
  }
  /// The mesh dimensions that split before i does (a bit mask).
  constexpr unsigned outer_mask(std::size_t i) const {
    unsigned m = 0;
    for (std::size_t j = 0; j < N; ++j)
      if (j != i && placements[i].is_shard() && placements[j] == placements[i] && splits_before(j, i)) m |= 1u << j;
    return m;
  }
  /// Same placements and the same split order per tensor dimension (priorities may differ).
  friend constexpr bool operator==(const LayoutDesc& a, const LayoutDesc& b) {
    for (std::size_t i = 0; i < N; ++i)
      if (!(a.placements[i] == b.placements[i]) || a.outer_mask(i) != b.outer_mask(i)) return false;
    return true;
  }
  constexpr int max_shard_dim() const {
    int d = -1;
    for (const auto& p : placements)
      if (p.is_shard() && p.dim > d) d = p.dim;
    return d;
  }
  constexpr bool has_partial() const {
    for (const auto& p : placements)
      if (p.is_partial()) return true;
    return false;
  }
};

namespace detail {
/// to_string of a layout held as spans: the one formatting for a LayoutDesc<N> and for a layout
/// whose mesh rank is known only at run time (the collective check decodes fingerprints with it).
inline std::string layout_string(std::span<const PlacementDesc> placements, std::span<const int> priority) {
  const std::size_t n = placements.size();
  std::string s = "(";
  for (std::size_t i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += to_string(placements[i]);
  }
  // Say the split order only where it differs from left to right (LayoutDesc::splits_before(j, i)).
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j)
      if (placements[i].is_shard() && placements[i] == placements[j] &&
          (priority[j] < priority[i] || (priority[j] == priority[i] && j < i))) {
        s += " order [";
        for (std::size_t k = 0; k < n; ++k) s += (k ? ", " : "") + std::to_string(priority[k]);
        return s + "])";
      }
  return s + ")";
}
}  // namespace detail

template <std::size_t N>
std::string to_string(const LayoutDesc<N>& l) {
  return detail::layout_string(l.placements, l.priority);
}

/// Mesh dimensions in the order they split a tensor dimension they share.
template <int... MeshDims>
struct ShardOrder {};

namespace detail {
template <std::size_t N, class Order>
struct priorities;
template <std::size_t N>
struct priorities<N, void> {
  static constexpr std::array<int, N> value = [] {
    std::array<int, N> p{};
    for (std::size_t i = 0; i < N; ++i) p[i] = int(i);
    return p;
  }();
};
template <std::size_t N, int... M>
struct priorities<N, ShardOrder<M...>> {
  static_assert(sizeof...(M) == N, "ordered<...> must list every mesh dimension once");
  static constexpr std::array<int, sizeof...(M)> order{M...};
  static constexpr bool is_permutation = [] {
    std::array<bool, N> seen{};
    for (int m : order) {
      if (m < 0 || m >= int(N) || seen[std::size_t(m)]) return false;
      seen[std::size_t(m)] = true;
    }
    return true;
  }();
  static_assert(is_permutation, "ordered<...> must be a permutation of the mesh dimensions 0..N-1");
  static constexpr std::array<int, N> value = [] {
    std::array<int, N> p{};
    for (std::size_t k = 0; k < N; ++k) p[std::size_t(order[k])] = int(k);
    return p;
  }();
};
}  // namespace detail

template <class Order, Placement... P>
struct BasicLayout {
  static constexpr std::size_t mesh_ndim = sizeof...(P);
  static_assert(mesh_ndim >= 1, "a Layout needs one placement per mesh dimension");
  static constexpr LayoutDesc<mesh_ndim> desc{{P::desc...}, detail::priorities<mesh_ndim, Order>::value};

  /// The same placements, with mesh dimensions splitting shared tensor dimensions in this order.
  template <int... MeshDims>
  using ordered = BasicLayout<ShardOrder<MeshDims...>, P...>;
};

template <Placement... P>
using Layout = BasicLayout<void, P...>;

template <class L>
concept LayoutType = requires {
  { L::mesh_ndim } -> std::convertible_to<std::size_t>;
  L::desc;
};

// ---------------------------------------------------------------- where a rank's piece lies

template <std::size_t R>
struct Box {
  Shape<R> offset{};
  Shape<R> extent{};
  friend constexpr bool operator==(const Box&, const Box&) = default;
};

/// The range of tensor dimension d of extent n held by the rank at `coord`.
template <std::size_t N>
constexpr Range local_range(const LayoutDesc<N>& l, const std::array<int, N>& mesh_shape,
                            const std::array<int, N>& coord, int d, Extent n) {
  Range r{0, n};
  // Apply the mesh dimensions that shard d from the first to split to the last.
  std::array<bool, N> done{};
  for (std::size_t step = 0; step < N; ++step) {
    int best = -1;
    for (std::size_t i = 0; i < N; ++i)
      if (!done[i] && l.placements[i].is_shard(d) && (best < 0 || l.splits_before(i, std::size_t(best))))
        best = int(i);
    if (best < 0) break;
    done[std::size_t(best)] = true;
    r = chunk_range(r, mesh_shape[std::size_t(best)], coord[std::size_t(best)]);
  }
  return r;
}

/// Offset and extents (in the global tensor) of the piece the rank at `coord` holds.
template <std::size_t R, std::size_t N>
constexpr Box<R> local_box(const LayoutDesc<N>& l, const std::array<int, N>& mesh_shape,
                           const std::array<int, N>& coord, const Shape<R>& global) {
  Box<R> b;
  for (std::size_t d = 0; d < R; ++d) {
    const Range r = local_range(l, mesh_shape, coord, int(d), global[d]);
    b.offset[d] = r.begin;
    b.extent[d] = r.size();
  }
  return b;
}

}  // namespace dtensor
