// dtensor/parallel/sync/local_gradients.hpp — a replica keeps its own gradient: the reduction
// pending on the replica dimension is dropped instead of issued (local SGD, DiLoCo, FedAvg).
//
//   model.backward(...);                                   // gradients Partial<sum> on "dp"
//   parallel::sync::keep_local_gradients<Mesh>(ps, mesh);  // now each replica's own, Replicate on "dp"
//   inner.step();
//
// A data-parallel loss is the mean over the global batch, so a gradient arrives Partial<sum>
// on the data dimension with each of its n ranks holding its share — its own batch's mean
// gradient divided by n (nn/loss.hpp) —, or Partial<avg> holding that mean itself. Either way
// this makes it the replica's own mean gradient (× n for sum; as it is for avg) and marks it
// Replicate there: each replica then steps on its own data, as the strategies of parallel/sync/
// want. It assumes equal local batches (the trainers' and DataParallel's convention). No
// communication.
#pragma once

#include "dtensor/parallel/sync/detail/replicas.hpp"

namespace dtensor::parallel::sync {

/// Returns how many gradients it changed.
template <MeshType Mesh, fixed_string Dim = "", class T, std::size_t N, class Space>
std::size_t keep_local_gradients(nn::ParamList<T, N, Space>& ps, const Mesh& mesh) {
  constexpr std::size_t dim = parallel::detail::data_parallel_dim<Mesh, Dim>();
  const int n = mesh.size(dim);
  std::size_t changed = 0;
  for (auto& p : ps) {
    auto& pl = p.grad_state->placements[dim];
    if (!pl.is_partial()) continue;
    if (pl.op != ReduceOp::sum && pl.op != ReduceOp::avg)
      mesh.comm().fail("keep_local_gradients", detail::cat("gradient of ", p.name, " is ", to_string(*p.grad_state),
                                                           ": only Partial<sum> or Partial<avg> is a share of a mean"));
    if (pl.op == ReduceOp::sum && n > 1) p.visit_grad([&](auto g) { detail::scale<Space>(g, double(n)); });
    pl = PlacementDesc::replicate();
    ++changed;
  }
  return changed;
}

}  // namespace dtensor::parallel::sync
