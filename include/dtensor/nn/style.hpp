// dtensor/nn/style.hpp — how a module's tensors are laid out: activation layouts, and the
// parallel style a Linear is built with.
//
//   using X = nn::tokens<Mesh>;                 // [B*T, C], tokens split over the data dimensions
//   using Xsp = nn::tokens<Mesh, Shard<0>>;     // ... and over "tp" too (sequence parallel)
//   using W = nn::params<Mesh, Shard<0>>;       // split on "tp", replicated elsewhere
//   nn::Linear<float, Mesh, nn::Replicated<>> fc(...); // no tensor parallelism
//   nn::Linear<float, Mesh, parallel::ColwiseParallel<>> fc(...);   // a style from parallel/
//
// Modules work on a mesh with a dimension named "tp" (size 1 is fine); every other mesh
// dimension is a data-parallel one. Activations are 2-D [tokens, features] with the batch and
// sequence flattened (B*T rows), so their Shard<0> on the data dimensions splits the batch and
// Shard<0> on "tp" is the sequence-parallel split of the tokens. Parameters are replicated on
// the data dimensions.
//
// A LinearStyle says where a Linear's weight [out, in] and bias [out] live and which layouts its
// input and output have; the Linear then issues exactly two redistributions, each documented by
// the style: the *entry* (input layout -> the layout the matmul needs) and the *exit* (the
// matmul's output -> the output layout). Their backwards are the adjoint redistributions
// (redistribute_backward). PyTorch's ParallelStyle, with the layouts in the type.
#pragma once

#include "dtensor/nn/parameter.hpp"

namespace dtensor::nn {

/// The mesh dimension tensor (and sequence) parallelism use.
inline constexpr fixed_string tp_dim = "tp";

/// Activation layout: Shard<0> (tokens) on the data dimensions, P on "tp".
template <class Mesh, Placement P = Replicate>
using tokens = layout_on<Mesh, Shard<0>, On<"tp", P>>;

/// Parameter layout: Replicate on the data dimensions, P on "tp".
template <class Mesh, Placement P = Replicate>
using params = layout_on<Mesh, Replicate, On<"tp", P>>;

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

/// No tensor parallelism: every rank along "tp" holds the whole weight. The tokens are split on
/// the data dimensions, and on "tp" by P (Replicate: every rank along "tp" computes the same
/// output; Shard<0>: each its own tokens, as the norms and position embedding do under sequence
/// parallelism). No collectives. Serves Linear and Embedding (whose ids are tokens<Mesh, P>).
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
