// tests/parity/pipeline_parity.hpp — one GPT training run through a pipeline schedule on a
// (pp, dp, tp) mesh, for the parity tests (threads and MPI): the per-step losses, the executor's
// measurements and the validator's memory report.
//
// The oracle is run_parity (gpt_parity.hpp) on one rank with the same batch and layers: the
// pipeline run splits the batch into M micro-batches, runs the schedule, reduces the gradients
// on "dp" (DDP after the schedule), syncs sequence-parallel gradients on "tp", clips by the norm
// over all stages and steps AdamW, so its per-step losses must be the one-rank run's.
#pragma once

#include <limits>
#include <memory>
#include <span>
#include <string>

#include "dtensor/nn/activation_offload.hpp"
#include "dtensor/parallel/pipeline/by_name.hpp"
#include "dtensor/parallel/pipeline/clip.hpp"
#include "dtensor/parallel/pipeline/executor.hpp"
#include "dtensor/parallel/pipeline/split.hpp"
#include "gpt_parity.hpp"

namespace dtensor::testing {

using PipelineMesh = DeviceMesh<"pp", "dp", "tp">;

/// Sequences per step and blocks of the pipeline parity runs: 8 sequences split into 4 or 8
/// micro-batches; 9 layers divide unevenly over 2, 4 and 8 stages.
inline constexpr Extent pipeline_batch = 8;
inline constexpr Extent pipeline_layers = 9;

struct PipelineRun {
  std::vector<double> losses;             // every step's mean loss, on every rank
  parallel::pipeline::StepStats first;              // the executor's measurements of step 1 on this rank
  double bubble = 0;                      // step 1's idle fraction in counted slots, mean over the pipeline ranks
  parallel::pipeline::Schedule schedule;
  parallel::pipeline::MemoryReport memory;          // the validator's
  int pipeline_rank = 0;
  std::int64_t activation_peak = 0;       // step 1's peak activation bytes on this rank (the ledger's)
  std::int64_t offload_peak = 0;          // with activation offload: step 1's peak on its tier (disk or host)
  nn::ActivationOffloadStats offload;     // with activation offload: this rank's, over the run
  std::size_t blocks_here = 0;            // the blocks of this rank's stages
};

struct PipelineShape {
  int pp = 2, dp = 1, tp = 1;
};

template <class Plan>
PipelineRun run_pipeline_parity(CommPtr world, PipelineShape shape, parallel::pipeline::ScheduleKind kind, int microbatches,
                                int stages_per_rank = 0, int steps = parity_steps, Extent batch = pipeline_batch,
                                std::optional<nn::ActivationOffloadOptions> offload = std::nullopt) {
  PipelineMesh mesh(world, {shape.pp, shape.dp, shape.tp});
  const GptMesh stage_mesh = parallel::pipeline::stage_mesh_of(mesh);
  auto cfg = parity_config();
  cfg.layers = pipeline_layers;
  using Model = models::GptParts<double, GptMesh, Plan>;
  using Stage = parallel::pipeline::Stage<Model>;
  auto schedule = parallel::pipeline::make_schedule(kind, shape.pp, microbatches, stages_per_rank);
  auto stages = parallel::pipeline::split(Model(stage_mesh, cfg), schedule.layout, mesh.coordinate(0));
  parallel::pipeline::Executor<Stage, PipelineMesh> exec(mesh, schedule, std::move(stages));
  std::shared_ptr<nn::ActivationOffload> offloader;  // every block's saved state on the tier, one offloader per rank
  if (offload) {
    offloader = std::make_shared<nn::ActivationOffload>(*offload, world.get());
    for (Stage& stage : exec.stages()) stage.set_activation_offload(offloader);
  }
  nn::ParamList<double, 2> ps;
  for (Stage& stage : exec.stages()) nn::collect(stage, ps);
  optim::AdamW<double, 2> opt(ps, parity_adamw());
  parallel::DataParallel<GptMesh> ddp(stage_mesh, {.bucket_bytes = 4096});

  PipelineRun out;
  out.schedule = schedule;
  out.memory = exec.memory();
  out.pipeline_rank = mesh.coordinate(0);
  for (Stage& stage : exec.stages()) out.blocks_here += stage.blocks().size();
  for (int step = 0; step < steps; ++step) {
    auto [ids, targets] = parity_tokens(step, cfg, batch);
    opt.zero_grad();
    auto microbatch_list = parallel::pipeline::split_microbatches<typename Stage::Input>(stage_mesh, ids, targets, microbatches);
    MemoryLedger ledger;  // what the schedule allocates: saved activations, received ones, their gradients
    MemoryTagScope activations(MemoryTag::activations);
    auto stats = exec.step(microbatch_list);
    if (step == 0) out.activation_peak = ledger.peak("host", MemoryTag::activations);
    if (step == 0 && offload)
      out.offload_peak = offload->tier == nn::OffloadTier::disk ? ledger.peak("disk", MemoryTag::activations) : 0;
    ddp.all_reduce_gradients(ps);
    parallel::sequence_parallel_grads(ps, stage_mesh, {.bucket_bytes = 4096});
    parallel::pipeline::clip_grad_norm(ps, stage_mesh, mesh.group(0), 1.0);
    opt.step();
    // The loss lives on the last stage's ranks; the harness shares it over the pipeline group.
    double loss = stats.loss.value_or(-std::numeric_limits<double>::infinity());
    mesh.group(0).all_reduce(std::span<double>(&loss, 1), ReduceOp::max);
    out.losses.push_back(loss);
    if (step == 0) {
      double idle = stats.idle_fraction();
      mesh.group(0).all_reduce(std::span<double>(&idle, 1), ReduceOp::sum);
      out.bubble = idle / double(shape.pp);
      out.first = std::move(stats);
    }
  }
  if (offloader) out.offload = offloader->stats();
  return out;
}

/// The one-rank reference of the pipeline runs (run_parity with the pipeline's batch and layers).
inline std::vector<double> pipeline_reference(CommPtr one_rank) {
  return run_parity<nn::ReplicatedPlan>(std::move(one_rank), {1, 1}, {.batch = pipeline_batch, .layers = pipeline_layers})
      .losses;
}

}  // namespace dtensor::testing
