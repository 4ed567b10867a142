// dtensor/parallel/fsdp/group.hpp — the group FSDP shards over and the state of all of a
// model's units on it (FSDP2's FSDPParamGroup, for every unit of one mesh at once).
//
// FsdpShardDims: the mesh dimensions a unit's flat buffer is sharded over, its ranks and this
// rank's range of a buffer — the one function every shard range comes from. FsdpGroup: what
// fully_shard holds for a model on one mesh — the options, one UnitShard per unit
// (parallel/fsdp/unit_state.hpp), the list of every unit's segments the optimizer steps over,
// the no_sync / unshard flags, the event log and the parameter-offload files — built and checked
// here (a bad model, option or offload directory: dtensor::Error before any collective). The
// collectives (parallel/fsdp/collectives.hpp) and the hooks (parallel/fsdp/hooks.hpp) act on
// it; parallel::FullyShard (parallel/fsdp/module.hpp) is its public face.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/mesh/roles.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/units.hpp"
#include "dtensor/optim/detail/offload_file.hpp"
#include "dtensor/parallel/fsdp/options.hpp"
#include "dtensor/parallel/fsdp/unit_state.hpp"
#include "dtensor/placement/chunk.hpp"

namespace dtensor::parallel {

/// The mesh dimensions FSDP shards a unit's flat buffer over: [first, last], adjacent, one
/// flattened group (DeviceMesh::group(first, last), label "fsdp*cp"). `first` is the data-shard
/// dimension (OverData: the one data dimension, an expert group's "edp"); `last` is the context
/// dimension when the mesh has one right after it, else `first` — torchtitan's dp_shard_cp:
/// under context parallelism every parameter is replicated on "cp" and its gradient arrives
/// Partial<sum> there as on "fsdp", so the context ranks shard the states too and one
/// reduce-scatter over the flattened group resolves both. The one function every shard range
/// comes from (FullyShard, checkpoint::fsdp_parameter_slots, the offloaded parameter files):
/// the flattened index f * C + c (the group's rank order: row-major over first..last), split
/// by chunk_range over F * C — not fsdp first and then cp, which differs for uneven sizes.
template <class Mesh, bool OverData = false>
struct FsdpShardDims {
  static constexpr std::size_t first = OverData ? role_dim<Mesh, Role::data> : role_dim<Mesh, Role::data_shard>;
  static constexpr std::size_t context = role_dim<Mesh, Role::context>;
  static constexpr std::size_t last = !OverData && context < Mesh::ndim && context == first + 1 ? context : first;
  /// Whether dimension d is one the flat buffer is sharded over.
  static constexpr bool covers(std::size_t d) { return d >= first && d <= last; }

  /// S: the ranks of the shard group.
  static int size(const Mesh& mesh) {
    int s = 1;
    for (std::size_t d = first; d <= last; ++d) s *= mesh.size(d);
    return s;
  }
  /// This rank's index in the shard group (row-major over first..last, as the group's ranks).
  static int coordinate(const Mesh& mesh) {
    int c = 0;
    for (std::size_t d = first; d <= last; ++d) c = c * mesh.size(d) + mesh.coordinate()[d];
    return c;
  }
  /// This rank's [lo, hi) of a flat buffer of n elements.
  static Range range(Extent n, const Mesh& mesh) { return chunk_range(n, size(mesh), coordinate(mesh)); }
  /// The flattened group the all-gathers and reduce-scatters run on: over a context dimension of
  /// one rank the data-shard dimension's own (the same ranks; the collectives keep its label).
  static auto& group(const Mesh& mesh) { return mesh.group(first, mesh.size(last) == 1 ? first : last); }
  /// `layout` with Shard<0> (of the flat buffer) on every dimension of the shard group.
  template <std::size_t N>
  static LayoutDesc<N> sharded(LayoutDesc<N> layout) {
    for (std::size_t d = first; d <= last; ++d) layout.placements[d] = PlacementDesc::shard(0);
    return layout;
  }
};

namespace detail {
template <class Unit>
class GroupUnits;  // parallel/fsdp/parameter_groups.hpp: one parameter group's units
template <class Model>
inline constexpr bool is_group_units = false;
template <class Unit>
inline constexpr bool is_group_units<GroupUnits<Unit>> = true;

/// The memory space of a model's parameters (its units' flat groups).
template <class Model>
using model_space_t = typename std::remove_cvref_t<decltype(*std::declval<Model&>().units().front().group)>::space;

/// Every unit of `Model` on `Mesh`, sharded over FsdpShardDims<Mesh, OverData>; M: the master
/// values' and gradient shards' element type, in StateSpace (see parallel::FullyShard).
template <class Model, MeshType Mesh, class M, MemorySpace StateSpace, bool OverData>
struct FsdpGroup {
  static_assert(nn::require_units<Model>());
  using Unit = std::remove_cvref_t<decltype(std::declval<Model&>().units().front())>;
  using Flat = typename decltype(Unit::group)::element_type;
  using T = typename Flat::element_type;
  using Space = typename Flat::space;
  using Master = M;
  using State = StateSpace;
  using MeshT = Mesh;
  static constexpr std::size_t N = Mesh::ndim;
  using Shard = UnitShard<T, M, N, Space, StateSpace>;

