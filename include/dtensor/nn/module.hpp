// dtensor/nn/module.hpp — the module protocol, and the one mechanism composite modules share.
//
//   auto [y, saved] = m.forward(x);                       // saved: what backward needs, owned by the caller
//   auto [dx, wctx] = m.backward_input(std::move(saved), dy);
//   m.backward_weight(std::move(wctx));                   // adds the weight gradients (later, if a schedule wants)
//
//   nn::for_each_parameter(m, [](auto& p) { ... });       // every nn::Parameter, in registration order
//   nn::collect(m, params);  nn::zero_grad(m);            // built on it
//   nn::collect_on<Mesh>(m, params);                      // only the parameters on mesh type Mesh
//
// A module keeps only its parameters. Whatever a backward needs (inputs, statistics) is returned
// by forward as a value the caller owns, one per micro-batch, so a pipeline schedule can keep
// several micro-batches in flight, run their backwards in any order and defer the weight
// gradients (zero-bubble); moving a module is safe. backward_input returns the input gradient
// and the weight context — what backward_weight needs to add the weight gradients.
//
// Leaf modules expose `parameters()` (a tuple of references to their nn::Parameters); composite
// modules expose `children()` (a tuple of references to sub-modules, or ranges of them). The
// free functions here walk both, so no composite writes its own collect / zero_grad / flatten.
// A composite's weight context is the tuple of its children's, in children() order:
// backward_weight_children runs them last child first (the order a backward finishes them).
//
// require_roles<Module, Mesh, Roles...>() is the compile-time check that a module handles every
// mesh dimension's role (mesh/roles.hpp): its error names the module, the dimension and the role.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <ranges>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/core/error.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/mesh/fixed_string.hpp"
#include "dtensor/mesh/roles.hpp"
#include "dtensor/nn/flat_params.hpp"

namespace dtensor::nn {

/// What forward returns: the output and the saved state for the backward.
template <class Y, class Saved>
struct Fwd {
  Y y;
  Saved saved;
};

/// What backward_input returns: the input gradient and the weight context.
template <class DX, class WeightCtx>
struct Bwd {
  DX dx;
  WeightCtx weight;
};

/// The saved state (or weight context) of a module that needs none.
struct Nothing {};

template <class M>
concept LeafModule = requires(M& m) { m.parameters(); };
template <class M>
concept CompositeModule = requires(M& m) { m.children(); };

namespace detail {
template <class T>
struct is_tuple : std::false_type {};
template <class... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

template <class X, class F>
void visit_parameters(X& x, F& f);

/// One child: a module, a range of modules (a GPT's blocks), or a module that may be absent
/// (std::optional: a pipeline stage holds the embeddings only if it is the first).
template <class Child, class F>
void visit_child(Child& c, F& f) {
  if constexpr (LeafModule<Child> || CompositeModule<Child>) visit_parameters(c, f);
  else if constexpr (is_optional<Child>::value) {
    if (c) visit_child(*c, f);
  }
  else if constexpr (std::ranges::range<Child>)
    for (auto& m : c) visit_child(m, f);
  else static_assert(sizeof(Child) == 0, "children() may hold modules, ranges of modules and optional modules only");
}

template <class X, class F>
void visit_parameters(X& x, F& f) {
  if constexpr (LeafModule<X>)
    std::apply([&](auto&... p) { (f(p), ...); }, x.parameters());
  if constexpr (CompositeModule<X>) {
    auto kids = x.children();  // a tuple of references, or of unit groups by value (nn::unit)
    std::apply([&](auto&... c) { (visit_child(c, f), ...); }, kids);
  }
}

/// One address per type: the identity a ParamSlot compares (meshes, groups, lists).
template <class T>
inline constexpr char type_key{};

/// What the bookkeeping of lists, groups and units needs of one parameter, without its type:
/// one table per parameter type. `group` identifies its FlatParams type (element type, mesh
/// rank, memory space) and `list` its ParamList type; the pointers to a group or a list passed
/// below are of those types.
struct ParamSlotOps {
  const void* mesh;   // type_key of the parameter's mesh type
  const void* group;  // type_key of its FlatParams type
  const void* list;   // type_key of its ParamList type
  bool (*defined)(const void* p);
  const std::string& (*name)(const void* p);
  const void* (*group_of)(const void* p);  // its std::shared_ptr<Group>
  std::size_t (*index)(const void* p);
  void (*rebind)(void* p, const void* group, std::size_t index);  // group: a std::shared_ptr<Group>
  void (*collect)(void* p, void* list);
  void (*zero_grad)(void* p);
};

template <class P>
inline constexpr ParamSlotOps param_slot_ops{
    &type_key<typename P::value_type::mesh_type>,
    &type_key<typename P::Group>,
    &type_key<typename P::List>,
    [](const void* p) { return static_cast<const P*>(p)->defined(); },
    [](const void* p) -> const std::string& { return static_cast<const P*>(p)->name(); },
    [](const void* p) -> const void* { return &static_cast<const P*>(p)->group(); },
    [](const void* p) { return static_cast<const P*>(p)->index(); },
    [](void* p, const void* group, std::size_t index) {
      static_cast<P*>(p)->rebind(*static_cast<const std::shared_ptr<typename P::Group>*>(group), index);
    },
    [](void* p, void* list) { static_cast<P*>(p)->collect(*static_cast<typename P::List*>(list)); },
    [](void* p) { static_cast<P*>(p)->zero_grad(); }};

/// A module's parameter seen through its type's table.
struct ParamSlot {
  void* param;
  const ParamSlotOps* ops;

