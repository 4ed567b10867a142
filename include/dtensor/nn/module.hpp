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

/// Appends the type-erased view of every (defined) parameter on a mesh of type OnMesh to out.
template <class OnMesh, class M, class List>
void collect_on(M& m, List& out) {
  for_each_parameter_on<OnMesh>(m, [&](auto& p) {
    if (p.defined()) p.collect(out);
  });
}

/// Appends the type-erased view of every (defined) parameter to out.
template <class M, class List>
void collect(M& m, List& out) {
  collect_on<detail::AnyMesh>(m, out);
}

/// Zeroes every parameter's gradient.
template <class M>
void zero_grad(M& m) {
  for_each_parameter(m, [](auto& p) {
    if (p.defined()) p.zero_grad();
  });
}

/// Moves every (defined) parameter of module m into one new flat group called `name`: values,
/// gradients and gradient states carried over, the parameters' views re-pointed. Returns the
/// group. T and N are the parameters' element type and mesh rank; OnMesh, when given, takes
/// only the parameters on that mesh type (the dense part of a block with an nn::MoE), and the
/// group lives in that mesh's memory space (host without one).
template <class T, std::size_t N, class OnMesh = detail::AnyMesh, class M>
std::shared_ptr<FlatParams<T, N, mesh_space_t<OnMesh>>> flatten(std::string name, M& m) {
  using Space = mesh_space_t<OnMesh>;
  std::vector<FlatEntry<N>> entries;
  for_each_parameter_on<OnMesh>(m, [&](auto& p) {
    if (p.defined()) entries.push_back(p.group()->entries()[p.index()]);
  });
  // Every parameter deferred (nn::DeferredInit): so is the group, nothing to copy; otherwise
  // the deferred ones among them are drawn first (nn/flat_params.hpp).
  auto group = std::make_shared<FlatParams<T, N, Space>>(std::move(name), std::move(entries));
  std::size_t i = 0;
  for_each_parameter_on<OnMesh>(m, [&](auto& p) {
    if (!p.defined()) return;
    auto& old = *p.group();
    if (group->deferred()) {
      p.rebind(group, i++);
      return;
    }
    old.ensure_materialized();
    const std::size_t bytes = group->entries()[i].numel * sizeof(T);
    Space::copy(group->value(i).data(), old.value(p.index()).data(), bytes);
    Space::copy(group->grad(i).data(), old.grad(p.index()).data(), bytes);
    p.rebind(group, i++);
  });
  return group;
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
