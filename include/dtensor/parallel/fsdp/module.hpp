// dtensor/parallel/fsdp/module.hpp — parallel::FullyShard, what fully_shard returns for a model
// on one mesh (FSDP2's FSDPModule): the optimizer's parameters, gradient sync on and off, the
// end of a step's reductions, unshard / reshard for pipeline stages, the parameter sync of
// ZeRO-1/2, the bytes held and the events. It owns the units' state (detail::FsdpGroup,
// parallel/fsdp/group.hpp), installs the hooks (parallel/fsdp/hooks.hpp) and runs the
// collectives (parallel/fsdp/collectives.hpp); parallel/fully_shard.hpp says what each stage does.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "dtensor/core/memory.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/units.hpp"
#include "dtensor/parallel/fsdp/collectives.hpp"
#include "dtensor/parallel/fsdp/group.hpp"
#include "dtensor/parallel/fsdp/hooks.hpp"
#include "dtensor/parallel/fsdp/options.hpp"

namespace dtensor::parallel {

/// StateSpace: where the master values, gradient shards and optimizer state live (the model's
/// space, or host_space for CPU offload). OverData: shard over the mesh's one Role::data
/// dimension, no replicate dimension (a parameter group on a mesh without a data-shard
/// dimension: the experts over "edp"; FullyShardGroups, parallel/fsdp/parameter_groups.hpp).
template <class Model, MeshType Mesh, class M, MemorySpace StateSpace = detail::model_space_t<Model>,
          bool OverData = false>
class FullyShard {
  static_assert(nn::require_units<Model>());
  using Group = detail::FsdpGroup<Model, Mesh, M, StateSpace, OverData>;
  using T = typename Group::T;
  using Space = typename Group::Space;
  static constexpr std::size_t N = Mesh::ndim;

 public:
  /// The mesh dimensions the units are sharded over: shard_dim (data-shard) .. shard_last (the
  /// context dimension when it follows: one flattened group, "fsdp*cp"; parallel/fsdp/group.hpp).
  using ShardDims = typename Group::ShardDims;
  static constexpr std::size_t shard_dim = Group::shard_dim;
  static constexpr std::size_t shard_last = Group::shard_last;
  static constexpr std::size_t replicate_dim = Group::replicate_dim;  // N when there is none

  FullyShard(Model& model, Mesh mesh, FsdpOptions o) : g_(model, std::move(mesh), o) {
    model.set_hooks(detail::fsdp::unit_hooks(g_));
  }
  FullyShard(const FullyShard&) = delete;  // the model's hooks hold the state
  FullyShard& operator=(const FullyShard&) = delete;
  ~FullyShard() {
    try {
      g_.model.set_hooks({});
      for (auto& u : g_.units) detail::fsdp::wait_gather(g_, *u);
      for (auto& u : g_.units) detail::fsdp::finish_reduce(g_, *u, false);
    } catch (...) {  // a failed collective is reported where it was waited on, not here
    }
  }

  /// This rank's shards of every unit's parameters (master values and gradient shards), for the
  /// optimizer, gradient clipping and the sequence-parallel gradient sync.
  nn::ParamList<M, N, StateSpace>& params() noexcept { return g_.params; }

  /// Off: the backward's gradients accumulate in the units' full buffers, unreduced (no_sync).
  void set_requires_gradient_sync(bool on) { g_.sync = on; }
  bool requires_gradient_sync() const noexcept { return g_.sync; }

  /// Waits for every unit's reduction, adds the result to the gradient shards and, for HSDP,
  /// all-reduces each unit's shard on the replicate dimension first. Returns the number of
  /// units reduced.
  std::size_t finish_gradient_sync() {
    std::size_t n = 0;
    for (auto& u : g_.units) n += detail::fsdp::finish_reduce(g_, *u, true);
    return n;
  }

  /// Issues the reduction of every unit's accumulated gradients now: after backwards run with
  /// set_requires_gradient_sync(false), e.g. a pipeline stage's last backward of a step, so
  /// that the reductions overlap the rest of the schedule. finish_gradient_sync waits for them.
  /// Returns the number issued.
  std::size_t reduce_gradients() {
    std::size_t n = 0;
    for (auto& unit : g_.units) {
      auto& s = *unit;
      if (s.reducing || (!s.group->grads_resident() && s.main_grad.numel() == 0)) continue;
      // Reduced already (during the backward, with sync on): ZeRO-1's full gradients stay
      // resident, but nothing in them is pending.
      bool pending = false;
      for (const auto& e : s.group->entries()) pending = pending || e.has_grad;
      if (!pending) continue;
      detail::fsdp::check_pending(g_, s);
      detail::fsdp::issue_reduce(g_, s);
      ++n;
    }
    return n;
  }