  static_assert(
      OverData || count_role<Mesh, Role::data_shard>() == 1,
      "fully_shard needs exactly one mesh dimension with Role::data_shard (\"fsdp\", \"dp_shard\", \"zero\")");
  static_assert(OverData || count_role<Mesh, Role::data>() <= 1,
                "fully_shard: at most one replicate (Role::data) dimension, for HSDP");
  static_assert(!OverData || count_role<Mesh, Role::data>() == 1,
                "fully_shard: a parameter group's mesh without a data-shard dimension needs exactly one data "
                "dimension (Role::data, e.g. the experts' \"edp\") to shard over");
  /// The mesh dimensions the units are sharded over: shard_dim (data-shard) .. shard_last (the
  /// context dimension when it follows: one flattened group, "fsdp*cp").
  using ShardDims = FsdpShardDims<Mesh, OverData>;
  static constexpr std::size_t shard_dim = ShardDims::first;
  static constexpr std::size_t shard_last = ShardDims::last;
  static constexpr std::size_t replicate_dim = OverData ? N : role_dim<Mesh, Role::data>;  // N when there is none
  static_assert(replicate_dim >= N || !ShardDims::covers(replicate_dim));

  /// Checks the options and the model's units, then shards every unit (stages 1/2: the shard
  /// makes room for the in-place all-gather and, where it can, keeps its states in the full
  /// buffers; unit_state.hpp) and, with FsdpOptions::offload_params_dir, moves the separate
  /// master shards into files — agreed by every rank of the mesh (one all-reduce of an int).
  FsdpGroup(Model& m, Mesh mesh_in, FsdpOptions o) : model(m), mesh(std::move(mesh_in)), options(o) {
    check_fsdp_options<Space, StateSpace>(o, mesh.rank());
    reshard_after_forward = fsdp_reshards_after_forward(o);
    check_units();
    check_fsdp_offload_dir<StateSpace>(o, mesh.rank());
    std::string error;  // parameter offload: this rank's failure to make its files
    const int size = ShardDims::size(mesh), coord = ShardDims::coordinate(mesh);
    for (auto& u : model.units()) {
      // Stages 1/2: the shard makes room for the in-place all-gather (values kept) and, where it
      // can, keeps its master values and gradient shard in the full buffers (unit_state.hpp).
      units.push_back(std::make_unique<Shard>(u.group->name(), u.group, size, coord, shard_dim, shard_last,
                                              options.stage, options.accumulate_grads_in_master));
      auto& s = *units.back();
      if (!options.offload_params_dir.empty()) error = offload_master(s, error);  // before the views are handed out
      s.group->set_sharded();  // an optimizer over the model's own ParamRefs now fails (optim/optimizer.hpp)
      if (options.stage == 3) s.group->release_values();
      if (options.stage >= 2 || s.main_grad.numel() > 0) s.group->release_grads();
      for (auto& p : s.segments) params.push_back(p);
    }
    if (!options.offload_params_dir.empty()) {
      std::vector<optim::detail::OffloadFile*> files;
      for (auto& f : offloaded) files.push_back(f.file.get());
      std::size_t bytes = 0, planned = 0;  // made; meant (every separate master shard)
      for (auto& f : offloaded) bytes += f.file ? f.file->bytes() : 0;
      for (auto& u : units) planned += u->master_in_values ? 0 : u->shard_size() * sizeof(M);
      // A failure anywhere: every rank throws, its files removed (the mappings go with this object).
      optim::detail::agree_on_offload(&mesh.comm(), error, files, "fully_shard", options.offload_params_dir,
                                      dtensor::detail::cat(planned, " bytes of master values on this rank"));
      disk_bytes = bytes;
      dtensor::detail::ledger_record<disk_ledger>(MemoryTag::optimizer_state, std::int64_t(disk_bytes));
      for (auto& f : offloaded) f.map.release(0, f.map.bytes());  // written: the file holds them now
    }
  }
  FsdpGroup(const FsdpGroup&) = delete;  // the shards' views and the model's hooks point into it
  FsdpGroup& operator=(const FsdpGroup&) = delete;
  ~FsdpGroup() {
    if (disk_bytes > 0)
      dtensor::detail::ledger_record<disk_ledger>(MemoryTag::optimizer_state, -std::int64_t(disk_bytes));
  }

