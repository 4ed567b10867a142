// dtensor/parallel/sync/kfold_parallel.hpp — k-fold cross-validation with the k models trained
// at once, one per index of a mesh dimension (the "fold" dimension).
//
//   using Mesh = DeviceMesh<"fold", "tp">;                      // k folds x TP inside each model
//   parallel::sync::KFoldParallel<Mesh, "fold"> cv(mesh, samples, /*seed=*/1);
//   const auto& split = cv.split();                             // this fold's train / val indices
//   ... train on split.train: gradients never reduced on "fold" (keep_local_gradients) ...
//   auto [mean, sd] = cv.report(my_val_loss);                   // one all-gather on "fold"
//
// Fold f of sync::kfold(samples, k, seed) (data_split.hpp) is trained by the ranks at
// coordinate f of the fold dimension, k = its size: the k sequential runs of k-fold cross-
// validation side by side, each model Replicate on that dimension and never synchronized over
// it (the gradients stay each fold's own), so each fold's result equals its sequential run.
// report() gathers the k validation losses over the fold dimension (one all-gather of one
// double per rank) and returns their mean and sample standard deviation (mean_std), the same
// on every rank. Errors as kfold: k < 2 or k > samples.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "dtensor/parallel/sync/data_split.hpp"
#include "dtensor/parallel/sync/detail/replicas.hpp"

namespace dtensor::parallel::sync {

template <MeshType Mesh, fixed_string Dim = "">
class KFoldParallel {
 public:
  static constexpr std::size_t dim = parallel::detail::data_parallel_dim<Mesh, Dim>();

  KFoldParallel(Mesh mesh, std::size_t samples, std::uint64_t seed) : mesh_(std::move(mesh)) {
    const std::size_t k = std::size_t(mesh_.size(dim));
    try {
      split_ = kfold(samples, k, seed).at(std::size_t(fold()));
    } catch (const Error& e) {
      throw Error("KFoldParallel", detail::cat("k = ", k, " folds (the size of mesh dimension \"", Mesh::names[dim], "\") over ",
                                               samples, " samples: ", e.what()),
                  mesh_.rank());
    }
  }

  int folds() const { return mesh_.size(dim); }
  /// This rank's fold: its coordinate on the fold dimension.
  int fold() const { return mesh_.coordinate(dim); }
  /// This fold's split: train on .train, validate on .val (sorted indices).
  const Split& split() const noexcept { return split_; }

  /// Every fold's validation loss (`val_loss` is this fold's, equal on its ranks), in fold order.
  std::vector<double> losses(double val_loss) {
    std::vector<double> all(static_cast<std::size_t>(folds()));
    mesh_.group(dim).all_gather(std::span<const double>(&val_loss, 1), std::span<double>(all));
    return all;
  }
  /// Mean and sample standard deviation of the folds' validation losses (one all-gather).
  std::pair<double, double> report(double val_loss) { return mean_std(losses(val_loss)); }

 private:
  Mesh mesh_;
  Split split_;
};

}  // namespace dtensor::parallel::sync
