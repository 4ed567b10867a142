// dtensor/nn/parameter.hpp — trainable parameters: a DTensor value and its gradient, as a view
// into a flat group (nn/flat_params.hpp).
//
//   using W = nn::Parameter<float, 2, Mesh, nn::params<Mesh, Shard<0>>>;
//   W w("fc1.weight", distribute_replicated<W::layout>(mesh, full));   // full init on every rank
//   w.accumulate_grad(dw);        // dw: a DTensor whose placements may still be Partial
//   w.grad_state()                // its placements now, e.g. (P(sum), S(0)): dp still to reduce
//   w.grad()                      // the gradient in the parameter's layout (throws if Partial)
//   ParamList<float, 2> ps; w.collect(ps);   // type-erased views for optimizers and DDP
//
// A gradient has the parameter's placements where the parameter is sharded; where the parameter
// is replicated it is either Replicate (every rank computed the same values) or Partial<op>
// (each rank holds a share still to be reduced: data parallelism, sequence parallelism). The
// gradient's layout therefore changes at run time (Partial until the gradient sync reduces it),
// so the group entry keeps a run-time LayoutDesc, and every incoming gradient's layout *type* is
// checked at compile time. Local extents never change: a Partial piece has the extents of the
// Replicate one.
//
// A parameter's value and gradient live in its group's flat buffers; a parameter made alone has
// a group of its own until nn::flatten moves it into a module group's. A Parameter is move-only
// (two modules never share one by accident); the group is shared, so moving is always safe.
// ParamRef is the type-erased view (spans into the group) that optimizers, gradient clipping and
// the bucketed all-reduces work on; it stays valid while the group lives.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/core/dtype.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/mesh/fixed_string.hpp"
#include "dtensor/nn/flat_params.hpp"

namespace dtensor::nn {

// ---------------------------------------------------------------- layouts by mesh dimension name

/// Placement P on the mesh dimension called Name (for layout_on).
template <fixed_string Name, Placement P>
struct On {
  static constexpr auto name = Name;
  using placement = P;
};

namespace detail {
template <class Mesh, std::size_t I, class Default, class... Ons>
struct placement_at {
  using type = Default;
};
template <class Mesh, std::size_t I, class Default, class First, class... Rest>
struct placement_at<Mesh, I, Default, First, Rest...> {
  using type = std::conditional_t<Mesh::names[I] == First::name.view(), typename First::placement,
                                  typename placement_at<Mesh, I, Default, Rest...>::type>;
};
template <class Mesh, class Default, class... Ons, std::size_t... I>
auto layout_on(std::index_sequence<I...>) -> Layout<typename placement_at<Mesh, I, Default, Ons...>::type...>;

template <class Mesh, class On>
constexpr bool mesh_has_dim() {
  for (auto n : Mesh::names)
    if (n == On::name.view()) return true;
  return false;
}
}  // namespace detail

/// The layout with placement P on each mesh dimension named by an On<Name, P>, Default elsewhere:
/// layout_on<DeviceMesh<"dp","tp">, Replicate, On<"tp", Shard<0>>> is Layout<Replicate, Shard<0>>.
template <class Mesh, Placement Default, class... Ons>
  requires(detail::mesh_has_dim<Mesh, Ons>() && ...)
using layout_on = decltype(detail::layout_on<Mesh, Default, Ons...>(std::make_index_sequence<Mesh::ndim>{}));

// ---------------------------------------------------------------- type-erased parameter views

namespace detail {
/// The memory spaces whose optimizer kernels read a gradient narrower than the value (widened
/// per element): the host's, and meta for dry runs. A device space keeps gradients in T.
template <class Space>
inline constexpr bool narrow_grads_supported = std::is_same_v<Space, host_space> || std::is_same_v<Space, meta_space>;
}  // namespace detail

/// What optimizers and gradient syncs see of one parameter: this rank's pieces and placements.
/// The spans point into memory space Space (nn/flat_params.hpp: read on the host only when it
/// is host memory).
template <class T, std::size_t N, MemorySpace Space = host_space>
struct ParamRef {
  using space = Space;
  std::string name;
  std::span<T> value;             // local piece of the parameter
  std::span<T> grad;              // local piece of its gradient (same extents)
  LayoutDesc<N> layout;           // the parameter's placements
  LayoutDesc<N>* grad_state;      // the gradient's placements now (Partial = reduction pending)
  bool* has_grad;                 // whether a gradient was added since the last zero_grad
  bool decay = true;              // whether weight decay applies (not to biases and norm weights)
  const void* buffer = nullptr;   // the flat buffer value/grad are windows of (null: none) ...
  std::size_t offset = 0;         // ... and where in it (adjacency without pointer arithmetic)
  // Set (by FlatParams::set_sharded) when fully_shard has taken the group over: the views may
  // dangle and the values are no longer what the model computes with. Optimizers refuse such
  // a parameter (a list collected before fully_shard); null: never taken over.
  const bool* sharded = nullptr;
  // The gradient held in a narrower floating type than the value (FSDP's mixed precision: a
  // bf16 gradient shard beside fp32 master values, ZeRO's 2 + 14/N, instead of an fp32 copy):
  // narrow_dtype differs from T's, value.size() elements of it at narrow_grad (null on meta),
  // and `grad` is empty. Readers go through grad_size() / visit_grad, which hand them a span of
  // the type it is held in; the kernels widen per element. Only where narrow_grads_supported<Space>.
  void* narrow_grad = nullptr;
  DType narrow_dtype = dtype_of<T>;