  bool defined() const { return ops->defined(param); }
  /// Whether it lives on the mesh type of key `mesh` (null: any mesh).
  bool on(const void* mesh) const { return mesh == nullptr || ops->mesh == mesh; }
};
/// A module's parameters in registration order. Built by one walk over the module tree per
/// module type (param_slots), so that what iterates them is not instantiated per module type
/// and caller: the walk was 78 instantiations of visit_parameters in one FSDP x TP program.
using ParamSlots = std::vector<ParamSlot>;

struct AppendParamSlot {
  ParamSlots& out;
  template <class P>
  void operator()(P& p) const {
    out.push_back(ParamSlot{&p, &param_slot_ops<P>});
  }
};

/// Every nn::Parameter of module m and its children, in registration order (the undefined too).
template <class M>
ParamSlots param_slots(M& m) {
  ParamSlots slots;
  AppendParamSlot add{slots};
  visit_parameters(m, add);
  return slots;
}

/// The defined parameters among slots on the mesh type of key `mesh` (null: any mesh).
inline std::size_t count_defined(const ParamSlots& slots, const void* mesh) {
  std::size_t count = 0;
  for (const auto& s : slots) count += s.on(mesh) && s.defined() ? 1 : 0;
  return count;
}

[[noreturn]] inline void throw_param_type_mismatch(const char* op, const std::string& param, const char* what) {
  throw Error(op, dtensor::detail::cat("parameter ", param, " is not of the ", what,
                                       "'s element type, mesh rank and memory space"));
}

/// Appends the type-erased view of every defined parameter among slots on mesh `mesh` to out.
template <class List>
void collect_slots(const ParamSlots& slots, const void* mesh, List& out) {
  for (const auto& s : slots) {
    if (!s.on(mesh) || !s.defined()) continue;
    if (s.ops->list != &type_key<List>) throw_param_type_mismatch("nn::collect", s.ops->name(s.param), "list");
    s.ops->collect(s.param, &out);
  }
}
}  // namespace detail

/// A composite of existing modules, for the free functions: nn::flatten("embed", nn::modules(wte, wpe)).
template <class... M>
struct ModuleRefs {
  std::tuple<M&...> refs;
  auto children() { return refs; }
};
template <class... M>
ModuleRefs<M...> modules(M&... m) {
  return {std::tie(m...)};
}

/// Calls f(p) for every nn::Parameter of module m and its children, in registration order.
/// A parameter that was never set (an optional bias) is passed too: check p.defined().
template <class M, class F>
void for_each_parameter(M& m, F&& f) {
  detail::visit_parameters(m, f);
}

namespace detail {
/// The mesh filter that takes every parameter.
struct AnyMesh {};
template <class OnMesh, class P>
constexpr bool param_on_mesh() {
  return std::is_same_v<OnMesh, AnyMesh> || std::is_same_v<typename P::value_type::mesh_type, OnMesh>;
}
/// The filter's key for ParamSlot::on.
template <class OnMesh>
constexpr const void* mesh_key() {
  if constexpr (std::is_same_v<OnMesh, AnyMesh>) return nullptr;
  else return &type_key<OnMesh>;
}
}  // namespace detail

/// Calls f(p) for the parameters of m that live on a mesh of type OnMesh, in registration
/// order. A module over two meshes (nn::MoE: the router on the dense mesh, the experts on the
/// expert mesh) has parameters of two mesh ranks, which no one ParamList or flat group can hold.
template <class OnMesh, class M, class F>
void for_each_parameter_on(M& m, F&& f) {
  for_each_parameter(m, [&](auto& p) {
    if constexpr (detail::param_on_mesh<OnMesh, std::remove_cvref_t<decltype(p)>>()) f(p);
  });
}

/// Appends the type-erased view of every (defined) parameter on a mesh of type OnMesh to out;
/// throws dtensor::Error for one of another element type, mesh rank or memory space than out's.
template <class OnMesh, class M, class List>
void collect_on(M& m, List& out) {
  detail::collect_slots(detail::param_slots(m), detail::mesh_key<OnMesh>(), out);
}

/// Appends the type-erased view of every (defined) parameter to out.
template <class M, class List>
void collect(M& m, List& out) {
  collect_on<detail::AnyMesh>(m, out);
}

/// Zeroes every parameter's gradient.
template <class M>
void zero_grad(M& m) {
  for (const auto& s : detail::param_slots(m))
    if (s.defined()) s.ops->zero_grad(s.param);
}

namespace detail {
/// nn::flatten of the defined parameters among slots on the mesh type of key `mesh`.
template <class T, std::size_t N, class Space>
std::shared_ptr<FlatParams<T, N, Space>> flatten_slots(std::string name, const ParamSlots& slots, const void* mesh) {
  using Group = FlatParams<T, N, Space>;
  auto group_of = [](const ParamSlot& s) -> Group& {
    return **static_cast<const std::shared_ptr<Group>*>(s.ops->group_of(s.param));
  };
  std::vector<FlatEntry<N>> entries;
  for (const auto& s : slots) {
    if (!s.on(mesh) || !s.defined()) continue;
    if (s.ops->group != &type_key<Group>) throw_param_type_mismatch("nn::flatten", s.ops->name(s.param), "group");
    entries.push_back(group_of(s).entries()[s.ops->index(s.param)]);
  }
  // Every parameter deferred (nn::DeferredInit): so is the group, nothing to copy; otherwise
  // the deferred ones among them are drawn first (nn/flat_params.hpp).
  auto group = std::make_shared<Group>(std::move(name), std::move(entries));
  std::size_t i = 0;
  for (const auto& s : slots) {
    if (!s.on(mesh) || !s.defined()) continue;
    if (!group->deferred()) {
      auto& old = group_of(s);
      const std::size_t index = s.ops->index(s.param);
      old.ensure_materialized();
      const std::size_t bytes = group->entries()[i].numel * sizeof(T);
      Space::copy(group->value(i).data(), old.value(index).data(), bytes);
      Space::copy(group->grad(i).data(), old.grad(index).data(), bytes);
    }
    s.ops->rebind(s.param, &group, i++);
  }
  return group;
}
}  // namespace detail

/// Moves every (defined) parameter of module m into one new flat group called `name`: values,
/// gradients and gradient states carried over, the parameters' views re-pointed. Returns the
/// group. T and N are the parameters' element type and mesh rank (dtensor::Error for a
/// parameter of another); OnMesh, when given, takes only the parameters on that mesh type (the
/// dense part of a block with an nn::MoE), and the group lives in that mesh's memory space
/// (host without one).
template <class T, std::size_t N, class OnMesh = detail::AnyMesh, class M>
std::shared_ptr<FlatParams<T, N, mesh_space_t<OnMesh>>> flatten(std::string name, M& m) {
  return detail::flatten_slots<T, N, mesh_space_t<OnMesh>>(std::move(name), detail::param_slots(m),
                                                           detail::mesh_key<OnMesh>());
}

/// backward_weight of each child with its part of ctx (a tuple in children() order), last first.
template <class M, class Ctx>
void backward_weight_children(M& m, Ctx&& ctx) {
  auto kids = m.children();
  static_assert(std::tuple_size_v<decltype(kids)> == std::tuple_size_v<std::remove_cvref_t<Ctx>>,
                "a composite's weight context holds one entry per child");
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    constexpr std::size_t n = sizeof...(I);
    (std::get<n - 1 - I>(kids).backward_weight(std::move(std::get<n - 1 - I>(ctx))), ...);
  }(std::make_index_sequence<std::tuple_size_v<decltype(kids)>>{});
}

