// dtensor/models/expert_load.hpp — how a pipelined MoE model's router spread its last forward's
// tokens: the choices each expert kept and the dropped share, summed over every rank of the mesh.
//
//   const auto [load, dropped] = models::expert_load(pipeline, mesh, experts);
//   // load[e]: the choices expert e kept; dropped: the share of the choices over capacity
//
// The statistics are those of the last forward (the last micro-batch) of each of this rank's MoE
// blocks (parallel/moe.hpp's stats). Every rank's blocks saw other tokens (its data and context
// ranks' share) and other blocks (its pipeline stages'), so the sums are all-reduced over "dp",
// "fsdp", "cp" and "pp": four all-reduces of experts + 2 int64, the same result on every rank.
// The tensor ranks route the same tokens and are not summed. Collective: every rank of the mesh
// calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/comm/communicator.hpp"

namespace dtensor::models {

/// The routing of one forward over the whole mesh.
struct ExpertLoad {
  std::vector<std::int64_t> load;  // per expert: the choices it kept
  double dropped = 0;              // the dropped share of the choices (0 when nothing was routed)
};

/// The routing of the last forward of `pipeline`'s MoE blocks (a pipeline::Executor's owner:
/// pipeline.executor().stages(), each stage's layers().stats(block)), over `mesh` (with
/// dimensions "pp", "dp", "fsdp" and "cp"), for a model of `experts` experts.
template <class Pipeline, class Mesh>
ExpertLoad expert_load(Pipeline& pipeline, const Mesh& mesh, std::int64_t experts) {
  const auto n = static_cast<std::size_t>(experts);
  std::vector<std::int64_t> sums(n + 2, 0);  // load per expert, routed, dropped
  for (auto& stage : pipeline.executor().stages())
    for (const auto& block : stage.blocks()) {
      const auto& st = stage.layers().stats(block);
      for (std::size_t e = 0; e < st.load.size(); ++e) sums[e] += st.load[e];
      sums[n] += st.routed;
      sums[n + 1] += st.dropped;
    }
  for (auto* group : {&mesh.template group<"dp">(), &mesh.template group<"fsdp">(), &mesh.template group<"cp">(),
                      &mesh.template group<"pp">()})
    group->all_reduce(std::span<std::int64_t>(sums), ReduceOp::sum);
  const double routed = double(sums[n]);
  const double dropped = routed > 0 ? double(sums[n + 1]) / routed : 0;
  sums.resize(n);
  return {std::move(sums), dropped};
}

/// The validation line's MoE note: "  expert load 410 398 ...  dropped 0.000" (expert_load's
/// kept choices per expert and dropped share). Collective over the mesh, as expert_load.
template <class Pipeline, class Mesh>
std::string expert_load_note(Pipeline& model, const Mesh& mesh, std::int64_t experts) {
  const auto [load, dropped] = expert_load(model, mesh, experts);
  std::string note = "  expert load";
  for (auto n : load) note += " " + std::to_string(n);
  char drop[32];
  std::snprintf(drop, sizeof drop, "  dropped %.3f", dropped);
  return note + drop;
}

}  // namespace dtensor::models
