// dtensor/train/replica_sync.hpp — what runs on the replica dimension "dp" of a training step,
// one interface over DDP, local SGD, DiLoCo, asynchronous (delayed) gradients and FedAvg
// (parallel/sync/, docs/beyond-sync.md). train::Trainer owns one.
//
//   train::ReplicaSync<float, StageMesh> sync(stage_mesh, params, {.kind = SyncKind::diloco, .inner_steps = 8}, dp);
//   // each step, after the pipeline's own gradient syncs inside each replica:
//   if (sync.gradients_ready()) { clip; optimizer.step(); }   // DDP: always (its all-reduce ran in the step)
//   sync.after_update(step);                                   // the outer sync when due
//
// Collectives: DDP none here (the step's all-reduce on "dp" is FSDP's / ShardedPipeline's);
// local SGD and DiLoCo the outer all-reduce on "dp" every inner_steps steps (per fragment);
// async one all-reduce on "dp" per step, applied s steps later; FedAvg a weighted all-reduce on
// "dp" per round. The others keep each replica's gradients its own (keep_local_gradients).
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "dtensor/nn/module.hpp"
#include "dtensor/parallel/sync/delayed_gradients.hpp"
#include "dtensor/parallel/sync/diloco.hpp"
#include "dtensor/parallel/sync/fed_avg.hpp"
#include "dtensor/parallel/sync/local_gradients.hpp"
#include "dtensor/train/options.hpp"

namespace dtensor::train {

template <class T, MeshType StageMesh>
class ReplicaSync {
 public:
  using List = nn::ParamList<T, StageMesh::ndim, mesh_space_t<StageMesh>>;
  using Kind = parallel::sync::SyncKind;

  /// `params`: the parameters on the stage mesh (their gradients after the step's syncs inside a
  /// replica).
  ReplicaSync(const StageMesh& mesh, const List& params, const ReplicaSyncOptions& o) : mesh_(mesh), params_(params), o_(o) {
    if (o.kind == Kind::local_sgd)
      diloco_.emplace(mesh, params, parallel::sync::DiLoCoOptions::local_sgd(o.inner_steps));
    if (o.kind == Kind::diloco) {
      auto d = o.diloco;
      d.inner_steps = o.inner_steps;
      diloco_.emplace(mesh, params, d);
    }
    if (o.kind == Kind::async) delayed_.emplace(mesh, params, o.staleness);
    if (o.kind == Kind::fedavg)
      fed_.emplace(mesh, params, parallel::sync::FedAvgOptions{.clients_per_round = o.clients, .seed = o.seed});
    participating_ = !fed_ || fed_->begin_round();
  }

  Kind kind() const noexcept { return o_.kind; }
  /// After the step's gradient syncs inside each replica: whether the optimizer steps now.
  bool gradients_ready() {
    if (o_.kind == Kind::ddp) return true;
    if (delayed_) return delayed_->exchange();  // the reduced gradients of step t - s, or none yet
    parallel::sync::keep_local_gradients<StageMesh, "dp">(params_, mesh_);  // each replica its own
    return participating_;
  }
  /// Whether clipping runs this step given the optimizer `updates`: FedAvg's idle clients still
  /// join the norm's all-reduce, which spans "dp".
  bool clips(bool updates) const noexcept { return updates || fed_.has_value(); }
  /// After the optimizer step `step` (1-based): local SGD's and DiLoCo's outer sync, FedAvg's round.
  void after_update(long step) {
    if (diloco_) diloco_->step();
    if (fed_ && step % o_.inner_steps == 0) {
      fed_->end_round(o_.samples_per_step * o_.inner_steps);  // equal slices: equal weights
      participating_ = fed_->begin_round();
    }
  }
  /// Resuming at `step` (the last one done): the strategies' clocks; returns the pending
  /// gradients' storage of async (for the checkpoint's slots to fill).
  std::vector<std::span<T>> resume_at(long step) {
    if (diloco_) diloco_->set_inner_step(step);
    if (fed_) fed_->set_round(step / o_.inner_steps), participating_ = fed_->begin_round();
    return delayed_ ? delayed_->restore(step) : std::vector<std::span<T>>{};
  }
  /// Before saving: async's gradients in flight settled into storage a checkpoint reads.
  std::vector<std::span<T>> settle() { return delayed_ ? delayed_->settle() : std::vector<std::span<T>>{}; }
  /// At the end of training: DiLoCo's outer all-reduces still in flight land.
  void finish() {
    if (diloco_) diloco_->finish();
  }

  std::optional<parallel::sync::DiLoCo<T, StageMesh, "dp">>& diloco() noexcept { return diloco_; }
  std::optional<parallel::sync::DelayedGradients<T, StageMesh, "dp">>& delayed() noexcept { return delayed_; }

 private:
  StageMesh mesh_;
  List params_;
  ReplicaSyncOptions o_;
  std::optional<parallel::sync::DiLoCo<T, StageMesh, "dp">> diloco_;             // local-sgd, diloco
  std::optional<parallel::sync::DelayedGradients<T, StageMesh, "dp">> delayed_;  // async
  std::optional<parallel::sync::FedAvg<T, StageMesh, "dp">> fed_;                // fedavg
  bool participating_ = true;
};

}  // namespace dtensor::train
