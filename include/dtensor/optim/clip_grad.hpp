// dtensor/optim/clip_grad.hpp — gradient clipping by the global norm of all gradients.
//
//   double norm = optim::clip_grad_norm(params, mesh, /*max_norm=*/1.0);   // one all-reduce
//   double norm = optim::grad_norm(params, mesh);                          // the norm only
//   optim::clip_grad_norm(dense, mesh, experts, expert_mesh, 1.0);           // two meshes, one norm
//
// The global norm is that of the logical gradients: each element of each gradient counted once.
// A rank adds the squares of its local piece only if it is the first copy (coordinate 0) along
// every mesh dimension where that gradient is replicated; shards along the other dimensions are
// disjoint, so the sum over all ranks counts every element exactly once. That sum is one
// all-reduce (sum, one double) over the whole mesh (group "dp*tp" on a (dp, tp) mesh), issued
// even on one rank so that the collectives per step do not depend on the mesh shape. A Partial
// gradient is an error: its local pieces are not elements of the gradient (reduce it first).
// Grads are then scaled by max_norm / (norm + 1e-6) when that is below 1, as PyTorch does.
#pragma once

#include <cmath>
#include <span>

#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/kernels/optim.hpp"
#include "dtensor/optim/optimizer.hpp"

namespace dtensor::optim {

/// The L2 norm of all gradients together (one all-reduce over the mesh).
template <class T, std::size_t N, class Space, MeshType Mesh>
double grad_norm(const ParamList<T, N, Space>& params, const Mesh& mesh) {
  static_assert(Mesh::ndim == N, "the parameter list and the mesh must have the same number of dimensions");
  const auto& coord = mesh.coordinate();
  double sq = 0;
  for (const auto& p : params) {
    if (!p.grad_state) throw Error("grad_norm", "parameter " + p.name + " has no gradient state", mesh.rank());
    const auto& g = *p.grad_state;
    bool first_copy = true;
    for (std::size_t i = 0; i < N; ++i) {
      if (g.placements[i].is_partial())
        mesh.comm().fail("grad_norm",
                         dtensor::detail::cat("gradient of ", p.name, " is ", to_string(g), ": Partial on mesh dimension \"",
                                              Mesh::names[i], "\"; reduce it before taking the norm"));
      if (g.placements[i].is_replicate() && coord[i] != 0) first_copy = false;
    }
    if (!first_copy) continue;
    sq += p.visit_grad([](auto g) { return kernels::sum_squares(nn::detail::flat_view<Space>(g)); });
  }
  mesh.comm().all_reduce(std::span<double>(&sq, 1), ReduceOp::sum);
  return std::sqrt(sq);
}

/// Scales all gradients whose global norm is `norm` so that it becomes at most max_norm (as
/// PyTorch does: by max_norm / (norm + 1e-6) when that is below 1). No communication.
template <class T, std::size_t N, class Space>
void scale_grads_to(const ParamList<T, N, Space>& params, double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (const auto& p : params) {
      p.visit_grad([&](auto span) {  // a narrow (bf16) gradient is scaled in its own type
        auto g = nn::detail::flat_view<Space>(span);
        kernels::scale_(g, coef);
      });
    }
}

namespace detail {
inline void check_max_norm(double max_norm, int rank) {
  if (!(max_norm > 0)) throw Error("clip_grad_norm", dtensor::detail::cat("max_norm = ", max_norm, " must be > 0"), rank);
}
}  // namespace detail

/// Scales all gradients so that their global norm is at most max_norm; returns the norm before.
template <class T, std::size_t N, class Space, MeshType Mesh>
double clip_grad_norm(const ParamList<T, N, Space>& params, const Mesh& mesh, double max_norm) {
  detail::check_max_norm(max_norm, mesh.rank());
  const double norm = grad_norm(params, mesh);
  scale_grads_to(params, norm, max_norm);
  return norm;
}

/// The same over two parameter lists on two meshes of the same ranks (a mixture-of-experts
/// model: the dense parameters and the experts, on the expert mesh): one norm of all their
/// gradients (one all-reduce per mesh), both lists scaled alike.
template <class T, std::size_t N, class Space, MeshType Mesh, std::size_t N2, MeshType Mesh2>
double clip_grad_norm(const ParamList<T, N, Space>& params, const Mesh& mesh, const ParamList<T, N2, Space>& params2,
                      const Mesh2& mesh2, double max_norm) {
  detail::check_max_norm(max_norm, mesh.rank());
  const double norm = std::hypot(grad_norm(params, mesh), grad_norm(params2, mesh2));
  scale_grads_to(params, norm, max_norm);
  scale_grads_to(params2, norm, max_norm);
  return norm;
}

}  // namespace dtensor::optim