  bool grad_is_narrow() const noexcept { return narrow_dtype != dtype_of<T>; }
  /// Elements of the gradient (whichever type holds it).
  std::size_t grad_size() const noexcept { return grad_is_narrow() ? value.size() : grad.size(); }

  /// Calls f(std::span<G>) with the gradient in the type G it is held in: T, or a narrower
  /// floating type (bfloat16; float when T is double).
  template <class F>
  decltype(auto) visit_grad(F&& f) const {
    if constexpr (detail::narrow_grads_supported<Space>) {
      if (grad_is_narrow()) {
        if constexpr (sizeof(T) > sizeof(float))
          if (narrow_dtype == DType::float32) return f(std::span<float>(static_cast<float*>(narrow_grad), value.size()));
        if constexpr (sizeof(T) > sizeof(bfloat16) && !std::is_same_v<T, bfloat16>)
          if (narrow_dtype == DType::bfloat16)
            return f(std::span<bfloat16>(static_cast<bfloat16*>(narrow_grad), value.size()));
        throw Error("ParamRef", dtensor::detail::cat(name, ": gradient held as ", name_of(narrow_dtype),
                                                     ", not narrower than the value's type"));
      }
    }
    return f(grad);
  }

  /// Whether this gradient ends where `next`'s begins, in the same flat buffer.
  bool precedes(const ParamRef& next) const noexcept {
    return buffer != nullptr && buffer == next.buffer && offset + grad.size() == next.offset && !grad_is_narrow() &&
           !next.grad_is_narrow();
  }

