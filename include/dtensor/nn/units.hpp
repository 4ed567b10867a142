// dtensor/nn/units.hpp — a model's parameter units, the hooks that run around them, and the
// library's derivation of both from the children a model declares.
//
//   class MyModel : public nn::WithUnits<float, Mesh> {           // units(), set_hooks(), hooks(), set_grads_ready()
//    public:
//     MyModel(...) : ... { this->make_units(*this); }            // one flat group per unit, from children()
//     auto children() { return nn::children(nn::unit("embed", wte_, wpe_), blocks_, head_); }
//     ... forward:  auto y = this->forward_unit(1, [&] { return blocks_[0].forward(x); });
//   };
//   nn::Sequential<L1, L2, L3> mlp(l1, l2, l3);                   // or no code at all: see nn/sequential.hpp
//
// A unit is what FSDP gathers and reshards as one (one all-gather, one reduce-scatter) and what
// DDP reduces as soon as the backward has finished it: one flat group (nn::FlatParams) and the
// type-erased views of its parameters (nn::ParamUnit). A parallel wrapper (DataParallel,
// fully_shard, trace_units) sees a model only through units() and set_hooks(UnitHooks): the
// four hooks, each given the unit's index, are pre_forward / post_forward around the unit's
// forward (FSDP: all-gather, reshard), pre_backward before its input gradients (FSDP: gather
// again) and grads_ready once its weight gradients are complete (DDP and FSDP reduce them).
//
// Which parameters form a unit is derived from children() (nn/module.hpp), so a model declares
// its structure once: every top-level child is one unit; a range child (a model's blocks) gives
// one unit per element; an absent std::optional child none; nn::unit("name", a, b) groups
// several modules into one unit. A unit is named by nn::unit's name, else by the module's
// name(), else by its index. Only the parameters on the model's mesh type go into the units
// (flatten<T, N, Mesh>): a module over two meshes (nn::MoE) keeps its other parameters in
// units of their own (nn::add_unit on that mesh).
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/nn/module.hpp"
#include "dtensor/nn/parameter.hpp"

