// dtensor/nn/param_groups.hpp — a module's parameters grouped by the mesh each lives on: the one
// question every consumer (pipeline FSDP, optimizer, clip, checkpoints, the trainer) asks of a
// model, whatever its layers are called.
//
//   auto groups = nn::parameter_groups(model);   // tuple: group 0 on the model's mesh, then one per other mesh
//   std::get<1>(groups).mesh                     // e.g. the expert mesh
//   std::get<1>(groups).units                    // its units ("h.1.experts", ...): checkpoints, FSDP-like sharding
//   auto all = nn::parameter_set(model);         // an nn::ParamSet over every group: one optimizer, one clip
//
// Group 0 is the model's units() on its mesh (what DataParallel and fully_shard take). A model
// whose parameters live on more meshes than its own — a mixture of experts (the experts on an
// expert mesh), a user's layer with parameters on a mesh of its own — declares those meshes once,
// `parameter_meshes()` returning a tuple of nn::on_mesh("experts", emesh), ... (on the model, or
// on its blocks' policy, `layers()`); nn::Stack then forms, for each declared mesh, one unit per
// part that has parameters there, named "<part>.<group name>" ("h.1.experts"), found by the
// parameters' mesh type whatever the members holding them are called. A module that implements
// `parameter_groups()` itself is asked that; any other module with units has its one group.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/nn/param_set.hpp"
#include "dtensor/nn/units.hpp"

namespace dtensor::nn {

/// A declaration: parameters on `mesh` form a group called `name` (model.parameter_meshes()).
template <MeshType Mesh>
struct OnMesh {
  using mesh_type = Mesh;
  std::string name;
  Mesh mesh;
};
template <MeshType Mesh>
OnMesh<Mesh> on_mesh(std::string name, const Mesh& mesh) {
  return {std::move(name), mesh};
}

/// One parameter group of a module: its mesh and its units there (views; the module owns both).
template <class Unit, MeshType Mesh>
struct ParamGroup {
  using unit_type = Unit;
  using mesh_type = Mesh;
  using list_type = std::remove_cvref_t<decltype(std::declval<Unit&>().params)>;
  const std::string* name;  // "" for the module's own mesh
  const Mesh* mesh;
  std::vector<Unit>* units;

  /// Every parameter of the group, in unit order.
  list_type params() const {
    list_type out;
    for (auto& u : *units) {
      materialize_unit(u);  // a deferred unit is drawn whole here (nn/units.hpp)
      out.insert(out.end(), u.params.begin(), u.params.end());
    }
    return out;
  }
};

namespace detail {
inline const std::string& own_group_name() {
  static const std::string name;
  return name;
}
}  // namespace detail

/// The parameter groups of module m (see the top of this file): m.parameter_groups() where m
/// has it, else the one group of its units on its mesh.
template <class M>
auto parameter_groups(M& m) {
  if constexpr (requires { m.parameter_groups(); }) {
    return m.parameter_groups();
  } else {
    static_assert(HasUnits<M> && requires { m.mesh(); },
                  "nn::parameter_groups: the module needs parameter_groups(), or units() and mesh() (nn::WithUnits)");
    using Unit = std::remove_cvref_t<decltype(m.units().front())>;
    using Mesh = std::remove_cvref_t<decltype(m.mesh())>;
    return std::tuple<ParamGroup<Unit, Mesh>>{{&detail::own_group_name(), &m.mesh(), &m.units()}};
  }
}

template <class M>
using parameter_groups_t = decltype(parameter_groups(std::declval<M&>()));

/// Which unit on the model's own mesh each unit of `group` follows: group unit k, named
/// "<part>.<group name>" (nn::Stack), follows the own unit named "<part>" — the model fires that
/// unit's hooks around the part, so a wrapper of the other groups (parallel::DataParallel,
/// parallel::fully_shard) acts on unit k when the model fires its own unit. npos where the part
/// has no unit on the model's mesh (a part whose parameters all live elsewhere fires no hook).
template <class OwnUnits, class Group>
std::vector<std::size_t> followed_units(const OwnUnits& own, const Group& group) {
  std::vector<std::size_t> out;
  const std::string suffix = "." + *group.name;
  for (const auto& u : *group.units) {
    const std::string& name = u.group->name();
    std::size_t found = std::size_t(-1);
    if (name.size() > suffix.size() && name.ends_with(suffix)) {
      const std::string part = name.substr(0, name.size() - suffix.size());
      for (std::size_t i = 0; i < own.size(); ++i)
        if (own[i].group->name() == part) found = i;
    }
    out.push_back(found);
  }
  return out;
}

namespace detail {
template <class First, class Groups, class Seq>
struct set_with;
template <class First, class Groups, std::size_t... I>
struct set_with<First, Groups, std::index_sequence<0, I...>> {
  using type = ParamSet<First, MeshParams<typename std::tuple_element_t<I, Groups>::list_type,
                                          typename std::tuple_element_t<I, Groups>::mesh_type>...>;
};
}  // namespace detail

/// The ParamSet of group 0 given as `first` (e.g. FSDP's shards of the modules' units, on their
/// mesh) and every other group of `modules` (a range of modules of one type: a rank's pipeline
/// stages), each group's parameters over all modules, on the group's mesh.
template <class Modules, class First>
auto parameter_set_with(Modules&& modules, First first) {
  using Module = std::remove_cvref_t<decltype(*std::begin(modules))>;
  using Groups = parameter_groups_t<Module>;
  constexpr std::size_t n = std::tuple_size_v<Groups>;
  using Set = typename detail::set_with<First, Groups, std::make_index_sequence<n>>::type;
  return [&]<std::size_t... I>(std::index_sequence<0, I...>) {
    auto front = parameter_groups(*std::begin(modules));
    auto list = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
      typename std::tuple_element_t<J, Groups>::list_type out;
      for (auto& m : modules) {
        auto mine = std::get<J>(parameter_groups(m)).params();
        out.insert(out.end(), mine.begin(), mine.end());
      }
      return on(*std::get<J>(front).mesh, std::move(out));
    };
    (void)list;  // a model with one group has no other list to make
    return Set(std::move(first), list(std::integral_constant<std::size_t, I>{})...);
  }(std::make_index_sequence<n>{});
}

/// Every parameter of module m, as one ParamSet over its groups' meshes: one optimizer
/// (optim::make_adamw) and one clip (optim::clip_grad_norm) over all.
template <class M>
auto parameter_set(M& m) {
  auto g0 = std::get<0>(parameter_groups(m));
  return parameter_set_with(std::span<M>(&m, 1), on(*g0.mesh, g0.params()));
}

}  // namespace dtensor::nn
