// dtensor/distributed/dtensor.hpp — one logical tensor stored as local pieces on a mesh.
//
//   DTensor<float, 2, DeviceMesh<"dp", "tp">, Layout<Shard<0>, Replicate>> x = ...;
//   x.shape()        // the global extents
//   x.to_local()     // this rank's piece
//   x.local_box()    // where that piece sits in the global tensor
//
// The layout is part of the type; the extents are run-time values. DTensors are made by
// distribute / from_local (distributed/distribute.hpp) and changed by redistribute
// (distributed/redistribute.hpp). Nothing in this header communicates.
#pragma once

#include <array>
#include <cstddef>
#include <utility>

#include "dtensor/core/checked.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/placement/layout.hpp"

namespace dtensor {

template <class M>
concept MeshType = requires(const M& m) {
  { M::ndim } -> std::convertible_to<std::size_t>;
  m.shape();
  m.coordinate();
  m.group(std::size_t{0});
};

namespace detail {
template <class M>
struct mesh_space {
  using type = host_space;
};
template <class M>
  requires requires { typename M::space; }
struct mesh_space<M> {
  using type = typename M::space;
};
}  // namespace detail

/// The memory space of the tensors on mesh type M (host for a mesh that names none).
template <class M>
using mesh_space_t = typename detail::mesh_space<M>::type;

namespace detail {
/// Throws: a DTensor's local piece does not have the extents its mesh coordinate holds under its
/// layout. On the ranks and the mesh's number of dimensions only, not on the layout or the mesh
/// type: one copy of the message's code per rank, not one per DTensor type.
template <std::size_t R, std::size_t N>
[[noreturn]] void throw_local_piece_mismatch(const Shape<R>& local, const Shape<R>& expected,
                                             const std::array<int, N>& coordinate, const Shape<R>& global,
                                             const LayoutDesc<N>& layout, int rank) {
  throw Error(
      "DTensor",
      cat("local piece ", to_string(local), " does not match the ", to_string(expected), " that mesh coordinate ",
          to_string(coordinate), " holds of global ", to_string(global), " under layout ", to_string(layout)),
      rank);
}

/// DTensor's constructor's check: `local` has the extents that this rank's mesh coordinate holds
/// of `global` under `layout`. On the rank and the mesh type only, and not inlined: one call where
/// a DTensor is made (every op's output), not a copy of the check per DTensor type and call site.
template <std::size_t R, class Mesh>
[[gnu::noinline]] void check_local_piece(const Mesh& mesh, const LayoutDesc<Mesh::ndim>& layout, const Shape<R>& global,
                                         const Shape<R>& local) {
  (void)checked_numel(global, "DTensor");  // negative or overflowing global extents
  const auto box = local_box(layout, mesh.shape(), mesh.coordinate(), global);
  if (box.extent != local)
    throw_local_piece_mismatch(local, box.extent, mesh.coordinate(), global, layout, mesh.rank());
}
}  // namespace detail

/// Local pieces live in Space, by default the mesh's (BasicDeviceMesh<Space, ...>).
template <Element T, std::size_t R, MeshType Mesh, LayoutType L, MemorySpace Space = mesh_space_t<Mesh>>
class DTensor {
  static_assert(L::mesh_ndim == Mesh::ndim, "the layout needs exactly one placement per mesh dimension");
  static_assert(L::desc.max_shard_dim() < int(R),
                "a Shard<d> placement names a tensor dimension d that this tensor does not have (d >= rank)");

 public:
  using value_type = T;
  using mesh_type = Mesh;
  using layout = L;
  using space = Space;
  using local_type = Tensor<T, R, Space>;
  static constexpr std::size_t rank = R;

  DTensor() = default;

  /// Wraps a local piece. Checks that its extents are the ones this rank holds under the layout
  /// (no communication; see from_local for the checked entry point users call).
  DTensor(Mesh mesh, const Shape<R>& global, local_type local)
      : mesh_(std::move(mesh)), global_(global), local_(std::move(local)) {
    detail::check_local_piece(mesh_, L::desc, global_, local_.shape());
  }

  const Mesh& mesh() const noexcept { return mesh_; }
  const Shape<R>& shape() const noexcept { return global_; }
  Extent extent(std::size_t d) const noexcept { return global_[d]; }
  Extent numel() const noexcept { return dtensor::numel(global_); }

  const local_type& to_local() const& noexcept { return local_; }
  local_type to_local() && noexcept { return std::move(local_); }
  /// The local piece, for in-place local updates that keep its extents (an optimizer step).
  local_type& local() noexcept { return local_; }

  /// Offset and extents of this rank's piece in the global tensor.
  Box<R> local_box() const { return dtensor::local_box(L::desc, mesh_.shape(), mesh_.coordinate(), global_); }

 private:
  Mesh mesh_;
  Shape<R> global_{};
  local_type local_;
};

template <class X>
inline constexpr bool is_dtensor_v = false;
template <Element T, std::size_t R, class M, class L, class S>
inline constexpr bool is_dtensor_v<DTensor<T, R, M, L, S>> = true;

/// The same DTensor type with another layout.
template <class X, class To>
struct with_layout;
template <Element T, std::size_t R, class M, class L, class S, class To>
struct with_layout<DTensor<T, R, M, L, S>, To> {
  using type = DTensor<T, R, M, To, S>;
};
template <class X, class To>
using with_layout_t = typename with_layout<X, To>::type;

namespace detail {
template <class P, std::size_t... I>
auto repeat_layout(std::index_sequence<I...>) -> Layout<std::enable_if_t<(I >= 0), P>...>;
}  // namespace detail

/// Layout<P, P, ..., P> with one P per mesh dimension.
template <class P, std::size_t N>
using uniform_layout = decltype(detail::repeat_layout<P>(std::make_index_sequence<N>{}));
template <std::size_t N>
using replicated_layout = uniform_layout<Replicate, N>;

}  // namespace dtensor
