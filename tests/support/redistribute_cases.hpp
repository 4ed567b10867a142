// tests/support/redistribute_cases.hpp — the redistribution suites, written once for every
// backend: the exhaustive layout pairs, other element types, and the seeded random cases.
//
//   check_all_pairs(mesh, /*with_orders=*/true, report);   // tests/unit and tests/mpi alike
//   check_random(mesh, seed, random_cases(250), report);
//
// Each runs on one rank of `mesh` (every rank of the mesh calls it with the same arguments)
// and calls report(message) for each case that differs from the single-rank oracle.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "support/oracle.hpp"

namespace dtensor::testing {

/// The placements the exhaustive suite combines: R, S(0), S(1), P(sum), P(max).
inline const std::vector<PlacementDesc>& pair_choices() {
  static const std::vector<PlacementDesc> c = {PlacementDesc::replicate(), PlacementDesc::shard(0),
                                               PlacementDesc::shard(1), PlacementDesc::partial(ReduceOp::sum),
                                               PlacementDesc::partial(ReduceOp::max)};
  return c;
}

/// Even, uneven and smaller-than-the-mesh extents.
inline const std::vector<Shape<2>>& pair_shapes() {
  static const std::vector<Shape<2>> s = {{8, 12}, {13, 5}, {1, 3}, {5, 13}};
  return s;
}

/// Every pair of layouts over pair_choices() (and, with_orders, nested shards split right to
/// left as well), each on every pair_shapes() extent, against the oracle. With stride k only
/// every k-th of these cases runs (the same ones on every rank, with the same seeds), for
/// backends where the full 60 000 cases of a 3-d mesh take minutes; see oracle_stride().
template <class Space = host_space, class Mesh, class Report>
void check_all_pairs(const Mesh& mesh, bool with_orders, Report&& report, std::uint64_t stride = 1) {
  constexpr std::size_t N = Mesh::ndim;
  auto layouts = all_layouts<N>(pair_choices());
  if (with_orders)
    for (std::size_t i = 0, e = layouts.size(); i < e; ++i)
      if (has_nested_shard(layouts[i])) layouts.push_back(reversed_order(layouts[i]));
  std::uint64_t seed = 1;
  for (const auto& from : layouts)
    for (const auto& to : layouts) {
      if (redistribution_error(from, to)) continue;
      for (const auto& g : pair_shapes()) {
        if (seed % stride == 0) report(check_redistribution<float, Space>(mesh, from, to, g, seed));
        ++seed;
      }
    }
}

/// The stride of check_all_pairs: DTENSOR_ORACLE_STRIDE if set (1 runs every case), else `fallback`.
inline std::uint64_t oracle_stride(std::uint64_t fallback) {
  const char* e = std::getenv("DTENSOR_ORACLE_STRIDE");
  const long long v = e && *e ? std::atoll(e) : 0;
  return v > 0 ? std::uint64_t(v) : fallback;
}

/// double, int32, int64 and bfloat16 move bit for bit too (a 2-d mesh).
template <class Space = host_space, class Mesh, class Report>
void check_other_element_types(const Mesh& mesh, Report&& report) {
  static_assert(Mesh::ndim == 2, "check_other_element_types takes a 2-d mesh");
  const LayoutDesc<2> a{{PlacementDesc::shard(0), PlacementDesc::shard(1)}, {0, 1}};
  const LayoutDesc<2> b{{PlacementDesc::shard(1), PlacementDesc::partial()}, {0, 1}};
  const LayoutDesc<2> r{{PlacementDesc::replicate(), PlacementDesc::shard(0)}, {0, 1}};
  for (const auto& [from, to] : {std::pair{a, r}, {r, a}, {a, b}, {b, r}}) {
    report(check_redistribution<double, Space>(mesh, from, to, Shape<2>{7, 5}, 3));
    report(check_redistribution<std::int32_t, Space>(mesh, from, to, Shape<2>{7, 5}, 4));
    report(check_redistribution<std::int64_t, Space>(mesh, from, to, Shape<2>{3, 9}, 5));
    report(check_redistribution<bfloat16, Space>(mesh, from, to, Shape<2>{6, 2}, 6));
  }
}

/// The number of random cases per mesh: DTENSOR_RANDOM_CASES if set, else `fallback`.
inline int random_cases(int fallback) {
  const char* e = std::getenv("DTENSOR_RANDOM_CASES");
  return e && *e ? std::atoi(e) : fallback;
}

/// A layout with random placements (any Partial op, Shard of any dimension) and split order.
template <std::size_t N>
LayoutDesc<N> random_layout(std::mt19937_64& g, int tensor_rank) {
  LayoutDesc<N> l;
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  for (std::size_t i = 0; i < N; ++i) {
    switch (g() % 4) {
      case 0: l.placements[i] = PlacementDesc::replicate(); break;
      case 1: l.placements[i] = PlacementDesc::partial(ops[g() % 4]); break;
      default: l.placements[i] = PlacementDesc::shard(int(g() % std::uint64_t(tensor_rank))); break;
    }
    l.priority[i] = int(g() % 8);  // a random split order for shared dimensions
  }
  return l;
}

/// One random case: a tensor of rank R with extents 0..13 and a random pair of layouts.
template <std::size_t R, class Space, class Mesh, class Report>
void random_case(const Mesh& mesh, std::mt19937_64& g, std::uint64_t id, Report&& report) {
  constexpr std::size_t N = Mesh::ndim;
  Shape<R> global{};
  for (auto& e : global) e = Extent(g() % 14);
  auto from = random_layout<N>(g, int(R));
  auto to = random_layout<N>(g, int(R));
  if (redistribution_error(from, to)) return;
  const auto msg = check_redistribution<float, Space>(mesh, from, to, global, id);
  if (!msg.empty()) report(detail::cat("case ", id, ": ", msg));
}

/// `cases` random cases drawn from `seed` (the same sequence on every rank, so every rank runs
/// the same collectives); a failure names its case id, seed * 100000 + index.
template <class Space = host_space, class Mesh, class Report>
void check_random(const Mesh& mesh, std::uint64_t seed, int cases, Report&& report) {
  std::mt19937_64 g(seed);
  for (int c = 0; c < cases; ++c) {
    const std::uint64_t id = seed * 100000 + std::uint64_t(c);
    switch (g() % 3) {
      case 0: random_case<1, Space>(mesh, g, id, report); break;
      case 1: random_case<2, Space>(mesh, g, id, report); break;
      default: random_case<3, Space>(mesh, g, id, report); break;
    }
  }
}

}  // namespace dtensor::testing
