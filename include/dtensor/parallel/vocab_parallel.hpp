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

#include "dtensor/kernels/host/cross_entropy.hpp"
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
  static_assert(nn::require_dense_roles<"parallel::VocabParallelCrossEntropy", Mesh>() && !has_role<Mesh, Role::context>,
                "parallel::VocabParallelCrossEntropy: rows split on a context dimension are not handled yet");

 public:
  using LogitsL = nn::tokens<Mesh, nn::FeatureSplit>;
  using Logits = DTensor<T, 3, Mesh, LogitsL>;
  using Targets = DTensor<Id, 2, Mesh, nn::tokens<Mesh>>;
  using LossL = nn::layout_by_role<Mesh, Partial<ReduceOp::sum>, Replicate>;
  using Loss = DTensor<double, 1, Mesh, LossL>;
  static constexpr std::size_t tp = nn::tensor_dim<Mesh>;

  /// What the backward needs: this rank's logits and targets as rows, and the row statistics.
  struct Saved {
    Logits logits;
    Tensor<Id, 1> targets;
    Tensor<double, 1> max, sum;
  };

  /// Three all-reduces on the tensor dimension of one double per local position (max, sum-exp,
  /// target logit); none when that dimension has size 1.
  nn::Fwd<Loss, Saved> forward(const Logits& logits, const Targets& targets) const {
    const auto& mesh = logits.mesh();
    nn::detail::check(targets.extent(0) == logits.extent(0) && targets.extent(1) == logits.extent(1),
                      "VocabParallelCrossEntropy::forward", mesh, "logits ", to_string(logits.shape()), " and targets ",
                      to_string(targets.shape()), ": one target per position");
    Saved s{logits, targets.to_local().template reshape<1>(Shape<1>{targets.to_local().numel()}), {}, {}};
    const auto& tl = s.targets;
    for (Extent i = 0; i < tl.numel(); ++i)
      nn::detail::check(tl[i] >= 0 && Extent(tl[i]) < logits.extent(2), "VocabParallelCrossEntropy::forward", mesh,
                        "target ", Extent(tl[i]), " at local position ", i, " is outside the vocabulary [0, ",
                        logits.extent(2), ")");
    auto& g = mesh.group(tp);
    // A tensor dimension of size 1 holds the whole vocabulary: nothing to reduce (like the
    // redistributions, which issue nothing on a group of one rank).
    auto all_reduce = [&](Tensor<double, 1>& t, ReduceOp op) {
      if (g.size() > 1) g.all_reduce(t.span(), op);
    };
    const auto rows = local_rows(s.logits);
    const Extent v0 = logits.local_box().offset[2];
    s.max = kernels::host::vocab_parallel_ce_max(rows);
    all_reduce(s.max, ReduceOp::max);
    s.sum = kernels::host::vocab_parallel_ce_sum_exp(rows, s.max);
    all_reduce(s.sum, ReduceOp::sum);
    auto target = kernels::host::vocab_parallel_ce_target_logit(rows, tl, v0);
    all_reduce(target, ReduceOp::sum);
    Tensor<double, 1> loss(Shape<1>{1});
    loss[0] = kernels::host::vocab_parallel_ce_loss(s.max, s.sum, target, positions(logits));
    return {Loss(mesh, Shape<1>{1}, std::move(loss)), std::move(s)};
  }

  /// This rank's columns of d(dloss * loss)/d(logits). No communication.
  Logits backward(Saved s, double dloss = 1.0) const {
    const auto& l = s.logits;
    auto d = kernels::host::vocab_parallel_ce_backward(local_rows(l), s.targets, l.local_box().offset[2], s.max, s.sum,
                                                       dloss, positions(l));
    return Logits(l.mesh(), l.shape(), std::move(d).template reshape<3>(l.to_local().shape()));
  }

 private:
  static Extent positions(const Logits& l) { return l.extent(0) * l.extent(1); }
  /// This rank's logits as [positions, local vocabulary] rows (a view: no copy).
  static Tensor<T, 2> local_rows(const Logits& l) {
    const auto& t = l.to_local();
    return Tensor<T, 2>::view(const_cast<T*>(t.data()), Shape<2>{t.extent(0) * t.extent(1), t.extent(2)});
  }
};

}  // namespace dtensor::parallel
