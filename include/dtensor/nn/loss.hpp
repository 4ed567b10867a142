// dtensor/nn/loss.hpp — mean cross-entropy of logits against integer targets.
//
//   nn::CrossEntropyLoss<float, Mesh, nn::tokens<Mesh>> ce;
//   auto [loss, saved] = ce.forward(logits, targets);   // logits [B, T, V], targets [B, T]
//   auto dlogits = ce.backward(std::move(saved));       // d(loss)/d(logits), in logits' layout
//   double value = full_tensor(loss)[0];                // the global mean (an all-reduce over the split dimensions)
//
// The kernel (kernels/host/cross_entropy.hpp, what ops::cross_entropy runs) on this rank's
// [b, t, V] logits taken as b*t whole rows, divided by the global number of positions B*T, so
// each rank's share is a Partial<sum> on every dimension that splits the positions: the data
// dimensions (the batch) and a context dimension (the sequence; with both, the rows of
// [B*T, V] that a rank holds are not one block of a global reshape, so the loss works on the
// local rows rather than through ops::reshape). The gradients of replicated parameters then come
// out Partial<sum> there. The vocabulary must not be split (for a split vocabulary use
// parallel::VocabParallelCrossEntropy). No communication.
#pragma once

#include <cstdint>

#include "dtensor/kernels/host/cross_entropy.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/nn/style.hpp"

namespace dtensor::nn {

/// The layout of a mean loss over positions split as in tokens<Mesh>: Partial<sum> on the data
/// and context dimensions, Replicate elsewhere.
template <class Mesh>
using position_mean_loss = layout_by_role<Mesh, Partial<ReduceOp::sum>, Replicate, Partial<ReduceOp::sum>>;

namespace detail {
/// The global number of positions of logits [B, T, V] (what a mean loss divides by).
template <class Logits>
Extent loss_positions(const Logits& l) {
  return l.extent(0) * l.extent(1);
}
/// This rank's logits [b, t, v] as [b*t, v] rows (a view: no copy).
template <class Logits>
auto loss_rows(const Logits& l) {
  using T = typename Logits::value_type;
  const auto& t = l.to_local();
  return Tensor<T, 2>::view(const_cast<T*>(t.data()), Shape<2>{t.extent(0) * t.extent(1), t.extent(2)});
}
}  // namespace detail

template <kernels::host::FloatElement T, MeshType Mesh, LayoutType LogitsL = tokens<Mesh>, class Id = std::int32_t>
class CrossEntropyLoss {
  static_assert(require_dense_roles<"nn::CrossEntropyLoss", Mesh>());
  static_assert(std::is_same_v<LogitsL, tokens<Mesh>>,
                "nn::CrossEntropyLoss takes logits whose vocabulary is whole (tokens<Mesh>); a split vocabulary is "
                "parallel::VocabParallelCrossEntropy");

 public:
  using Logits = DTensor<T, 3, Mesh, LogitsL>;
  using Targets = DTensor<Id, 2, Mesh, tokens<Mesh>>;
  using LossL = position_mean_loss<Mesh>;
  using Loss = DTensor<double, 1, Mesh, LossL>;
  struct Saved {
    Logits logits;
    Tensor<Id, 1> targets;  // this rank's, as rows
    Tensor<double, 1> lse;  // the log-sum-exp of each of this rank's rows
  };

  /// No communication.
  Fwd<Loss, Saved> forward(const Logits& logits, const Targets& targets) const {
    detail::check(targets.extent(0) == logits.extent(0) && targets.extent(1) == logits.extent(1),
                  "nn::CrossEntropyLoss::forward", logits.mesh(), "logits ", to_string(logits.shape()), " and targets ",
                  to_string(targets.shape()), ": one target per position");
    const auto& tl = targets.to_local();
    Saved s{logits, tl.template reshape<1>(Shape<1>{tl.numel()}), {}};
    auto f = kernels::host::cross_entropy(detail::loss_rows(logits), s.targets, detail::loss_positions(logits));
    s.lse = std::move(f.lse);
    Tensor<double, 1> loss(Shape<1>{1});
    loss[0] = f.loss;
    return {Loss(logits.mesh(), Shape<1>{1}, std::move(loss)), std::move(s)};
  }
  /// d(dloss * loss)/d(logits). No communication.
  Logits backward(Saved s, double dloss = 1.0) const {
    const auto& l = s.logits;
    auto d = kernels::host::cross_entropy_backward(detail::loss_rows(l), s.targets, s.lse, dloss, detail::loss_positions(l));
    return Logits(l.mesh(), l.shape(), std::move(d).template reshape<3>(l.to_local().shape()));
  }
};

}  // namespace dtensor::nn
