// dtensor/parallel/fsdp/parameter_groups.hpp — FSDP over a model whose parameters live on
// several meshes (nn/param_groups.hpp: a MoE's experts on (edp, ep, tp) beside the dense units
// on (dp, fsdp, tp)): one parallel::FullyShard per parameter group, each sharded over its own
// mesh's data dimension(s), the other groups' hooks fired when the model fires the unit each of
// their units follows (nn::followed_units), and one nn::ParamSet over every group's shards.
// fully_shard (parallel/fsdp/api.hpp) returns a FullyShardGroups for such a model.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/mesh/roles.hpp"
#include "dtensor/nn/param_groups.hpp"
#include "dtensor/nn/units.hpp"
#include "dtensor/parallel/fsdp/group.hpp"
#include "dtensor/parallel/fsdp/module.hpp"
#include "dtensor/parallel/fsdp/options.hpp"

namespace dtensor::parallel {

namespace detail {
/// One parameter group's units as a model FullyShard can wrap: units() and the hooks, which
/// FullyShardGroups fires when the model fires the unit each group unit follows.
template <class Unit>
class GroupUnits {
 public:
  explicit GroupUnits(std::vector<Unit>& units) : units_(&units) {}
  std::vector<Unit>& units() noexcept { return *units_; }
  void set_hooks(nn::UnitHooks h) { hooks_ = std::move(h); }
  const nn::UnitHooks& hooks() const noexcept { return hooks_; }

 private:
  std::vector<Unit>* units_;
  nn::UnitHooks hooks_;
};

/// The FSDP of one parameter group beyond the model's mesh: over the group mesh's data-shard
/// dimension (and data, HSDP) where it has one, else over its one data dimension ("edp").
template <class Group, class M, MemorySpace StateSpace>
struct GroupShard {
  using Unit = typename Group::unit_type;
  using GMesh = typename Group::mesh_type;
  static constexpr bool over_data = count_role<GMesh, Role::data_shard>() == 0;
  using Fsdp = FullyShard<GroupUnits<Unit>, GMesh, M, StateSpace, over_data>;
  std::unique_ptr<GroupUnits<Unit>> view;
  std::unique_ptr<Fsdp> fsdp;
  std::vector<std::vector<std::size_t>> following;  // the model's unit u -> this group's units that follow it
};

template <class Model>
constexpr std::size_t parameter_group_count() {
  if constexpr (requires(Model& m) { m.parameter_groups(); })
    return std::tuple_size_v<decltype(std::declval<Model&>().parameter_groups())>;
  else return 1;
}

template <class Model, class M, MemorySpace StateSpace, class Seq>
struct group_shards;
template <class Model, class M, MemorySpace StateSpace, std::size_t... I>
struct group_shards<Model, M, StateSpace, std::index_sequence<0, I...>> {
  using Groups = nn::parameter_groups_t<Model>;
  using type = std::tuple<GroupShard<std::tuple_element_t<I, Groups>, M, StateSpace>...>;
};
}  // namespace detail

/// FSDP over every parameter group of a model (nn/param_groups.hpp): the model's units on its
/// mesh as FullyShard, and each other group (a MoE's experts on (edp, ep, tp)) sharded over its
/// own mesh's data dimension(s) by a FullyShard of its own, whose hooks run when the model runs
/// the unit each of its units follows (nn::followed_units: "h.1.experts" with "h.1"). So ZeRO-3
/// all-gathers a block's experts with the block, every stage reduce-scatters their gradients as
/// the block's backward ends, and params() is one nn::ParamSet (one optimizer, one clip) over
/// all groups' shards. fully_shard(model, ...) returns this for a model with several groups.
template <class Model, MeshType Mesh, class M, MemorySpace StateSpace>
class FullyShardGroups {
  using Own = FullyShard<Model, Mesh, M, StateSpace>;
  static constexpr std::size_t groups = detail::parameter_group_count<Model>();
  using Shards = typename detail::group_shards<Model, M, StateSpace, std::make_index_sequence<groups>>::type;
  static_assert(std::is_same_v<StateSpace, detail::model_space_t<Model>>,
                "fully_shard: CPU offload of a model with parameters on several meshes is not supported (the "
                "parameter set's lists live on their meshes' memory space)");
  template <class S>
  using list_of = nn::MeshParams<nn::ParamList<M, S::GMesh::ndim, StateSpace>, typename S::GMesh>;
  template <class Tuple>
  struct set_of;
  template <class... S>
  struct set_of<std::tuple<S...>> {
    using type = nn::ParamSet<nn::MeshParams<nn::ParamList<M, Mesh::ndim, StateSpace>, Mesh>, list_of<S>...>;
  };

 public:
  using Set = typename set_of<Shards>::type;

