// dtensor/nn/loss.hpp — mean cross-entropy of logits against integer targets.
//
//   nn::CrossEntropyLoss<float, Mesh, nn::tokens<Mesh>> ce;
//   auto [loss, saved] = ce.forward(logits, targets);   // logits [B, T, V], targets [B, T]
//   auto dlogits = ce.backward(std::move(saved));       // d(loss)/d(logits), in logits' layout
//   double value = full_tensor(loss)[0];                // the global mean (an all-reduce over the data dimensions)
//
// ops::cross_entropy on whole rows of [B*T, V] (a local reshape: the batch split stays a row
// split); the vocabulary must not be split (for a split vocabulary use
// parallel::VocabParallelCrossEntropy). The mean is over the global number of positions, so each
// rank's share is a Partial<sum> on the data dimensions and the gradients of replicated
// parameters come out Partial<sum> there. No communication.
#pragma once

#include <cstdint>

#include "dtensor/nn/module.hpp"
#include "dtensor/nn/style.hpp"
#include "dtensor/ops/shape.hpp"
#include "dtensor/ops/cross_entropy.hpp"

namespace dtensor::nn {

template <kernels::host::FloatElement T, MeshType Mesh, LayoutType LogitsL = tokens<Mesh>, class Id = std::int32_t>
class CrossEntropyLoss {
  static_assert(require_dense_roles<"nn::CrossEntropyLoss", Mesh>() && !has_role<Mesh, Role::context>,
                "nn::CrossEntropyLoss: rows split on a context dimension are not handled yet");
  static_assert(std::is_same_v<LogitsL, tokens<Mesh>>,
                "nn::CrossEntropyLoss takes logits whose vocabulary is whole (tokens<Mesh>); a split vocabulary is "
                "parallel::VocabParallelCrossEntropy");
  using RowsL = tokens<Mesh>;        // [B*T, V]: the batch split becomes a row split
  using TargetRowsL = tokens<Mesh>;  // [B*T]

 public:
  using Logits = DTensor<T, 3, Mesh, LogitsL>;
  using Targets = DTensor<Id, 2, Mesh, tokens<Mesh>>;
  using LossL = ops::rules::cross_entropy_t<RowsL, TargetRowsL>;
  using Loss = DTensor<double, 1, Mesh, LossL>;
  struct Saved {
    DTensor<T, 2, Mesh, RowsL> logits;
    DTensor<Id, 1, Mesh, TargetRowsL> targets;
    ops::CrossEntropyStats stats;
    Shape<3> shape;
  };

  /// No communication.
  Fwd<Loss, Saved> forward(const Logits& logits, const Targets& targets) const {
    detail::check(targets.extent(0) == logits.extent(0) && targets.extent(1) == logits.extent(1),
                  "nn::CrossEntropyLoss::forward", logits.mesh(), "logits ", to_string(logits.shape()), " and targets ",
                  to_string(targets.shape()), ": one target per position");
    const Extent rows = logits.extent(0) * logits.extent(1);
    auto l2 = ops::reshape<RowsL>(logits, Shape<2>{rows, logits.extent(2)});
    auto t1 = ops::reshape<TargetRowsL>(targets, Shape<1>{rows});
    auto r = ops::cross_entropy(l2, t1);
    return {std::move(r.loss), Saved{std::move(l2), std::move(t1), std::move(r.stats), logits.shape()}};
  }
  /// d(dloss * loss)/d(logits). No communication.
  Logits backward(Saved s, double dloss = 1.0) const {
    auto d = ops::cross_entropy_backward(s.logits, s.targets, s.stats, dloss);
    return ops::reshape<LogitsL>(d, s.shape);
  }
};

}  // namespace dtensor::nn
