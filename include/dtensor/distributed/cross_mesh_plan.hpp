// dtensor/distributed/cross_mesh_plan.hpp — who sends which box to whom, between two meshes of any shape.
//
//   auto plan = plan_cross_mesh(Layout<Shard<0>, Replicate>::desc, train.ranks(),
//                               Layout<Shard<1>>::desc, serve.ranks(), Shape<2>{13, 7}, sizeof(float));
//   plan.bytes() == plan.minimum_bytes();   // each destination element received once, from elsewhere
//   std::cout << plan.to_string();          // one line per link: source rank -> destination rank, box, bytes
//
// The plan of redistribute_to (distributed/cross_mesh.hpp), computed alike on every rank from
// numbers alone, without communicating: the box of the global tensor each source rank holds (the
// chunk arithmetic of placement/chunk.hpp: uneven and empty chunks), the box each destination
// rank holds, and their intersections. Distinct source boxes tile the tensor (replicas hold equal
// boxes), so every destination element lies in exactly one of them: the destination takes it
// from a rank that holds that box — itself if it does (a local copy, no bytes), otherwise the
// holder that has been given the fewest bytes so far (replicas share the sending). A source rank
// and a destination rank meet in at most one box, so a link carries at most one message.
//
// Partial placements are refused (plan_cross_mesh throws; the typed API does not compile): a
// Partial source would need its pieces reduced, which moves every partial holder's bytes (P times
// the minimum over P partial ranks) or a collective on the source mesh the caller did not ask
// for; redistribute the source to Replicate or Shard on its own mesh first, which makes that
// collective explicit.
//
// Cost: the plan lists one move per (distinct source box, destination rank) that meet, found by
// trying each pair: O(distinct source boxes x destination ranks) box intersections.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/shape.hpp"
#include "dtensor/distributed/step_geometry.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/placement/layout.hpp"

namespace dtensor {

/// One message of a cross-mesh plan (or a local copy, src == dst): the box of the global tensor
/// that root rank `src` sends to root rank `dst`.
template <std::size_t R>
struct CrossMeshMove {
  int src = -1, dst = -1;
  Box<R> box;
  std::size_t bytes = 0;
  bool local() const { return src == dst; }
};

/// Every move of a redistribution between two meshes, and the numbers every rank must agree on.
template <std::size_t R>
struct CrossMeshPlan {
  Shape<R> global{};
  std::size_t element_bytes = 0;
  std::vector<CrossMeshMove<R>> moves;  // by destination rank (row-major), then source box
  std::vector<int> ranks;               // the root ranks of either mesh, ascending
  std::string source, destination;      // "(S(0), R) on mesh [2, 2] ranks {0, 1, 2, 3}"
  std::size_t minimum = 0;              // see minimum_bytes
  std::uint64_t fingerprint = 0;        // a hash of everything above the moves are computed from

  /// Bytes that cross between distinct ranks (local copies excluded).
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& m : moves)
      if (!m.local()) n += m.bytes;
    return n;
  }
  /// Bytes copied within a rank that is in both meshes.
  std::size_t local_bytes() const {
    std::size_t n = 0;
    for (const auto& m : moves)
      if (m.local()) n += m.bytes;
    return n;
  }
  /// The least any plan can move, computed from the layouts alone (not from the moves): each
  /// destination rank's box, less what that rank already holds as a source rank.
  std::size_t minimum_bytes() const { return minimum; }
  /// Bytes root rank r sends / receives (local copies excluded).
  std::size_t sent_by(int r) const {
    std::size_t n = 0;
    for (const auto& m : moves)
      if (!m.local() && m.src == r) n += m.bytes;
    return n;
  }
  std::size_t received_by(int r) const {
    std::size_t n = 0;
    for (const auto& m : moves)
      if (!m.local() && m.dst == r) n += m.bytes;
    return n;
  }
  /// Messages between distinct ranks.
  std::size_t links() const {
    return std::size_t(std::count_if(moves.begin(), moves.end(), [](const auto& m) { return !m.local(); }));
  }
  bool contains(int r) const { return std::binary_search(ranks.begin(), ranks.end(), r); }

  /// The plan, one line per move, then the totals.
  std::string to_string() const {
    std::string s = detail::cat("cross-mesh plan of ", dtensor::to_string(global), " (", element_bytes,
                                "-byte elements): ", source, " -> ", destination, "\n");
    for (const auto& m : moves) {
      s += detail::cat("  rank ", m.src, " -> rank ", m.dst, ": ");
      for (std::size_t d = 0; d < R; ++d)
        s += detail::cat(d ? " x " : "", "[", m.box.offset[d], ", ", m.box.offset[d] + m.box.extent[d], ")");
      s += detail::cat("  ", m.bytes, " B", m.local() ? " (local copy)" : "", "\n");
    }
    return s + detail::cat("  total ", bytes(), " B over ", links(), " links (minimum ", minimum, " B), ", local_bytes(),
                           " B copied locally\n");
  }
};

