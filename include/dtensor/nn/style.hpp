// dtensor/nn/style.hpp — how a module's tensors are laid out: activation layouts, and the
// parallel style a Linear is built with.
//
//   using X = nn::tokens<Mesh>;                   // [B, T, C]: batch split over the data dimensions
//   using Xsp = nn::tokens<Mesh, nn::SeqSplit>;   // ... and the sequence over the tensor dimension (SP)
//   using W = nn::params<Mesh, Shard<0>>;         // split on the tensor dimension, replicated elsewhere
//   nn::Linear<float, Mesh, nn::Replicated<>> fc(...); // no tensor parallelism
//   nn::Linear<float, Mesh, parallel::ColwiseParallel<>> fc(...);   // a style from parallel/
//
// Modules read the roles of the mesh's dimensions (mesh/roles.hpp), never their names.
// Activations are [batch, sequence, features]: Shard<0> (the batch) on every data dimension,
// and on the tensor dimension Replicate, SeqSplit (Shard<1>: sequence parallelism, where norms
// and residual adds run on this rank's positions) or FeatureSplit (Shard<2>: inside a
// tensor-parallel region). Token ids and targets are [B, T] with the same batch split.
// On a context dimension activations are Shard<1> (context parallelism: this rank's positions
// for the whole model; only attention looks across positions, see nn/attention.hpp).
// Parameters are replicated on the data and context dimensions. A mesh without a tensor dimension
// is fine (no tensor parallelism); a dimension of another role (pipeline, expert, or none) is a
// compile error naming it (nn::require_dense_roles).
//
// A LinearStyle says where a Linear's weight [out, in] and bias [out] live and which layouts its
// input and output have; the Linear then issues exactly two redistributions, each documented by
// the style: the *entry* (input layout -> the layout the matmul needs) and the *exit* (the
// matmul's output -> the output layout). Their backwards are the adjoint redistributions
// (redistribute_backward). PyTorch's ParallelStyle, with the layouts in the type.
#pragma once

#include "dtensor/core/error.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/nn/parameter.hpp"

namespace dtensor::nn {

/// The index of the mesh's tensor dimension, or Mesh::ndim when it has none.
template <class Mesh>
inline constexpr std::size_t tensor_dim = role_dim<Mesh, Role::tensor>;

/// The size of the mesh's tensor dimension (1 without one).
template <class Mesh>
int tensor_size(const Mesh& mesh) {
  return role_size<Role::tensor>(mesh);
}

/// Placements of activations [B, T, C] on the tensor dimension.
using SeqSplit = Shard<1>;      // sequence parallelism: this rank's positions
using FeatureSplit = Shard<2>;  // inside a tensor-parallel region: this rank's features (heads)

namespace detail {
template <class Mesh, Placement OnData, Placement OnTensor, Placement OnContext, std::size_t... I>
auto layout_by_role(std::index_sequence<I...>)
    -> Layout<std::conditional_t<
        role_of<Mesh>(I) == Role::tensor, OnTensor,
        std::conditional_t<role_of<Mesh>(I) == Role::context, OnContext,
                           std::conditional_t<is_data_dim<Mesh>(I), OnData, Replicate>>>...>;
}  // namespace detail

/// The layout with OnData on every data dimension, OnTensor on the tensor dimension and
/// OnContext on the context dimension.
template <class Mesh, Placement OnData, Placement OnTensor, Placement OnContext = Replicate>
using layout_by_role =
    decltype(detail::layout_by_role<Mesh, OnData, OnTensor, OnContext>(std::make_index_sequence<Mesh::ndim>{}));

/// Activation layout [B, T, C] (or ids [B, T]): the batch split on the data dimensions, the
/// sequence on the context dimension (context parallelism; parallel/context_layout.hpp says in
/// which order it is stored), P on the tensor dimension. With both a context dimension and
/// sequence parallelism the context dimension must come before the tensor dimension in the
/// mesh, so that it splits the sequence first.
template <class Mesh, Placement P = Replicate>
using tokens = layout_by_role<Mesh, Shard<0>, P, Shard<1>>;

/// Parameter layout: Replicate on the data and context dimensions, P on the tensor dimension.
template <class Mesh, Placement P = Replicate>
using params = layout_by_role<Mesh, Replicate, P>;

/// Every gradient the modules produce is Partial<sum> on the data dimensions: the loss is the
/// mean over the global batch, each rank's share of it a Partial<sum> (ops::cross_entropy's
/// rule), so each rank's gradient is its share of the sum.
template <class S, class Mesh>
concept LinearStyle = requires {
  typename S::template weight_layout<Mesh>;  // [out, in]
  typename S::template bias_layout<Mesh>;    // [out]
  typename S::template input_layout<Mesh>;   // what forward takes
  typename S::template compute_layout<Mesh>; // what the matmul takes (the entry redistributes to it)
  typename S::template output_layout<Mesh>;  // what forward returns (the exit redistributes to it)
  { S::bias_after_exit } -> std::convertible_to<bool>;  // add the bias after the exit (row-wise)
  { S::name } -> std::convertible_to<std::string_view>;
};

/// No tensor parallelism: every rank along the tensor dimension holds the whole weight. The batch
/// is split on the data dimensions, and on the tensor dimension by P (Replicate: every rank
/// computes the same output; SeqSplit: each its own positions, as the norms and position
/// embedding do under sequence parallelism). No collectives. Serves Linear and Embedding (whose
/// ids are tokens<Mesh, P>).
template <Placement P = Replicate>
struct Replicated {
  static constexpr std::string_view name = "Replicated";
  template <class Mesh> using weight_layout = params<Mesh>;
  template <class Mesh> using bias_layout = params<Mesh>;
  template <class Mesh> using input_layout = tokens<Mesh, P>;
  template <class Mesh> using compute_layout = tokens<Mesh, P>;
  template <class Mesh> using output_layout = tokens<Mesh, P>;
  template <class Mesh> using ids_layout = tokens<Mesh, P>;
  static constexpr bool bias_after_exit = false;
};

/// An Embedding's style: where the table [V, C] lives, the ids' layout, and the output layout
/// the lookup's result is redistributed to (the exit).
template <class S, class Mesh>
concept EmbeddingStyle = requires {
  typename S::template weight_layout<Mesh>;
  typename S::template ids_layout<Mesh>;
  typename S::template output_layout<Mesh>;
};

namespace detail {
using dtensor::detail::check;  // check(ok, op, mesh, parts...) throws dtensor::Error naming the rank
}  // namespace detail

}  // namespace dtensor::nn
