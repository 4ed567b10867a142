// dtensor/parallel/vocab_parallel.hpp — the vocabulary split over "tp": embedding and loss.
//
//   nn::Embedding<float, Mesh, parallel::VocabParallel<>> wte("wte", mesh, V, C, seed);   // out Replicate
//   nn::Embedding<float, Mesh, parallel::VocabParallel<Shard<0>>> wte(...);               // out sequence-split
//   parallel::VocabParallelCrossEntropy<float, Mesh> ce;                                  // loss parallel
//   auto loss = ce.forward(logits, targets);   // logits [N, V] split on V over "tp"
//   auto dlogits = ce.backward();
//
// VocabParallel<Out> (an nn::EmbeddingStyle): the table [V, C] is Shard<0> (rows) on "tp"; the
// ids are whole on "tp" (split over the data dimensions); each rank looks up the ids in its rows
// and writes zeros for the others, so the lookup is Partial<sum> on "tp" (ops::embedding). The
// exit: Out = Replicate: one all-reduce of [tokens, C]; Out = Shard<0> (sequence parallel): one
// reduce-scatter of the tokens. Backward: the exit's adjoint (none, or an all-gather of the
// tokens), then each rank scatters into its own rows: the gradient is Shard<0> like the table.
//
// VocabParallelCrossEntropy (loss parallel): the logits [N, V] are Shard<1> on "tp" (the output of
// a column-wise LM head) and are never gathered. Per row, three all-reduces on "tp" of one double
// per row of this rank: the row max (max), the sum of exp(x - max) over this rank's columns
// (sum), and the target's logit (sum; 0 on the ranks that do not hold it). The loss is the mean
// over the global rows, a [1] DTensor Partial<sum> on the data dimensions and Replicate on "tp";
// the backward is local: softmax - onehot on this rank's columns, no communication. The kernels
// are kernels/host/cross_entropy.hpp's vocab_parallel_ce_*.
#pragma once

#include <cstdint>
#include <span>

#include "dtensor/kernels/host/cross_entropy.hpp"
#include "dtensor/nn/style.hpp"

namespace dtensor::parallel {

/// An nn::EmbeddingStyle: table rows split on "tp", lookup Partial<sum>, exit to tokens<Out>.
template <Placement Out = Replicate>
struct VocabParallel {
  static_assert(std::is_same_v<Out, Replicate> || std::is_same_v<Out, Shard<0>>,
                "VocabParallel<Out>: the output is Replicate (all-reduce) or Shard<0> (reduce-scatter) on \"tp\"");
  static constexpr std::string_view name = "VocabParallel";
  template <class Mesh> using weight_layout = nn::params<Mesh, Shard<0>>;
  template <class Mesh> using ids_layout = nn::tokens<Mesh, Replicate>;
  template <class Mesh> using output_layout = nn::tokens<Mesh, Out>;
};

template <kernels::host::FloatElement T, MeshType Mesh, class Id = std::int32_t>
class VocabParallelCrossEntropy {
 public:
  using LogitsL = nn::tokens<Mesh, Shard<1>>;
  using Logits = DTensor<T, 2, Mesh, LogitsL>;
  using Targets = DTensor<Id, 1, Mesh, nn::tokens<Mesh>>;
  using LossL = nn::layout_on<Mesh, Partial<ReduceOp::sum>, nn::On<"tp", Replicate>>;
  using Loss = DTensor<double, 1, Mesh, LossL>;
  static constexpr std::size_t tp = Mesh::template index_of<"tp">();

  /// Three all-reduces on "tp" of one double per local row (max, sum-exp, target logit).
  Loss forward(const Logits& logits, const Targets& targets) {
    const auto& mesh = logits.mesh();
    nn::detail::check(targets.extent(0) == logits.extent(0), "VocabParallelCrossEntropy::forward", mesh, "logits ",
                      to_string(logits.shape()), " and targets ", to_string(targets.shape()), ": one target per row");
    const auto& tl = targets.to_local();
    for (Extent i = 0; i < tl.numel(); ++i)
      nn::detail::check(tl[i] >= 0 && Extent(tl[i]) < logits.extent(1), "VocabParallelCrossEntropy::forward", mesh,
                        "target ", Extent(tl[i]), " at local row ", i, " is outside the vocabulary [0, ",
                        logits.extent(1), ")");
    auto& g = mesh.group(tp);
    const auto& ll = logits.to_local();
    const Extent v0 = logits.local_box().offset[1];
    max_ = kernels::host::vocab_parallel_ce_max(ll);
    g.all_reduce(max_.span(), ReduceOp::max);
    sum_ = kernels::host::vocab_parallel_ce_sum_exp(ll, max_);
    g.all_reduce(sum_.span(), ReduceOp::sum);
    auto target = kernels::host::vocab_parallel_ce_target_logit(ll, tl, v0);
    g.all_reduce(target.span(), ReduceOp::sum);
    Tensor<double, 1> loss(Shape<1>{1});
    loss[0] = kernels::host::vocab_parallel_ce_loss(max_, sum_, target, logits.extent(0));
    logits_ = logits;
    targets_ = targets;
    return Loss(mesh, Shape<1>{1}, std::move(loss));
  }

  /// This rank's columns of d(dloss * loss)/d(logits). No communication.
  Logits backward(double dloss = 1.0) {
    if (logits_.numel() == 0) throw Error("VocabParallelCrossEntropy::backward", "no forward before it");
    auto d = kernels::host::vocab_parallel_ce_backward(logits_.to_local(), targets_.to_local(),
                                                       logits_.local_box().offset[1], max_, sum_, dloss,
                                                       logits_.extent(0));
    Logits out(logits_.mesh(), logits_.shape(), std::move(d));
    release();
    return out;
  }
  void release() {
    logits_ = {};
    targets_ = {};
  }

 private:
  Logits logits_;
  Targets targets_;
  Tensor<double, 1> max_, sum_;
};

}  // namespace dtensor::parallel
