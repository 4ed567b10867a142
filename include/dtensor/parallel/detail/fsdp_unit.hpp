// dtensor/parallel/detail/fsdp_unit.hpp — one FSDP unit's shard: which part of the unit's flat
// buffer this rank owns, its master values and gradient shard, and the type-erased views
// (nn::ParamRef) the optimizers step over.
//
// The unit's flat buffer (nn::FlatParams::values(), n elements, this rank's tensor-parallel
// pieces of the unit's parameters one after the other) is Shard<0> over the data-shard mesh
// dimension of size S, split as torch.chunk: c = ceil(n / S) elements per rank, the tail ranks
// fewer or none (placement/chunk.hpp). Collectives move c * S elements (the buffer padded at the
// end), so the all-gather writes straight into the group's storage and the reduce-scatter
// reads straight from it (the group allocates c * S).
//
// A parameter entry may straddle two ranks' shards: each rank gets one segment (a ParamRef) per
// entry that overlaps its shard, named like the entry, with the entry's decay flag. Its layout
// is the entry's with Shard<0> (of the flat buffer) on the data-shard dimension — the elements
// of different ranks are disjoint there, which is what optim::grad_norm needs to count each
// element once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtensor/comm/work.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/placement/chunk.hpp"

namespace dtensor::parallel::detail {

/// Converts between element types (float, double, bfloat16) through double.
template <class To, class From>
To convert(From x) {
  return static_cast<To>(static_cast<double>(x));
}

/// One unit's shard on this rank. T: the model's (compute) element type; M: the master
/// values', the gradient shard's and the optimizer's.
template <class T, class M, std::size_t N>
struct UnitShard {
  std::string name;
  std::shared_ptr<nn::FlatParams<T, N>> group;
  std::size_t numel = 0;  // n: the unit's flat size on this rank's tensor-parallel piece
  std::size_t chunk = 0;  // c = ceil(n / S)
  std::size_t ranks = 1;  // S
  Range shard;            // [lo, hi) of the flat buffer
  std::vector<M> master;  // this rank's values, hi - lo
  std::vector<M> grad;    // this rank's reduced gradients, hi - lo (accumulated until zero_grad)
  std::vector<LayoutDesc<N>> grad_states;  // one per segment
  std::unique_ptr<bool[]> has_grad;        // one per segment (ParamRef points at them)
  nn::ParamList<M, N> segments;            // views of master / grad, one per overlapping entry

  // In flight.
  Work gather;                  // all-gather of the values into the group's storage
  std::vector<T> gather_send;   // this rank's c values in T (padded)
  bool gathering = false;
  Work reduce;                  // reduce-scatter (all-reduce for ZeRO-1) of the gradients
  std::vector<M> reduce_wide;   // the gradients widened to M when the reduction runs in M and T != M
  std::vector<M> reduced_wide;  // the reduce-scatter's output in M
  std::vector<T> reduced_narrow;  // ... or in T
  bool reducing = false;         // a reduction was issued and not yet added to `grad`
  bool reduce_waited = false;    // its collective has completed (the full gradients are free)
  ReduceOp grad_op = ReduceOp::sum;
  std::vector<LayoutDesc<N>> pending_states;  // the segments' gradient states once reduced

  std::size_t padded() const { return chunk * ranks; }
  std::size_t shard_size() const { return std::size_t(shard.size()); }

  UnitShard(std::string unit_name, std::shared_ptr<nn::FlatParams<T, N>> g, int size, int coord, std::size_t shard_dim)
      : name(std::move(unit_name)), group(std::move(g)) {
    numel = group->size();
    ranks = std::size_t(size);
    chunk = std::size_t(chunk_size(Extent(numel), size));
    shard = chunk_range(Extent(numel), size, coord);
    master.resize(shard_size());
    grad.assign(shard_size(), M(0));
    const auto values = group->values();
    for (std::size_t i = 0; i < shard_size(); ++i) master[i] = convert<M>(values[std::size_t(shard.begin) + i]);
    // Segments: the entries that overlap [lo, hi). Reserve first: the views point into these vectors.
    std::size_t count = 0;
    for (const auto& e : group->entries()) count += overlap(e).size() > 0;
    grad_states.reserve(count);
    has_grad = std::make_unique<bool[]>(count);
    for (const auto& e : group->entries()) {
      const Range r = overlap(e);
      if (r.size() == 0) continue;
      auto layout = e.layout;
      layout.placements[shard_dim] = PlacementDesc::shard(0);
      grad_states.push_back(layout);
      const std::size_t at = std::size_t(r.begin - shard.begin), len = std::size_t(r.size());
      segments.push_back(nn::ParamRef<M, N>{e.name, std::span<M>(master).subspan(at, len),
                                            std::span<M>(grad).subspan(at, len), layout, &grad_states.back(),
                                            &has_grad[grad_states.size() - 1], e.decay, &master, at});
    }
  }
  UnitShard(const UnitShard&) = delete;  // the segments point into this object
  UnitShard& operator=(const UnitShard&) = delete;

  /// The part of entry e inside this rank's shard (in flat-buffer offsets).
  Range overlap(const nn::FlatEntry<N>& e) const {
    const Extent b = std::max(Extent(e.offset), shard.begin);
    const Extent en = std::min(Extent(e.offset + e.numel), shard.end);
    return b < en ? Range{b, en} : Range{shard.begin, shard.begin};
  }

  /// Bytes of the shard state this object holds (master values and gradient shard).
  std::size_t shard_bytes() const { return (master.size() + grad.size()) * sizeof(M); }
};

}  // namespace dtensor::parallel::detail
