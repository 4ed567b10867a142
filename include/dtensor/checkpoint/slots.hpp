// dtensor/checkpoint/slots.hpp — what a rank saves and loads: named boxes of global tensors
// with the memory that holds them.
//
//   auto params = checkpoint::parameter_slots(model.units(), mesh);          // every parameter's local piece
//   auto params = checkpoint::fsdp_parameter_slots(model.units(), fsdp, mesh);  // FSDP: this rank's shards
//   auto moments = checkpoint::adamw_slots(params, opt);                     // "adamw.exp_avg/<name>", "adamw.exp_avg_sq/<name>"
//   checkpoint::HostStaging<cuda_space, float> staged(params, /*copy_in=*/true);   // a device model's slots, through the host
//
// A slot is one box of a global tensor that this rank holds as row-major elements at `data`.
// A parameter of a flat group (nn/flat_params.hpp) is one slot: its local piece, the box
// local_box gives under its layout. Under FSDP (parallel/fully_shard.hpp) a rank holds a range
// of each unit's flat buffer, which cuts its pieces of some parameters in the middle of a row:
// such a range is split into at most 2 * rank - 1 boxes (region.hpp flat_range_boxes), each a
// slot. Optimizer moments have the structure of the parameters they belong to, so their slots
// are the parameters' boxes over the optimizer's buffers.
//
// `writer`: replicated pieces are saved once, by the lowest rank holding the box: the rank
// whose coordinate is 0 on every mesh dimension where the tensor is Replicate. A Partial
// layout cannot be saved (its value is a reduction not yet done): add_slot throws, naming the
// tensor and the layout.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dtensor/checkpoint/region.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/meta_space.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/nn/flat_params.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/placement/chunk.hpp"

