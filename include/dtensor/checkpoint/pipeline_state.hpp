// dtensor/checkpoint/pipeline_state.hpp — the training state of a parallel::pipeline::ShardedPipeline
// (pipeline stages sharded by FSDP, MoE experts on the expert mesh) and its one AdamW.
//
//   pipeline::ShardedPipeline<Stage, Mesh> model(mesh, schedule, std::move(stages), {.stage = 3});
//   auto opt = optim::make_adamw(model.params(), adamw);   // every parameter, the experts included
//   checkpoint::save_pipeline_state(dir, model, opt, {.step = s, .rng_state = ..., .config = ...});
//   auto meta = checkpoint::load_pipeline_state(dir, model, opt, config);      // any saving mesh
//
// What a rank saves: for each of its stages, its FSDP shards of the stage's units (the master
// values, fsdp_parameter_slots) and of the units of every other parameter group (MoE: its experts
// on the expert mesh, sharded over "edp"; nn::parameter_groups); and AdamW's moments over all (the optimizer's
// part over each list of model.params(): optim::Joint::part<I>). The slots and
// their writers are worked out on the mesh the tensor lives on — the stage mesh (dp, fsdp, cp,
// tp) or the expert mesh (edp, ep, tp) — because a stage's tensors exist on the ranks of one
// pipeline coordinate only: among those, the rank at coordinate 0 of every Replicate dimension
// writes. The save itself runs over the whole pipeline mesh (its communicator; its shape goes into
// the manifest), so every rank of every stage takes part and rank 0 merges them all. Each
// tensor's name is global (models::GPT's: "h.3.attn.qkv.weight", "h.3.experts..."), so a checkpoint
// saved with pp 2 loads with pp 1, other data, context or tensor sizes, or another schedule.
//
// Loading fills the same slots from the checkpoint (checkpoint/load.hpp: only the overlapping
// pieces), sets the optimizers' step counts, then model.sync_parameters() (ZeRO-1/2: one
// all-gather per unit so the stages' full values agree with the shards; ZeRO-3: nothing, the
// next step gathers). Communication: save's and load's status all-gathers and that sync. A
// device model's slots go through host copies (HostStaging, checkpoint/slots.hpp).
#pragma once

#include <filesystem>
#include <iterator>
#include <map>
#include <tuple>
#include <type_traits>
#include <string>
#include <utility>

#include "dtensor/checkpoint/training_state.hpp"
#include "dtensor/nn/param_groups.hpp"

namespace dtensor::checkpoint {

namespace detail {

template <class T>
void append_slots(Slots<T>& to, Slots<T> from) {
  to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
}

/// A stage's FSDP of the parameters on the stage mesh: the FSDP itself, or its own part when the
/// stage has parameter groups on further meshes (parallel::FullyShardGroups).
template <class Fsdp>
auto& stage_mesh_fsdp(Fsdp& f) {
  if constexpr (requires { f.own(); }) return f.own();
  else return f;
}

/// This rank's FSDP shards of every one of its stages, with `opt`'s moments over them.
template <class Pipeline, class Opt>
auto stage_slots(Pipeline& model, Opt& opt) {
  auto& stages = model.executor().stages();
  using Slot0 =
      decltype(fsdp_parameter_slots(stages.front().units(), stage_mesh_fsdp(model.fsdp(0)), stages.front().mesh()));
  Slot0 params;
  for (std::size_t i = 0; i < stages.size(); ++i)
    append_slots(params, fsdp_parameter_slots(stages[i].units(), stage_mesh_fsdp(model.fsdp(i)), stages[i].mesh()));
  return with_moments(std::move(params), opt);
}

/// This rank's FSDP shards of group I >= 1 of its stages (a mesh beyond the stage mesh, e.g. the
/// experts on the expert mesh, sharded over its "edp": nn::parameter_groups), on that group's mesh.
template <std::size_t I, class Pipeline>
auto group_slots(Pipeline& model) {
  auto& stages = model.executor().stages();
  auto front = std::get<I>(nn::parameter_groups(stages.front()));
  decltype(fsdp_parameter_slots(*front.units, model.fsdp(0).template group<I>(), *front.mesh)) params;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    auto group = std::get<I>(nn::parameter_groups(stages[i]));
    append_slots(params, fsdp_parameter_slots(*group.units, model.fsdp(i).template group<I>(), *group.mesh));
  }
  return params;
}

/// The slots of every list of model.params(), each with its part of the optimizer.
template <class Pipeline, class Opt>
auto pipeline_slots(Pipeline& model, Opt& opt) {
  auto slots = stage_slots(model, opt.template part<0>());
  if constexpr (Opt::parts > 1) {
    using Stage = std::remove_cvref_t<decltype(model.executor().stages().front())>;
    static_assert(std::tuple_size_v<nn::parameter_groups_t<Stage>> == Opt::parts,
                  "checkpoint::save_pipeline_state: the optimizer must be over model.params() (one part per parameter group)");
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (append_slots(slots, with_moments(group_slots<I + 1>(model), opt.template part<I + 1>())), ...);
    }(std::make_index_sequence<Opt::parts - 1>{});
  }
  return slots;
}

template <class Pipeline, class Opt>
void save_pipeline(const std::filesystem::path& dir, Pipeline& model, Opt& opt, TrainingMeta meta, const SaveOptions& o) {
  auto slots = pipeline_slots(model, opt);
  const HostStaging<mesh_space_t<std::remove_cvref_t<decltype(model.mesh())>>, typename decltype(slots)::value_type::value_type>
      staged(slots, true);
  meta.optimizer_steps = opt.steps();
  save(dir, model.mesh(), slots, meta, o);
}

template <class Pipeline, class Opt>
TrainingMeta load_pipeline(const std::filesystem::path& dir, Pipeline& model, Opt& opt,
                           std::map<std::string, std::string> config) {
  auto slots = pipeline_slots(model, opt);
  const HostStaging<mesh_space_t<std::remove_cvref_t<decltype(model.mesh())>>, typename decltype(slots)::value_type::value_type>
      staged(slots, false);
  auto meta = load(dir, model.mesh(), slots, {.config = std::move(config)});
  staged.copy_back();
  opt.set_steps(long(meta.optimizer_steps));  // every part's
  model.sync_parameters();
  return meta;
}

}  // namespace detail

/// Saves a pipeline's parameters (this rank's FSDP shards of its stages; MoE: its experts), the
/// moments and step count of `opt` (one optimizer over model.params(): optim::make_adamw), and
/// `meta` at `dir`. Collective over model.mesh().
template <class Pipeline, class Opt>
void save_pipeline_state(const std::filesystem::path& dir, Pipeline& model, Opt& opt, TrainingMeta meta,
                         const SaveOptions& o = {}) {
  detail::save_pipeline(dir, model, opt, std::move(meta), o);
}

/// Loads what save_pipeline_state saved (on any mesh and schedule) into the pipeline and opt;
/// throws unless the checkpoint's configuration is `config`. Returns the trainer's metadata.
template <class Pipeline, class Opt>
TrainingMeta load_pipeline_state(const std::filesystem::path& dir, Pipeline& model, Opt& opt,
                                 std::map<std::string, std::string> config) {
  return detail::load_pipeline(dir, model, opt, std::move(config));
}

}  // namespace dtensor::checkpoint
