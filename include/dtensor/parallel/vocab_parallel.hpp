// dtensor/parallel/vocab_parallel.hpp — the vocabulary split over the tensor dimension:
// embedding and loss.
//
//   nn::Embedding<float, Mesh, parallel::VocabParallel<>> wte("wte", mesh, V, C, seed);              // out Replicate
//   nn::Embedding<float, Mesh, parallel::VocabParallel<nn::SeqSplit>> wte(...);                      // out sequence-split
//   parallel::VocabParallelCrossEntropy<float, Mesh> ce;                                              // loss parallel
//   auto [loss, saved] = ce.forward(logits, targets);   // logits [B, T, V] split on V, targets [B, T]
//   auto dlogits = ce.backward(std::move(saved));
//
// VocabParallel<Out> (an nn::EmbeddingStyle): the table [V, C] is Shard<0> (rows) on the tensor
// dimension; the ids [B, T] are whole there (split over the data dimensions); each rank looks up
// the ids in its rows and writes zeros for the others, so the lookup is Partial<sum> (ops::embedding).
// The exit: Out = Replicate: one all-reduce of [B, T, C]; Out = SeqSplit (sequence parallel): one
// reduce-scatter of the sequence. Backward: the exit's adjoint (none, or an all-gather of the
// sequence), then each rank scatters into its own rows: the gradient is Shard<0> like the table.
//
// VocabParallelCrossEntropy (loss parallel): the logits [B, T, V] are FeatureSplit on the tensor
// dimension (the output of a column-wise LM head) and are never gathered. Per position, three
// all-reduces on the tensor dimension of one double per position of this rank: the max (max),
// the sum of exp(x - max) over this rank's columns (sum), and the target's logit (sum; 0 on the
// ranks that do not hold it). The loss is the mean over the global positions, a [1] DTensor
// Partial<sum> on the data dimensions and Replicate on the tensor dimension; the backward is
// local: softmax - onehot on this rank's columns, no communication. The kernels are
// kernels/host/cross_entropy.hpp's vocab_parallel_ce_* on the local [positions, V/tp] rows.
#pragma once

#include <cstdint>
#include <span>

#include "dtensor/nn/loss.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/nn/style.hpp"

namespace dtensor::parallel {

/// An nn::EmbeddingStyle: table rows split on the tensor dimension, lookup Partial<sum>, exit to tokens<Out>.
template <Placement Out = Replicate>
struct VocabParallel {
  static_assert(std::is_same_v<Out, Replicate> || std::is_same_v<Out, nn::SeqSplit>,
                "VocabParallel<Out>: the output is Replicate (all-reduce) or nn::SeqSplit (reduce-scatter) on the "
                "tensor dimension");
  static constexpr std::string_view name = "VocabParallel";
  template <class Mesh> using weight_layout = nn::params<Mesh, Shard<0>>;
  template <class Mesh> using ids_layout = nn::tokens<Mesh, Replicate>;
  template <class Mesh> using output_layout = nn::tokens<Mesh, Out>;
};

template <kernels::host::FloatElement T, MeshType Mesh, class Id = std::int32_t>
class VocabParallelCrossEntropy {
  static_assert(has_role<Mesh, Role::tensor>,
                "VocabParallelCrossEntropy splits the vocabulary over the mesh's tensor dimension: the mesh has none");
  static_assert(nn::require_dense_roles<"parallel::VocabParallelCrossEntropy", Mesh>());
  using Impl = nn::detail::PositionCrossEntropy<T, Mesh, nn::tokens<Mesh, nn::FeatureSplit>, Id>;

 public:
  using LogitsL = nn::tokens<Mesh, nn::FeatureSplit>;
  using Logits = typename Impl::Logits;
  using Targets = typename Impl::Targets;
  using LossL = typename Impl::LossL;
  using Loss = typename Impl::Loss;
  using Saved = typename Impl::Saved;

  /// Three all-reduces on the tensor dimension of one double per local position (max, sum-exp,
  /// target logit); none when that dimension has size 1.
  nn::Fwd<Loss, Saved> forward(const Logits& logits, const Targets& targets) const {
    return impl_.forward("VocabParallelCrossEntropy::forward", logits, targets);
  }
  /// This rank's columns of d(dloss * loss)/d(logits). No communication.
  Logits backward(Saved s, double dloss = 1.0) const { return impl_.backward(std::move(s), dloss); }

 private:
  Impl impl_;
};

}  // namespace dtensor::parallel