  /// ZeRO-3: all-gathers every unit now and keeps them unsharded until reshard(): the hooks
  /// neither gather nor free them meanwhile (a pipeline stage's UNSHARD before its first
  /// forward of a step, so its micro-batches share one all-gather per unit). Stages 1 and 2
  /// keep their values anyway: nothing to do.
  void unshard() {
    if (g_.options.stage != 3) return;
    for (std::size_t u = 0; u < g_.units.size(); ++u) detail::fsdp::issue_gather(g_, u, false);
    for (auto& u : g_.units) detail::fsdp::wait_gather(g_, *u);
    g_.held = true;
  }
  /// ZeRO-3: frees every unit's full values again (RESHARD), ending unshard().
  void reshard() {
    if (g_.options.stage != 3) return;
    g_.held = false;
    for (std::size_t u = 0; u < g_.units.size(); ++u) detail::fsdp::reshard_unit(g_, u);
  }

  /// ZeRO-1/2: all-gathers every unit's updated shard into its full values (one all-gather per
  /// unit). ZeRO-3: nothing (the next forward gathers).
  /// Over one shard rank (DDP: ZeRO-1 over a size-1 "fsdp"; HSDP's replicas hold whole units) the
  /// shard is the unit: no all-gather and no staging buffer of the unit's size — the master
  /// values are the model's own (T == M: nothing to do) or are converted into them in place.
  /// Parameter offload: then starts writing every unit's updated master shard to its file and
  /// drops it from the process's memory (ZeRO-3: the next forward reads it back, prefetched).
  void sync_parameters() {
    if (g_.options.stage != 3 && ShardDims::size(g_.mesh) == 1 && g_.offloaded.empty()) {
      for (auto& u : g_.units)
        if (!u->master_in_values)
          detail::convert_across<Space, StateSpace>(u->group->values_storage().first(u->shard_size()),
                                                    std::span<const M>(u->master.span()));
    } else if (g_.options.stage != 3) {
      // Two in flight at a time: unit u + 1's all-gather issued before unit u's is waited for, so
      // the send buffers staged are two units' shards, not every unit's at once.
      for (std::size_t u = 0; u < g_.units.size(); ++u) {
        detail::fsdp::issue_gather(g_, u, false);
        if (u > 0) detail::fsdp::wait_gather(g_, *g_.units[u - 1]);
      }
      if (!g_.units.empty()) detail::fsdp::wait_gather(g_, *g_.units.back());
    }
    for (auto& f : g_.offloaded) {
      f.map.write_behind();
      f.map.release(0, f.map.bytes());
    }
  }

  /// Zeroes the gradient shards (and ZeRO-1's full gradients), nothing pending.
  void zero_grad() {
    for (auto& p : g_.params) p.zero_grad();
    for (auto& u : g_.units) {
      u->grad_reduced = false;
      u->carried = {};
      if (u->main_grad.numel() > 0) u->zero_full_grads();
    }
    for (auto& u : g_.units)
      if (u->group->grads_resident()) {
        nn::detail::zero_flat<Space>(u->group->grads());
        detail::fsdp::reset_grad_states(*u);
      }
  }

  /// Bytes held now (see FsdpMemory); the optimizer's state is the optimizer's.
  FsdpMemory memory() const {
    FsdpMemory m;
    for (const auto& u : g_.units) {
      m.params += u->group->values_storage().size() * sizeof(T);
      m.grads += u->group->grads_storage().size() * sizeof(T) + std::size_t(u->main_grad.numel()) * sizeof(M);
      m.master += u->master_bytes();     // 0 where they are the full values' slice
      m.grad_shards += u->grad_bytes();  // 0 where the shard lives in the full gradients
    }
    m.disk = g_.disk_bytes;
    return m;
  }
  /// The most units whose full values were resident or being gathered at once (ZeRO-3).
  std::size_t peak_unsharded_units() const noexcept { return g_.peak_unsharded; }
  const std::vector<FsdpEvent>& events() const noexcept { return g_.events; }
  void clear_events() { g_.events.clear(); }
  std::size_t num_units() const noexcept { return g_.units.size(); }
  const FsdpOptions& options() const noexcept { return g_.options; }
  bool reshard_after_forward() const noexcept { return g_.reshard_after_forward; }

 private:
  Group g_;
};

}  // namespace dtensor::parallel
