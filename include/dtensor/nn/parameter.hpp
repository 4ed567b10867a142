// dtensor/nn/parameter.hpp — trainable parameters: a DTensor value and its gradient.
//
//   using W = nn::Parameter<float, 2, Mesh, nn::layout_on<Mesh, Replicate, nn::On<"tp", Shard<0>>>>;
//   W w("fc1.weight", distribute_replicated<W::layout>(mesh, full));   // full init on every rank
//   w.accumulate_grad(dw);        // dw: a DTensor whose placements may still be Partial
//   w.grad_state()                // its placements now, e.g. (P(avg), S(0)): dp still to reduce
//   w.grad()                      // the gradient in the parameter's layout (throws if Partial)
//   ParamList<float, 2> ps; w.collect(ps);   // type-erased views for optimizers and DDP
//
// A gradient has the parameter's placements where the parameter is sharded; where the parameter
// is replicated it is either Replicate (every rank computed the same values) or Partial<op>
// (each rank holds a share still to be reduced: data parallelism, sequence parallelism). The
// gradient's layout therefore changes at run time (Partial until the gradient sync reduces it),
// so a Parameter keeps the local piece plus a run-time LayoutDesc, and checks every incoming
// gradient's layout *type* at compile time. Local extents never change: a Partial piece has the
// extents of the Replicate one.
//
// ParamRef is the type-erased view (spans into the local pieces) that optimizers, gradient
// clipping and the bucketed all-reduces work on. Spans point into the Parameter: a module must
// not be moved after its ParamList was taken.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/mesh/fixed_string.hpp"

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

/// What optimizers and gradient syncs see of one parameter: this rank's pieces and placements.
template <class T, std::size_t N>
struct ParamRef {
  std::string name;
  std::span<T> value;             // local piece of the parameter
  std::span<T> grad;              // local piece of its gradient (same extents)
  LayoutDesc<N> layout;           // the parameter's placements
  LayoutDesc<N>* grad_state;      // the gradient's placements now (Partial = reduction pending)
  bool* has_grad;                 // whether a gradient was added since the last zero_grad
  bool decay = true;              // whether weight decay applies (not to biases and norm weights)

  /// Zero gradient, nothing pending.
  void zero_grad() const {
    std::fill(grad.begin(), grad.end(), T(0));
    *grad_state = layout;
    *has_grad = false;
  }
};

template <class T, std::size_t N>
using ParamList = std::vector<ParamRef<T, N>>;

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

template <Element T, std::size_t R, MeshType Mesh, LayoutType L>
class Parameter {
  static_assert(!L::desc.has_partial(), "a parameter's layout cannot be Partial: its value must be known per rank");

 public:
  using value_type = DTensor<T, R, Mesh, L>;
  using layout = L;
  static constexpr std::size_t mesh_ndim = Mesh::ndim;

  Parameter() = default;
  Parameter(std::string name, value_type value, bool decay = true)
      : name_(std::move(name)), value_(std::move(value)), grad_(value_.to_local().shape()), decay_(decay) {}

  const std::string& name() const noexcept { return name_; }
  const value_type& value() const noexcept { return value_; }
  value_type& value() noexcept { return value_; }
  const Mesh& mesh() const noexcept { return value_.mesh(); }
  bool decay() const noexcept { return decay_; }

  /// Sets the gradient to zero, with nothing pending.
  void zero_grad() {
    std::fill_n(grad_.data(), grad_.numel(), T(0));
    state_ = L::desc;
    touched_ = false;
  }

  /// Adds g to the gradient. g's layout must fit the parameter's (checked at compile time) and,
  /// when a gradient is already held, have the same pending reductions (checked at run time).
  template <LayoutType G>
  void accumulate_grad(const DTensor<T, R, Mesh, G>& g) {
    static_assert(detail::grad_layout_fits(L::desc, G::desc),
                  "a gradient must be sharded like its parameter, and be Replicate or Partial<sum|avg> where the "
                  "parameter is replicated");
    if (g.shape() != value_.shape())
      throw Error("Parameter::accumulate_grad",
                  dtensor::detail::cat(name_, ": gradient ", to_string(g.shape()), " for a parameter of ",
                                       to_string(value_.shape())),
                  value_.mesh().rank());
    if (touched_ && !(state_ == G::desc))
      throw Error("Parameter::accumulate_grad",
                  dtensor::detail::cat(name_, ": gradient in layout ", to_string(G::desc),
                                       " added to one held in layout ", to_string(state_)),
                  value_.mesh().rank());
    const auto& gl = g.to_local();
    T* d = grad_.data();
    for (Extent i = 0, n = gl.numel(); i < n; ++i) d[i] = T(d[i] + gl[i]);
    state_ = G::desc;
    touched_ = true;
  }

  /// The gradient's placements now.
  const LayoutDesc<mesh_ndim>& grad_state() const noexcept { return state_; }
  const Tensor<T, R>& grad_local() const noexcept { return grad_; }

  /// The gradient in the parameter's layout; throws while a reduction is pending.
  value_type grad() const {
    if (!is_reduced(state_))
      throw Error("Parameter::grad",
                  dtensor::detail::cat(name_, ": gradient is ", to_string(state_),
                                       ", still Partial: run the gradient sync (DataParallel, sequence parallel) first"),
                  value_.mesh().rank());
    return value_type(value_.mesh(), value_.shape(), grad_);
  }

  /// Appends this parameter's type-erased view.
  template <class U = T>
  void collect(ParamList<U, mesh_ndim>& out) {
    out.push_back(ParamRef<U, mesh_ndim>{name_, value_.local().span(), grad_.span(), L::desc, &state_, &touched_, decay_});
  }

 private:
  std::string name_;
  value_type value_;
  Tensor<T, R> grad_;
  LayoutDesc<mesh_ndim> state_ = L::desc;
  bool touched_ = false;
  bool decay_ = true;
};

}  // namespace dtensor::nn
