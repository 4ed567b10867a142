// dtensor/distributed/transfer.hpp — moving a DTensor to another mesh of the same shape.
//
//   // stage s (this rank is on it) sends to stage s + 1; stage s + 1 receives:
//   Work w = send_to(x, mesh.slice<"pp">(s + 1));
//   auto y = recv_from<Layout<Shard<0>, Replicate>>(stage_mesh, mesh.slice<"pp">(s), global);
//
// Every rank sends its piece to the rank at the same coordinate of the other mesh, with one
// point-to-point message over the root communicator: the only path by which data crosses
// pipeline stages. The adjoint of a send is the matching recv of the gradient.
#pragma once

#include "dtensor/comm/work.hpp"
#include "dtensor/distributed/dtensor.hpp"

namespace dtensor {

/// Sends this rank's piece of x to the rank at the same coordinate of `dst`. The returned Work
/// must be waited on before x is changed or destroyed.
template <Element T, std::size_t R, class Mesh, class L, class Space>
[[nodiscard]] Work send_to(const DTensor<T, R, Mesh, L, Space>& x, const MeshRanks<Mesh::ndim>& dst, int tag = 0) {
  if (dst.shape != x.mesh().shape())
    x.mesh().root().fail("send_to", "meshes of different shapes: " + to_string(x.mesh().shape()) + " -> " + to_string(dst.shape));
  return x.mesh().root().send_async(x.to_local().span(), dst.root_rank_at(x.mesh().coordinate()), tag);
}

/// A receive posted by recv_from_async: the tensor it fills, and the Work to wait on.
template <class DT>
struct PendingRecv {
  DT value;
  Work work;

  /// Waits for the data and hands the tensor over.
  DT take() {
    work.wait();
    return std::move(value);
  }
};

/// Posts the receive of this rank's piece of a tensor of extents `global` in layout L from the
/// rank at the same coordinate of `src`, and returns at once (a pipeline posts its receives
/// early and waits just before the computation that uses them).
template <LayoutType L, Element T, std::size_t R, MeshType Mesh, MemorySpace Space = mesh_space_t<Mesh>>
[[nodiscard]] PendingRecv<DTensor<T, R, Mesh, L, Space>> recv_from_async(const Mesh& mesh, const MeshRanks<Mesh::ndim>& src,
                                                                         const Shape<R>& global, int tag = 0) {
  if (src.shape != mesh.shape())
    mesh.root().fail("recv_from", "meshes of different shapes: " + to_string(src.shape) + " -> " + to_string(mesh.shape()));
  auto local = Tensor<T, R, Space>::uninitialized(local_box(L::desc, mesh.shape(), mesh.coordinate(), global).extent);
  // The tensor's storage stays where it is when the DTensor is moved, so the posted receive may
  // keep writing into it.
  DTensor<T, R, Mesh, L, Space> value(mesh, global, std::move(local));
  Work work = mesh.root().recv_async(value.local().span(), src.root_rank_at(mesh.coordinate()), tag);
  return {std::move(value), std::move(work)};
}

/// Receives this rank's piece of a tensor of extents `global` in layout L from the rank at the
/// same coordinate of `src`.
template <LayoutType L, Element T, std::size_t R, MeshType Mesh, MemorySpace Space = mesh_space_t<Mesh>>
DTensor<T, R, Mesh, L, Space> recv_from(const Mesh& mesh, const MeshRanks<Mesh::ndim>& src, const Shape<R>& global,
                                        int tag = 0) {
  return recv_from_async<L, T, R, Mesh, Space>(mesh, src, global, tag).take();
}

}  // namespace dtensor
