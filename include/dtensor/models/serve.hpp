// dtensor/models/serve.hpp — a trained pipeline's model moved in memory to a serving mesh, tensor
// parallel over ranks 0..n-1, which generates there: training on one mesh, serving on another.
//
//   const auto s = models::serve_on_tp(stages, mesh, layout, 4, prompt, {.new_tokens = 20});
//   if (s.serve_rank == 0) print(s.tokens, s.moved);   // the serving mesh's first rank
//
// The stages (a pipeline split of one model type, pipeline::split: FSDP shards gathered, as for
// generation; MoE: with their experts) are on `mesh`, (pp, dp, fsdp, cp, tp). The serving model is
// the same type on ranks 0..n-1 as (pp 1, dp 1, fsdp 1, cp 1, tp n) (MoE: its experts on
// (edp 1, ep 1, tp n)), built from another seed, so that a parameter no move filled would show
// as other tokens. The weights move with nn::redistribute_parameters (the fewest bytes,
// docs/cross-mesh.md), one pipeline stage at a time (each on its own mesh: the ranks of its "pp"
// coordinate) and one mesh at a time (the dense weights', then the experts'). A rank takes part
// in the moves of each stage it holds and, if it serves, in every stage's; for a side it is not
// on it passes a twin over the sim backend (names, extents, layouts: nothing is sent to a twin).
// Then the serving mesh generates from `prompt` with `o` (models/generate.hpp). The training
// model is not changed. Collective over every rank of `mesh`; the serving ranks alone generate.
// An Error if the stages' parameters do not cover the serving model's (a stage split that lost a
// parameter would otherwise serve a random one).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "dtensor/comm/sim.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/models/generate.hpp"
#include "dtensor/nn/cross_mesh_params.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/parallel/expert_parallel.hpp"
#include "dtensor/parallel/pipeline/executor.hpp"
#include "dtensor/parallel/pipeline/split.hpp"