namespace dtensor::checkpoint {

template <class T>
struct Slot {
  using value_type = T;
  std::string name;
  std::vector<Extent> shape;  // the global tensor's extents
  Region box;                 // the part held at `data`, row-major
  T* data = nullptr;
  std::string layout;         // for the manifest: "(S(0), R) on (dp, tp)"
  bool writer = true;         // this rank saves the box (see the top of this file)
};

template <class T>
using Slots = std::vector<Slot<T>>;

/// "(S(0), R) on (dp, tp)".
template <MeshType Mesh, std::size_t N>
std::string describe_layout(const LayoutDesc<N>& layout) {
  std::string s = to_string(layout) + " on (";
  for (std::size_t i = 0; i < N; ++i) s += (i ? ", " : "") + std::string(Mesh::names[i]);
  return s + ")";
}

/// Appends the slot of `box` of tensor `name` (global `shape`, `layout` on `mesh`) held at `data`.
template <class T, MeshType Mesh, std::size_t N>
void add_slot(Slots<T>& out, const Mesh& mesh, std::string name, std::vector<Extent> shape, Region box, T* data,
              const LayoutDesc<N>& layout) {
  static_assert(N == Mesh::ndim, "add_slot: the layout needs one placement per mesh dimension");
  const char* op = "checkpoint::add_slot";
  if (layout.has_partial())
    throw Error(op, dtensor::detail::cat("tensor ", name, " has layout ", describe_layout<Mesh>(layout),
                                         ": a Partial value cannot be saved; reduce it (redistribute to Replicate) first"),
                mesh.rank());
  if (box.rank() != shape.size() || box.offset.size() != shape.size())
    throw Error(op, dtensor::detail::cat("tensor ", name, " of ", to_string(shape), ": box ", to_string(box),
                                         " has another rank"), mesh.rank());
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (box.offset[d] < 0 || box.extent[d] < 0 || box.offset[d] + box.extent[d] > shape[d])
      throw Error(op, dtensor::detail::cat("tensor ", name, " of ", to_string(shape), ": box ", to_string(box),
                                           " is not inside it"), mesh.rank());
  if (data == nullptr && !box.empty())
    throw Error(op, dtensor::detail::cat("tensor ", name, ": no memory for box ", to_string(box)), mesh.rank());
  Slot<T> s{std::move(name), std::move(shape), std::move(box), data, describe_layout<Mesh>(layout), true};
  for (std::size_t i = 0; i < N; ++i)
    if (layout.placements[i].is_replicate() && mesh.coordinate()[i] != 0) s.writer = false;
  out.push_back(std::move(s));
}

/// Every parameter of the units (each with a `group`: nn::ParamUnit, a model's units()): one
/// slot per entry, its local piece in the group's values.
template <class Units, MeshType Mesh>
auto parameter_slots(Units& units, const Mesh& mesh) {
  using Group = typename std::remove_cvref_t<decltype(*units.begin()->group)>;
  using T = typename Group::element_type;
  // Slots only point at the buffers; a device model's (cuda) go through host copies (HostStaging).
  static_assert(holds_data_v<typename Group::space>,
                "checkpoint::parameter_slots: the units of a meta-space model hold no values to save or load");
  Slots<T> out;
  for (auto& u : units) {
    auto& g = *u.group;
    if (!g.values_resident())
      throw Error("checkpoint::parameter_slots",
                  dtensor::detail::cat("the values of unit ", g.name(),
                                       " are released (FSDP): use fsdp_parameter_slots for a sharded model"),
                  mesh.rank());
    for (const auto& e : g.entries())
      add_slot(out, mesh, e.name, e.global_shape, Region{e.local_offset, e.local_extent}, g.values().data() + e.offset,
               e.layout);
  }
  return out;
}

/// This rank's FSDP shards of every unit's parameters (fsdp.params(): the master values), each
/// shard of a parameter's local piece as the boxes it covers. `Fsdp` is a
/// parallel::FullyShard over these units on `mesh`.
template <class Units, class Fsdp, MeshType Mesh>
auto fsdp_parameter_slots(Units& units, Fsdp& fsdp, const Mesh& mesh) {
  auto& segments = fsdp.params();
  using M = typename std::remove_cvref_t<decltype(segments.front().value)>::value_type;
  using Group = typename std::remove_cvref_t<decltype(*units.begin()->group)>;
  // Slots only point at the shards; a device model's (cuda) go through host copies (HostStaging).
  static_assert(holds_data_v<typename Group::space>,
                "checkpoint::fsdp_parameter_slots: the shards of a meta-space model hold no values to save or load");
  const char* op = "checkpoint::fsdp_parameter_slots";
  Slots<M> out;
  std::size_t next = 0;  // fsdp.params() lists the segments unit by unit, entry by entry
  for (auto& u : units) {
    const auto& g = *u.group;
    // The unit's flat buffer is Shard<0> over FSDP's shard group ("fsdp", or "fsdp*cp"): the range
    // FSDP itself holds (parallel/fsdp/group.hpp FsdpShardDims, the one function for it).
    const Range shard = Fsdp::ShardDims::range(Extent(g.size()), mesh);
    for (const auto& e : g.entries()) {
      const Extent lo = std::max(Extent(e.offset), shard.begin), hi = std::min(Extent(e.offset + e.numel), shard.end);
      if (lo >= hi) continue;
      if (next >= segments.size() || segments[next].name != e.name || segments[next].value.size() != std::size_t(hi - lo))
        throw Error(op, dtensor::detail::cat("unit ", g.name(), ": the FSDP shard of ", e.name,
                                             " is not the next of fsdp.params(): pass the units FSDP was built on"),
                    mesh.rank());
      auto& seg = segments[next++];
      for (const auto& part : flat_range_boxes(e.local_extent, lo - Extent(e.offset), hi - Extent(e.offset))) {
        Region box = part.box;
        for (std::size_t d = 0; d < box.rank(); ++d) box.offset[d] += e.local_offset[d];
        add_slot(out, mesh, e.name, e.global_shape, std::move(box), seg.value.data() + part.at, seg.layout);
      }
    }
  }
  if (next != segments.size())
    throw Error(op, dtensor::detail::cat(segments.size() - next, " of fsdp.params() belong to no unit given"), mesh.rank());
  return out;
}

namespace detail {
/// For each element range of `values` (an optimizer's parameter views), the slots inside it.
template <class T, class Views, class Each>
void slots_within(const Slots<T>& params, const Views& views, const char* op, Each&& each) {
  std::vector<std::size_t> by_address(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) by_address[i] = i;
  std::sort(by_address.begin(), by_address.end(),
            [&](std::size_t a, std::size_t b) { return std::less<const T*>()(params[a].data, params[b].data); });
  for (std::size_t k = 0; k < views.size(); ++k) {
    const T* lo = views[k].value.data();
    const T* hi = lo + views[k].value.size();
    auto it = std::lower_bound(by_address.begin(), by_address.end(), lo,
                               [&](std::size_t i, const T* p) { return std::less<const T*>()(params[i].data, p); });
    std::size_t covered = 0;
    for (; it != by_address.end() && std::less<const T*>()(params[*it].data, hi); ++it) {
      const auto& s = params[*it];
      covered += std::size_t(s.box.numel());
      each(k, s, std::size_t(s.data - lo));
    }
    if (covered != views[k].value.size())
      throw Error(op, dtensor::detail::cat("parameter ", views[k].name, ": slots cover ", covered, " of its ",
                                           views[k].value.size(), " local elements; pass the slots of the parameters this optimizer steps"));
  }
}
}  // namespace detail

/// The slots of an AdamW's two moments: "adamw.exp_avg/<name>" and "adamw.exp_avg_sq/<name>"
/// with the boxes of the parameter slots (made from the views the optimizer steps over).
template <class T, class Opt>
Slots<T> adamw_slots(const Slots<T>& params, Opt& opt) {
  Slots<T> out;
  for (const bool second : {false, true}) {
    detail::slots_within(params, opt.params(), "checkpoint::adamw_slots", [&](std::size_t k, const Slot<T>& s, std::size_t at) {
      std::span<T> moment = second ? opt.exp_avg_sq(k) : opt.exp_avg(k);
      Slot<T> m = s;
      m.name = (second ? "adamw.exp_avg_sq/" : "adamw.exp_avg/") + s.name;
      m.data = moment.data() + at;
      out.push_back(std::move(m));
    });
  }
  return out;
}

/// Slots held in the memory of space Space, pointed at host copies for the file I/O (save and
/// load read and write host memory): with `copy_in` the copies start as the slots' values (to
/// save them); copy_back() writes the copies to the slots' memory (after a load). In a
/// host-accessible space nothing is copied. A device model's checkpoint moves through here.
template <MemorySpace Space, class T>
class HostStaging {
 public:
  HostStaging(Slots<T>& slots, bool copy_in) {
    if constexpr (!Space::host_accessible) {
      staged_.reserve(slots.size());
      for (auto& s : slots) {
        staged_.emplace_back(std::size_t(s.box.numel()));
        held_.push_back(s.data);
        if (copy_in) Space::copy(staged_.back().data(), s.data, staged_.back().size() * sizeof(T));
        s.data = staged_.back().data();
      }
    }
  }
  void copy_back() const {
    for (std::size_t i = 0; i < staged_.size(); ++i) Space::copy(held_[i], staged_[i].data(), staged_[i].size() * sizeof(T));
  }

 private:
  std::vector<std::vector<T>> staged_;
  std::vector<T*> held_;  // where each slot's values live (device memory)
};

}  // namespace dtensor::checkpoint
