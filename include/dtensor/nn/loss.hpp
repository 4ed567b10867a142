// dtensor/nn/loss.hpp — mean cross-entropy of logits against integer targets, position by position.
//
//   nn::CrossEntropyLoss<float, Mesh> ce;
//   auto [loss, saved] = ce.forward(logits, targets);   // logits [B, T, V], targets [B, T]
//   auto dlogits = ce.backward(std::move(saved));       // d(loss)/d(logits), in logits' layout
//   double value = full_tensor(loss)[0];                // the global mean (an all-reduce over the data dimensions)
//
// Each rank computes the loss of the positions it holds — whatever splits them: the batch over
// the data dimensions, uneven or empty pieces included — divided by the GLOBAL number of
// positions, so the pieces add up to the mean: the loss is Partial<sum> on the data dimensions
// and the gradients of replicated parameters come out Partial<sum> there. The vocabulary is whole
// here (no communication); parallel::VocabParallelCrossEntropy is the same computation with the
// vocabulary split over the tensor dimension, whose per-position statistics (max, sum of exps,
// target logit) are then all-reduced there: detail::PositionCrossEntropy serves both.
//
// The kernels are kernels/host/cross_entropy.hpp's vocab_parallel_ce_* on the local
// [positions, local vocabulary] rows (with the whole vocabulary they are exactly cross_entropy).
#pragma once

#include <cstdint>

#include "dtensor/kernels/cross_entropy.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/nn/style.hpp"

namespace dtensor::nn {

namespace detail {

/// The mesh dimension that splits the vocabulary (dimension 2) of logits in layout L, or ndim.
template <class Mesh, LayoutType L>
constexpr std::size_t vocab_split_dim() {
  for (std::size_t i = 0; i < Mesh::ndim; ++i)
    if (L::desc.placements[i].is_shard(2)) return i;
  return Mesh::ndim;
}

template <class T, class Mesh, LayoutType LogitsL, class Id, LayoutType TargetsL = tokens<Mesh>>
class PositionCrossEntropy {
  static constexpr std::size_t vocab_dim = vocab_split_dim<Mesh, LogitsL>();

 public:
  using Logits = DTensor<T, 3, Mesh, LogitsL>;
  using Targets = DTensor<Id, 2, Mesh, TargetsL>;
  // Partial<sum> wherever positions are split (data, and context dimensions), Replicate elsewhere.
  using LossL = nn::layout_by_role<Mesh, Partial<ReduceOp::sum>, Replicate, Partial<ReduceOp::sum>>;
  using Loss = DTensor<double, 1, Mesh, LossL>;
  using Space = mesh_space_t<Mesh>;

  /// What the backward needs: the logits, the targets as rows, and the per-position statistics.
  struct Saved {
    Logits logits;
    Tensor<Id, 1, Space> targets;
    Tensor<double, 1, Space> max, sum;
  };

  /// Communication: with a split vocabulary, three all-reduces over its dimension of one double
  /// per local position (max, sum of exps, target logit); none on a dimension of size 1, none
  /// without a split.
  Fwd<Loss, Saved> forward(const char* op, const Logits& logits, const Targets& targets) const {
    const auto& mesh = logits.mesh();
    check(targets.extent(0) == logits.extent(0) && targets.extent(1) == logits.extent(1), op, mesh, "logits ",
          to_string(logits.shape()), " and targets ", to_string(targets.shape()), ": one target per position");
    Saved s{logits, targets.to_local().template reshape<1>(Shape<1>{targets.to_local().numel()}), {}, {}};
    const auto& tl = s.targets;
    const auto check_targets = [&](const Tensor<Id, 1>& host_targets) {
      for (Extent i = 0; i < host_targets.numel(); ++i)
        check(host_targets[i] >= 0 && Extent(host_targets[i]) < logits.extent(2), op, mesh, "target ",
              Extent(host_targets[i]), " at local position ", i, " is outside the vocabulary [0, ", logits.extent(2), ")");
    };
    if constexpr (std::is_same_v<Space, host_space>) check_targets(tl);
    else if constexpr (holds_data_v<Space>) check_targets(to_space<host_space>(tl));  // ids are few: copy them
    auto all_reduce = [&](Tensor<double, 1, Space>& t, ReduceOp r) {
      if constexpr (vocab_dim < Mesh::ndim)
        if (mesh.size(vocab_dim) > 1) mesh.group(vocab_dim).all_reduce(t.span(), r);
    };
    const auto rows = local_rows(s.logits);
    const Extent v0 = logits.local_box().offset[2];
    s.max = kernels::vocab_parallel_ce_max(rows);
    all_reduce(s.max, ReduceOp::max);
    s.sum = kernels::vocab_parallel_ce_sum_exp(rows, s.max);
    all_reduce(s.sum, ReduceOp::sum);
    auto target = kernels::vocab_parallel_ce_target_logit(rows, tl, v0);
    all_reduce(target, ReduceOp::sum);
    Tensor<double, 1> loss(Shape<1>{1});
    loss[0] = kernels::vocab_parallel_ce_loss(s.max, s.sum, target, positions(logits));
    return {Loss(mesh, Shape<1>{1}, into_space<Space>(std::move(loss))), std::move(s)};
  }

  /// This rank's part of d(dloss * loss)/d(logits). No communication.
  Logits backward(Saved s, double dloss = 1.0) const {
    const auto& l = s.logits;
    auto d = kernels::vocab_parallel_ce_backward(local_rows(l), s.targets, l.local_box().offset[2], s.max, s.sum,
                                                       dloss, positions(l));
    return Logits(l.mesh(), l.shape(), std::move(d).template reshape<3>(l.to_local().shape()));
  }

 private:
  static Extent positions(const Logits& l) { return l.extent(0) * l.extent(1); }
  /// This rank's logits as [positions, local vocabulary] rows: a read-only view, no copy.
  static Tensor<T, 2, Space> local_rows(const Logits& l) {
    const auto& t = l.to_local();
    return Tensor<T, 2, Space>::view(const_cast<T*>(t.data()), Shape<2>{t.extent(0) * t.extent(1), t.extent(2)});
  }
};

}  // namespace detail

template <kernels::host::FloatElement T, MeshType Mesh, LayoutType LogitsL = tokens<Mesh>, class Id = std::int32_t>
class CrossEntropyLoss {
  static_assert(require_dense_roles<"nn::CrossEntropyLoss", Mesh>());
  static_assert(std::is_same_v<LogitsL, tokens<Mesh>>,
                "nn::CrossEntropyLoss takes logits whose vocabulary is whole (tokens<Mesh>); a split vocabulary is "
                "parallel::VocabParallelCrossEntropy");
  using Impl = detail::PositionCrossEntropy<T, Mesh, LogitsL, Id>;

 public:
  using Logits = typename Impl::Logits;
  using Targets = typename Impl::Targets;
  using LossL = typename Impl::LossL;
  using Loss = typename Impl::Loss;
  using Saved = typename Impl::Saved;

  /// No communication.
  Fwd<Loss, Saved> forward(const Logits& logits, const Targets& targets) const {
    return impl_.forward("nn::CrossEntropyLoss::forward", logits, targets);
  }
  /// d(dloss * loss)/d(logits). No communication.
  Logits backward(Saved s, double dloss = 1.0) const { return impl_.backward(std::move(s), dloss); }

 private:
  Impl impl_;
};

}  // namespace dtensor::nn
