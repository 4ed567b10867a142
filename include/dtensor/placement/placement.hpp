// dtensor/placement/placement.hpp — how a tensor is stored along one mesh dimension.
//
//   Shard<1>                 tensor dimension 1 is split across the ranks of that mesh dimension
//   Replicate                every rank holds the same values
//   Partial<>                every rank holds a partial sum; the value is the sum over ranks
//   Partial<ReduceOp::max>   ... the maximum over ranks (also avg, min)
//
// Each placement type lowers to a PlacementDesc, a plain value: the planner and the chunk
// arithmetic work on those, so they serve compile-time layouts and run-time ones alike.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "dtensor/core/dtype.hpp"

namespace dtensor {

enum class PlacementKind : std::uint8_t { replicate, shard, partial };

struct PlacementDesc {
  PlacementKind kind = PlacementKind::replicate;
  int dim = -1;                // the tensor dimension, for shard
  ReduceOp op = ReduceOp::sum;  // the reduction, for partial

  constexpr bool is_shard() const { return kind == PlacementKind::shard; }
  constexpr bool is_shard(int d) const { return is_shard() && dim == d; }
  constexpr bool is_replicate() const { return kind == PlacementKind::replicate; }
  constexpr bool is_partial() const { return kind == PlacementKind::partial; }
  friend constexpr bool operator==(const PlacementDesc& a, const PlacementDesc& b) {
    return a.kind == b.kind && (a.kind != PlacementKind::shard || a.dim == b.dim) &&
           (a.kind != PlacementKind::partial || a.op == b.op);
  }

  static constexpr PlacementDesc replicate() { return {}; }
  static constexpr PlacementDesc shard(int d) { return {PlacementKind::shard, d, ReduceOp::sum}; }
  static constexpr PlacementDesc partial(ReduceOp op = ReduceOp::sum) { return {PlacementKind::partial, -1, op}; }
};

/// "S(0)", "R", "P(sum)" — the short form PyTorch prints.
inline std::string to_string(const PlacementDesc& p) {
  switch (p.kind) {
    case PlacementKind::replicate: return "R";
    case PlacementKind::shard: return "S(" + std::to_string(p.dim) + ")";
    case PlacementKind::partial: return "P(" + std::string(name_of(p.op)) + ")";
  }
  return "?";
}

template <int D>
struct Shard {
  static_assert(D >= 0, "Shard<d> needs a tensor dimension d >= 0");
  static constexpr int dim = D;
  static constexpr PlacementDesc desc = PlacementDesc::shard(D);
};

struct Replicate {
  static constexpr PlacementDesc desc = PlacementDesc::replicate();
};

template <ReduceOp Op = ReduceOp::sum>
struct Partial {
  static constexpr ReduceOp op = Op;
  static constexpr PlacementDesc desc = PlacementDesc::partial(Op);
};

template <class P>
concept Placement = requires {
  { P::desc } -> std::convertible_to<PlacementDesc>;
};

}  // namespace dtensor