  /// Zero gradient, nothing pending.
  void zero_grad() const {
    visit_grad([](auto g) { detail::zero_flat<Space>(g); });
    *grad_state = layout;
    *has_grad = false;
  }
};

template <class T, std::size_t N, MemorySpace Space = host_space>
using ParamList = std::vector<ParamRef<T, N, Space>>;

namespace detail {
/// Where a parameter is replicated its gradient may be Replicate or Partial<sum|avg>; where it is
/// sharded the gradient must be sharded the same way.
template <std::size_t N>
constexpr bool grad_layout_fits(const LayoutDesc<N>& param, const LayoutDesc<N>& grad) {
  for (std::size_t i = 0; i < N; ++i) {
    const auto &p = param.placements[i], &g = grad.placements[i];
    if (p.is_shard() && !(g == p)) return false;
    if (p.is_replicate() && !(g.is_replicate() || (g.is_partial() && (g.op == ReduceOp::sum || g.op == ReduceOp::avg))))
      return false;
    if (p.is_partial()) return false;
  }
  return true;
}
}  // namespace detail

/// Whether a gradient is fully reduced (no Partial placement left).
template <std::size_t N>
constexpr bool is_reduced(const LayoutDesc<N>& grad_state) {
  return !grad_state.has_partial();
}

// nn::Init (how a parameter's values start) and nn::DeferredInit: nn/flat_params.hpp.

namespace detail {
/// A parameter's group of its own, holding its one entry. On the group type only (not on the
/// parameter's layout): one copy for all the parameters of an element type and mesh.
template <class Group>
std::shared_ptr<Group> group_of_one(typename Group::Entry entry) {
  std::vector<typename Group::Entry> entries;
  entries.push_back(std::move(entry));
  return std::make_shared<Group>(entries.front().name, std::move(entries));
}

// The errors of Parameter's members, built on the ranks only (not per parameter type).
template <std::size_t R>
[[noreturn]] void throw_grad_shape(const std::string& name, const Shape<R>& grad, const Shape<R>& param, int rank) {
  throw Error("Parameter::accumulate_grad",
              dtensor::detail::cat(name, ": gradient ", to_string(grad), " for a parameter of ", to_string(param)),
              rank);
}
template <std::size_t N>
[[noreturn]] void throw_grad_layout(const std::string& name, const LayoutDesc<N>& added, const LayoutDesc<N>& held,
                                    int rank) {
  throw Error("Parameter::accumulate_grad",
              dtensor::detail::cat(name, ": gradient in layout ", to_string(added), " added to one held in layout ",
                                   to_string(held)),
              rank);
}
template <std::size_t R>
[[noreturn]] void throw_entry_mismatch(const std::string& name, std::size_t numel, const Shape<R>& local) {
  throw Error("Parameter::rebind",
              dtensor::detail::cat(name, ": entry of ", numel, " elements for a piece ", to_string(local)));
}
}  // namespace detail

namespace detail {
/// This rank's piece of the tensor of extents `shape` that `init` describes, in the layout
/// `layout` that `from_replica` (the plan from Replicate to it) cuts out of the whole. On the
/// element type, rank and mesh only, not on the layout: one copy for every parameter layout.
template <Element T, std::size_t R, MeshType Mesh>
Tensor<T, R, mesh_space_t<Mesh>> initial_local(const Plan<Mesh::ndim>& from_replica,
                                               const LayoutDesc<Mesh::ndim>& layout, const Mesh& mesh,
                                               const Shape<R>& shape, const Init& init) {
  using Space = mesh_space_t<Mesh>;
  if constexpr (!holds_data_v<Space>) {
    const auto box = local_box(layout, mesh.shape(), mesh.coordinate(), shape);
    return Tensor<T, R, Space>::uninitialized(box.extent);
  } else {
    Tensor<T, R> full = init.kind == Init::Kind::normal ? normal<T>(shape, init.seed, init.mean, init.stddev)
                        : init.kind == Init::Kind::ones ? ones<T>(shape)
                                                         : zeros<T>(shape);
    // What distribute_replicated runs: no communication, each rank keeps its piece (host memory).
    return into_space<Space>(execute(from_replica, full, mesh, shape));
  }
}

/// A parameter's entry in its group: its name, extents, layout and where this rank's piece lies.
template <std::size_t R, MeshType Mesh>
FlatEntry<Mesh::ndim> param_entry(std::string name, const LayoutDesc<Mesh::ndim>& layout, const Mesh& mesh,
                                  const Shape<R>& shape, const Box<R>& box, bool decay) {
  FlatEntry<Mesh::ndim> e;
  e.name = std::move(name);
  e.global_shape.assign(shape.begin(), shape.end());
  e.local_offset.assign(box.offset.begin(), box.offset.end());
  e.local_extent.assign(box.extent.begin(), box.extent.end());
  e.layout = e.grad_state = layout;
  e.decay = decay;
  e.numel = std::size_t(dtensor::numel(box.extent));
  // Where the piece was cut: the group it joins works out the room it takes (FlatEntry::slot).
  e.mesh_shape = mesh.shape();
  e.mesh_coordinate = mesh.coordinate();
  return e;
}

/// A parameter's group of its own, holding its one entry with this rank's piece `local` (which
/// lies at `box` of a tensor of extents `shape`). On the element type, rank and mesh only.
template <Element T, std::size_t R, MeshType Mesh>
std::shared_ptr<FlatParams<T, Mesh::ndim, mesh_space_t<Mesh>>> param_group_of_one(
    std::string name, const LayoutDesc<Mesh::ndim>& layout, const Mesh& mesh, const Shape<R>& shape, const Box<R>& box,
    bool decay, const Tensor<T, R, mesh_space_t<Mesh>>& local) {
  using Space = mesh_space_t<Mesh>;
  auto group =
      group_of_one<FlatParams<T, Mesh::ndim, Space>>(param_entry(std::move(name), layout, mesh, shape, box, decay));
  // Written through a view of the piece's extents (as assigning the parameter's value does).
  Tensor<T, R, Space>::view(group->value(0).data(), box.extent) = local;
  return group;
}

/// A parameter's group of its own for the values `init` describes: drawn now, or, inside an
/// nn::DeferredInit scope, recorded in the entry (nothing drawn or allocated).
template <Element T, std::size_t R, MeshType Mesh>
std::shared_ptr<FlatParams<T, Mesh::ndim, mesh_space_t<Mesh>>> param_group_of_one(
    std::string name, const Plan<Mesh::ndim>& from_replica, const LayoutDesc<Mesh::ndim>& layout, const Mesh& mesh,
    const Shape<R>& shape, const Init& init, bool decay) {
  const auto box = local_box(layout, mesh.shape(), mesh.coordinate(), shape);
  if (!DeferredInit::active())
    return param_group_of_one<T>(std::move(name), layout, mesh, shape, box, decay,
                                 initial_local<T>(from_replica, layout, mesh, shape, init));
  auto entry = param_entry(std::move(name), layout, mesh, shape, box, decay);
  entry.init = init;
  return group_of_one<FlatParams<T, Mesh::ndim, mesh_space_t<Mesh>>>(std::move(entry));
}
}  // namespace detail

/// The DTensor of extents `shape` in layout L on `mesh` that `init` describes.
template <LayoutType L, Element T, std::size_t R, MeshType Mesh>
DTensor<T, R, Mesh, L> initial_value(const Mesh& mesh, const Shape<R>& shape, const Init& init) {
  return DTensor<T, R, Mesh, L>(
      mesh, shape, detail::initial_local<T>(layout_plan<replicated_layout<Mesh::ndim>, L>, L::desc, mesh, shape, init));
}

template <Element T, std::size_t R, MeshType Mesh, LayoutType L>
class Parameter {
  static_assert(!L::desc.has_partial(), "a parameter's layout cannot be Partial: its value must be known per rank");

