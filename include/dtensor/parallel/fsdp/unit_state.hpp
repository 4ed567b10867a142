// dtensor/parallel/fsdp/unit_state.hpp — one FSDP unit's state on this rank (FSDP2's
// FSDPParam, per unit): which part of the unit's flat buffer this rank owns, its master values
// and gradient shard (and where they live: their own buffers, or slices of the unit's full
// buffers), the type-erased views (nn::ParamRef) the optimizers step over, and the buffers of the
// collectives in flight (parallel/fsdp/collectives.hpp issues and finishes them).
//
// The unit's flat buffer (nn::FlatParams::values(), n elements, this rank's tensor-parallel
// pieces of the unit's parameters one after the other) is Shard<0> over the shard group of S
// ranks (FsdpShardDims, parallel/fsdp/group.hpp: the data-shard dimension, flattened with the
// context dimension after it when the mesh has one there), split as torch.chunk: c = ceil(n / S)
// elements per rank, the tail ranks fewer or none (placement/chunk.hpp). Collectives move c * S
// elements (the buffer padded at the end), so the all-gather writes straight into the group's
// storage and the reduce-scatter reads straight from it (the group allocates c * S).
//
// A parameter entry may straddle two ranks' shards: each rank gets one segment (a ParamRef) per
// entry that overlaps its shard, named like the entry, with the entry's decay flag. Its layout
// is the entry's with Shard<0> (of the flat buffer) on every dimension of the shard group — the
// elements of different ranks are disjoint there, which is what optim::grad_norm needs to count
// each element once and the checkpoint's writers to save each once. (Shard<0> on both "fsdp"
// and "cp" reads as a nested split in DTensor terms; the flat buffer's split is the flattened
// group's, chunk f * C + c of F * C, which equals the nested one only when the sizes divide.
// Nothing derives a range from these placements: every range comes from FsdpShardDims::range.)
//
// A deferred group (nn::DeferredInit, nn/flat_params.hpp) is never made whole here: under
// ZeRO-3 (values released after sharding) the shard [lo, hi) is drawn straight from the
// parameters' Inits into the master values; ZeRO-1/2 keep the full values anyway, which
// materialize_values draws. Either way the values equal the eager path's bit for bit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/comm/work.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/nn/flat_params.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/parallel/detail/convert.hpp"
#include "dtensor/placement/chunk.hpp"

namespace dtensor::parallel::detail {

/// One unit's shard on this rank. T: the model's (compute) element type; M: the master
/// values', the gradient shard's and the optimizer's. The collectives' buffers live in the
/// group's memory space, the master values and gradient shard in StateSpace (the group's, or the
/// host's under CPU offload). The ledger counts master values as optimizer state, the gradient
/// shard as gradients, the collectives' staging as communication.
template <class T, class M, std::size_t N, MemorySpace Space = host_space, MemorySpace StateSpace = Space>
struct UnitShard {
  template <class E>
  using Buffer = Tensor<E, 1, Space>;
  template <class E>
  using StateBuffer = Tensor<E, 1, StateSpace>;