namespace detail {

template <std::size_t R>
Extent box_numel(const Box<R>& b) {
  Extent n = 1;
  for (Extent e : b.extent) n *= e;
  return n;
}

/// The box of `global` that each rank of a mesh holds, by row-major mesh rank.
template <std::size_t R, std::size_t N>
std::vector<Box<R>> mesh_boxes(const LayoutDesc<N>& l, const std::array<int, N>& shape, const Shape<R>& global) {
  int n = 1;
  for (int s : shape) n *= s;
  std::vector<Box<R>> boxes(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) boxes[std::size_t(i)] = local_box(l, shape, row_major_coordinate(shape, i), global);
  return boxes;
}

/// "(S(0), R) on mesh [2, 2] ranks {0, 1, 2, 3}"
template <std::size_t N>
std::string describe_side(const LayoutDesc<N>& l, const MeshRanks<N>& m) {
  std::string s = to_string(l) + " on mesh " + to_string(m.shape) + " ranks {";
  for (std::size_t i = 0; i < m.root_ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(m.root_ranks[i]);
  return s + "}";
}

/// Throws unless the mesh lists one distinct root rank per coordinate and the layout can move.
template <std::size_t R, std::size_t N>
void check_side(const char* which, const LayoutDesc<N>& l, const MeshRanks<N>& m) {
  int n = 1;
  for (int s : m.shape) {
    if (s < 1) throw Error("redistribute_to", cat(which, " mesh shape ", to_string(m.shape), " has a dimension < 1"));
    n *= s;
  }
  if (m.root_ranks.size() != std::size_t(n))
    throw Error("redistribute_to", cat(which, " mesh ", to_string(m.shape), " lists ", m.root_ranks.size(),
                                       " root ranks, not ", n));
  auto sorted = m.root_ranks;
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty() && sorted.front() < 0)
    throw Error("redistribute_to", cat(which, " mesh lists root rank ", sorted.front()));
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw Error("redistribute_to", cat(which, " mesh lists a root rank twice: ", describe_side(l, m)));
  for (const auto& p : l.placements) {
    if (p.is_partial())
      throw Error("redistribute_to",
                  cat(which, " layout ", to_string(l),
                      " is Partial: redistribute it to Replicate or Shard on its own mesh first (the reduction is a "
                      "collective there; reducing on the way would send every partial holder's bytes)"));
    if (p.is_shard() && p.dim >= int(R))
      throw Error("redistribute_to", cat(which, " layout ", to_string(l), " shards a dimension of a rank-", R, " tensor"));
  }
}

inline std::uint64_t fnv(std::uint64_t h, std::int64_t v) {
  return (h ^ std::uint64_t(v)) * 1099511628211ull + 0x9e3779b97f4a7c15ull;
}

template <std::size_t N>
std::uint64_t fold_side(std::uint64_t h, const LayoutDesc<N>& l, const MeshRanks<N>& m) {
  h = fnv(h, std::int64_t(N));
  for (std::size_t i = 0; i < N; ++i) {
    h = fnv(h, std::int64_t(l.placements[i].kind) | std::int64_t(l.placements[i].dim + 1) << 8 |
                   std::int64_t(l.placements[i].op) << 24);
    h = fnv(h, std::int64_t(l.outer_mask(i)));
    h = fnv(h, m.shape[i]);
  }
  for (int r : m.root_ranks) h = fnv(h, r);
  return h;
}

}  // namespace detail

