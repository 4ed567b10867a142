// dtensor/train/options.hpp — what a train::Trainer is built from: the mesh's degrees, the
// schedule, ZeRO, the optimizer, clipping, the replica sync and offload (train/trainer.hpp).
//
//   train::TrainerOptions o{.degrees = {.pp = 2, .fsdp = 2, .tp = 2}, .schedule = "1f1b", .microbatches = 4,
//                           .zero = 3, .adamw = {.lr = 3e-3}};
//   o.check(world->size(), world->rank());   // the Trainer does it too: a dtensor::Error naming the flag-free cause
//
// The mesh is always (pp, dp, fsdp, cp, tp) — a parallelism that is off is a dimension of size 1,
// whose collectives cost nothing — so every program, the dry run and a user's model share one
// step. "pp" cuts the model into pipeline stages; "dp" replicates (DDP; with "fsdp" > 1 HSDP's
// replicas); "fsdp" shards parameters, gradients and optimizer state (ZeRO `zero`); "cp" splits
// every sequence; "tp" splits heads, MLP and vocabulary (the model's plan).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "dtensor/comm/settings_agreement.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/optim/adamw.hpp"
#include "dtensor/parallel/sync/diloco.hpp"
#include "dtensor/parallel/sync/fed_avg.hpp"
#include "dtensor/parallel/sync/traffic.hpp"

namespace dtensor::train {

/// The trainer's mesh over a memory space, and the mesh of one pipeline stage (no "pp").
template <class Space = host_space>
using MeshIn = BasicDeviceMesh<Space, "pp", "dp", "fsdp", "cp", "tp">;
template <class Space = host_space>
using StageMeshIn = BasicDeviceMesh<Space, "dp", "fsdp", "cp", "tp">;

/// The size of each mesh dimension; their product is the number of ranks.
struct Degrees {
  int pp = 1, dp = 1, fsdp = 1, cp = 1, tp = 1;
  int ranks() const noexcept { return pp * dp * fsdp * cp * tp; }
  std::array<int, 5> shape() const noexcept { return {pp, dp, fsdp, cp, tp}; }
  /// Throws a dtensor::Error unless every degree is >= 1 and their product is `ranks`.
  void check(int ranks, int rank = -1) const {
    constexpr const char* op = "train::Trainer";
    for (auto [name, v] : {std::pair{"pp", pp}, {"dp", dp}, {"fsdp", fsdp}, {"cp", cp}, {"tp", tp}})
      if (v < 1) throw Error(op, dtensor::detail::cat("the mesh degree ", name, " is ", v, ": every degree must be >= 1"), rank);
    if (this->ranks() != ranks)
      throw Error(op, dtensor::detail::cat("the mesh pp ", pp, " x dp ", dp, " x fsdp ", fsdp, " x cp ", cp, " x tp ", tp, " = ",
                                           this->ranks(), " ranks, but the communicator has ", ranks),
                  rank);
  }
};

/// What runs on "dp" instead of DDP's gradient all-reduce (parallel/sync/, docs/beyond-sync.md).
struct ReplicaSyncOptions {
  parallel::sync::SyncKind kind = parallel::sync::SyncKind::ddp;
  int inner_steps = 1;                  // local-sgd and diloco's H; fedavg's local steps per round
  int staleness = 1;                    // async: the gradients applied are s steps old
  int clients = 0;                      // fedavg: clients sampled per round (0: all)
  std::uint64_t seed = 0;               // fedavg's sampling
  double samples_per_step = 1;          // fedavg: each client's samples per step (its weight; equal slices: equal weights)
  parallel::sync::DiLoCoOptions diloco{};  // diloco (inner_steps above wins)
};

struct TrainerOptions {
  Degrees degrees{};
  std::string schedule = "1f1b";  // parallel/pipeline/by_name.hpp: gpipe, 1f1b, interleaved, zbh1, zbv, dualpipev
  int microbatches = 1;
  int stages_per_rank = 0;        // interleaved schedules: pipeline stages per rank (0: the schedule's own)
  // Run the schedule's stages with one micro-batch (parallel::pipeline::one_microbatch) instead of
  // its `microbatches`: the dry run's step (models/training_plan.hpp), which counts the schedule's
  // other micro-batches rather than runs them. `microbatches` still picks and checks the schedule.
  bool one_microbatch = false;
  int zero = 0;                   // ZeRO stage over "fsdp" (1, 2, 3); 0: 3 when fsdp > 1, else 1 (DDP)
  std::optional<bool> reshard_after_forward{};  // ZeRO-3: per unit and micro-batch (true) or the stage held for the step
  optim::AdamWOptions adamw{};
  double clip_norm = 1.0;         // the gradients' norm over every stage clipped to this; <= 0: no clipping
  ReplicaSyncOptions sync{};
  std::string offload_params_dir{};   // FSDP's master shards in mapped files there (parallel/fully_shard.hpp)
  std::string offload_optimizer_dir{};  // AdamW's moments in files there (host memory only; optim/offload_adamw.hpp)
  std::size_t offload_buffer_bytes = std::size_t(1) << 20;  // the optimizer offload's host staging buffer,
  std::function<std::size_t()> offload_buffer_sizer{};      // or its size chosen once the model is built (every rank)
  std::size_t bucket_bytes = std::size_t(1) << 20;          // gradient all-reduce buckets
  // Parameters built as shards (nn::DeferredInit: each rank draws only what FSDP keeps on it,
  // the same values as eagerly); false: every rank builds its stages whole, then shards them.
  bool deferred_init = true;