  std::string name;
  std::shared_ptr<nn::FlatParams<T, N, Space>> group;
  std::size_t numel = 0;  // n: the unit's flat size on this rank's tensor-parallel piece
  std::size_t chunk = 0;  // c = ceil(n / S)
  std::size_t ranks = 1;  // S
  Range shard;            // [lo, hi) of the flat buffer
  StateBuffer<M> master;  // this rank's values, hi - lo (a view of the group's values: see master_in_values)
  StateBuffer<M> grad;    // this rank's reduced gradients, hi - lo (accumulated until zero_grad)
  // Where the states live (ZeRO's memory formulas: no state held twice).
  //  master_in_values  ZeRO-1/2 with T == M in one space: the master values are this rank's slice
  //                    of the group's full values, which the stage keeps anyway (no second copy);
  //                    the optimizer updates them in place and the all-gather sends them.
  //  grad_in_full      ZeRO-1 in one space: the gradient shard lives in the group's full gradient
  //                    buffer, which ZeRO-1 keeps anyway: T == M, this rank's slice [lo, hi) of
  //                    it (Megatron's distributed optimizer: main_grad is a view of the grad
  //                    buffer); T != M, the first (hi - lo) * sizeof(M) bytes of its storage,
  //                    which holds c * S * sizeof(T) >= that (S >= 2 for bf16 -> fp32). After
  //                    the reduction the rest of the buffer is zero, so the optimizer's zero_grad
  //                    leaves the whole buffer zero for the next backward; a reduced gradient not
  //                    zeroed before the next backward is moved aside first (`carried`).
  //  main_grad         ZeRO-1 with T != M and FsdpOptions::accumulate_grads_in_master (Megatron's
  //                    distributed optimizer with fp32 gradient accumulation): a full gradient
  //                    buffer in M per unit that the backward's T gradients are added into (they
  //                    exist only around the unit's backward); the gradient shard is its slice.
  //  grad_narrow       T != M in one space where the kernels widen per element
  //                    (nn::detail::narrow_grads_supported) and an M gradient shard would cost
  //                    memory that nothing else holds (ZeRO-2; ZeRO-1 over one shard rank, where
  //                    c * S * sizeof(T) < (hi - lo) * sizeof(M)): the gradient shard is held in
  //                    T — `grad_low`, or ZeRO-1's slice [lo, hi) of the full T buffer — and the
  //                    segments' ParamRefs point at it (ParamRef::narrow_grad); the optimizer,
  //                    clipping and the finite check read it widened. The reduction still runs
  //                    in M (or T by option) and is rounded to T once, when added into the shard:
  //                    ZeRO's 2 + (2 + 12)/N and DDP's 16 bytes per parameter.
  bool master_in_values = false;
  bool master_on_disk = false;  // FsdpOptions::offload_params_dir: `master` views a file mapped into memory
  bool grad_in_full = false;
  bool grad_narrow = false;
  Buffer<T> grad_low;  // grad_narrow: the T gradient shard, hi - lo (a view of the full gradients when grad_in_full)
  Buffer<M> main_grad;
  bool grad_reduced = false;                 // grad_in_full: the shard holds a reduced gradient (since finish_reduce)
  StateBuffer<M> carried;                    // grad_in_full: that gradient, moved aside for the next reduction to add
  std::vector<LayoutDesc<N>> grad_states;    // one per segment
  std::unique_ptr<bool[]> has_grad;          // one per segment (ParamRef points at them)
  nn::ParamList<M, N, StateSpace> segments;  // views of master / grad, one per overlapping entry

  // In flight.
  Work gather;            // all-gather of the values into the group's storage
  Buffer<T> gather_send;  // this rank's c values in T (padded)
  bool gathering = false;
  Work reduce;                 // reduce-scatter (all-reduce for ZeRO-1) of the gradients
  Buffer<M> reduce_wide;       // the gradients widened to M when the reduction runs in M and T != M
  Buffer<M> reduced_wide;      // the reduce-scatter's output in M
  Buffer<T> reduced_narrow;    // ... or in T
  bool reducing = false;       // a reduction was issued and not yet added to `grad`
  bool reduce_waited = false;  // its collective has completed (the full gradients are free)
  Work replica_reduce;         // HSDP: the all-reduce of the reduced part on the replicate dimension
  bool replica_issued = false;
  ReduceOp grad_op = ReduceOp::sum;
  std::vector<LayoutDesc<N>> pending_states;  // the segments' gradient states once reduced

  std::size_t padded() const { return chunk * ranks; }
  std::size_t shard_size() const { return std::size_t(shard.size()); }

