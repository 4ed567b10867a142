// dtensor/parallel/fsdp/collectives.hpp — FSDP's communication, per unit: the all-gather of its
// values, the reduce-scatter of its gradients on the shard group and, for HSDP, the all-reduce
// of the reduced shard on the replicate dimension; and how each result lands in the unit's
// state (FSDP2's _fsdp_collectives). Every function acts on a detail::FsdpGroup
// (parallel/fsdp/group.hpp); the hooks (parallel/fsdp/hooks.hpp) and parallel::FullyShard
// (parallel/fsdp/module.hpp) call them.
//
// Where a decision depends on the ZeRO stage, the precision (T == M or not, reductions in M or
// in T) or the offload (the states in another memory space), it is one small named function
// below: the buffer a reduce-scatter reads (reduce_source), what happens to a unit's full
// gradients once reduced (after_reduction), and how the reduced part reaches the gradient shard
// (shard_update, a table of four paths). Nothing here communicates beyond what
// parallel/fully_shard.hpp's table says; every collective is recorded by CommLog.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>

#include "dtensor/comm/work.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/parallel/detail/convert.hpp"
#include "dtensor/parallel/fsdp/group.hpp"
#include "dtensor/parallel/fsdp/options.hpp"

namespace dtensor::parallel::detail::fsdp {

// ---------------------------------------------------------------- all-gather

/// Issues unit u's all-gather of this rank's value shard (narrowed to T, moved from the state's
/// space) into the unit's full values; nothing when one is in flight or, under ZeRO-3, the values
/// are resident. Parameter offload: the next unit in this direction is read ahead, this one's
/// shard released to its file once sent.
template <class G>
void issue_gather(G& g, std::size_t u, bool backward) {
  using T = typename G::T;
  using M = typename G::Master;
  using Space = typename G::Space;
  using StateSpace = typename G::State;
  auto& s = *g.units[u];
  if (s.gathering || (s.group->values_resident() && g.options.stage == 3)) return;
  s.group->materialize_values(s.padded());
  s.gather_send = G::Shard::template make_buffer<T>(s.chunk, MemoryTag::communication, true);  // padding stays 0
  if (!g.offloaded.empty()) {                           // parameter offload: the next unit in this direction read ahead
    const std::size_t next = backward ? u - 1 : u + 1;  // u - 1 wraps past 0 to a large index: none
    if (next < g.units.size()) g.offloaded[next].map.prefetch(0, g.offloaded[next].map.bytes());
  }
  convert_across<Space, StateSpace>(s.gather_send.span().first(s.shard_size()), std::span<const M>(s.master.span()));
  if (!g.offloaded.empty()) g.offloaded[u].map.release(0, g.offloaded[u].map.bytes());  // sent: back to the file
  s.gather =
      G::ShardDims::group(g.mesh).all_gather_async(std::span<const T>(s.gather_send.span()), s.group->values_storage());
  s.gathering = true;
  g.events.push_back({FsdpEvent::gather_issued, u, backward});
  g.peak_unsharded = std::max(g.peak_unsharded, g.unsharded_now());
}

template <class G>
void wait_gather(G& g, typename G::Shard& s) {
  if (!s.gathering) return;
  s.gathering = false;
  s.gather.wait();
  s.gather_send = {};
  g.events.push_back({FsdpEvent::gather_done, g.index_of(s), false});
}

/// Frees unit u's full values (after waiting for a gather in flight).
template <class G>
void reshard_unit(G& g, std::size_t u) {
  auto& s = *g.units[u];
  wait_gather(g, s);
  s.group->release_values();
  g.events.push_back({FsdpEvent::reshard, u, false});
}

// ---------------------------------------------------------------- gradient states

/// Every pending gradient is Partial on every dimension of the shard group (under context
/// parallelism on "cp" as on "fsdp": the reduce-scatter over the flattened group sums both).
template <class G>
void check_pending(const G& g, const typename G::Shard& s) {
  using Mesh = typename G::MeshT;
  constexpr std::size_t shard_dim = G::shard_dim;
  for (const auto& e : s.group->entries())
    for (std::size_t d = shard_dim; d <= G::shard_last; ++d) {
      if (e.has_grad && !e.grad_state.placements[d].is_partial())
        g.mesh.comm().fail(
            "fully_shard",
            dtensor::detail::cat("gradient of ", e.name, " in unit ", s.name, " is ", to_string(e.grad_state),
                                 ", not Partial on the ", d == shard_dim ? "data-shard" : "context", " dimension \"",
                                 Mesh::names[d], "\" of the shard group: reduced twice?"));
      else if (e.has_grad && e.grad_state.placements[d].op != e.grad_state.placements[shard_dim].op)
        g.mesh.comm().fail(
            "fully_shard",
            dtensor::detail::cat("gradient of ", e.name, " in unit ", s.name, " is ", to_string(e.grad_state),
                                 ": one reduce-scatter over the shard group needs one reduction op on \"",
                                 Mesh::names[shard_dim], "\" and \"", Mesh::names[d], "\""));
    }
}

/// The pending reduction of the unit's gradients on the shard dimension (sum, or avg).
template <class G>
ReduceOp pending_op(const typename G::Shard& s) {
  for (const auto& e : s.group->entries()) {
    const auto& p = e.grad_state.placements[G::shard_dim];
    if (e.has_grad && p.is_partial()) return p.op;
  }
  return ReduceOp::sum;
}

/// The segments' gradient states once reduced: the entry's, with the shard group's dimensions
/// Shard<0> (of the flat buffer) and the replicate dimension reduced; the tensor dimension as it was
/// (Partial<sum> under sequence parallelism, for sequence_parallel_grads).
template <class G>
void remember_grad_states(const G& g, typename G::Shard& s) {
  s.pending_states.clear();
  for (const auto& e : s.group->entries()) {
    if (s.overlap(e).size() == 0) continue;
    auto st = G::ShardDims::sharded(e.grad_state);
    if constexpr (G::replicate_dim < G::N)
      if (g.options.reduce_replicas) st.placements[G::replicate_dim] = PlacementDesc::replicate();
    s.pending_states.push_back(st);
  }
}

template <class Shard>
void reset_grad_states(Shard& s) {
  for (auto& e : s.group->entries()) {
    e.grad_state = e.layout;
    e.has_grad = false;
  }
}

/// The shard's gradient is not this step's until its reduction is added into it: Partial(op) on
/// the shard group's dimensions, so that an optimizer step taken before finish_gradient_sync
/// fails (optim::detail::check_reduced) instead of stepping on a stale gradient.
template <class G>
void mark_unreduced(LayoutDesc<G::N>& state, ReduceOp op) {
  for (std::size_t d = G::shard_dim; d <= G::shard_last; ++d) state.placements[d] = PlacementDesc::partial(op);
}

// ---------------------------------------------------------------- reduce-scatter

/// ZeRO-1 with the gradient shard in the full gradient buffer: a reduced gradient still there
/// when the next backward starts (no zero_grad in between: accumulation over steps) is moved
/// aside and the buffer zeroed, so that the backward accumulates this rank's local gradient
/// from 0 and the next finish_reduce adds the moved one back.
template <class G>
void carry_reduced_grad(typename G::Shard& s) {
  using T = typename G::T;
  using M = typename G::Master;
  if (!s.grad_in_full || !s.grad_reduced) return;
  s.grad_reduced = false;
  bool held = false;
  for (const auto& seg : s.segments) held = held || *seg.has_grad;
  if (held) {
    s.carried = G::Shard::template make_buffer<M, typename G::State>(s.shard_size(), MemoryTag::gradients, false);
    if (s.grad_narrow)
      convert_into<typename G::Space>(s.carried.span(), std::span<const T>(s.grad_low.span()));  // exact
    else convert_into<typename G::State>(s.carried.span(), std::span<const M>(s.grad.span()));
  }
  s.zero_full_grads();
}

/// The buffer a reduce-scatter in M reads: the full gradients themselves (T == M), main_grad
/// (ZeRO-1's fp32 accumulation), or the full T gradients widened into reduce_wide.
template <class G>
std::span<typename G::Master> reduce_source(typename G::Shard& s, std::span<typename G::T> full) {
  using T = typename G::T;
  using M = typename G::Master;
  if constexpr (std::is_same_v<T, M>) return full;
  else if (s.main_grad.numel() > 0) return s.main_grad.span();
  else {
    s.reduce_wide = G::Shard::template make_buffer<M>(full.size(), MemoryTag::communication, false);
    convert_into<typename G::Space>(s.reduce_wide.span(), std::span<const T>(full));
    return s.reduce_wide.span();
  }
}

/// Issues the unit's reduction on the shard group: a reduce-scatter of the full gradients
/// (every stage: ZeRO-1 too needs only its shard), in M or T.
template <class G>
void issue_reduce(G& g, typename G::Shard& s) {
  using T = typename G::T;
  using M = typename G::Master;
  auto& group = G::ShardDims::group(g.mesh);
  // The full gradients of T (main_grad: released; the reduction reads main_grad in M).
  const auto full = s.group->grads_resident() ? s.group->grads_storage().first(s.padded()) : std::span<T>();
  s.grad_op = pending_op<G>(s);
  if (g.reduce_in_m()) {
    const std::span<M> send = reduce_source<G>(s, full);
    s.reduced_wide = G::Shard::template make_buffer<M>(s.chunk, MemoryTag::communication, false);
    s.reduce = group.reduce_scatter_async(std::span<const M>(send), s.reduced_wide.span(), s.grad_op);
  } else {
    s.reduced_narrow = G::Shard::template make_buffer<T>(s.chunk, MemoryTag::communication, false);
    s.reduce = group.reduce_scatter_async(std::span<const T>(full), s.reduced_narrow.span(), s.grad_op);
  }
  s.reducing = true;
  // Until its reduction is added into the shard, the shard's gradient is not this step's
  // (finish_collective says so again once the collective is done).
  for (auto& seg : s.segments) mark_unreduced<G>(*seg.grad_state, s.grad_op);
  g.events.push_back({FsdpEvent::reduce_issued, g.index_of(s), true});
}

/// A unit's full gradients once its reduce-scatter is done: ZeRO-2/3 free them; ZeRO-1 keeps
/// them and zeroes them (consumed: the next step starts from 0) unless the gradient shard lives
/// in them (then the shard update does).
template <class G>
void after_reduction(const G& g, typename G::Shard& s) {
  if (g.options.stage != 1) s.group->release_grads();
  else if (!s.grad_in_full) nn::detail::zero_flat<typename G::Space>(s.group->grads_storage());
}

/// Waits for the unit's collective on the shard dimension (this rank's part is then in
/// reduced_*), then after_reduction.
template <class G>
void finish_collective(G& g, typename G::Shard& s) {
  if (!s.reducing || s.reduce_waited) return;
  s.reduce.wait();
  s.reduce_waited = true;
  after_reduction(g, s);
  s.reduce_wide = {};
  remember_grad_states(g, s);
  reset_grad_states(s);
  // Until finish_gradient_sync adds the reduction into the shard, the shard's gradient is not
  // this step's (mark_unreduced).
  for (std::size_t k = 0; k < s.segments.size(); ++k) {
    auto pending = s.pending_states[k];
    mark_unreduced<G>(pending, s.grad_op);
    *s.segments[k].grad_state = pending;
  }
}

/// HSDP: once the unit's reduce-scatter is done, issues the all-reduce of this rank's reduced
/// part on the replicate dimension, asynchronously and in place (none when the mesh has no such
/// dimension, it has one rank or FsdpOptions::reduce_replicas is off), so that it runs while
/// the backward computes the next units (grads_ready, parallel/fsdp/hooks.hpp) — DDP's
/// all-reduce overlapped with the backward, as its bucketed form was. finish_reduce waits for it.
template <class G>
void issue_replica_reduce(G& g, typename G::Shard& s) {
  if (!s.reducing || s.replica_issued) return;
  finish_collective(g, s);
  if constexpr (G::replicate_dim < G::N) {
    if (!g.has_replicas()) return;
    auto& replicas = g.mesh.group(G::replicate_dim);
    const std::size_t n = s.shard_size();  // the reduced part holds at least n elements
    auto in_place = [&](auto reduced) {
      using E = typename decltype(reduced)::element_type;
      s.replica_reduce = replicas.all_reduce_async(std::span<const E>(reduced), reduced, s.grad_op);
    };
    if (g.reduce_in_m()) in_place(s.reduced_wide.span().first(n));
    else in_place(s.reduced_narrow.span().first(n));
    s.replica_issued = true;
    g.events.push_back({FsdpEvent::replica_reduce_issued, g.index_of(s), true});
  }
}

// ---------------------------------------------------------------- the reduced part into the shard

/// How the reduced part (this rank's n elements, of E = M or T, in the model's space) reaches the
/// gradient shard, by where the shard lives (unit_state.hpp's StateLayout):
///
///   path            the shard                              what happens
///   narrow          T (grad_narrow; in the full T          summed in M with what the shard holds
///                   gradients when grad_in_full)           (or a carried part), rounded to T once
///   in_full         M, a slice of the full gradients       the full buffer zeroed, the shard set
///                   (grad_in_full)                         to the reduction (+ a carried part)
///   add             M, its own buffer, the model's space   added (the reduction in M)
///   staged_add      M, its own buffer                      converted (reduction in T) and/or moved
///                                                          (CPU offload) into M there, then added
///
/// `narrow` and `in_full` occur only with the states in the model's space (unit_state.hpp).
enum class ShardUpdate { narrow, in_full, add, staged_add };

template <class G, class E>
ShardUpdate shard_update(const typename G::Shard& s) {
  if (s.grad_narrow) return ShardUpdate::narrow;
  if (s.grad_in_full) return ShardUpdate::in_full;
  if constexpr (std::is_same_v<E, typename G::Master> && std::is_same_v<typename G::Space, typename G::State>)
    return ShardUpdate::add;
  return ShardUpdate::staged_add;
}

/// `narrow`: the T shard += the reduction, summed in M and rounded to T once (the held part and
/// a carried one widen exactly).
template <class G, class E>
void update_narrow(typename G::Shard& s, std::span<E> reduced) {
  using T = typename G::T;
  using M = typename G::Master;
  using Space = typename G::Space;
  if constexpr (std::is_same_v<Space, typename G::State>) {
    const std::size_t n = s.shard_size();
    auto sum = G::Shard::template make_buffer<M>(n, MemoryTag::communication, false);
    convert_into<Space>(sum.span(), std::span<const E>(reduced));
    if (s.grad_in_full) {
      s.zero_full_grads();
      if (s.carried.numel() > 0) add_into<Space>(sum.span(), std::span<const M>(s.carried.span()));
      s.carried = {};
      s.grad_reduced = true;
    } else {
      auto held = G::Shard::template make_buffer<M>(n, MemoryTag::communication, false);
      convert_into<Space>(held.span(), std::span<const T>(s.grad_low.span()));
      add_into<Space>(sum.span(), std::span<const M>(held.span()));
    }
    convert_into<Space>(s.grad_low.span(), std::span<const M>(sum.span()));
  }
}

/// `in_full`: the shard is (a part of) the full gradient buffer: the buffer to 0 but for the
/// shard, which becomes the reduced gradient, plus one carried over from before this backward
/// (carry_reduced_grad): the same sum as adding this one to that.
template <class G, class E>
void update_in_full(typename G::Shard& s, std::span<E> reduced) {
  using M = typename G::Master;
  using Space = typename G::Space;
  if constexpr (std::is_same_v<Space, typename G::State>) {
    s.zero_full_grads();
    convert_into<Space>(s.grad.span(), std::span<const E>(reduced));
    if (s.carried.numel() > 0) add_into<Space>(s.grad.span(), std::span<const M>(s.carried.span()));
    s.carried = {};
    s.grad_reduced = true;
  }
}

/// `add` and `staged_add`: the M shard of its own += the reduction.
template <class G, class E>
void update_add(typename G::Shard& s, std::span<E> reduced, ShardUpdate path) {
  using M = typename G::Master;
  using StateSpace = typename G::State;
  if constexpr (std::is_same_v<E, M> && std::is_same_v<typename G::Space, StateSpace>) {
    if (path == ShardUpdate::add) {
      add_into<StateSpace>(s.grad.span(), std::span<const M>(reduced));
      return;
    }
  }
  auto incoming = G::Shard::template make_buffer<M, StateSpace>(s.shard_size(), MemoryTag::communication, false);
  convert_across<StateSpace, typename G::Space>(incoming.span(), std::span<const E>(reduced));
  add_into<StateSpace>(s.grad.span(), std::span<const M>(incoming.span()));
}

/// The reduced part (HSDP: all-reduced on the replicate dimension already) into the gradient shard.
template <class G, class E>
void add_to_shard(typename G::Shard& s, std::span<E> reduced) {
  switch (const auto path = shard_update<G, E>(s)) {
    case ShardUpdate::narrow:
      update_narrow<G>(s, reduced);
      break;
    case ShardUpdate::in_full:
      update_in_full<G>(s, reduced);
      break;
    case ShardUpdate::add:
    case ShardUpdate::staged_add:
      update_add<G>(s, reduced, path);
      break;
  }
}

/// Finishes the unit's reduction (HSDP: then the all-reduce on the replicate dimension) and
/// adds it into the gradient shard (not when `accumulate` is false: a destructor's wait).
/// Returns whether there was one.
template <class G>
bool finish_reduce(G& g, typename G::Shard& s, bool accumulate) {
  if (!s.reducing) return false;
  if (accumulate) issue_replica_reduce(g, s);
  else finish_collective(g, s);
  if (s.replica_issued) {
    s.replica_issued = false;
    s.replica_reduce.wait();
  }
  s.reducing = false;
  s.reduce_waited = false;
  if (!accumulate) return true;
  // The reduced part holds at least this rank's n elements (c >= n after a reduce-scatter).
  const std::size_t n = s.shard_size();
  if (g.reduce_in_m()) add_to_shard<G>(s, s.reduced_wide.span().first(n));
  else add_to_shard<G>(s, s.reduced_narrow.span().first(n));
  s.reduced_wide = {};
  s.reduced_narrow = {};
  for (std::size_t k = 0; k < s.segments.size(); ++k) {
    *s.segments[k].grad_state = s.pending_states[k];
    *s.segments[k].has_grad = true;
  }
  g.events.push_back({FsdpEvent::reduce_done, g.index_of(s), true});
  return true;
}

}  // namespace dtensor::parallel::detail::fsdp
