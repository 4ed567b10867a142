// dtensor/placement/chunk.hpp — which elements of a sharded dimension each rank holds.
//
//   chunk_range(13, 4, 3) == Range{12, 13}    // torch.chunk: 4, 4, 4, 1
//   chunk_range(5, 4, 3)  == Range{5, 5}      // 2, 2, 1, 0 — trailing ranks may hold nothing
//
// Extent n over k ranks: every chunk has ceil(n / k) elements except at the tail, so padding
// always sits at the end and a gather of equally padded chunks is the tensor plus a tail.
#pragma once

#include "dtensor/core/shape.hpp"

namespace dtensor {

struct Range {
  Extent begin = 0, end = 0;
  constexpr Extent size() const { return end - begin; }
  friend constexpr bool operator==(const Range&, const Range&) = default;
};

/// ceil(n / k): the extent of every chunk but the tail ones.
constexpr Extent chunk_size(Extent n, int k) { return k > 0 ? (n + k - 1) / k : n; }

/// The part of [0, n) that rank i of k holds.
constexpr Range chunk_range(Extent n, int k, int i) {
  const Extent c = chunk_size(n, k);
  const Extent b = c * i < n ? c * i : n;
  const Extent e = c * (i + 1) < n ? c * (i + 1) : n;
  return {b, e};
}

/// The part of `parent` that rank i of k holds (nested sharding splits a chunk again).
constexpr Range chunk_range(Range parent, int k, int i) {
  const Range r = chunk_range(parent.size(), k, i);
  return {parent.begin + r.begin, parent.begin + r.end};
}

}  // namespace dtensor