 public:
  using value_type = DTensor<T, R, Mesh, L>;
  using layout = L;
  using element_type = T;
  static constexpr std::size_t mesh_ndim = Mesh::ndim;
  using space = mesh_space_t<Mesh>;
  using Group = FlatParams<T, mesh_ndim, space>;
  using List = ParamList<T, mesh_ndim, space>;

  Parameter() = default;
  /// A parameter of extents `shape` on `mesh` starting as `init` says, in a group of its own;
  /// inside an nn::DeferredInit scope nothing is drawn or allocated (nn/flat_params.hpp).
  Parameter(std::string name, const Mesh& mesh, const Shape<R>& shape, const Init& init, bool decay = true) {
    static_assert(layout_plan<replicated_layout<mesh_ndim>, L>.collectives() == 0,
                  "a replica becomes any layout without communication");
    bind(detail::param_group_of_one<T>(std::move(name), layout_plan<replicated_layout<mesh_ndim>, L>, L::desc, mesh,
                                       shape, init, decay),
         0, mesh, shape);
  }
  /// A parameter with the given initial value, in a group of its own.
  Parameter(std::string name, const value_type& value, bool decay = true) {
    bind(detail::param_group_of_one<T>(std::move(name), L::desc, value.mesh(), value.shape(), value.local_box(), decay,
                                       value.to_local()),
         0, value.mesh(), value.shape());
  }
  Parameter(Parameter&&) noexcept = default;
  /// Takes o's group and view (assigning to a view would write through it: the view is rebuilt).
  Parameter& operator=(Parameter&& o) noexcept {
    if (this != &o) {
      group_ = std::move(o.group_);
      index_ = o.index_;
      value_.reset();
      if (o.value_) value_.emplace(std::move(*o.value_));
    }
    return *this;
  }
  Parameter(const Parameter&) = delete;
  Parameter& operator=(const Parameter&) = delete;

  /// Whether this parameter was set (an optional bias may not be).
  bool defined() const noexcept { return group_ != nullptr; }
  const std::string& name() const { return entry().name; }
  const value_type& value() const { return current_value(); }
  value_type& value() { return current_value(); }
  const Mesh& mesh() const { return checked_value().mesh(); }
  bool decay() const { return entry().decay; }
  /// The group whose buffers hold this parameter, and its entry there.
  const std::shared_ptr<Group>& group() const noexcept { return group_; }
  std::size_t index() const noexcept { return index_; }

  /// Points this parameter at entry `index` of `group` (nn::flatten; the entry must match).
  void rebind(std::shared_ptr<Group> group, std::size_t index) {
    const auto mesh = checked_value().mesh();
    const auto shape = value_->shape();
    bind(std::move(group), index, mesh, shape);
  }

  /// Sets the gradient to zero, with nothing pending.
  void zero_grad() {
    detail::zero_flat<space>(grad_span());
    entry().grad_state = L::desc;
    entry().has_grad = false;
  }