  /// The ZeRO stage this runs (0 resolved).
  int zero_stage() const noexcept { return zero != 0 ? zero : degrees.fsdp > 1 ? 3 : 1; }

  /// Every rank's options must be the same (one all-gather over `comm`: a dtensor::Error on every
  /// rank naming what differs, before anything is built); then they are checked (check()).
  void agree_and_check(Communicator& comm) const {
    auto text = [](auto v) { return dtensor::detail::cat(v); };
    const auto& a = adamw;
    require_same_settings(
        comm, "train::Trainer",
        {{"degrees (pp dp fsdp cp tp)",
          dtensor::detail::cat(degrees.pp, " ", degrees.dp, " ", degrees.fsdp, " ", degrees.cp, " ", degrees.tp)},
         {"schedule", schedule},
         {"microbatches", text(microbatches)},
         {"stages_per_rank", text(stages_per_rank)},
         {"one_microbatch", text(int(one_microbatch))},
         {"zero", text(zero)},
         {"reshard_after_forward", reshard_after_forward ? text(int(*reshard_after_forward)) : "default"},
         {"adamw (lr beta1 beta2 eps weight_decay)",
          dtensor::detail::cat(a.lr, " ", a.beta1, " ", a.beta2, " ", a.eps, " ", a.weight_decay)},
         {"clip_norm", text(clip_norm)},
         {"sync", dtensor::detail::cat(parallel::sync::to_string(sync.kind), " inner ", sync.inner_steps, " staleness ",
                                       sync.staleness, " clients ", sync.clients, " seed ", sync.seed)},
         {"offload (params, optimizer)",
          dtensor::detail::cat(!offload_params_dir.empty(), " ", !offload_optimizer_dir.empty())},
         {"bucket_bytes", text(bucket_bytes)},
         {"deferred_init", text(int(deferred_init))}});
    check(comm.size(), comm.rank());
  }

  /// Throws a dtensor::Error naming the setting when these options cannot train on `ranks` ranks.
  void check(int ranks, int rank = -1) const {
    constexpr const char* op = "train::Trainer";
    degrees.check(ranks, rank);
    if (microbatches < 1) throw Error(op, dtensor::detail::cat("microbatches ", microbatches, ": must be >= 1"), rank);
    if (zero < 0 || zero > 3) throw Error(op, dtensor::detail::cat("ZeRO stage ", zero, ": must be 1, 2 or 3 (0: chosen)"), rank);
    if (reshard_after_forward && zero_stage() != 3)
      throw Error(op, dtensor::detail::cat("reshard_after_forward is for ZeRO-3, got ZeRO-", zero_stage()), rank);
    const auto& s = sync;
    using parallel::sync::SyncKind;
    if (s.kind != SyncKind::ddp) {
      if (s.inner_steps < 1) throw Error(op, dtensor::detail::cat("inner_steps ", s.inner_steps, ": must be >= 1"), rank);
      if (s.kind == SyncKind::async && s.staleness < 0)
        throw Error(op, dtensor::detail::cat("staleness ", s.staleness, ": must be >= 0"), rank);
    }
  }
};

}  // namespace dtensor::train
