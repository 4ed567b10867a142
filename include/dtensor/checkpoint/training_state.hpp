// dtensor/checkpoint/training_state.hpp — what a trainer saves and resumes from: the model's
// parameters, AdamW's moments and step count, and the trainer's own position.
//
//   checkpoint::TrainingMeta meta{.step = step, .data_position = next_batch, .rng_state = rng_bytes,
//                                 .config = models::config_of(cfg)};        // models/gpt_config.hpp
//   checkpoint::save_training_state(dir, mesh, model, opt, meta);               // replicated / TP / DDP
//   checkpoint::save_training_state(dir, mesh, model, fsdp, opt, meta);         // FSDP: the shards
//   auto resumed = checkpoint::load_training_state(dir, mesh, model, opt, models::config_of(cfg));
//   step = resumed.step;  next_batch = resumed.data_position;  rng_bytes = resumed.rng_state;
//
// `model` is anything with units() (models::GPT, models::MoEGPT, a pipeline stage): every unit's
// parameters are saved by name with their global extents, so a checkpoint loads onto any mesh
// and layout the model can be built on (dp x tp -> FSDP, -> one rank). `opt` is an
// optim::AdamW over model.collect(...) (or over fsdp.params()). Loading checks the model
// configuration, then sets the parameters, the moments and opt's step count; under FSDP it then
// runs fsdp.sync_parameters() (ZeRO-1/2: one all-gather per unit; ZeRO-3: nothing) so that the
// full values agree with the loaded shards. Communication: save's three and load's one status
// all-gathers (save.hpp, load.hpp), and that sync.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "dtensor/checkpoint/load.hpp"
#include "dtensor/checkpoint/save.hpp"
#include "dtensor/checkpoint/slots.hpp"

namespace dtensor::checkpoint {

namespace detail {
template <class T>
Slots<T> with_moments(Slots<T> params, auto& opt) {
  auto moments = adamw_slots(params, opt);
  params.insert(params.end(), std::make_move_iterator(moments.begin()), std::make_move_iterator(moments.end()));
  return params;
}
}  // namespace detail

/// Saves the model's parameters, opt's moments and step count, and `meta` at `dir`.
template <MeshType Mesh, class Model, class Opt>
void save_training_state(const std::filesystem::path& dir, const Mesh& mesh, Model& model, Opt& opt, TrainingMeta meta,
                         const SaveOptions& o = {}) {
  const auto slots = detail::with_moments(parameter_slots(model.units(), mesh), opt);
  meta.optimizer_steps = opt.steps();
  save(dir, mesh, slots, meta, o);
}

/// The same for a model sharded by parallel::fully_shard: this rank's shards are saved.
template <MeshType Mesh, class Model, class Fsdp, class Opt>
void save_training_state(const std::filesystem::path& dir, const Mesh& mesh, Model& model, Fsdp& fsdp, Opt& opt,
                         TrainingMeta meta, const SaveOptions& o = {}) {
  const auto slots = detail::with_moments(fsdp_parameter_slots(model.units(), fsdp, mesh), opt);
  meta.optimizer_steps = opt.steps();
  save(dir, mesh, slots, meta, o);
}

/// Loads what save_training_state saved (on any mesh) into the model and opt; throws unless the
/// checkpoint's configuration is `config`. Returns the trainer's metadata.
template <MeshType Mesh, class Model, class Opt>
TrainingMeta load_training_state(const std::filesystem::path& dir, const Mesh& mesh, Model& model, Opt& opt,
                                 std::map<std::string, std::string> config) {
  auto slots = detail::with_moments(parameter_slots(model.units(), mesh), opt);
  auto meta = load(dir, mesh, slots, {.config = std::move(config)});
  opt.set_steps(long(meta.optimizer_steps));
  return meta;
}

/// The same for a model sharded by parallel::fully_shard.
template <MeshType Mesh, class Model, class Fsdp, class Opt>
TrainingMeta load_training_state(const std::filesystem::path& dir, const Mesh& mesh, Model& model, Fsdp& fsdp, Opt& opt,
                                 std::map<std::string, std::string> config) {
  auto slots = detail::with_moments(fsdp_parameter_slots(model.units(), fsdp, mesh), opt);
  auto meta = load(dir, mesh, slots, {.config = std::move(config)});
  opt.set_steps(long(meta.optimizer_steps));
  fsdp.sync_parameters();
  return meta;
}

}  // namespace dtensor::checkpoint
