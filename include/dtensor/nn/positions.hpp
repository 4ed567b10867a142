// dtensor/nn/positions.hpp — the global position of each of this rank's tokens in its sequence.
//
//   auto pos = nn::positions<nn::tokens<Mesh>>(mesh, ids.shape());            // [B, T] int32
//   auto pos = nn::positions<nn::tokens<Mesh>>(mesh, ids.shape(), original);  // a permuted sequence
//
// Laid out as PL (a [B, T] layout: batch split on the data dimensions, the sequence on the
// context dimension, and on the tensor dimension under sequence parallelism). The position of a
// stored token is its index in the sequence, or, when `original` is given (one entry per
// position of the sequence: a sequence stored permuted, as context parallelism's load balancing
// stores it — parallel::original_positions), the original index of the stored one. What GPT's position table and the rotary
// embedding (nn/attention.hpp) look up, so both see the same positions under every split.
// Built on the host from the layout alone (no communication), then copied to the mesh's memory
// space (on meta: extents only).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/style.hpp"

namespace dtensor::nn {

template <LayoutType PL, class Id = std::int32_t, MeshType Mesh>
DTensor<Id, 2, Mesh, PL> positions(const Mesh& mesh, const Shape<2>& global, std::span<const Extent> original = {}) {
  using Space = mesh_space_t<Mesh>;
  const auto box = local_box(PL::desc, mesh.shape(), mesh.coordinate(), global);
  if constexpr (!holds_data_v<Space>)
    return from_local<PL>(mesh, Tensor<Id, 2, Space>::uninitialized(box.extent), global);
  detail::check(original.empty() || Extent(original.size()) == global[1], "nn::positions", mesh, "an order of ",
                original.size(), " positions for a sequence of ", global[1]);
  Tensor<Id, 2> p(box.extent);
  for (Extent b = 0; b < box.extent[0]; ++b)
    for (Extent t = 0; t < box.extent[1]; ++t) {
      const Extent stored = box.offset[1] + t;
      p(b, t) = Id(original.empty() ? stored : original[std::size_t(stored)]);
    }
  return from_local<PL>(mesh, into_space<Space>(std::move(p)), global);
}

}  // namespace dtensor::nn
