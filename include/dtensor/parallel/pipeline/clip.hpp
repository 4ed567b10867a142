// dtensor/parallel/pipeline/clip.hpp — gradient clipping by the global norm over all pipeline
// stages.
//
//   double norm = pipeline::clip_grad_norm(params, stage_mesh, mesh.group(0), /*max_norm=*/1.0);
//
// `params`: every parameter of this rank's stages (all on the same stage mesh). The norm of the
// stage mesh's share (optim::grad_norm: one all-reduce over the stage mesh), squared and summed
// over the pipeline group (one all-reduce of one double), is the norm of the whole model's
// gradients; every rank then scales its own gradients as optim::clip_grad_norm does.
#pragma once

#include <cmath>
#include <span>

#include "dtensor/optim/clip_grad.hpp"

namespace dtensor::parallel::pipeline {

template <class T, std::size_t N, class Space, MeshType StageMesh>
double clip_grad_norm(const nn::ParamList<T, N, Space>& params, const StageMesh& stage_mesh, Communicator& pipeline_group,
                      double max_norm) {
  if (!(max_norm > 0))
    throw Error("pipeline::clip_grad_norm", dtensor::detail::cat("max_norm = ", max_norm, " must be > 0"), stage_mesh.rank());
  const double stage_norm = optim::grad_norm(params, stage_mesh);
  double squares = stage_norm * stage_norm;
  pipeline_group.all_reduce(std::span<double>(&squares, 1), ReduceOp::sum);
  const double norm = std::sqrt(squares);
  optim::scale_grads_to(params, norm, max_norm);
  return norm;
}

}  // namespace dtensor::parallel::pipeline