  FullyShardGroups(Model& model, const Mesh& mesh, FsdpOptions o)
      : model_(model), own_(model, mesh, o), shards_(make_shards(model, mesh, o)), params_(make_set(model, mesh)) {
    static_assert(
        requires { model.hooks(); }, "fully_shard over parameter groups needs `hooks()` on the model (nn::WithUnits)");
    // The model's hooks: its own units' FSDP, then the units of each group that follow the unit.
    const nn::UnitHooks own_hooks = model.hooks();
    auto chain = [this](std::function<void(std::size_t)> first, auto pick) -> std::function<void(std::size_t)> {
      return [this, first = std::move(first), pick](std::size_t u) {
        if (first) first(u);
        for_groups([&]<std::size_t I>(std::integral_constant<std::size_t, I>, auto& g) {
          const auto& hook = pick(g.view->hooks());
          if (hook)
            for (std::size_t k : g.following[u]) hook(k);
        });
      };
    };
    model.set_hooks(
        {.pre_forward = chain(own_hooks.pre_forward, [](const nn::UnitHooks& h) -> auto& { return h.pre_forward; }),
         .post_forward = chain(own_hooks.post_forward, [](const nn::UnitHooks& h) -> auto& { return h.post_forward; }),
         .pre_backward = chain(own_hooks.pre_backward, [](const nn::UnitHooks& h) -> auto& { return h.pre_backward; }),
         .grads_ready = chain(own_hooks.grads_ready, [](const nn::UnitHooks& h) -> auto& { return h.grads_ready; })});
  }
  FullyShardGroups(const FullyShardGroups&) = delete;  // the model's hooks hold `this`
  FullyShardGroups& operator=(const FullyShardGroups&) = delete;
  ~FullyShardGroups() { model_.set_hooks({}); }

  /// This rank's shards of every group's parameters: list<0> the model's mesh's, then one per group.
  Set& params() noexcept { return params_; }
  /// The FSDP of the model's own units, and of group I (>= 1).
  Own& own() noexcept { return own_; }
  template <std::size_t I>
  auto& group() noexcept {
    static_assert(I >= 1 && I < groups, "FullyShardGroups::group<I>: I names a group beyond the model's own (1, ...)");
    return *std::get<I - 1>(shards_).fsdp;
  }

  void set_requires_gradient_sync(bool on) {
    each([&](auto& f) { f.set_requires_gradient_sync(on); });
  }
  bool requires_gradient_sync() const noexcept { return own_.requires_gradient_sync(); }
  std::size_t finish_gradient_sync() {
    std::size_t n = 0;
    each([&](auto& f) { n += f.finish_gradient_sync(); });
    return n;
  }
  std::size_t reduce_gradients() {
    std::size_t n = 0;
    each([&](auto& f) { n += f.reduce_gradients(); });
    return n;
  }
  void unshard() {
    each([](auto& f) { f.unshard(); });
  }
  void reshard() {
    each([](auto& f) { f.reshard(); });
  }
  void sync_parameters() {
    each([](auto& f) { f.sync_parameters(); });
  }
  void zero_grad() {
    each([](auto& f) { f.zero_grad(); });
  }
  FsdpMemory memory() const {
    FsdpMemory m;
    const_cast<FullyShardGroups*>(this)->each([&](auto& f) {
      const auto x = f.memory();
      m.params += x.params, m.grads += x.grads, m.master += x.master, m.grad_shards += x.grad_shards;
    });
    return m;
  }
  std::size_t num_units() const {
    std::size_t n = 0;
    const_cast<FullyShardGroups*>(this)->each([&](auto& f) { n += f.num_units(); });
    return n;
  }
  const FsdpOptions& options() const noexcept { return own_.options(); }

 private:
  template <class F>
  void for_groups(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::integral_constant<std::size_t, I>{}, std::get<I>(shards_)), ...);
    }(std::make_index_sequence<groups - 1>{});
  }
  template <class F>
  void each(F&& f) {
    f(own_);
    for_groups([&]<std::size_t I>(std::integral_constant<std::size_t, I>, auto& g) { f(*g.fsdp); });
  }
  /// Each other group's FSDP, and which of its units follow each of the model's units.
  static Shards make_shards(Model& model, const Mesh& mesh, const FsdpOptions& o) {
    Shards shards;
    auto all = model.parameter_groups();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (make_shard(model, mesh, o, std::get<I + 1>(all), std::get<I>(shards)), ...);
    }(std::make_index_sequence<groups - 1>{});
    return shards;
  }
  template <class Group, class S>
  static void make_shard(Model& model, const Mesh& mesh, const FsdpOptions& o, const Group& group, S& g) {
    g.view = std::make_unique<typename decltype(g.view)::element_type>(*group.units);
    g.fsdp = std::make_unique<typename S::Fsdp>(*g.view, *group.mesh, o);
    g.following.assign(model.units().size(), {});
    const auto follows = nn::followed_units(model.units(), group);
    for (std::size_t k = 0; k < follows.size(); ++k) {
      if (follows[k] >= model.units().size())
        throw Error(
            "fully_shard",
            dtensor::detail::cat("unit ", (*group.units)[k].group->name(), " of parameter group \"", *group.name,
                                 "\" follows no unit on the model's mesh (its part has no parameter there): "
                                 "nothing would fire its hooks"),
            mesh.rank());
      g.following[follows[k]].push_back(k);
    }
  }
  Set make_set(Model& model, const Mesh& mesh) {
    auto all = model.parameter_groups();
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return Set(nn::on(mesh, own_.params()),
                 nn::on(*std::get<I + 1>(all).mesh, std::get<I>(shards_).fsdp->params())...);
    }(std::make_index_sequence<groups - 1>{});
  }

  Model& model_;
  Own own_;
  Shards shards_;
  Set params_;
};

}  // namespace dtensor::parallel
