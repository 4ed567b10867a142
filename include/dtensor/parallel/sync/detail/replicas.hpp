// dtensor/parallel/sync/detail/replicas.hpp — what the synchronization strategies of
// parallel/sync/ share: the replica dimension, the check that parameters are replicated on it,
// flat copies of the parameters' local pieces, and element-wise updates in their memory space.
//
// Every strategy there treats the ranks along one mesh dimension (the replica dimension: the
// mesh's Role::data dimension, or one named) as copies of one model that drift apart between
// synchronizations. Inside a replica the parameters may be sharded any way (FSDP on a data-shard
// dimension, TP on a tensor dimension): the ranks at the same coordinate of the other dimensions
// hold matching pieces, so averaging the local pieces over the replica dimension averages the
// replicas. A parameter sharded on the replica dimension itself has no such twin, and is refused.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "dtensor/core/error.hpp"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/optim/optimizer.hpp"
#include "dtensor/parallel/data_parallel.hpp"

namespace dtensor::parallel::sync::detail {

using dtensor::detail::cat;

/// Throws unless every parameter is Replicate on mesh dimension `dim` (ranks hold twins there).
template <class Mesh, class T, std::size_t N, class Space>
void check_replicated(const char* op, const Mesh& mesh, std::size_t dim, const nn::ParamList<T, N, Space>& ps) {
  for (const auto& p : ps)
    if (!p.layout.placements[dim].is_replicate())
      mesh.comm().fail(op, cat("parameter ", p.name, " is ", to_string(p.layout), ", not Replicate on the replica dimension \"",
                               Mesh::names[dim], "\": replicas are averaged piece by piece, so each rank there needs a "
                               "whole copy (shard inside the replica on another dimension: FSDP, TP)"));
}

/// The local pieces of the parameters' values into `dst` (a FlatState of the same list).
template <class T, std::size_t N, class Space>
void copy_values(optim::FlatState<T, Space>& dst, const nn::ParamList<T, N, Space>& ps) {
  for (std::size_t k = 0; k < ps.size(); ++k) Space::copy(dst.of(k).data(), ps[k].value.data(), ps[k].value.size_bytes());
}

/// The parameters' local pieces from `src`.
template <class T, std::size_t N, class Space>
void restore_values(const nn::ParamList<T, N, Space>& ps, optim::FlatState<T, Space>& src) {
  for (std::size_t k = 0; k < ps.size(); ++k) Space::copy(ps[k].value.data(), src.of(k).data(), ps[k].value.size_bytes());
}

/// y += alpha * x, element by element, in memory space Space.
template <MemorySpace Space, class T>
void axpy(std::span<T> y, std::span<const T> x, double alpha) {
  auto out = nn::detail::flat_view<Space>(y);
  kernels::add_(out, nn::detail::flat_view<Space>(x), alpha);
}

/// y *= alpha, element by element, in memory space Space.
template <MemorySpace Space, class T>
void scale(std::span<T> y, double alpha) {
  auto out = nn::detail::flat_view<Space>(y);
  kernels::scale_(out, alpha);
}

/// The total number of local elements of the parameters.
template <class T, std::size_t N, class Space>
std::size_t local_elements(const nn::ParamList<T, N, Space>& ps) {
  std::size_t n = 0;
  for (const auto& p : ps) n += p.value.size();
  return n;
}

}  // namespace dtensor::parallel::sync::detail
