// dtensor/mesh/device_mesh.hpp — the ranks of a job as an n-dimensional grid with named dimensions.
//
//   DeviceMesh<"dp", "tp"> mesh(world, {2, 4});   // 8 ranks; rank r at the row-major coordinate of r
//   mesh.coordinate()        // this rank's {dp, tp}
//   mesh.group<"tp">()       // the communicator of this rank's "tp" group (ranks differing only in tp)
//   mesh.group(0, 1)         // the flattened group of adjacent dimensions 0..1 ("dp*tp")
//   mesh.sub<"tp">()         // the one-dimensional mesh of this rank's "tp" group
//   mesh.slice<"pp">(1)      // the ranks of another pipeline stage (for cross-mesh transfers)
//
//   MetaMesh<"dp", "tp"> dry(sim, {2, 4});          // the same mesh whose tensors live in meta_space
//   CudaMesh<"dp", "tp"> gpu(nccl, {2, 4});         // ... in cuda_space (mesh/cuda_mesh.cuh)
//
// A mesh names the memory space its tensors live in, as PyTorch's init_device_mesh("cuda", ...)
// names a device type: BasicDeviceMesh<Space, Names...> is the mesh, DeviceMesh<Names...> the
// host one. DTensor's space defaults to its mesh's, so a model written once against `Mesh` runs
// on host, cuda or meta memory by the mesh it is given; the communicator must be able to move
// that space's memory (threads/MPI: host; cuda_threads/NCCL: cuda; sim: meta).
//
// Names are types, sizes are run-time values. Constructing a mesh is collective over the
// communicator: it splits one communicator per mesh dimension and per run of adjacent
// dimensions, labelled with their names, so that every later collective knows its group
// without communicating. Copies of a mesh share those communicators. Each group's size and
// this rank's place in it follow from the shape, so on the sim backend (comm/sim.hpp) the
// splits need no peers.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/checked.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/memory.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/core/shape.hpp"
#include "dtensor/mesh/fixed_string.hpp"

namespace dtensor {

/// The ranks (in the root communicator) of a mesh of shape `shape`, in row-major order: what a
/// rank needs to know of a mesh it does not belong to, to send to it.
template <std::size_t N>
struct MeshRanks {
  std::array<int, N> shape{};
  std::vector<int> root_ranks;
  int root_rank_at(const std::array<int, N>& coord) const {
    int r = 0;
    for (std::size_t i = 0; i < N; ++i) r = r * shape[i] + coord[i];
    return root_ranks[std::size_t(r)];
  }
};

namespace detail {
template <std::size_t N>
constexpr int row_major_index(const std::array<int, N>& shape, const std::array<int, N>& coord) {
  int r = 0;
  for (std::size_t i = 0; i < N; ++i) r = r * shape[i] + coord[i];
  return r;
}
template <std::size_t N>
constexpr std::array<int, N> row_major_coordinate(const std::array<int, N>& shape, int r) {
  std::array<int, N> c{};
  for (std::size_t i = N; i-- > 0;) {
    c[i] = r % shape[i];
    r /= shape[i];
  }
  return c;
}
/// Instantiated only when a mesh is asked for a dimension it does not have (`mesh.size<"pp">()`
/// on a ("dp", "tp") mesh): the compiler prints the name asked for and then the mesh's names, as
/// PyTorch's error lists the valid ones; a type rather than a message string, because clang cuts
/// a static_assert message built at compile time and g++ < 14 cannot print one.
template <fixed_string Name, fixed_string... ValidNames>
struct mesh_has_no_dimension_named {
  static_assert(Name.view().empty(),
                "this DeviceMesh has no dimension of that name: mesh_has_no_dimension_named<name, valid names...> "
                "above names it, then the mesh's dimensions");
  static constexpr bool value = false;
};
/// Consecutive increasing indices (a run of adjacent mesh dimensions).
template <std::size_t K>
constexpr bool is_run(const std::array<std::size_t, K>& idx) {
  for (std::size_t k = 1; k < K; ++k)
    if (idx[k] != idx[k - 1] + 1) return false;
  return true;
}
}  // namespace detail

template <MemorySpace Space, fixed_string... Names>
class BasicDeviceMesh {
 public:
  /// The memory space of the tensors on this mesh (DTensor's default).
  using space = Space;
  static constexpr std::size_t ndim = sizeof...(Names);
  static_assert(ndim >= 1, "a DeviceMesh needs at least one named dimension");
  static constexpr std::array<std::string_view, ndim> names{Names.view()...};
  static_assert(
      [] {
        for (std::size_t i = 0; i < ndim; ++i)
          for (std::size_t j = i + 1; j < ndim; ++j)
            if (names[i] == names[j]) return false;
        return true;
      }(),
      "DeviceMesh dimension names must be distinct");

  /// The index of the dimension called `Name`; a name the mesh does not have does not compile.
  template <fixed_string Name>
  static constexpr std::size_t index_of() {
    constexpr std::size_t i = [] {
      for (std::size_t k = 0; k < ndim; ++k)
        if (names[k] == Name.view()) return k;
      return ndim;
    }();
    if constexpr (i == ndim) static_assert(detail::mesh_has_no_dimension_named<Name, Names...>::value);
    return i;
  }

