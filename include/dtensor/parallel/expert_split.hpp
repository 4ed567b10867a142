// dtensor/parallel/expert_split.hpp — which experts each expert rank and each node of expert ranks
// owns: chunk_range's split of E experts over ep ranks (placement/chunk.hpp, the experts' Shard<0>
// weights), and for the node-level dispatch (parallel/node_dispatch.hpp) nodes of L consecutive
// ranks, each owning its ranks' experts. Light (no tensors), for the planner too (sim/analytic.hpp).
//
//   parallel::expert_offsets_of(7, 4);              // {0, 2, 4, 6, 7}: 2, 2, 2, 1
//   parallel::node_expert_offsets(7, 4, 2);         // {0, 4, 7}: nodes of 2 ranks own 4 and 3
//   parallel::check_nodes_own_experts(7, 6, 2, rank);   // throws: 2, 2, 2, 1, 0, 0 leaves node 2 none
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/placement/chunk.hpp"

namespace dtensor::parallel {

/// The first expert of each of `ranks` ranks and the end: chunk_range's split of `experts`, as
/// the experts' Shard<0> weights hold them.
inline std::vector<std::int64_t> expert_offsets_of(std::int64_t experts, int ranks) {
  std::vector<std::int64_t> offsets(std::size_t(std::max(ranks, 0)) + 1, experts);
  for (int r = 0; r < ranks; ++r) offsets[std::size_t(r)] = chunk_range(experts, ranks, r).begin;
  return offsets;
}

/// The first expert of each node and the end: node n owns its ranks' experts (chunk_range's split
/// of `experts` over `ranks`, as the experts' Shard<0> weights hold them).
inline std::vector<std::int64_t> node_expert_offsets(std::int64_t experts, int ranks, int node_size) {
  const auto per_rank = expert_offsets_of(experts, ranks);
  std::vector<std::int64_t> out(std::size_t(ranks / node_size) + 1);
  for (std::size_t n = 0; n < out.size(); ++n) out[n] = per_rank[n * std::size_t(node_size)];
  return out;
}

/// Whether every node of `node_size` consecutive ranks (dividing `ranks`) owns an expert.
inline bool nodes_own_experts(std::int64_t experts, int ranks, int node_size) {
  const auto offsets = node_expert_offsets(experts, ranks, node_size);
  for (std::size_t n = 0; n + 1 < offsets.size(); ++n)
    if (offsets[n] == offsets[n + 1]) return false;
  return true;
}

/// Throws unless every node owns an expert: a node without one would route nothing inside it
/// (chunk_range's split leaves the last ranks without experts when E < ep, e.g. 7 over 6 ranks
/// is 2, 2, 2, 1, 0, 0: in nodes of 2 the last owns none). Local.
inline void check_nodes_own_experts(std::int64_t experts, int ranks, int node_size, int rank = Error::no_rank) {
  if (node_size < 1 || ranks % node_size != 0) return;  // split_into_nodes names that
  const auto offsets = node_expert_offsets(experts, ranks, node_size);
  for (std::size_t n = 0; n + 1 < offsets.size(); ++n)
    if (offsets[n] == offsets[n + 1])
      throw Error("parallel::check_nodes_own_experts",
                  dtensor::detail::cat(experts, " experts over ", ranks, " expert ranks leave node ", n, " (ranks ",
                                       n * std::size_t(node_size), "..", (n + 1) * std::size_t(node_size) - 1,
                                       ") without an expert; the node-level dispatch needs one on every node"),
                  rank);
}

}  // namespace dtensor::parallel