  /// Where a unit's states live (the flags above), by precision and offload x ZeRO stage; a
  /// state not shared is a buffer of its own (stage 3 shares none: it keeps no full buffer).
  ///
  ///   one space, T == M   stage 1: master_in_values, grad_in_full     stage 2: master_in_values
  ///   one space, T != M   stage 1: grad_in_full, the M shard in main_grad (accumulate_in_master)
  ///                       or in the full T gradients' bytes where they hold it (S >= 2 for bf16
  ///                       -> fp32); else, where the kernels widen T, grad_narrow in the full T
  ///                       gradients' slice                          stage 2: grad_narrow (own T
  ///                       buffer) where the kernels widen T
  ///   two spaces          nothing shared (CPU offload: the states on the host)
  struct StateLayout {
    bool master_in_values = false, grad_in_full = false, grad_narrow = false;
  };
  static StateLayout state_layout(int stage, bool accumulate_in_master, std::size_t padded, std::size_t shard_size) {
    StateLayout out;
    constexpr bool one_space = std::is_same_v<Space, StateSpace>;
    if constexpr (one_space && std::is_same_v<T, M>) {
      out.master_in_values = stage <= 2;
      out.grad_in_full = stage == 1;
    } else if constexpr (one_space) {
      out.grad_in_full =
          stage == 1 && (accumulate_in_master || (padded * sizeof(T) >= shard_size * sizeof(M) &&
                                                  alignof(M) <= alignof(std::max_align_t)));  // max-aligned storage
      if constexpr (nn::detail::narrow_grads_supported<Space> && sizeof(T) < sizeof(M)) {
        if (!accumulate_in_master && (stage == 2 || (stage == 1 && !out.grad_in_full))) {
          out.grad_narrow = true;
          out.grad_in_full = stage == 1;
        }
      }
    }
    return out;
  }

  /// A buffer of n elements of E in memory space S (the group's by default), counted under
  /// `tag`; zero-filled when `zero`.
  template <class E, MemorySpace S = Space>
  static Tensor<E, 1, S> make_buffer(std::size_t n, MemoryTag tag, bool zero) {
    MemoryTagScope scope(tag);
    using B = Tensor<E, 1, S>;
    return zero ? B(Shape<1>{Extent(n)}) : B::uninitialized(Shape<1>{Extent(n)});
  }

