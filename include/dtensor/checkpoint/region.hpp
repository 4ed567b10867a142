// dtensor/checkpoint/region.hpp — boxes of tensors whose rank is known only at run time, and
// the overlap plan between the boxes a checkpoint holds and the boxes a rank needs.
//
//   Region a{{0, 0}, {15, 16}}, b{{8, 0}, {8, 16}};
//   intersect(a, b)                        // {{8, 0}, {7, 16}}
//   flat_range_boxes({4, 5}, 3, 12)        // elements 3..11 of a row-major 4x5 box: [0,3:5], [1,0:5], [2,0:2]
//   OverlapIndex index(saved_boxes);       // O(C log C)
//   index.for_each_overlap(needed, [](std::size_t piece, const Region& common) { ... });
//
// A checkpoint stores each tensor as pieces, each a box of the global tensor (a rank's local
// piece under its layout, placement/layout.hpp local_box, cut into slabs). Loading onto another
// mesh or layout means: for every box this rank needs, the saved pieces that overlap it. The
// index sorts the saved boxes once along the dimension where they are cut most finely (the
// one with the most distinct starts) and answers a query by binary search over the starts:
// O((L + C) log C) for L queries and C pieces plus the candidates examined, never all pairs.
// The candidates of a query are the pieces that start within one piece length before it along
// that dimension; for the tilings layouts produce (a product of per-dimension chunkings) these
// are the pieces of the bands it crosses.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/core/box.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/memory.hpp"
#include "dtensor/core/shape.hpp"

namespace dtensor::checkpoint {

using dtensor::to_string;  // shapes; the overload below prints regions

/// A box of a tensor of any rank: where it starts and its extents, one per dimension.
struct Region {
  std::vector<Extent> offset, extent;

  std::size_t rank() const noexcept { return extent.size(); }
  Extent numel() const {
    Extent n = 1;
    for (Extent e : extent) n *= e;
    return n;
  }
  bool empty() const { return numel() == 0; }
  friend bool operator==(const Region&, const Region&) = default;
};

/// "[0:15, 8:16]": the half-open range of each dimension.
inline std::string to_string(const Region& r) {
  std::string s = "[";
  for (std::size_t d = 0; d < r.rank(); ++d)
    s += (d ? ", " : "") + std::to_string(r.offset[d]) + ":" + std::to_string(r.offset[d] + r.extent[d]);
  return s + "]";
}

/// The common part of two boxes of the same tensor (empty extents when they do not meet).
inline Region intersect(const Region& a, const Region& b) {
  Region r;
  r.offset.resize(a.rank());
  r.extent.resize(a.rank());
  for (std::size_t d = 0; d < a.rank(); ++d) {
    const Extent lo = std::max(a.offset[d], b.offset[d]);
    const Extent hi = std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    r.offset[d] = lo;
    r.extent[d] = hi > lo ? hi - lo : 0;
  }
  return r;
}

/// Whether `inner` lies within `outer`.
inline bool contains(const Region& outer, const Region& inner) {
  if (outer.rank() != inner.rank()) return false;
  for (std::size_t d = 0; d < outer.rank(); ++d)
    if (inner.offset[d] < outer.offset[d] || inner.offset[d] + inner.extent[d] > outer.offset[d] + outer.extent[d])
      return false;
  return true;
}

/// A box of the elements [begin, end) of a row-major box of `extent`, contiguous there, and
/// where its first element sits in that range (relative to begin).
struct FlatPart {
  Region box;  // relative to the row-major box (offset 0 is its first element)
  Extent at = 0;
};

namespace detail {
inline void flat_range_boxes(const std::vector<Extent>& extent, std::size_t dim, std::vector<Extent>& prefix, Extent lo,
                             Extent hi, Extent base, std::vector<FlatPart>& out) {
  if (lo >= hi) return;
  const std::size_t rank = extent.size();
  Extent slice = 1;  // elements of one index along `dim` (the trailing dimensions)
  for (std::size_t d = dim + 1; d < rank; ++d) slice *= extent[d];
  auto emit = [&](Extent first, Extent count) {
    FlatPart p;
    p.box.offset = prefix;
    p.box.offset.push_back(first);
    p.box.extent.assign(dim, 1);
    p.box.extent.push_back(count);
    for (std::size_t d = dim + 1; d < rank; ++d) {
      p.box.offset.push_back(0);
      p.box.extent.push_back(extent[d]);
    }
    p.at = base + first * slice;
    out.push_back(std::move(p));
  };
  auto descend = [&](Extent index, Extent sub_lo, Extent sub_hi) {
    prefix.push_back(index);
    flat_range_boxes(extent, dim + 1, prefix, sub_lo, sub_hi, base + index * slice, out);
    prefix.pop_back();
  };
  Extent first = lo / slice, last = (hi - 1) / slice;  // the indices along `dim` the range touches
  if (first == last && (lo % slice != 0 || hi % slice != 0)) return descend(first, lo % slice, hi - first * slice);
  if (lo % slice != 0) descend(first++, lo % slice, slice);  // a partial slice at the head
  const bool partial_tail = hi % slice != 0;
  const Extent full_end = partial_tail ? last : last + 1;
  if (full_end > first) emit(first, full_end - first);  // whole slices: contiguous
  if (partial_tail) descend(last, 0, hi % slice);
}
}  // namespace detail

/// The elements [begin, end) of a row-major box of `extent` as at most 2 * rank - 1 boxes, each
/// contiguous in that order, in increasing order (an FSDP shard of a flat buffer cuts a
/// parameter's local piece this way: parallel/fsdp/unit_state.hpp).
inline std::vector<FlatPart> flat_range_boxes(const std::vector<Extent>& extent, Extent begin, Extent end) {
  std::vector<FlatPart> out;
  std::vector<Extent> prefix;
  if (extent.empty()) {  // a scalar: one element, a box of no dimensions
    if (begin < end) out.push_back({Region{}, 0});
    return out;
  }
  detail::flat_range_boxes(extent, 0, prefix, begin, end, 0, out);
  for (auto& p : out) p.at -= begin;
  return out;
}

/// The saved boxes of one tensor, indexed for overlap queries (see the top of this file).
class OverlapIndex {
 public:
  OverlapIndex() = default;
  explicit OverlapIndex(std::vector<Region> boxes) : boxes_(std::move(boxes)) {
    if (boxes_.empty() || boxes_.front().rank() == 0) {
      order_.resize(boxes_.size());
      std::iota(order_.begin(), order_.end(), std::size_t(0));
      return;
    }
    // The dimension cut most finely: the most distinct starts.
    std::size_t best = 0, best_count = 0;
    for (std::size_t d = 0; d < boxes_.front().rank(); ++d) {
      std::vector<Extent> starts;
      for (const auto& b : boxes_) starts.push_back(b.offset[d]);
      std::sort(starts.begin(), starts.end());
      const auto count = std::size_t(std::unique(starts.begin(), starts.end()) - starts.begin());
      if (count > best_count) best = d, best_count = count;
    }
    dim_ = best;
    for (std::size_t i = 0; i < boxes_.size(); ++i)
      if (!boxes_[i].empty()) order_.push_back(i);
    std::sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) { return boxes_[a].offset[dim_] < boxes_[b].offset[dim_]; });
    for (std::size_t i : order_) {
      starts_.push_back(boxes_[i].offset[dim_]);
      longest_ = std::max(longest_, boxes_[i].extent[dim_]);
    }
  }

  /// Calls f(box index, common region) for every indexed box that overlaps `query`.
  template <class F>
  void for_each_overlap(const Region& query, F&& f) const {
    std::size_t lo = 0, hi = order_.size();
    if (!starts_.empty() && query.rank() > dim_) {
      const Extent q0 = query.offset[dim_], q1 = q0 + query.extent[dim_];
      lo = std::size_t(std::lower_bound(starts_.begin(), starts_.end(), q0 - longest_ + 1) - starts_.begin());
      hi = std::size_t(std::lower_bound(starts_.begin(), starts_.end(), q1) - starts_.begin());
    }
    for (std::size_t k = lo; k < hi; ++k) {
      const Region common = intersect(boxes_[order_[k]], query);
      if (!common.empty()) f(order_[k], common);
    }
  }
  const std::vector<Region>& boxes() const noexcept { return boxes_; }

 private:
  std::vector<Region> boxes_;
  std::vector<std::size_t> order_;  // non-empty boxes by their start along dim_
  std::vector<Extent> starts_;
  std::size_t dim_ = 0;
  Extent longest_ = 0;
};