namespace dtensor::nn {

/// What runs around each unit of a model (each given the unit's index); empty ones are skipped.
struct UnitHooks {
  std::function<void(std::size_t)> pre_forward;   // before the unit's forward
  std::function<void(std::size_t)> post_forward;  // after it
  std::function<void(std::size_t)> pre_backward;  // before the unit's backward (input gradients)
  std::function<void(std::size_t)> grads_ready;   // once the unit's weight gradients are complete
};

/// A unit of parameters: one flat group and its type-erased views.
template <class T, std::size_t N, MemorySpace Space = host_space>
struct ParamUnit {
  std::shared_ptr<FlatParams<T, N, Space>> group;
  ParamList<T, N, Space> params;  // empty while the group is deferred (nn::DeferredInit): see materialize_unit
};

/// A unit whose group is deferred (nn::DeferredInit) made whole: its values drawn, its
/// gradients zero and its params() views taken (they are empty until then: a view of nothing
/// would be a trap). What uses a unit's params() calls it first (ParamGroup::params, DDP);
/// FSDP instead draws only its shard and never needs them. No-op for any other unit.
template <class Unit>
void materialize_unit(Unit& u) {
  if (!u.group || !u.group->deferred()) return;
  u.group->ensure_materialized();
  u.params.clear();
  auto& g = *u.group;
  for (std::size_t i = 0; i < g.entries().size(); ++i) {  // as Parameter::collect, in the group's (registration) order
    auto& e = g.entries()[i];
    u.params.push_back({e.name, g.value(i), g.grad(i), e.layout, &e.grad_state, &e.has_grad, e.decay, &g, e.offset,
                        g.sharded_flag()});
  }
}

/// What a parallel wrapper needs of a model: its units (each with a flat `group` and its
/// `params`) and a way to set the hooks that run around them.
template <class M>
concept UnitList = std::ranges::random_access_range<M> && requires(std::ranges::range_reference_t<M> u) {
  u.group;
  u.params;
  u.group->size();
};
template <class M>
concept HasUnits = requires(M& m, UnitHooks h) {
  { m.units() } -> UnitList;
  m.set_hooks(std::move(h));
};

/// A compile-time check with a readable message, for the wrappers that take a model's units.
template <class M>
constexpr bool require_units() {
  static_assert(requires(M& m) { m.units(); },
                "this parallel wrapper needs the model's units: give the model `units()` (derive it from "
                "nn::WithUnits<T, Mesh> and call make_units(*this), or use nn::Sequential)");
  static_assert(requires(M& m) {
    { m.units() } -> UnitList;
  }, "model.units() must return a random-access range of units, each with a flat `group` and its `params` (nn::ParamUnit)");
  static_assert(requires(M& m, UnitHooks h) { m.set_hooks(std::move(h)); },
                "this parallel wrapper needs `set_hooks(nn::UnitHooks)` on the model (nn::WithUnits gives it)");
  return true;
}

/// Several modules that form one unit, named: nn::unit("embed", wte, wpe). A composite child
/// for the parameter walks too, so children() lists them once.
template <class... M>
struct UnitOf {
  std::string name;
  std::tuple<M&...> refs;
  auto children() { return refs; }
};
template <class... M>
UnitOf<M...> unit(std::string name, M&... m) {
  return {std::move(name), std::tie(m...)};
}

/// A children() tuple: modules and ranges given as lvalues are held by reference, nn::unit(...)
/// groups by value. nn::children(nn::unit("embed", wte_, wpe_), blocks_, head_).
template <class... C>
std::tuple<C...> children(C&&... c) {
  return std::tuple<C...>(std::forward<C>(c)...);
}

namespace detail {
template <class T>
struct is_unit : std::false_type {};
template <class... M>
struct is_unit<UnitOf<M...>> : std::true_type {};

/// A unit's name: nn::unit's, the module's name(), or its index among the units.
template <class M>
std::string unit_name(M& m, std::size_t index) {
  if constexpr (is_unit<std::remove_cvref_t<M>>::value) return m.name;
  else if constexpr (requires { { m.name() } -> std::convertible_to<std::string>; }) return std::string(m.name());
  else return std::to_string(index);
}

/// Calls f(name, part) for each unit-forming part of a child (see the top of this file).
template <class Child, class F>
void for_each_unit_part(Child& c, std::size_t& index, F& f) {
  if constexpr (LeafModule<Child> || CompositeModule<Child>) f(unit_name(c, index++), c);
  else if constexpr (is_optional<Child>::value) {
    if (c) for_each_unit_part(*c, index, f);
  } else if constexpr (std::ranges::range<Child>) {
    for (auto& m : c) f(unit_name(m, index++), m);
  } else static_assert(sizeof(Child) == 0, "children() may hold modules, ranges of modules and optional modules only");
}

/// A unit-forming part of a model's children(): its name and its parameters.
struct UnitPart {
  std::string name;
  ParamSlots params;
};
struct AppendUnitPart {
  std::vector<UnitPart>& out;
  template <class Part>
  void operator()(std::string name, Part& part) const {
    out.push_back(UnitPart{std::move(name), param_slots(part)});
  }
};

/// The unit-forming parts of model.children(), in order, each with its parameters: the one walk
/// over the model that the units' bookkeeping (WithUnits, nn::Stack) iterates.
template <class Model>
std::vector<UnitPart> unit_parts(Model& model) {
  static_assert(CompositeModule<Model>, "nn::WithUnits: the model must declare its children() (nn/module.hpp)");
  std::vector<UnitPart> parts;
  std::size_t index = 0;
  AppendUnitPart add{parts};
  auto kids = model.children();
  std::apply([&](auto&... c) { (for_each_unit_part(c, index, add), ...); }, kids);
  return parts;
}
}  // namespace detail

/// Moves the parameters among `params` on mesh type OnMesh into a new flat group `name` and
/// appends it, with its views, to units. The one way a unit is made (models and
/// models::MoELayers alike).
template <class T, MeshType OnMesh, class Units>
void add_unit(Units& units, std::string name, const detail::ParamSlots& params) {
  typename Units::value_type u;
  constexpr const void* mesh = detail::mesh_key<OnMesh>();
  u.group = detail::flatten_slots<T, OnMesh::ndim, mesh_space_t<OnMesh>>(std::move(name), params, mesh);
  if (!u.group->deferred()) detail::collect_slots(params, mesh, u.params);  // deferred: materialize_unit takes them
  units.push_back(std::move(u));
}

/// The same for a module `part` (its parameters on mesh type OnMesh): what a model over two
/// meshes calls for the parts on its second mesh.
template <class T, MeshType OnMesh, class Units, class Part>
  requires(!std::is_same_v<std::remove_cv_t<Part>, detail::ParamSlots>)
void add_unit(Units& units, std::string name, Part& part) {
  add_unit<T, OnMesh>(units, std::move(name), detail::param_slots(part));
}

/// The units, hooks and hook firing of a model, derived from its children(). A model derives
/// from it (the members below are its public API) and calls make_units(*this) once its
/// modules are built; its forward and backward wrap each unit's work in forward_unit /
/// backward_unit and announce grads_ready (nn::Sequential does all of it for a chain).
template <class T, MeshType Mesh>
class WithUnits {
 public:
  using Unit = ParamUnit<T, Mesh::ndim, mesh_space_t<Mesh>>;

