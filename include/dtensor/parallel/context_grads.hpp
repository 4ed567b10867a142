// dtensor/parallel/context_grads.hpp — the gradient sync context parallelism needs.
//
//   auto [y, saved] = block.forward(x);  ...  block.backward_weight(std::move(wctx));
//   parallel::context_parallel_grads(params, mesh);       // Partial<sum> on "cp" -> Replicate
//
// Under context parallelism every parameter is replicated on the context dimension while each
// rank sees only its positions, so every weight gradient arrives Partial<sum> there (the sum
// over positions is split), like data parallelism's over the batch. This all-reduces them on
// the context group, bucketed like DataParallel: one all-reduce per bucket, in place where a
// bucket's gradients are adjacent in their flat group. None without a context dimension.
// FSDP's shards are not reduced here: where "cp" follows the data-shard dimension, fully_shard
// shards over the flattened ("fsdp", "cp") group (FsdpShardDims) and its reduce-scatter there
// resolves "cp" too — their layout is Shard<0> on "cp", and their gradient must be reduced
// (not Partial) by now; this skips them.
// (With data parallelism as well, DataParallel reduces the data dimension separately; one
// all-reduce over the flattened ("dp", "cp") group would do both, as torchtitan's dp_cp mesh.)
#pragma once

#include <cstddef>

#include "dtensor/parallel/context_parallel.hpp"
#include "dtensor/parallel/detail/buckets.hpp"

namespace dtensor::parallel {

struct ContextGradsOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;
};

/// All-reduces the pending Partial<sum> of every gradient on the context dimension (but FSDP's
/// shards over it, which FSDP reduced). Returns the number of buckets (= all-reduces).
template <class T, MeshType Mesh>
std::size_t context_parallel_grads(nn::ParamList<T, Mesh::ndim, mesh_space_t<Mesh>>& ps, const Mesh& mesh, ContextGradsOptions o = {}) {
  if (o.bucket_bytes == 0) throw Error("context_parallel_grads", "bucket_bytes must be > 0", mesh.rank());
  constexpr std::size_t cp = context_dim<Mesh>;
  if constexpr (cp == Mesh::ndim) {
    return 0;  // no context dimension: nothing can be pending on it
  } else {
    for (const auto& p : ps) {
      const auto& g = p.grad_state->placements[cp];
      if (p.layout.placements[cp].is_shard()) {  // an FSDP shard over ("fsdp", "cp"): reduced by FSDP
        if (g.is_partial())
          mesh.comm().fail("context_parallel_grads",
                           dtensor::detail::cat("gradient of ", p.name, " is ", to_string(*p.grad_state),
                                                ": sharded on the context dimension \"", Mesh::names[cp],
                                                "\" (FSDP over the flattened shard group), its reduce-scatter not finished "
                                                "(call finish_gradient_sync first)"));
        continue;
      }
      if (!(g.is_partial() && g.op == ReduceOp::sum))
        mesh.comm().fail("context_parallel_grads",
                         dtensor::detail::cat("gradient of ", p.name, " is ", to_string(*p.grad_state),
                                              ": expected Partial<sum> on the context dimension \"", Mesh::names[cp],
                                              "\" (a second sync, or a missing backward?)"));
    }
    return detail::bucketed_all_reduce(ps, mesh, cp, {.bucket_bytes = o.bucket_bytes, .contiguous_only = false});
  }
}

}  // namespace dtensor::parallel
