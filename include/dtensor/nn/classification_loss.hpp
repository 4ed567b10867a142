// dtensor/nn/classification_loss.hpp — mean cross-entropy of class logits [B, C] against integer
// labels [B]: a classifier's loss (an encoder's head), as nn::CrossEntropyLoss is a language model's.
//
//   nn::ClassificationCrossEntropy<float, Mesh> ce;
//   auto [loss, saved] = ce.forward(logits, labels);   // logits [B, C], labels [B]: batch split on the data dims
//   auto dlogits = ce.backward(std::move(saved));       // d(loss)/d(logits), in logits' layout
//   double value = full_tensor(loss)[0];                // the global mean over the B samples
//
// One sample is one position: the logits are seen as [B, 1, C] (the same local memory, no copy of
// the computation) and the per-position cross-entropy of nn/loss.hpp runs on them, so the loss is
// this rank's share of the global mean (Partial<sum> on the data dimensions, whatever the split:
// uneven or empty pieces included) and its gradients come out like the language model's. The
// classes are whole on every rank (no communication). The samples (nn::samples<Mesh>) are split
// over the data dimensions and, on a mesh with a context dimension, over it too: an encoder whose
// positions were split there pools them into features that are Partial<sum> on it, and one
// reduce-scatter leaves each context rank its share of the samples (models/vit.hpp), so the
// classifier's gradients come out Partial<sum> there like every other parameter's
// (parallel::context_parallel_grads). The logits are replicated on the tensor dimension.
// nn::PerSample is the Linear style of such a classifier head ([B, 1, C] in and out).
#pragma once

#include <cstdint>

#include "dtensor/nn/loss.hpp"

namespace dtensor::nn {

/// A classifier's layout of per-sample tensors ([B, C] logits, [B] labels, [B, 1, C] pooled
/// features): the samples split over the data and context dimensions, Replicate on the tensor one.
template <class Mesh>
using samples = layout_by_role<Mesh, Shard<0>, Replicate, Shard<0>>;

/// The Linear style of a classifier head on per-sample features [B, 1, C]: weights replicated,
/// each rank its samples (nn::samples). No collectives.
struct PerSample {
  static constexpr std::string_view name = "PerSample";
  template <class Mesh> using weight_layout = params<Mesh>;
  template <class Mesh> using bias_layout = params<Mesh>;
  template <class Mesh> using input_layout = samples<Mesh>;
  template <class Mesh> using compute_layout = samples<Mesh>;
  template <class Mesh> using output_layout = samples<Mesh>;
  static constexpr bool bias_after_exit = false;
};

template <kernels::host::FloatElement T, MeshType Mesh, class Id = std::int32_t>
class ClassificationCrossEntropy {
  static_assert(require_roles<"nn::ClassificationCrossEntropy", Mesh, Role::data, Role::data_shard, Role::tensor,
                              Role::context>());
  using Impl = detail::PositionCrossEntropy<T, Mesh, samples<Mesh>, Id, samples<Mesh>>;
  using Space = mesh_space_t<Mesh>;

 public:
  using LogitsL = samples<Mesh>;  // [B, C]: samples split over the data (and context) dimensions
  using LabelsL = samples<Mesh>;  // [B]
  using Logits = DTensor<T, 2, Mesh, LogitsL>;
  using Labels = DTensor<Id, 1, Mesh, LabelsL>;
  using Loss = typename Impl::Loss;
  using Saved = typename Impl::Saved;

  /// No communication.
  Fwd<Loss, Saved> forward(const Logits& logits, const Labels& labels) const {
    constexpr const char* op = "nn::ClassificationCrossEntropy::forward";
    detail::check(labels.extent(0) == logits.extent(0), op, logits.mesh(), "logits ", to_string(logits.shape()),
                  " and labels ", to_string(labels.shape()), ": one label per sample");
    const auto& l = logits.to_local();
    const auto& y = labels.to_local();
    // [b, C] as [b, 1, C] and [b] as [b, 1]: views of the same local memory.
    typename Impl::Logits rows(logits.mesh(), Shape<3>{logits.extent(0), 1, logits.extent(1)},
                               Tensor<T, 3, Space>::view(const_cast<T*>(l.data()), Shape<3>{l.extent(0), 1, l.extent(1)}));
    typename Impl::Targets targets(labels.mesh(), Shape<2>{labels.extent(0), 1},
                                   Tensor<Id, 2, Space>::view(const_cast<Id*>(y.data()), Shape<2>{y.extent(0), 1}));
    return impl_.forward(op, rows, targets);
  }

  /// d(dloss * loss)/d(logits). No communication.
  Logits backward(Saved s, double dloss = 1.0) const {
    auto d = impl_.backward(std::move(s), dloss);
    const auto& local = d.to_local();
    Tensor<T, 2, Space> rows(Shape<2>{local.extent(0), local.extent(2)});
    Space::copy(rows.data(), local.data(), std::size_t(local.numel()) * sizeof(T));
    return Logits(d.mesh(), Shape<2>{d.extent(0), d.extent(2)}, std::move(rows));
  }

 private:
  Impl impl_;
};

}  // namespace dtensor::nn
