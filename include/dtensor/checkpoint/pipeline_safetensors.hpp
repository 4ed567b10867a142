// dtensor/checkpoint/pipeline_safetensors.hpp — a parallel::pipeline::ShardedPipeline's parameters
// (FSDP-sharded stages, MoE experts) as one safetensors file, and back.
//
//   checkpoint::export_pipeline_safetensors("model.safetensors", model);   // after training
//   checkpoint::import_pipeline_safetensors("model.safetensors", model);   // instead of the init
//
// The slots are those of checkpoint/pipeline_state.hpp without the optimizer: this rank's FSDP
// shards (master values) of its stages, and its experts on the expert mesh. Their names are the
// model's global ones ("h.3.attn.qkv.weight"), so a file exported with pp 2 x fsdp 2 x tp 2 is
// the whole model, loadable on any mesh or into a one-rank models::GPT (examples/train_gpt's
// --generate does), and readable by Python's safetensors. Import ends with model.sync_parameters()
// (ZeRO-1/2: the stages' full values from the shards). A device model's slots go through host
// copies. Collective over model.mesh().
#pragma once

#include <filesystem>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/checkpoint/pipeline_state.hpp"
#include "dtensor/checkpoint/safetensors.hpp"

namespace dtensor::checkpoint {

namespace detail {

template <class Pipeline>
auto pipeline_parameter_slots(Pipeline& model) {
  auto& stages = model.executor().stages();
  using Slot0 =
      decltype(fsdp_parameter_slots(stages.front().units(), stage_mesh_fsdp(model.fsdp(0)), stages.front().mesh()));
  Slot0 params;
  for (std::size_t i = 0; i < stages.size(); ++i)
    append_slots(params, fsdp_parameter_slots(stages[i].units(), stage_mesh_fsdp(model.fsdp(i)), stages[i].mesh()));
  using Stage = std::remove_cvref_t<decltype(stages.front())>;
  [&]<std::size_t... I>(std::index_sequence<I...>) {  // the other parameter groups (MoE: the experts)
    (append_slots(params, group_slots<I + 1>(model)), ...);
  }(std::make_index_sequence<std::tuple_size_v<nn::parameter_groups_t<Stage>> - 1>{});
  return params;
}

}  // namespace detail

/// Writes every parameter of the pipeline, whole, to one safetensors file.
template <class Pipeline>
void export_pipeline_safetensors(const std::filesystem::path& path, Pipeline& model, const SafetensorsOptions& o = {}) {
  auto slots = detail::pipeline_parameter_slots(model);
  using Slot = typename decltype(slots)::value_type;
  const HostStaging<mesh_space_t<std::remove_cvref_t<decltype(model.mesh())>>, typename Slot::value_type> staged(slots, true);
  export_safetensors(path, model.mesh(), slots, o);
}

/// Fills the pipeline's parameters from a safetensors file (or an index of several).
template <class Pipeline>
void import_pipeline_safetensors(const std::filesystem::path& path, Pipeline& model, const SafetensorsOptions& o = {}) {
  auto slots = detail::pipeline_parameter_slots(model);
  using Slot = typename decltype(slots)::value_type;
  const HostStaging<mesh_space_t<std::remove_cvref_t<decltype(model.mesh())>>, typename Slot::value_type> staged(slots, false);
  import_safetensors(path, model.mesh(), slots, o);
  staged.copy_back();
  model.sync_parameters();
}

}  // namespace dtensor::checkpoint
