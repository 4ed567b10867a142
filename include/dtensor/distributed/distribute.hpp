// dtensor/distributed/distribute.hpp — making DTensors from full tensors or from local pieces.
//
//   auto x = distribute<Layout<Shard<0>, Replicate>>(mesh, full, /*src=*/0);  // full on rank 0 only
//   auto y = distribute_replicated<Layout<Shard<0>, Shard<1>>>(mesh, full);    // full on every rank
//   auto z = from_local<Layout<Shard<0>, Replicate>>(mesh, piece, global_shape);
//
// distribute sends each rank its piece from the source rank (one send per rank that holds
// data: under Partial<sum> only coordinate 0 does). distribute_replicated and from_local never
// communicate, unless from_local is asked to check the pieces of all ranks against each other
// (then it all-gathers their extents and every rank throws the same error).
#pragma once

#include <vector>

#include "dtensor/distributed/redistribute.hpp"

namespace dtensor {

namespace detail {
/// Whether the rank at `coord` holds values, not zeros, when a layout is made from a replica
/// (replica_keeps_values on every Partial mesh dimension, as redistribution does).
template <std::size_t N>
bool holds_values(const LayoutDesc<N>& l, const std::array<int, N>& coord) {
  for (std::size_t i = 0; i < N; ++i)
    if (l.placements[i].is_partial() && !replica_keeps_values(l.placements[i], coord[i])) return false;
  return true;
}
}  // namespace detail

/// Every rank already holds the same `full` tensor: each keeps its piece. No communication.
template <LayoutType L, Element T, std::size_t R, MeshType Mesh, class Space>
DTensor<T, R, Mesh, L, Space> distribute_replicated(const Mesh& mesh, const Tensor<T, R, Space>& full) {
  constexpr auto plan = layout_plan<replicated_layout<Mesh::ndim>, L>;
  static_assert(plan.collectives() == 0, "a replica becomes any layout without communication");
  return DTensor<T, R, Mesh, L, Space>(mesh, full.shape(), execute(plan, full, mesh, full.shape()));
}

/// `full` is read on mesh rank `src` only (other ranks may pass an empty tensor); each rank
/// receives its piece. Collective over the mesh.
template <LayoutType L, Element T, std::size_t R, MeshType Mesh, class Space>
DTensor<T, R, Mesh, L, Space> distribute(const Mesh& mesh, const Tensor<T, R, Space>& full, int src = 0) {
  auto& comm = mesh.comm();
  if (src < 0 || src >= comm.size())
    comm.fail("distribute", detail::cat("source rank ", src, " is not in a mesh of ", comm.size(), " ranks"));
  Shape<R> global = full.shape();
  comm.broadcast(std::span<Extent>(global), src);
  constexpr auto& l = L::desc;
  constexpr int tag = 0x7d15;  // distinct from user tags by convention
  if (comm.rank() == src) {
    Tensor<T, R, Space> mine;
    for (int r = 0; r < comm.size(); ++r) {
      const auto coord = detail::row_major_coordinate(mesh.shape(), r);
      const auto box = local_box(l, mesh.shape(), coord, global);
      if (!detail::holds_values(l, coord)) {
        if (r == src) mine = Tensor<T, R, Space>(box.extent);
        continue;
      }
      auto piece = Tensor<T, R, Space>::uninitialized(box.extent);
      copy_box(full, box.offset, piece, Shape<R>{}, box.extent);
      if (r == src) mine = std::move(piece);
      else comm.send(std::span<const T>(piece.span()), r, tag);
    }
    return DTensor<T, R, Mesh, L, Space>(mesh, global, std::move(mine));
  }
  const auto box = local_box(l, mesh.shape(), mesh.coordinate(), global);
  Tensor<T, R, Space> mine(box.extent);
  if (detail::holds_values(l, mesh.coordinate())) comm.recv(mine.span(), src, tag);
  return DTensor<T, R, Mesh, L, Space>(mesh, global, std::move(mine));
}

/// Wraps this rank's piece of a tensor of extents `global`. Throws if the piece's extents are
/// not the ones this rank holds. With check_all_ranks, the ranks also compare their global
/// extents and pieces (one all-gather) so that every rank throws, naming the ranks at fault.
template <LayoutType L, Element T, std::size_t R, MeshType Mesh, class Space>
DTensor<T, R, Mesh, L, Space> from_local(const Mesh& mesh, Tensor<T, R, Space> local, const Shape<R>& global,
                                         bool check_all_ranks = false) {
  (void)checked_numel(global, "from_local");  // a negative or overflowing global extent
  if (check_all_ranks) {
    auto& comm = mesh.comm();
    std::array<Extent, 2 * R> mine{};
    for (std::size_t d = 0; d < R; ++d) {
      mine[d] = global[d];
      mine[R + d] = local.extent(d);
    }
    std::vector<Extent> all(2 * R * std::size_t(comm.size()));
    comm.all_gather(std::span<const Extent>(mine), std::span<Extent>(all));
    std::string bad;
    for (int r = 0; r < comm.size(); ++r) {
      Shape<R> g{}, p{};
      for (std::size_t d = 0; d < R; ++d) {
        g[d] = all[std::size_t(r) * 2 * R + d];
        p[d] = all[std::size_t(r) * 2 * R + R + d];
      }
      const auto box = local_box(L::desc, mesh.shape(), detail::row_major_coordinate(mesh.shape(), r), g);
      if (g != global || box.extent != p)
        bad += detail::cat("\n  rank ", r, ": global ", to_string(g), ", piece ", to_string(p), " (expected ",
                           to_string(box.extent), ")");
    }
    if (!bad.empty())
      comm.fail("from_local", detail::cat("pieces inconsistent with layout ", to_string(L::desc), " and global ",
                                          to_string(global), " on this rank:", bad));
  }
  return DTensor<T, R, Mesh, L, Space>(mesh, global, std::move(local));
}

/// Wraps evenly sharded pieces: the global extents are the local ones times the number of
/// shards of each dimension (use the overload with `global` for uneven extents).
template <LayoutType L, Element T, std::size_t R, MeshType Mesh, class Space>
DTensor<T, R, Mesh, L, Space> from_local(const Mesh& mesh, Tensor<T, R, Space> local) {
  Shape<R> global = local.shape();
  for (std::size_t i = 0; i < Mesh::ndim; ++i)
    if (L::desc.placements[i].is_shard()) {
      Extent& e = global[std::size_t(L::desc.placements[i].dim)];
      e = checked_mul(e, Extent(mesh.size(i)), "from_local", "global extent");
    }
  return from_local<L>(mesh, std::move(local), global);
}

}  // namespace dtensor