  /// Adds g to the gradient. g's layout must fit the parameter's (checked at compile time) and,
  /// when a gradient is already held, have the same pending reductions (checked at run time).
  template <LayoutType G>
  void accumulate_grad(const DTensor<T, R, Mesh, G>& g) {
    static_assert(detail::grad_layout_fits(L::desc, G::desc),
                  "a gradient must be sharded like its parameter, and be Replicate or Partial<sum|avg> where the "
                  "parameter is replicated");
    auto& e = entry();
    if (g.shape() != value_->shape()) detail::throw_grad_shape(e.name, g.shape(), value_->shape(), mesh().rank());
    if (e.has_grad && !(e.grad_state == G::desc))
      detail::throw_grad_layout(e.name, G::desc, e.grad_state, mesh().rank());
    auto d = detail::flat_view<space>(grad_span());
    const auto& gl = g.to_local();
    kernels::add_(d, Tensor<T, 1, space>::view(const_cast<T*>(gl.data()), d.shape()));
    e.grad_state = G::desc;
    e.has_grad = true;
  }

  /// The gradient's placements now.
  const LayoutDesc<mesh_ndim>& grad_state() const { return entry().grad_state; }
  /// This rank's piece of the gradient (a copy).
  Tensor<T, R, space> grad_local() const {
    entry();  // throws for a parameter never set
    group_->ensure_materialized();
    auto t = Tensor<T, R, space>::uninitialized(value_->to_local().shape());
    space::copy(t.data(), group_->grads().data() + entry().offset, entry().numel * sizeof(T));
    return t;
  }

  /// The gradient in the parameter's layout (a copy); throws while a reduction is pending.
  value_type grad() const {
    if (!is_reduced(grad_state()))
      throw Error("Parameter::grad",
                  dtensor::detail::cat(name(), ": gradient is ", to_string(grad_state()),
                                       ", still Partial: run the gradient sync (DataParallel, sequence parallel) first"),
                  mesh().rank());
    return value_type(mesh(), value_->shape(), grad_local());
  }

  /// Appends this parameter's type-erased view (a deferred group is materialised first).
  void collect(List& out) {
    auto& e = entry();  // throws for a parameter never set
    group_->ensure_materialized();
    out.push_back(ParamRef<T, mesh_ndim, space>{e.name, group_->value(index_), group_->grad(index_), e.layout,
                                                &e.grad_state, &e.has_grad, e.decay, group_.get(), e.offset,
                                                group_->sharded_flag()});
  }

 private:
  typename Group::Entry& entry() const {
    if (!group_) throw Error("Parameter", "use of a parameter that was never set");
    return group_->entries()[index_];
  }
  std::span<T> grad_span() const {
    entry();  // throws for a parameter never set
    group_->ensure_materialized();
    return group_->grad(index_);
  }

  void bind(std::shared_ptr<Group> group, std::size_t index, const Mesh& mesh, const Shape<R>& global) {
    auto& e = group->entries().at(index);
    Shape<R> local{};
    for (std::size_t d = 0; d < R; ++d) local[d] = e.local_extent.at(d);
    if (e.numel != std::size_t(dtensor::numel(local))) detail::throw_entry_mismatch(e.name, e.numel, local);
    value_.reset();  // emplace, not assign: assigning to a view would write through it
    // A deferred group has no values yet: a null view until current_value() materialises it.
    T* data = group->deferred() ? nullptr : group->value(index).data();
    value_.emplace(mesh, global, Tensor<T, R, space>::view(data, local));
    group_ = std::move(group);
    index_ = index;
  }

  value_type& checked_value() const {
    if (!value_) throw Error("Parameter", "use of a parameter that was never set");
    return const_cast<value_type&>(*value_);
  }

  /// The value, its view re-pointed first if the group's storage moved (FSDP released and
  /// re-materialized it: nn/flat_params.hpp); throws while the storage is released.
  value_type& current_value() const {
    auto& v = checked_value();
    group_->ensure_materialized();
    T* here = group_->value(index_).data();  // throws, naming the group, while released
    if (v.to_local().data() != here) {
      const auto mesh = v.mesh();  // copies: bind replaces the value they live in
      const auto shape = v.shape();
      const_cast<Parameter*>(this)->bind(group_, index_, mesh, shape);
    }
    return const_cast<value_type&>(*value_);
  }

  std::shared_ptr<Group> group_;
  std::size_t index_ = 0;
  std::optional<value_type> value_;  // a view into group_'s values
};

}  // namespace dtensor::nn
