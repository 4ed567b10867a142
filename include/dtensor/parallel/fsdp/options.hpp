// dtensor/parallel/fsdp/options.hpp — what fully_shard is asked to do (FsdpOptions: ZeRO stage,
// prefetch, mixed precision, offload) and what it reports (FsdpEvent, FsdpMemory), with the
// checks of a combination of options that cannot run (dtensor::Error naming the option), FSDP2's
// fully_shard arguments and MixedPrecisionPolicy / OffloadPolicy. See parallel/fully_shard.hpp
// for what each stage does; docs/fsdp.md for the options' table.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "dtensor/core/error.hpp"
#include "dtensor/core/memory.hpp"
#include "dtensor/core/meta_space.hpp"

namespace dtensor::parallel {

struct FsdpOptions {
  int stage = 3;                                // 1, 2 or 3 (ZeRO's stages)
  std::optional<bool> reshard_after_forward{};  // ZeRO-3: free each unit after its forward (default true)
  int prefetch = 2;                             // units unsharded at once (>= 1; 1 = no prefetch)
  bool reduce_in_compute_dtype = false;         // reduce gradients in T (bf16) instead of M (fp32)
  bool offload_optimizer = false;               // CPU offload of master values and optimizer state
  bool reduce_replicas = true;                  // HSDP: all-reduce on the replicate dimension; off: each
                                                // replica keeps its gradient (still Partial there), for parallel/sync/
  // ZeRO-1 with T != M: accumulate the gradients in a full buffer of M per unit (Megatron's
  // distributed optimizer with fp32 gradient accumulation, 6 + 12/N bytes per parameter in bf16
  // with fp32 master values and AdamW); the model's T gradients exist only around a unit's backward.
  bool accumulate_grads_in_master = false;
  // Parameter offload (parallel/fully_shard.hpp): the separate master shards in files in this
  // existing, writable directory on local disk; empty: in memory.
  std::string offload_params_dir{};
};

/// What fully_shard did, in order (unit indices), for tests and traces.
struct FsdpEvent {
  enum Kind {
    gather_issued,
    gather_done,
    compute_begin,
    compute_end,
    reshard,
    reduce_issued,
    reduce_done,
    replica_reduce_issued  // HSDP: the unit's all-reduce over the replicas ("dp"), asynchronous
  };
  Kind kind;
  std::size_t unit;
  bool backward;
};

/// Bytes this rank holds now, by kind.
struct FsdpMemory {
  std::size_t params = 0;  // the units' full values (resident ones, padding included)
  std::size_t grads = 0;   // the units' full gradients (resident ones)
  std::size_t master = 0;  // master values of this rank's shards
  std::size_t grad_shards = 0;
  std::size_t disk = 0;  // master values in files (FsdpOptions::offload_params_dir): not in memory
  std::size_t total() const { return params + grads + master + grad_shards; }
};

/// The (replicate, shard) sizes of the data ranks for HSDP: `data_ranks` split into `replicate`
/// groups; throws naming the flag when it does not divide.
inline std::pair<int, int> hsdp_shape(int data_ranks, int replicate, const char* flag = "hsdp") {
  if (replicate < 1 || data_ranks < 1 || data_ranks % replicate != 0)
    throw Error("hsdp_shape", dtensor::detail::cat("--", flag, " ", replicate, " does not divide the ", data_ranks,
                                                   " data-parallel ranks"));
  return {replicate, data_ranks / replicate};
}

namespace detail {

/// The options that no model could run with, on a model whose parameters live in Space with the
/// shards' state in StateSpace: an error naming the option on this rank (every rank reaches the
/// same verdict: the options and types are the same everywhere).
template <MemorySpace Space, MemorySpace StateSpace>
void check_fsdp_options(const FsdpOptions& o, int rank) {
  if (o.stage < 1 || o.stage > 3)
    throw Error("fully_shard", dtensor::detail::cat("stage ", o.stage, " is not a ZeRO stage (1, 2 or 3)"), rank);
  if (o.prefetch < 1)
    throw Error("fully_shard", dtensor::detail::cat("prefetch ", o.prefetch, " must be >= 1 (units unsharded at once)"),
                rank);
  if (o.reshard_after_forward.value_or(false) && o.stage != 3)
    throw Error("fully_shard", dtensor::detail::cat("reshard_after_forward needs stage 3, not ", o.stage), rank);
  if (o.offload_optimizer && !std::is_same_v<StateSpace, host_space>)
    throw Error("fully_shard",
                dtensor::detail::cat("offload_optimizer for a model in ", Space::name,
                                     " memory: the shards' memory space is a type, call "
                                     "fully_shard<M, host_space>(model, mesh, options)"),
                rank);
  if (o.accumulate_grads_in_master && (o.stage != 1 || o.reduce_in_compute_dtype || !std::is_same_v<StateSpace, Space>))
    throw Error(
        "fully_shard",
        dtensor::detail::cat("accumulate_grads_in_master needs stage 1 (not ", o.stage,
                             "), reductions in the master type (reduce_in_compute_dtype is ",
                             o.reduce_in_compute_dtype ? "true" : "false", ") and no offload (the state space is ",
                             StateSpace::name, ", the model's ", Space::name, ")"),
        rank);
}

/// Parameter offload maps files into host memory: the shards' state must live there.
template <MemorySpace StateSpace>
void check_fsdp_offload_dir(const FsdpOptions& o, int rank) {
  if (!o.offload_params_dir.empty() && !(std::is_same_v<StateSpace, host_space> && holds_data_v<StateSpace>))
    throw Error("fully_shard",
                dtensor::detail::cat("offload_params_dir with the state in ", StateSpace::name,
                                     " memory: parameter offload maps files into host memory"),
                rank);
}

/// ZeRO-3 frees each unit after its forward unless told not to; the other stages keep their values.
inline bool fsdp_reshards_after_forward(const FsdpOptions& o) {
  return o.stage == 3 && o.reshard_after_forward.value_or(true);
}

}  // namespace detail
}  // namespace dtensor::parallel