  BasicDeviceMesh() = default;

  /// Collective over `comm`. Its size must be the product of `shape`.
  BasicDeviceMesh(CommPtr comm, const std::array<int, ndim>& shape) {
    if (!comm) throw Error("DeviceMesh", "null communicator");
    for (int s : shape)
      if (s < 1) throw Error("DeviceMesh", "mesh shape " + to_string(shape) + " has a dimension < 1", comm->rank());
    const int n = checked_product<int>(shape, "DeviceMesh", "number of ranks");
    if (n != comm->size())
      throw Error("DeviceMesh",
                  detail::cat("mesh shape ", to_string(shape), " has ", n, " ranks but the communicator has ",
                              comm->size()),
                  comm->rank());
    auto st = std::make_shared<State>();
    st->root = comm;
    st->shape = shape;
    st->coord = detail::row_major_coordinate(shape, comm->rank());
    st->root_ranks.resize(std::size_t(n));
    for (int r = 0; r < n; ++r) st->root_ranks[std::size_t(r)] = r;
    // Every run of adjacent dimensions lo..hi gets its communicator: color = the coordinate
    // outside the run, key = the row-major index inside it.
    for (std::size_t lo = 0; lo < ndim; ++lo)
      for (std::size_t hi = lo; hi < ndim; ++hi) {
        int color = 0, key = 0, group_size = 1;
        for (std::size_t i = 0; i < ndim; ++i) {
          if (i >= lo && i <= hi) key = key * shape[i] + st->coord[i], group_size *= shape[i];
          else color = color * shape[i] + st->coord[i];
        }
        // The group is known from the shape: the sim backend makes it without a rendezvous.
        auto g = comm->split(color, key, group_size);
        std::string label;
        for (std::size_t i = lo; i <= hi; ++i) {
          if (i > lo) label += '*';
          label += names[i];  // appended in place: GCC 12 warns (-Wrestrict) on "*" + string
        }
        g->set_label(label);
        st->groups[lo][hi] = std::move(g);
      }
    state_ = std::move(st);
  }

  /// A mesh over some ranks of a larger communicator `root`, which cross-mesh transfers address
  /// (distributed/cross_mesh.hpp): `comm` holds exactly those ranks, its rank i being `root`'s
  /// rank root_ranks[i]. Collective over `comm` only; mesh_on_ranks makes both from `root`.
  BasicDeviceMesh(CommPtr comm, const std::array<int, ndim>& shape, CommPtr root, std::vector<int> root_ranks)
      : BasicDeviceMesh(comm, shape) {
    if (!root) throw Error("DeviceMesh", "null root communicator", comm->rank());
    if (root_ranks.size() != std::size_t(comm->size()))
      throw Error("DeviceMesh", detail::cat("mesh of ", comm->size(), " ranks given ", root_ranks.size(), " root ranks"),
                  comm->rank());
    for (std::size_t i = 0; i < root_ranks.size(); ++i) {
      if (root_ranks[i] < 0 || root_ranks[i] >= root->size())
        throw Error("DeviceMesh", detail::cat("root rank ", root_ranks[i], " is not a rank of the root communicator of ",
                                              root->size()), comm->rank());
      for (std::size_t j = 0; j < i; ++j)
        if (root_ranks[j] == root_ranks[i])
          throw Error("DeviceMesh", detail::cat("root rank ", root_ranks[i], " listed twice"), comm->rank());
    }
    if (root_ranks[std::size_t(comm->rank())] != root->rank())
      throw Error("DeviceMesh", detail::cat("mesh rank ", comm->rank(), " is root rank ", root->rank(), ", not ",
                                            root_ranks[std::size_t(comm->rank())], " as listed"), comm->rank());
    state_->root = std::move(root);
    state_->root_ranks = std::move(root_ranks);
  }

  bool valid() const noexcept { return bool(state_); }
  const std::array<int, ndim>& shape() const { return state().shape; }
  int size(std::size_t dim) const { return state().shape[dim]; }
  template <fixed_string Name>
  int size() const { return size(index_of<Name>()); }
  int size() const { return state().groups[0][ndim - 1]->size(); }
  const std::array<int, ndim>& coordinate() const { return state().coord; }
  int coordinate(std::size_t dim) const { return state().coord[dim]; }
  template <fixed_string Name>
  int coordinate() const { return coordinate(index_of<Name>()); }
  /// This rank in the mesh (row-major index of its coordinate).
  int rank() const { return detail::row_major_index(shape(), coordinate()); }

  /// The communicator of this rank's group along mesh dimension `dim`.
  Communicator& group(std::size_t dim) const { return group(dim, dim); }
  /// The communicator of the flattened adjacent dimensions first..last.
  Communicator& group(std::size_t first, std::size_t last) const {
    if (first > last || last >= ndim)
      throw Error("DeviceMesh::group", detail::cat("dimensions ", first, "..", last, " of a ", ndim, "-d mesh"));
    return *state().groups[first][last];
  }
  template <fixed_string Name>
  Communicator& group() const { return group(index_of<Name>()); }
  /// All ranks of the mesh.
  Communicator& comm() const { return group(0, ndim - 1); }