/// The plan of moving a tensor of extents `global` from layout `src_layout` on the mesh whose
/// root ranks are `src` to `dst_layout` on `dst` (any shapes; disjoint, overlapping or the same
/// ranks of one root communicator). Pure arithmetic: every rank computes the same plan.
template <std::size_t R, std::size_t NS, std::size_t ND>
CrossMeshPlan<R> plan_cross_mesh(const LayoutDesc<NS>& src_layout, const MeshRanks<NS>& src,
                                 const LayoutDesc<ND>& dst_layout, const MeshRanks<ND>& dst, const Shape<R>& global,
                                 std::size_t element_bytes) {
  detail::check_side<R>("source", src_layout, src);
  detail::check_side<R>("destination", dst_layout, dst);
  for (Extent e : global)
    if (e < 0) throw Error("redistribute_to", "negative global extents " + to_string(global));
  CrossMeshPlan<R> plan;
  plan.global = global;
  plan.element_bytes = element_bytes;
  plan.source = detail::describe_side(src_layout, src);
  plan.destination = detail::describe_side(dst_layout, dst);
  plan.ranks = src.root_ranks;
  plan.ranks.insert(plan.ranks.end(), dst.root_ranks.begin(), dst.root_ranks.end());
  std::sort(plan.ranks.begin(), plan.ranks.end());
  plan.ranks.erase(std::unique(plan.ranks.begin(), plan.ranks.end()), plan.ranks.end());
  std::uint64_t h = 14695981039346656037ull;
  h = detail::fnv(h, std::int64_t(element_bytes));
  h = detail::fnv(h, std::int64_t(R));
  for (Extent e : global) h = detail::fnv(h, e);
  h = detail::fold_side(h, src_layout, src);
  plan.fingerprint = detail::fold_side(h, dst_layout, dst);

  const auto src_boxes = detail::mesh_boxes(src_layout, src.shape, global);
  const auto dst_boxes = detail::mesh_boxes(dst_layout, dst.shape, global);
  // Distinct source boxes, each with the mesh ranks (row-major) of its holders.
  struct Held {
    Box<R> box;
    std::vector<std::size_t> holders;
  };
  std::vector<Held> held;
  for (std::size_t i = 0; i < src_boxes.size(); ++i) {
    if (detail::box_numel(src_boxes[i]) == 0) continue;
    auto it = std::find_if(held.begin(), held.end(), [&](const Held& g) { return g.box == src_boxes[i]; });
    if (it == held.end()) held.push_back({src_boxes[i], {i}});
    else it->holders.push_back(i);
  }
  std::vector<std::size_t> load(src_boxes.size(), std::size_t{0});  // bytes given to each source rank so far
  for (std::size_t j = 0; j < dst_boxes.size(); ++j) {
    const int me = dst.root_ranks[j];
    // What this destination rank already holds as a source rank is not the minimum's.
    Extent must = detail::box_numel(dst_boxes[j]);
    const auto self = std::find(src.root_ranks.begin(), src.root_ranks.end(), me);
    if (self != src.root_ranks.end())
      must -= detail::box_numel(detail::intersect(dst_boxes[j], src_boxes[std::size_t(self - src.root_ranks.begin())]));
    plan.minimum += std::size_t(must) * element_bytes;
    for (const Held& g : held) {
      const Box<R> piece = detail::intersect(g.box, dst_boxes[j]);
      const std::size_t bytes = std::size_t(detail::box_numel(piece)) * element_bytes;
      if (bytes == 0) continue;
      std::size_t from = g.holders[0];
      bool local = false;
      for (std::size_t h2 : g.holders)
        if (src.root_ranks[h2] == me) from = h2, local = true;
      if (!local) {
        // The least loaded holder; among equals, the one after this destination's index in a
        // rotation, so that replicas share equal pieces evenly.
        const std::size_t n = g.holders.size();
        for (std::size_t k = 0; k < n; ++k) {
          const std::size_t c = g.holders[(j + k) % n];
          if (k == 0 || load[c] < load[from]) from = c;
        }
        load[from] += bytes;
      }
      plan.moves.push_back({src.root_ranks[from], me, piece, bytes});
    }
  }
  return plan;
}

}  // namespace dtensor
