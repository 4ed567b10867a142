// dtensor/parallel/tensor_parallel.hpp — tensor- and sequence-parallel styles for nn::Linear.
//
//   nn::Linear<float, Mesh, parallel::ColwiseParallel<>>              q;    // Replicate in, features split out
//   nn::Linear<float, Mesh, parallel::RowwiseParallel<>>              o;    // features split in, Replicate out
//   nn::Linear<float, Mesh, parallel::ColwiseParallel<nn::SeqSplit>>  fc1;  // sequence parallel in (all-gather)
//   nn::Linear<float, Mesh, parallel::RowwiseParallel<nn::SeqSplit>>  fc2;  // sequence parallel out (reduce-scatter)
//
// PyTorch's styles (torch.distributed.tensor.parallel), on the mesh's tensor dimension (its role,
// mesh/roles.hpp, not its name); the data dimensions split the batch and replicate the weights
// (nn/style.hpp). A Linear's weight is [out, in]. Activations are [B, T, features].
//
//   ColwiseParallel<In = Replicate>: weight Shard<0> (output features), bias Shard<0>.
//     input tokens<In> -> entry -> tokens<Replicate> -> matmul -> tokens<FeatureSplit> (no exit).
//     entry: In = Replicate: none (backward: all-reduce of dx, the Partial<sum> of the shards);
//            In = SeqSplit (sequence parallel): all-gather of the sequence (backward: the saved
//            shard all-gathered again for the weight gradient, and a reduce-scatter of dx).
//   RowwiseParallel<Out = Replicate>: weight Shard<1> (input features), bias Replicate (added
//     after the exit, once). input tokens<FeatureSplit> -> matmul -> tokens<Partial<sum>> -> exit.
//     exit: Out = Replicate: all-reduce (backward: none);
//           Out = SeqSplit (sequence parallel): reduce-scatter of the sequence (backward: all-gather).
//
// The bytes: an all-reduce or all-gather or reduce-scatter of [B, T, features] per rank of the
// tensor dimension (this rank's batch shard). Column-wise then row-wise (Megatron's MLP and
// attention) has one collective forward and one backward without sequence parallelism, or an
// all-gather and a reduce-scatter each way with it, plus the column-wise Linear's re-gather in
// backward (it saves its input's shard, as Megatron does: nn/linear.hpp). Under sequence parallelism the norms,
// residuals and dropout between the TP regions run on tokens<SeqSplit>: see
// sequence_parallel_grads below for their weights.
#pragma once

#include "dtensor/nn/style.hpp"
#include "dtensor/parallel/detail/buckets.hpp"

namespace dtensor::parallel {

/// Column-wise Linear on the tensor dimension: weight Shard<0>, output features split. In:
/// Replicate, or SeqSplit for a sequence-parallel input (then the entry is an all-gather).
template <Placement In = Replicate>
struct ColwiseParallel {
  static_assert(std::is_same_v<In, Replicate> || std::is_same_v<In, nn::SeqSplit>,
                "ColwiseParallel<In>: the input is Replicate, or nn::SeqSplit (sequence parallel) on the tensor "
                "dimension");
  static constexpr std::string_view name = "ColwiseParallel";
  template <class Mesh> using weight_layout = nn::params<Mesh, Shard<0>>;
  template <class Mesh> using bias_layout = nn::params<Mesh, Shard<0>>;
  template <class Mesh> using input_layout = nn::tokens<Mesh, In>;
  template <class Mesh> using compute_layout = nn::tokens<Mesh, Replicate>;
  template <class Mesh> using output_layout = nn::tokens<Mesh, nn::FeatureSplit>;
  static constexpr bool bias_after_exit = false;
};

/// Row-wise Linear on the tensor dimension: weight Shard<1>, input features split, output
/// reduced: Replicate (all-reduce) or SeqSplit (reduce-scatter of the sequence, sequence parallel).
template <Placement Out = Replicate>
struct RowwiseParallel {
  static_assert(std::is_same_v<Out, Replicate> || std::is_same_v<Out, nn::SeqSplit>,
                "RowwiseParallel<Out>: the output is Replicate (all-reduce) or nn::SeqSplit (reduce-scatter, sequence "
                "parallel) on the tensor dimension");
  static constexpr std::string_view name = "RowwiseParallel";
  template <class Mesh> using weight_layout = nn::params<Mesh, Shard<1>>;
  template <class Mesh> using bias_layout = nn::params<Mesh, Replicate>;
  template <class Mesh> using input_layout = nn::tokens<Mesh, nn::FeatureSplit>;
  template <class Mesh> using compute_layout = nn::tokens<Mesh, nn::FeatureSplit>;
  template <class Mesh> using output_layout = nn::tokens<Mesh, Out>;
  static constexpr bool bias_after_exit = true;
};

/// The tensor-dimension placement of activations between TP regions: Replicate, or SeqSplit
/// (the sequence) under sequence parallelism.
template <bool SP>
using between_regions = std::conditional_t<SP, nn::SeqSplit, Replicate>;

struct SequenceParallelOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;
};

/// Sequence parallelism leaves the gradients of the weights used between the TP regions (norms,
/// row-wise biases, position embeddings) Partial<sum> on the tensor dimension: each rank saw
/// only its positions. This all-reduces them, bucketed like DataParallel: one all-reduce on the
/// tensor dimension per bucket (none without sequence parallelism, where they are Replicate).
/// These parameters are scattered through the flat groups, so a bucket packs them into one
/// buffer (they are small: norms and biases). Returns the number of buckets.
template <class T, MeshType Mesh>
std::size_t sequence_parallel_grads(nn::ParamList<T, Mesh::ndim, mesh_space_t<Mesh>>& ps, const Mesh& mesh,
                                    SequenceParallelOptions o = {}) {
  if (o.bucket_bytes == 0) throw Error("sequence_parallel_grads", "bucket_bytes must be > 0", mesh.rank());
  constexpr std::size_t tp = nn::tensor_dim<Mesh>;
  if constexpr (tp == Mesh::ndim) {
    return 0;  // no tensor dimension: nothing can be pending on it
  } else {
    for (const auto& p : ps) {
      const auto& g = p.grad_state->placements[tp];
      if (g.is_partial() && g.op != ReduceOp::sum)
        mesh.comm().fail("sequence_parallel_grads",
                         dtensor::detail::cat("gradient of ", p.name, " is ", to_string(*p.grad_state),
                                              ": expected Partial<sum> on the tensor dimension \"", Mesh::names[tp], "\""));
    }
    return detail::bucketed_all_reduce(ps, mesh, tp, {.bucket_bytes = o.bucket_bytes, .contiguous_only = false});
  }
}

}  // namespace dtensor::parallel