  /// stage: the ZeRO stage (1 and 2 keep the full values, 1 the full gradients, which the
  /// shard's states may then live in; see master_in_values / grad_in_full).
  /// size, coord: the shard group's (FsdpShardDims); shard_first..shard_last its mesh dimensions.
  UnitShard(std::string unit_name, std::shared_ptr<nn::FlatParams<T, N, Space>> g, int size, int coord,
            std::size_t shard_first, std::size_t shard_last, int stage = 3, bool accumulate_in_master = false)
      : name(std::move(unit_name)), group(std::move(g)) {
    numel = group->size();
    ranks = std::size_t(size);
    chunk = std::size_t(chunk_size(Extent(numel), size));
    shard = chunk_range(Extent(numel), size, coord);
    constexpr bool one_space = std::is_same_v<Space, StateSpace>;
    // The full buffers the collectives run on, with their padding (they never move after this:
    // stages 1/2 never release their values, stage 1 never its gradients).
    if (stage <= 2) group->materialize_values(padded());
    if (stage == 1) group->materialize_grads(padded());
    const auto lo = std::size_t(shard.begin);
    const auto where = state_layout(stage, accumulate_in_master, padded(), shard_size());
    master_in_values = where.master_in_values;
    grad_in_full = where.grad_in_full;
    grad_narrow = where.grad_narrow;
    if constexpr (one_space && std::is_same_v<T, M>) {
      auto at = [lo](T* base) { return base ? base + lo : base; };  // meta: no elements, null
      if (master_in_values)
        master = StateBuffer<M>::view(at(group->values_storage().data()), Shape<1>{Extent(shard_size())});
      if (grad_in_full) grad = StateBuffer<M>::view(at(group->grads_storage().data()), Shape<1>{Extent(shard_size())});
    } else if constexpr (one_space) {
      if (grad_narrow) {
        if (grad_in_full) {
          T* base = group->grads_storage().data();
          grad_low = Buffer<T>::view(base ? base + lo : base, Shape<1>{Extent(shard_size())});
        } else {
          grad_low = make_buffer<T>(shard_size(), MemoryTag::gradients, true);
        }
      } else if (grad_in_full && accumulate_in_master) {
        main_grad = make_buffer<M>(padded(), MemoryTag::gradients, true);
        M* base = main_grad.data();
        grad = StateBuffer<M>::view(base ? base + lo : base, Shape<1>{Extent(shard_size())});
      } else if (grad_in_full) {
        M* wide = reinterpret_cast<M*>(static_cast<void*>(group->grads_storage().data()));
        grad = StateBuffer<M>::view(wide, Shape<1>{Extent(shard_size())});
        if (wide) Space::zero(group->grads_storage().data(), group->grads_storage().size_bytes());
      }
    }
    if (!master_in_values) {
      master = make_buffer<M, StateSpace>(shard_size(), MemoryTag::optimizer_state, false);
      if (!group->deferred()) {
        convert_across<StateSpace, Space>(master.span(), std::span<const T>(group->values().subspan(lo, shard_size())));
      } else if constexpr (std::is_same_v<T, M> && std::is_same_v<StateSpace, host_space>) {
        // Deferred initialisation: only this rank's shard is drawn (nn/flat_params.hpp) ...
        group->initial_values(lo, master.span());
      } else if constexpr (holds_data_v<StateSpace>) {
        // ... in T as the eager values would hold it, then converted as they would be.
        auto drawn = make_buffer<T, host_space>(shard_size(), MemoryTag::parameters, false);
        group->initial_values(lo, drawn.span());
        convert_across<StateSpace, host_space>(master.span(), std::span<const T>(drawn.span()));
      } else if constexpr (!std::is_same_v<T, M>) {
        [[maybe_unused]] auto drawn =
            make_buffer<T, StateSpace>(shard_size(), MemoryTag::parameters, false);  // a dry run: the same bytes
      }
    }
    group->end_deferred();  // the values live in the shards now (stages 1/2: drawn whole above)
    if (!grad_in_full && !grad_narrow) grad = make_buffer<M, StateSpace>(shard_size(), MemoryTag::gradients, true);
    // Segments: the entries that overlap [lo, hi). Reserve first: the views point into these vectors.
    std::size_t count = 0;
    for (const auto& e : group->entries()) count += overlap(e).size() > 0;
    grad_states.reserve(count);
    has_grad = std::make_unique<bool[]>(count);
    for (const auto& e : group->entries()) {
      const Range r = overlap(e);
      if (r.size() == 0) continue;
      auto layout = e.layout;
      for (std::size_t d = shard_first; d <= shard_last; ++d) layout.placements[d] = PlacementDesc::shard(0);
      grad_states.push_back(layout);
      const std::size_t at = std::size_t(r.begin - shard.begin), len = std::size_t(r.size());
      const auto grad_part = grad_narrow ? std::span<M>() : grad.span().subspan(at, len);
      segments.push_back(nn::ParamRef<M, N, StateSpace>{e.name, master.span().subspan(at, len), grad_part, layout,
                                                        &grad_states.back(), &has_grad[grad_states.size() - 1], e.decay,
                                                        this, at});
      if (grad_narrow) {
        T* low = grad_low.data();  // null on meta: nothing is read
        segments.back().narrow_grad = low ? low + at : low;
        segments.back().narrow_dtype = dtype_of<T>;
      }
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

  /// Bytes of the shard state this object holds (master values and gradient shard it owns:
  /// none where they live in the group's full buffers).
  std::size_t master_bytes() const {
    return master_in_values || master_on_disk ? 0 : std::size_t(master.numel()) * sizeof(M);
  }
  std::size_t grad_bytes() const {
    if (grad_in_full) return 0;
    return grad_narrow ? std::size_t(grad_low.numel()) * sizeof(T) : std::size_t(grad.numel()) * sizeof(M);
  }

  /// Zeroes the full gradient buffer the shard lives in (grad_in_full): main_grad, or the group's.
  void zero_full_grads() {
    if (main_grad.numel() > 0) nn::detail::zero_flat<Space>(main_grad.span());
    else nn::detail::zero_flat<Space>(group->grads_storage());
  }
  std::size_t shard_bytes() const { return master_bytes() + grad_bytes(); }
};

}  // namespace dtensor::parallel::detail