namespace dtensor::models {

/// What serve_on_tp did on this rank.
struct ServeResult {
  int serve_rank = -1;               // this rank's rank on the serving mesh; -1: not on it
  std::vector<std::int32_t> tokens;  // the serving mesh's generation (on its ranks)
  nn::ModelMoveTotals moved;         // the moves of every stage (and their experts), as planned
  double move_seconds = 0;           // the moves' time, on this rank
};

/// `stages` (this rank's stages of a model on `mesh`, laid out by `layout`) served on tp = n over
/// ranks 0..n-1: moved there in memory, then generating from `prompt`. See the top of this file.
template <class Stage, class Mesh>
ServeResult serve_on_tp(std::vector<Stage>& stages, const Mesh& mesh, const parallel::pipeline::StageLayout& layout,
                        int n, const std::vector<std::int32_t>& prompt, const GenerateOptions& o) {
  namespace pp = parallel::pipeline;
  using Parts = std::remove_cvref_t<decltype(stages.front().model())>;
  using Layers = std::remove_cvref_t<decltype(stages.front().model().layers())>;
  constexpr bool moe = requires { typename Layers::ExpertMesh; };
  if (stages.empty()) throw Error("serve_on_tp", "this rank holds no pipeline stage");
  if (n < 1 || n > mesh.comm().size())
    throw Error("serve_on_tp", dtensor::detail::cat("tp ", n, ": the serving mesh needs 1 to the training mesh's ",
                                                    mesh.comm().size(), " ranks"));
  const std::array<int, 5> shape{1, 1, 1, 1, n};
  std::vector<int> ranks(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) ranks[std::size_t(r)] = r;
  const MeshRanks<4> serve_ranks{{1, 1, 1, n}, ranks};
  const auto& parts = stages.front().model();
  // The training mesh's "ep" (MoE), for the twins of stages this rank does not hold.
  int train_ep = 1;
  if constexpr (moe) train_ep = parts.layers().expert_mesh().shape()[1];
  // The Layers policy on a stage mesh (MoE: the experts on an expert mesh of `ep` ranks made from it).
  auto layers_on = [&](const auto& stage_mesh, int ep) {
    if constexpr (moe)
      return Layers(parallel::make_expert_mesh<typename Layers::ExpertMesh>(stage_mesh, ep), parts.layers().config());
    else return parts.layers();
  };
  const auto one = pp::StageLayout::looped(1);
  const auto serve_mesh = mesh_on_ranks<Mesh>(mesh.root_ptr(), shape, ranks);  // collective over every rank
  // The serving model, or on a rank that only sends, its twin.
  const Mesh serve_twin_mesh(sim::world(0, n), shape);
  const auto serve_stage = pp::stage_mesh_of(serve_mesh ? *serve_mesh : serve_twin_mesh);
  // From another seed: a parameter that no move filled would hold other values, and other tokens follow.
  auto serve_config = parts.config();
  serve_config.seed += 1;
  auto served = pp::split(Parts(serve_stage, serve_config, layers_on(serve_stage, 1)), one, 0);
  // Twins of the training mesh's stages, built only for a stage this rank does not hold.
  const Mesh train_twin_mesh(sim::world(0, mesh.comm().size()), mesh.shape());
  const auto train_twin_stage = pp::stage_mesh_of(train_twin_mesh);
  const auto twin_layers = layers_on(train_twin_stage, train_ep);
  const int my_pp = mesh.coordinate()[0];
  const auto start = std::chrono::steady_clock::now();
  ServeResult result;
  auto add = [&](const nn::ModelMoveTotals& m) {
    result.moved.parameters += m.parameters;
    result.moved.links += m.links;
    result.moved.bytes += m.bytes;
    result.moved.minimum_bytes += m.minimum_bytes;
    result.moved.local_bytes += m.local_bytes;
  };
  const auto keep = nn::DstParameters::keep_unnamed;
  const auto skip = moe ? nn::OtherMeshes::skip : nn::OtherMeshes::error;
  for (int s = 0; s < layout.stages(); ++s) {  // the same order on every rank
    const int p = layout.rank_of(s);
    if (p != my_pp && !serve_mesh) continue;  // in neither mesh of this stage's moves
    const auto stage_ranks = mesh.template slice<"pp">(p);
    std::optional<std::vector<Stage>> twin;
    Stage* src = nullptr;
    for (auto& st : stages)
      if (st.index() == s) src = &st;
    if (!src) {
      twin = pp::split(Parts(train_twin_stage, parts.config(), twin_layers), layout, p);
      for (auto& st : *twin)
        if (st.index() == s) src = &st;
    }
    add(nn::redistribute_parameters(*src, stage_ranks, served.front(), serve_ranks, 2 * s, keep, skip));
    if constexpr (moe) {  // the experts: their mesh has the stage's ranks in the same order (make_expert_mesh)
      using EMesh = typename Layers::ExpertMesh;
      // A stage of dense blocks only (a MoE every k-th block) has none: no move (alike on every rank).
      std::size_t experts = 0;
      nn::for_each_parameter_on<EMesh>(*src, [&](auto& q) { experts += q.defined() ? 1 : 0; });
      if (experts == 0) continue;
      const MeshRanks<EMesh::ndim> expert_ranks{parts.layers().expert_mesh().shape(), stage_ranks.root_ranks};
      const MeshRanks<EMesh::ndim> serve_expert_ranks{served.front().model().layers().expert_mesh().shape(), ranks};
      add(nn::redistribute_parameters(*src, expert_ranks, served.front(), serve_expert_ranks, 2 * s + 1, keep, skip));
    }
  }
  if (!serve_mesh) return result;
  result.move_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::size_t count = 0;
  nn::for_each_parameter(served.front(), [&](auto& q) { count += q.defined() ? 1 : 0; });
  if (result.moved.parameters != count)  // the stages' names must cover the whole model's
    throw Error("serve_on_tp",
                dtensor::detail::cat("the ", layout.stages(), " stages moved ", result.moved.parameters,
                                     " parameters, the serving model has ", count),
                serve_mesh->comm().rank());
  result.tokens = generate(served, one, *serve_mesh, prompt, o);
  result.serve_rank = serve_mesh->comm().rank();
  return result;
}

}  // namespace dtensor::models