  std::size_t index_of(const Shard& s) const {
    for (std::size_t i = 0; i < units.size(); ++i)
      if (units[i].get() == &s) return i;
    return units.size();
  }
  /// The units whose full values are resident or being gathered now.
  std::size_t unsharded_now() const {
    std::size_t n = 0;
    for (const auto& u : units) n += u->group->values_resident() || u->gathering;
    return n;
  }
  /// Gradients are reduced in M unless the option asks for T (the same when T == M).
  bool reduce_in_m() const { return std::is_same_v<T, M> || !options.reduce_in_compute_dtype; }
  /// HSDP: each unit's reduced part is all-reduced over replicas on the replicate dimension.
  bool has_replicas() const {
    if constexpr (replicate_dim < N) return options.reduce_replicas && mesh.size(replicate_dim) > 1;
    else return false;
  }

  Model& model;
  Mesh mesh;
  FsdpOptions options;
  bool reshard_after_forward = true;
  bool sync = true;   // set_requires_gradient_sync: off, the backward's gradients accumulate unreduced
  bool held = false;  // unshard() called: the hooks leave the full values in place
  std::vector<std::unique_ptr<Shard>> units;
  nn::ParamList<M, N, StateSpace> params;
  std::vector<FsdpEvent> events;
  std::size_t peak_unsharded = 0;
  // Parameter offload: per unit, its master's file and mapping (none where the master is the
  // model's own values); their bytes on the ledger's disk.
  struct OffloadedMaster {
    std::unique_ptr<optim::detail::OffloadFile> file;
    optim::detail::FileMapping map;  // declared after the file: unmapped before it is removed
  };
  std::vector<OffloadedMaster> offloaded;
  std::size_t disk_bytes = 0;

 private:
  /// Parameter offload of unit s (the last built): its master values copied into a file of
  /// their own and the unit's views pointed there. `error`: an earlier unit's failure (then
  /// nothing more is made); returns this rank's error so far.
  std::string offload_master(Shard& s, std::string error) {
    offloaded.emplace_back();
    if (!error.empty() || s.master_in_values || s.shard_size() == 0) return error;
    auto& f = offloaded.back();
    f.file = std::make_unique<optim::detail::OffloadFile>(options.offload_params_dir, s.shard_size() * sizeof(M),
                                                          mesh.rank(), "fsdp-params");
    if (!f.file->error().empty()) {
      error = f.file->error();
      f.file.reset();
      return error;
    }
    f.map = optim::detail::FileMapping(*f.file);
    M* at = static_cast<M*>(f.map.data());
    std::copy_n(s.master.data(), s.shard_size(), at);
    s.master = Tensor<M, 1, StateSpace>::view(at, Shape<1>{Extent(s.shard_size())});  // the buffer in memory goes
    s.master_on_disk = true;
    for (auto& p : s.segments) p.value = std::span<M>(at + p.offset, p.value.size());
    return error;
  }

  /// The model's units: each owns parameters, no two share a group or a parameter.
  void check_units() {
    auto& model_units = model.units();
    std::unordered_map<std::string, std::string> owner;  // parameter -> unit
    for (std::size_t i = 0; i < model_units.size(); ++i) {
      const auto& g = model_units[i].group;
      // No entries, not size 0: a rank of an expert group may hold no expert (E < ep) and so
      // no elements, while its unit still has the parameters (empty pieces) its peers shard.
      if (!g || g->entries().empty())
        throw Error("fully_shard",
                    dtensor::detail::cat("unit ", i, g ? " (" + g->name() + ")" : std::string(),
                                         " has no parameters: a unit must own some"),
                    mesh.rank());
      for (std::size_t j = 0; j < i; ++j)
        if (model_units[j].group == g)
          throw Error("fully_shard", dtensor::detail::cat("units ", j, " and ", i, " share the group ", g->name()),
                      mesh.rank());
      for (const auto& e : g->entries()) {
        auto [it, fresh] = owner.emplace(e.name, g->name());
        if (!fresh)
          throw Error("fully_shard",
                      dtensor::detail::cat("parameter ", e.name, " is in unit ", it->second, " and in unit ", g->name(),
                                           ": a module shared by two units cannot be sharded twice"),
                      mesh.rank());
      }
    }
    // A parameter group beyond the model's mesh (a MoE's experts) may have no unit on a pipeline
    // stage whose blocks are all dense (--dense-first, --moe-every): it shards nothing there.
    if (model_units.empty() && !is_group_units<Model>)
      throw Error("fully_shard", "the model has no units", mesh.rank());
  }
};

}  // namespace detail
}  // namespace dtensor::parallel