  /// The communicator the mesh was built on, which cross-mesh transfers use.
  Communicator& root() const { return *state().root; }
  /// The same, shared: what mesh_on_ranks takes to make another mesh on it.
  const CommPtr& root_ptr() const { return state().root; }
  MeshRanks<ndim> ranks() const { return {shape(), state().root_ranks}; }

  /// The mesh of this rank's group over the adjacent dimensions `Sub...` (in mesh order).
  template <fixed_string... Sub>
  BasicDeviceMesh<Space, Sub...> sub() const {
    constexpr std::array<std::size_t, sizeof...(Sub)> idx{index_of<Sub>()...};
    static_assert(detail::is_run(idx), "sub<...>() takes adjacent mesh dimensions in mesh order");
    constexpr std::size_t lo = idx[0];
    BasicDeviceMesh<Space, Sub...> m;
    auto st = std::make_shared<typename BasicDeviceMesh<Space, Sub...>::State>();
    st->root = state().root;
    for (std::size_t k = 0; k < idx.size(); ++k) {
      st->shape[k] = shape()[lo + k];
      st->coord[k] = coordinate()[lo + k];
      for (std::size_t l = k; l < idx.size(); ++l) st->groups[k][l] = state().groups[lo + k][lo + l];
    }
    st->root_ranks = slice_ranks<lo, sizeof...(Sub)>(coordinate()).root_ranks;
    m.state_ = std::move(st);
    return m;
  }

  /// The ranks of the sub-mesh over every dimension but `Name`, at coordinate `index` of
  /// `Name` (e.g. another pipeline stage), for cross-mesh transfers.
  template <fixed_string Name>
  auto slice(int index) const {
    constexpr std::size_t d = index_of<Name>();
    static_assert(ndim >= 2, "slice<Name>() needs a mesh of two or more dimensions");
    static_assert(d == 0 || d == ndim - 1, "slice<Name>() takes the first or the last mesh dimension");
    if (index < 0 || index >= size(d))
      throw Error("DeviceMesh::slice", detail::cat("index ", index, " of dimension ", names[d], " of size ", size(d)));
    auto c = coordinate();
    c[d] = index;
    constexpr std::size_t lo = d == 0 ? 1 : 0;
    return slice_ranks<lo, ndim - 1>(c);
  }

 private:
  template <MemorySpace, fixed_string...>
  friend class BasicDeviceMesh;

  struct State {
    CommPtr root;
    std::array<int, ndim> shape{};
    std::array<int, ndim> coord{};
    std::vector<int> root_ranks;
    std::array<std::array<CommPtr, ndim>, ndim> groups{};
  };

  // Root ranks of the block of dimensions lo..lo+n-1 through coordinate `at`, row-major.
  template <std::size_t lo, std::size_t n>
  MeshRanks<n> slice_ranks(std::array<int, ndim> at) const {
    MeshRanks<n> r;
    int count = 1;
    for (std::size_t k = 0; k < n; ++k) count *= (r.shape[k] = shape()[lo + k]);
    for (int j = 0; j < count; ++j) {
      auto sc = detail::row_major_coordinate(r.shape, j);
      for (std::size_t k = 0; k < n; ++k) at[lo + k] = sc[k];
      r.root_ranks.push_back(state().root_ranks[std::size_t(detail::row_major_index(shape(), at))]);
    }
    return r;
  }
  const State& state() const {
    if (!state_) throw Error("DeviceMesh", "use of an empty (default-constructed) mesh");
    return *state_;
  }
  std::shared_ptr<State> state_;
};

/// The mesh of shape `shape` over the ranks `ranks` of `root` (listed in row-major mesh order), on
/// those ranks; nothing on the others. Collective over `root` (one split): how a serving or
/// evaluation mesh over some of a job's ranks is made, so that it shares `root` with the training
/// mesh and redistribute_to can move tensors between them.
template <class Mesh>
std::optional<Mesh> mesh_on_ranks(const CommPtr& root, const std::array<int, Mesh::ndim>& shape,
                                  const std::vector<int>& ranks) {
  if (!root) throw Error("mesh_on_ranks", "null root communicator");
  int key = -1;
  for (std::size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == root->rank()) key = int(i);
  // Ranks outside the mesh form a group of their own, which they drop.
  auto comm = root->split(key >= 0 ? 0 : 1, key >= 0 ? key : root->rank());
  if (key < 0) return std::nullopt;
  return Mesh(comm, shape, root, ranks);
}

/// The host mesh: tensors in host memory (the threads and MPI backends).
template <fixed_string... Names>
using DeviceMesh = BasicDeviceMesh<host_space, Names...>;

/// The meta mesh: tensors with extents and no data, on the sim communicator (dry runs).
template <fixed_string... Names>
using MetaMesh = BasicDeviceMesh<meta_space, Names...>;

}  // namespace dtensor