namespace detail {
template <std::size_t R>
Shape<R> fixed(const std::vector<Extent>& v) {
  Shape<R> s{};
  for (std::size_t d = 0; d < R; ++d) s[d] = v[d];
  return s;
}
template <std::size_t R>
void copy_region_fixed(const void* src, const Region& src_box, void* dst, const Region& dst_box, const Region& part,
                       std::size_t elem_bytes) {
  Shape<R> src_off{}, dst_off{};
  for (std::size_t d = 0; d < R; ++d) {
    src_off[d] = part.offset[d] - src_box.offset[d];
    dst_off[d] = part.offset[d] - dst_box.offset[d];
  }
  dtensor::detail::copy_box_raw<host_space, R>(src, fixed<R>(src_box.extent), src_off, dst, fixed<R>(dst_box.extent), dst_off,
                              fixed<R>(part.extent), elem_bytes);
}
}  // namespace detail

/// Copies `part` (a box of the global tensor inside both) from the row-major host buffer of
/// `src_box` to that of `dst_box`. Ranks 0 to 6 (core/box.hpp's copy, by the rank).
inline void copy_region(const void* src, const Region& src_box, void* dst, const Region& dst_box, const Region& part,
                        std::size_t elem_bytes) {
  if (!contains(src_box, part) || !contains(dst_box, part))
    throw Error("checkpoint::copy_region", dtensor::detail::cat("box ", to_string(part), " is not inside both ",
                                                                to_string(src_box), " and ", to_string(dst_box)));
  switch (part.rank()) {
    case 0: return host_space::copy(dst, src, elem_bytes);
    case 1: return detail::copy_region_fixed<1>(src, src_box, dst, dst_box, part, elem_bytes);
    case 2: return detail::copy_region_fixed<2>(src, src_box, dst, dst_box, part, elem_bytes);
    case 3: return detail::copy_region_fixed<3>(src, src_box, dst, dst_box, part, elem_bytes);
    case 4: return detail::copy_region_fixed<4>(src, src_box, dst, dst_box, part, elem_bytes);
    case 5: return detail::copy_region_fixed<5>(src, src_box, dst, dst_box, part, elem_bytes);
    case 6: return detail::copy_region_fixed<6>(src, src_box, dst, dst_box, part, elem_bytes);
    default:
      throw Error("checkpoint::copy_region",
                  dtensor::detail::cat("a tensor of rank ", part.rank(), ": checkpoints hold ranks 0 to 6"));
  }
}

}  // namespace dtensor::checkpoint
