// dtensor/parallel/fsdp/api.hpp — parallel::fully_shard(model, mesh, options), the entry point
// (FSDP2's fully_shard): a FullyShard (parallel/fsdp/module.hpp) for a model whose parameters
// live on its mesh, a FullyShardGroups (parallel/fsdp/parameter_groups.hpp) for one with
// parameter groups on further meshes. parallel/fully_shard.hpp, which includes this, says what
// every stage does; docs/fsdp.md is the guide.
#pragma once

#include <type_traits>

#include "dtensor/nn/units.hpp"
#include "dtensor/parallel/fsdp/group.hpp"
#include "dtensor/parallel/fsdp/module.hpp"
#include "dtensor/parallel/fsdp/options.hpp"
#include "dtensor/parallel/fsdp/parameter_groups.hpp"

namespace dtensor::parallel {

/// Shards `model`'s units over the mesh's data-shard dimension (see parallel/fully_shard.hpp).
/// M: the master values' and optimizer state's element type (default: the model's).
/// StateSpace: where they and the gradient shards live (default: the model's memory space;
/// host_space offloads them to the CPU). The model must outlive the result and stay where it is.
/// A model with parameters on more meshes than its own (nn::parameter_groups: a MoE's experts)
/// gets a FullyShardGroups: every group sharded over its own mesh's data dimension(s).
template <class M = void, class StateSpace = void, class Model, MeshType Mesh>
auto fully_shard(Model& model, const Mesh& mesh, FsdpOptions o = {}) {
  static_assert(nn::require_units<Model>());  // before anything reads model.units(): a readable error
  using Unit = std::remove_cvref_t<decltype(model.units().front())>;
  using T = typename decltype(Unit::group)::element_type::element_type;
  using Master = std::conditional_t<std::is_void_v<M>, T, M>;
  using State = std::conditional_t<std::is_void_v<StateSpace>, detail::model_space_t<Model>, StateSpace>;
  if constexpr (detail::parameter_group_count<Model>() > 1)
    return FullyShardGroups<Model, Mesh, Master, State>(model, mesh, o);
  else return FullyShard<Model, Mesh, Master, State>(model, mesh, o);
}

}  // namespace dtensor::parallel