  /// The parameter units, in forward order (parameters on the model's mesh only).
  std::vector<Unit>& units() noexcept { return units_; }
  const std::vector<Unit>& units() const noexcept { return units_; }
  /// Replaces every unit hook (see UnitHooks).
  void set_hooks(UnitHooks h) { hooks_ = std::move(h); }
  const UnitHooks& hooks() const noexcept { return hooks_; }
  /// Called with a unit's index as soon as backward has completed its gradients (DDP's overlap).
  void set_grads_ready(std::function<void(std::size_t)> fn) { hooks_.grads_ready = std::move(fn); }

 protected:
  /// The unit index of a part without parameters on the model's mesh: it forms no unit (FSDP
  /// has nothing to gather for it) and its hooks are not fired.
  static constexpr std::size_t no_unit = std::size_t(-1);

  /// One flat group per unit-forming part of model.children() (see the top of this file).
  /// Returns, for each part in order, its unit's index (no_unit for a part without parameters).
  template <class Model>
  std::vector<std::size_t> make_units(Model& model) {
    return make_units_from(detail::unit_parts(model));
  }
  /// The same, from the model's parts (nn::Stack makes its other meshes' units from them too).
  std::vector<std::size_t> make_units_from(const std::vector<detail::UnitPart>& parts) {
    units_.clear();
    std::vector<std::size_t> unit_of_part;
    for (const auto& part : parts) {
      if (detail::count_defined(part.params, detail::mesh_key<Mesh>()) == 0) {
        unit_of_part.push_back(no_unit);
        continue;
      }
      unit_of_part.push_back(units_.size());
      add_unit<T, Mesh>(units_, part.name, part.params);
    }
    return unit_of_part;
  }

  /// f() between the unit's pre_forward and post_forward hooks; returns what f returns.
  template <class F>
  decltype(auto) forward_unit(std::size_t unit, F&& f) const {
    fire(hooks_.pre_forward, unit);
    if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
      f();
      fire(hooks_.post_forward, unit);
    } else {
      auto result = f();
      fire(hooks_.post_forward, unit);
      return result;
    }
  }
  /// f() after the unit's pre_backward hook (the unit's input gradients).
  template <class F>
  decltype(auto) backward_unit(std::size_t unit, F&& f) const {
    fire(hooks_.pre_backward, unit);
    return f();
  }
  /// Announces that the unit's weight gradients are complete.
  void grads_ready(std::size_t unit) const { fire(hooks_.grads_ready, unit); }

 private:
  static void fire(const std::function<void(std::size_t)>& hook, std::size_t unit) {
    if (hook && unit != no_unit) hook(unit);
  }

  std::vector<Unit> units_;
  UnitHooks hooks_;
};

}  // namespace dtensor::nn