// ---------------------------------------------------------------- roles a module handles

namespace detail {
/// A dimension name as a template argument, so that the compiler prints it.
struct DimName {
  char text[64]{};
  constexpr DimName(std::string_view s) {  // NOLINT: implicit
    for (std::size_t i = 0; i < s.size() && i + 1 < sizeof(text); ++i) text[i] = s[i];
  }
};

/// Instantiated only when a module is given a mesh dimension whose role it does not handle;
/// the compiler prints the module, the dimension and its role.
template <fixed_string Module, DimName Dimension, DimName DimensionRole>
struct mesh_dimension_role_not_handled {
  static_assert(Dimension.text[0] == '\0',
                "this module does not handle the role of a mesh dimension: mesh_dimension_role_not_handled<module, "
                "dimension, role> above names them. Give the module a sub-mesh without that dimension (a pipeline "
                "stage's mesh), or name the role of the dimension with mesh_roles (mesh/roles.hpp)");
  static constexpr bool value = false;
};

template <fixed_string Module, class Mesh, std::size_t I, Role... Handled>
constexpr bool require_role_at() {
  constexpr Role r = role_of<Mesh>(I);
  if constexpr (((r == Handled) || ...)) return true;
  else return mesh_dimension_role_not_handled<Module, Mesh::names[I], name_of(r)>::value;
}
}  // namespace detail

/// Compiles only when every dimension of Mesh has one of the roles Handled.
template <fixed_string Module, class Mesh, Role... Handled>
constexpr bool require_roles() {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return (detail::require_role_at<Module, Mesh, I, Handled...>() && ...);
  }(std::make_index_sequence<Mesh::ndim>{});
}

/// The roles the dense modules of nn/ handle: data (replicated or, under FSDP, sharded
/// parameters), tensor (with sequence parallelism) and context (the sequence split: row-wise
/// modules run on this rank's positions; attention handles it, nn/attention.hpp).
template <fixed_string Module, class Mesh>
constexpr bool require_dense_roles() {
  return require_roles<Module, Mesh, Role::data, Role::data_shard, Role::tensor, Role::context>();
}

}  // namespace dtensor::nn
