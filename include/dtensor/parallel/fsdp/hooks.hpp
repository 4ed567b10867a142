// dtensor/parallel/fsdp/hooks.hpp — what FSDP does when the model runs a unit (FSDP2's
// FSDPState hooks): the nn::UnitHooks (nn/units.hpp) fully_shard installs on the model, by ZeRO
// stage —
//
//   stage   pre_forward / post_forward              pre_backward                     grads_ready
//   3       gather (+ prefetch) / free the unit     gather (+ prefetch), gradients   free the unit; reduce
//           (reshard_after_forward, not held)
//   2       —                                       the full gradients materialized  reduce (then freed)
//   1       —                                       a reduced gradient carried        reduce (gradients kept)
//                                                   aside; gradients materialized
//
// — "reduce" meaning: with gradient sync on (not no_sync), the earlier units' reductions
// finished and this unit's reduce-scatter issued (parallel/fsdp/collectives.hpp).
#pragma once

#include <cstddef>
#include <span>

#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/nn/units.hpp"
#include "dtensor/parallel/detail/convert.hpp"
#include "dtensor/parallel/fsdp/collectives.hpp"
#include "dtensor/parallel/fsdp/group.hpp"
#include "dtensor/parallel/fsdp/options.hpp"

namespace dtensor::parallel::detail::fsdp {

/// Unit u is about to compute: its values resident (waiting for a prefetch, or gathering now),
/// then the next units' all-gathers issued, up to `prefetch` unsharded at once.
template <class G>
void pre_compute(G& g, std::size_t u, bool backward) {
  auto& s = *g.units[u];
  if (!s.group->values_resident() || s.gathering) {
    issue_gather(g, u, backward);
    wait_gather(g, s);
  }
  if (backward && !s.group->grads_resident()) s.group->materialize_grads(s.padded());
  g.events.push_back({FsdpEvent::compute_begin, u, backward});
  for (int k = 1; k < g.options.prefetch; ++k) {
    const auto next = backward ? std::ptrdiff_t(u) - k : std::ptrdiff_t(u) + k;
    if (next < 0 || next >= std::ptrdiff_t(g.units.size())) break;
    issue_gather(g, std::size_t(next), backward);
  }
}

/// Unit u's weight gradients are complete: ZeRO-1's fp32 accumulation adds them into main_grad;
/// ZeRO-3 frees the unit's values; with sync on, the earlier units' reductions (issued while
/// this one computed) are finished and added into their gradient shards, so that their full
/// gradients and the reduce-scatter's output go now (at most two units' of each live at once,
/// not every unit's until finish_gradient_sync: on a one-rank shard dimension, DDP, the output
/// is a whole unit), and this unit's reduction is issued. HSDP: the previous unit's (u + 1)
/// reduce-scatter is waited for and its all-reduce over the replicas issued, finished at the
/// next unit's: it runs while this unit's reduction and the next unit's backward do (three
/// units' reduced parts live at once).
template <class G>
void grads_ready(G& g, std::size_t u) {
  using T = typename G::T;
  using M = typename G::Master;
  using Space = typename G::Space;
  auto& s = *g.units[u];
  if (s.main_grad.numel() > 0 && s.group->grads_resident()) {
    // Megatron's fp32 accumulation: this backward's T gradients added into main_grad, then freed.
    auto wide = G::Shard::template make_buffer<M>(s.padded(), MemoryTag::communication, false);
    convert_into<Space>(wide.span(), std::span<const T>(s.group->grads_storage().first(s.padded())));
    add_into<Space>(s.main_grad.span(), std::span<const M>(wide.span()));
    s.group->release_grads();
  }
  if (g.options.stage == 3) {
    if (!g.held) reshard_unit(g, u);
    if (!s.group->grads_resident()) return;  // no gradient came (cannot happen for a model's own unit)
  }
  if (!g.sync) return;  // accumulate in the full buffer (no_sync)
  check_pending(g, s);
  // HSDP: the unit before this one (u + 1, the backward runs from the last unit) gets its
  // replica all-reduce issued, to run while this one computes; the ones before it are finished.
  for (std::size_t v = u + 2; v < g.units.size(); ++v) finish_reduce(g, *g.units[v], true);
  if (u + 1 < g.units.size()) {
    if (g.has_replicas()) issue_replica_reduce(g, *g.units[u + 1]);
    else finish_reduce(g, *g.units[u + 1], true);
  }
  issue_reduce(g, s);
}

/// ZeRO-3: each unit gathered before its forward and its backward, freed after each.
template <class G>
nn::UnitHooks zero3_hooks(G& g) {
  nn::UnitHooks h;
  h.pre_forward = [&g](std::size_t u) { pre_compute(g, u, false); };
  h.post_forward = [&g](std::size_t u) {
    g.events.push_back({FsdpEvent::compute_end, u, false});
    if (g.reshard_after_forward && !g.held) reshard_unit(g, u);
  };
  h.pre_backward = [&g](std::size_t u) { pre_compute(g, u, true); };
  return h;
}

/// ZeRO-2: the full gradients exist only around the unit's backward.
template <class G>
nn::UnitHooks zero2_hooks(G& g) {
  nn::UnitHooks h;
  h.pre_backward = [&g](std::size_t u) {
    auto& s = *g.units[u];
    if (!s.group->grads_resident()) s.group->materialize_grads(s.padded());
  };
  return h;
}

/// ZeRO-1: a reduced gradient still in the full buffer moved aside (carry_reduced_grad); the
/// full gradients materialized where they are not kept (main_grad: around the backward).
template <class G>
nn::UnitHooks zero1_hooks(G& g) {
  nn::UnitHooks h;
  h.pre_backward = [&g](std::size_t u) {
    auto& s = *g.units[u];
    carry_reduced_grad<G>(s);
    if (!s.group->grads_resident()) s.group->materialize_grads(s.padded());  // main_grad: around the backward
  };
  return h;
}

/// The hooks of g's stage (the table at the top of this file).
template <class G>
nn::UnitHooks unit_hooks(G& g) {
  nn::UnitHooks h = g.options.stage == 3 ? zero3_hooks(g) : g.options.stage == 2 ? zero2_hooks(g) : zero1_hooks(g);
  h.grads_ready = [&g](std::size_t u) { grads_ready(g, u); };
  return h;
}

}  // namespace dtensor::parallel::detail::fsdp
