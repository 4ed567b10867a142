// dtensor/nn/loss.hpp — mean cross-entropy of logits against integer targets.
//
//   nn::CrossEntropyLoss<float, Mesh, nn::tokens<Mesh>> ce;
//   auto loss = ce.forward(logits, targets);   // [1] DTensor<double>: Partial<sum> on the data dimensions
//   auto dlogits = ce.backward();              // d(loss)/d(logits), in logits' layout
//   double value = full_tensor(loss)[0];       // the global mean (an all-reduce over the data dimensions)
//
// ops::cross_entropy on whole rows (the vocabulary must not be split on "tp"; for a split
// vocabulary use parallel::VocabParallelCrossEntropy). The mean is over the global number of
// rows, so each rank's share is a Partial<sum> and the gradients of replicated parameters come
// out Partial<sum> on the data dimensions. No communication.
#pragma once

#include <cstdint>

#include "dtensor/nn/style.hpp"
#include "dtensor/ops/cross_entropy.hpp"

namespace dtensor::nn {

template <kernels::host::FloatElement T, MeshType Mesh, LayoutType LogitsL = tokens<Mesh>, class Id = std::int32_t>
class CrossEntropyLoss {
 public:
  using Logits = DTensor<T, 2, Mesh, LogitsL>;
  using Targets = DTensor<Id, 1, Mesh, tokens<Mesh>>;
  using LossL = ops::rules::cross_entropy_t<LogitsL, tokens<Mesh>>;
  using Loss = DTensor<double, 1, Mesh, LossL>;

  /// No communication.
  Loss forward(const Logits& logits, const Targets& targets) {
    auto r = ops::cross_entropy(logits, targets);
    logits_ = logits;
    targets_ = targets;
    stats_ = std::move(r.stats);
    return std::move(r.loss);
  }
  /// d(dloss * loss)/d(logits). No communication.
  Logits backward(double dloss = 1.0) {
    if (logits_.numel() == 0) throw Error("nn::CrossEntropyLoss::backward", "no forward before it");
    auto d = ops::cross_entropy_backward(logits_, targets_, stats_, dloss);
    release();
    return d;
  }
  void release() {
    logits_ = {};
    targets_ = {};
    stats_ = {};
  }

 private:
  Logits logits_;
  Targets targets_;
  ops::CrossEntropyStats stats_;
};

}  // namespace dtensor::nn
