// dtensor/mesh/roles.hpp — what each mesh dimension is for: data, tensor, context, pipeline, expert.
//
//   using Mesh = DeviceMesh<"dp", "tp">;                 // roles by the conventional names
//   static_assert(role_of<Mesh>(1) == Role::tensor);
//   role_dim<Mesh, Role::tensor>                          // 1: the index of the tensor dimension
//
//   // other names: specialise mesh_roles once, next to the mesh type
//   template <> struct dtensor::mesh_roles<DeviceMesh<"data", "model">>
//       : dtensor::roles<Role::data, Role::tensor> {};
//
// Modules and parallel styles read roles, never names: activations are split on the batch over
// the data dimensions, on the sequence over the context dimension, on features (or, under
// sequence parallelism, the sequence) over the tensor dimension. A module given a mesh with a
// dimension whose role it does not handle does not compile (nn/module.hpp require_roles), so a
// "pp" dimension is never silently treated as data parallel.
//
// Default roles by name: "dp", "dp_replicate", "ddp", "edp" → data (replicated parameters; "edp"
// is the data dimension of an expert mesh, parallel/expert_parallel.hpp); "fsdp",
// "dp_shard", "zero" → data_shard (sharded parameters); "tp" → tensor; "cp" → context; "pp" →
// pipeline; "ep" → expert. Any other name has no role (unassigned) until mesh_roles says.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace dtensor {

enum class Role {
  unassigned,  // a name without a conventional role and no mesh_roles specialisation
  data,        // data parallel, parameters replicated (DDP; HSDP's replicate dimension)
  data_shard,  // data parallel, parameters sharded (FSDP / ZeRO)
  tensor,      // tensor (and sequence) parallel
  context,     // context parallel: the sequence split for the whole model
  pipeline,    // pipeline stages
  expert,      // expert parallel
};

constexpr std::string_view name_of(Role r) {
  switch (r) {
    case Role::data: return "data";
    case Role::data_shard: return "data_shard";
    case Role::tensor: return "tensor";
    case Role::context: return "context";
    case Role::pipeline: return "pipeline";
    case Role::expert: return "expert";
    case Role::unassigned: break;
  }
  return "unassigned";
}

/// The conventional role of a dimension name.
constexpr Role default_role(std::string_view name) {
  if (name == "dp" || name == "dp_replicate" || name == "ddp" || name == "edp") return Role::data;
  if (name == "fsdp" || name == "dp_shard" || name == "zero") return Role::data_shard;
  if (name == "tp") return Role::tensor;
  if (name == "cp") return Role::context;
  if (name == "pp") return Role::pipeline;
  if (name == "ep") return Role::expert;
  return Role::unassigned;
}

/// A role per dimension, for specialising mesh_roles.
template <Role... Rs>
struct roles {
  static constexpr std::array<Role, sizeof...(Rs)> value{Rs...};
};

/// The roles of a mesh type's dimensions: by name unless specialised.
template <class Mesh>
struct mesh_roles {
  static constexpr std::array<Role, Mesh::ndim> value = [] {
    std::array<Role, Mesh::ndim> r{};
    for (std::size_t i = 0; i < Mesh::ndim; ++i) r[i] = default_role(Mesh::names[i]);
    return r;
  }();
};

template <class Mesh>
constexpr Role role_of(std::size_t dim) {
  static_assert(mesh_roles<Mesh>::value.size() == Mesh::ndim, "mesh_roles<Mesh> must give one role per dimension");
  return mesh_roles<Mesh>::value[dim];
}

/// Whether dimension `dim` is a data dimension (replicated or sharded parameters).
template <class Mesh>
constexpr bool is_data_dim(std::size_t dim) {
  return role_of<Mesh>(dim) == Role::data || role_of<Mesh>(dim) == Role::data_shard;
}

/// How many dimensions have role R.
template <class Mesh, Role R>
constexpr std::size_t count_role() {
  std::size_t n = 0;
  for (std::size_t i = 0; i < Mesh::ndim; ++i) n += role_of<Mesh>(i) == R;
  return n;
}

namespace detail {
template <class Mesh, Role R>
constexpr std::size_t find_role() {
  for (std::size_t i = 0; i < Mesh::ndim; ++i)
    if (role_of<Mesh>(i) == R) return i;
  return Mesh::ndim;
}
}  // namespace detail

/// The index of the one dimension with role R, or Mesh::ndim when there is none. Two
/// dimensions with one role (other than data) do not compile.
template <class Mesh, Role R>
inline constexpr std::size_t role_dim = [] {
  static_assert(R == Role::data || R == Role::data_shard || count_role<Mesh, R>() <= 1,
                "a mesh may have at most one dimension of each role other than data");
  return detail::find_role<Mesh, R>();
}();

/// Whether the mesh has a dimension with role R.
template <class Mesh, Role R>
inline constexpr bool has_role = count_role<Mesh, R>() > 0;

/// The size of the mesh's one dimension with role R (1 when it has none).
template <Role R, class Mesh>
int role_size(const Mesh& mesh) {
  if constexpr (has_role<Mesh, R>) return mesh.size(role_dim<Mesh, R>);
  else return 1;
}

}  // namespace dtensor
