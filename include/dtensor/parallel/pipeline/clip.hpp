// dtensor/parallel/pipeline/clip.hpp — gradient clipping by the global norm over all pipeline
// stages.
//
//   double norm = pipeline::clip_grad_norm(params, stage_mesh, mesh.group(0), /*max_norm=*/1.0);
//
// `params`: every parameter of this rank's stages (all on the same stage mesh). The norm of the
// stage mesh's share (optim::grad_norm: one all-reduce over the stage mesh), squared and summed
// over the pipeline group (one all-reduce of one double), is the norm of the whole model's
// gradients; every rank then scales its own gradients as optim::clip_grad_norm does. An
// nn::ParamSet (lists on several meshes: MoE experts on the expert mesh) takes one norm over all.
#pragma once

#include <cmath>
#include <span>

#include "dtensor/optim/clip_grad.hpp"
#include "dtensor/optim/param_set.hpp"

namespace dtensor::parallel::pipeline {

namespace detail {
/// The norm of the gradients of every stage from this stage's sum of squares (one all-reduce of
/// one double over the pipeline group).
inline double norm_over_stages(double squares, Communicator& pipeline_group) {
  pipeline_group.all_reduce(std::span<double>(&squares, 1), ReduceOp::sum);
  return std::sqrt(squares);
}
inline void check_max_norm(double max_norm, int rank) {
  if (!(max_norm > 0))
    throw Error("pipeline::clip_grad_norm", dtensor::detail::cat("max_norm = ", max_norm, " must be > 0"), rank);
}
}  // namespace detail

template <class T, std::size_t N, class Space, MeshType StageMesh>
double clip_grad_norm(const nn::ParamList<T, N, Space>& params, const StageMesh& stage_mesh, Communicator& pipeline_group,
                      double max_norm) {
  detail::check_max_norm(max_norm, stage_mesh.rank());
  const double stage_norm = optim::grad_norm(params, stage_mesh);
  const double norm = detail::norm_over_stages(stage_norm * stage_norm, pipeline_group);
  optim::scale_grads_to(params, norm, max_norm);
  return norm;
}

/// The same over every parameter of this rank's stages, whatever mesh each lives on (an
/// nn::ParamSet: the stages' parameters on the stage mesh, MoE experts on the expert mesh): one
/// norm over every list and all stages, every list scaled alike.
template <class... Parts>
double clip_grad_norm(nn::ParamSet<Parts...>& params, Communicator& pipeline_group, double max_norm) {
  detail::check_max_norm(max_norm, params.template mesh<0>().rank());
  const double norm = detail::norm_over_stages(optim::grad_squares(params), pipeline_group);
  optim::scale_grads_to(params, norm, max_norm);
  return norm;
}

}  // namespace dtensor::parallel::pipeline
