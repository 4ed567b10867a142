// dtensor/parallel/tensor_parallel.hpp — tensor- and sequence-parallel styles for nn::Linear.
//
//   nn::Linear<float, Mesh, parallel::ColwiseParallel<>>          q;    // Replicate in, features split out
//   nn::Linear<float, Mesh, parallel::RowwiseParallel<>>          o;    // features split in, Replicate out
//   nn::Linear<float, Mesh, parallel::ColwiseParallel<Shard<0>>>  fc1;  // sequence parallel in (all-gather)
//   nn::Linear<float, Mesh, parallel::RowwiseParallel<Shard<0>>>  fc2;  // sequence parallel out (reduce-scatter)
//
// PyTorch's styles (torch.distributed.tensor.parallel), on the "tp" mesh dimension; the data
// dimensions split the tokens and replicate the weights (nn/style.hpp). A Linear's weight is
// [out, in]. Activations are [tokens, features].
//
//   ColwiseParallel<In = Replicate>: weight Shard<0> (output features), bias Shard<0>.
//     input tokens<In> -> entry -> tokens<Replicate> -> matmul -> tokens<Shard<1>> (no exit).
//     entry: In = Replicate: none (backward: all-reduce of dx, the Partial<sum> of the shards);
//            In = Shard<0> (sequence parallel): all-gather of the tokens (backward: reduce-scatter).
//   RowwiseParallel<Out = Replicate>: weight Shard<1> (input features), bias Replicate (added
//     after the exit, once). input tokens<Shard<1>> -> matmul -> tokens<Partial<sum>> -> exit.
//     exit: Out = Replicate: all-reduce (backward: none);
//           Out = Shard<0> (sequence parallel): reduce-scatter of the tokens (backward: all-gather).
//
// The bytes: an all-reduce or all-gather or reduce-scatter of [tokens, features] per rank of "tp"
// (tokens of this rank's data shard). Column-wise then row-wise (Megatron's MLP and attention)
// has one collective forward and one backward without sequence parallelism, or an all-gather and
// a reduce-scatter each way with it. Under sequence parallelism the norms, residuals and dropout
// between the TP regions run on tokens<Shard<0>>: see sequence_parallel_grads below for their
// weights.
#pragma once

#include "dtensor/nn/style.hpp"
#include "dtensor/parallel/detail/buckets.hpp"

namespace dtensor::parallel {

/// Column-wise Linear on "tp": weight Shard<0>, output features split. In: Replicate, or
/// Shard<0> for a sequence-parallel input (then the entry is an all-gather of the tokens).
template <Placement In = Replicate>
struct ColwiseParallel {
  static_assert(std::is_same_v<In, Replicate> || std::is_same_v<In, Shard<0>>,
                "ColwiseParallel<In>: the input is Replicate, or Shard<0> (sequence parallel) on \"tp\"");
  static constexpr std::string_view name = "ColwiseParallel";
  template <class Mesh> using weight_layout = nn::params<Mesh, Shard<0>>;
  template <class Mesh> using bias_layout = nn::params<Mesh, Shard<0>>;
  template <class Mesh> using input_layout = nn::tokens<Mesh, In>;
  template <class Mesh> using compute_layout = nn::tokens<Mesh, Replicate>;
  template <class Mesh> using output_layout = nn::tokens<Mesh, Shard<1>>;
  static constexpr bool bias_after_exit = false;
};

/// Row-wise Linear on "tp": weight Shard<1>, input features split, output reduced: Replicate
/// (all-reduce) or Shard<0> (reduce-scatter of the tokens, sequence parallel).
template <Placement Out = Replicate>
struct RowwiseParallel {
  static_assert(std::is_same_v<Out, Replicate> || std::is_same_v<Out, Shard<0>>,
                "RowwiseParallel<Out>: the output is Replicate (all-reduce) or Shard<0> (reduce-scatter, sequence "
                "parallel) on \"tp\"");
  static constexpr std::string_view name = "RowwiseParallel";
  template <class Mesh> using weight_layout = nn::params<Mesh, Shard<1>>;
  template <class Mesh> using bias_layout = nn::params<Mesh, Replicate>;
  template <class Mesh> using input_layout = nn::tokens<Mesh, Shard<1>>;
  template <class Mesh> using compute_layout = nn::tokens<Mesh, Shard<1>>;
  template <class Mesh> using output_layout = nn::tokens<Mesh, Out>;
  static constexpr bool bias_after_exit = true;
};

/// The "tp" placement of activations between TP regions: Replicate, or Shard<0> (the tokens)
/// under sequence parallelism.
template <bool SP>
using between_regions = std::conditional_t<SP, Shard<0>, Replicate>;

struct SequenceParallelOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;
};

/// Sequence parallelism leaves the gradients of the weights used between the TP regions (norms,
/// row-wise biases, position embeddings) Partial<sum> on "tp": each rank saw only its tokens.
/// This all-reduces them, bucketed like DataParallel: one all-reduce on "tp" per bucket (none
/// without sequence parallelism, where they are Replicate). Returns the number of buckets.
template <class T, MeshType Mesh>
std::size_t sequence_parallel_grads(nn::ParamList<T, Mesh::ndim>& ps, const Mesh& mesh,
                                    SequenceParallelOptions o = {}) {
  if (o.bucket_bytes == 0) throw Error("sequence_parallel_grads", "bucket_bytes must be > 0", mesh.rank());
  constexpr std::size_t tp = Mesh::template index_of<"tp">();
  for (const auto& p : ps) {
    const auto& g = p.grad_state->placements[tp];
    if (g.is_partial() && g.op != ReduceOp::sum)
      mesh.comm().fail("sequence_parallel_grads", dtensor::detail::cat("gradient of ", p.name, " is ", to_string(*p.grad_state),
                                                                   ": expected Partial<sum> on \"tp\""));
  }
  return detail::bucketed_all_reduce(ps, mesh, tp, o.bucket_bytes);
}

}  // namespace dtensor::parallel
