// tests/support/adjoint_cases.hpp — the adjoint checks of redistribution, for every backend.
//
// <A x, y> == <x, A* y>, summed over ranks, where A acts on the raw pieces of all ranks (which
// need not agree with each other) and A* is the redistribution between the dual layouts
// (Replicate <-> Partial<sum>, Shard stays). And redistribute_backward gives the gradient in
// the layout PyTorch's DTensor would. Each check runs on every rank of its mesh and calls
// report(message) for what fails.
#pragma once

#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/dtensor.hpp"
#include "support/gradcheck.hpp"
#include "support/oracle.hpp"

namespace dtensor::testing {

template <class P>
using dual_placement = std::conditional_t<P::desc.is_replicate(), Partial<>,
                                          std::conditional_t<P::desc.is_partial(), Replicate, P>>;
template <class L>
struct dual;
template <class O, class... P>
struct dual<BasicLayout<O, P...>> {
  using type = BasicLayout<O, dual_placement<P>...>;
};
template <class L>
using dual_t = typename dual<L>::type;

/// One (from, to) pair of 1-d layouts for each kind of redistribution step.
using AdjointStepKinds = std::tuple<std::pair<Layout<Shard<0>>, Layout<Replicate>>,   // all_gather
                                    std::pair<Layout<Partial<>>, Layout<Replicate>>,  // all_reduce
                                    std::pair<Layout<Partial<>>, Layout<Shard<1>>>,   // reduce_scatter
                                    std::pair<Layout<Shard<0>>, Layout<Shard<1>>>,    // all_to_all
                                    std::pair<Layout<Replicate>, Layout<Shard<0>>>,   // take_chunk
                                    std::pair<Layout<Replicate>, Layout<Partial<>>>,  // replicate_to_partial
                                    std::pair<Layout<Shard<1>>, Layout<Partial<>>>>;  // shard_to_partial

/// <A x, y> - <x, A* y> over all ranks, for random integer pieces x and y (exact in double).
template <class From, class To, class Mesh, std::size_t R>
double adjoint_gap(const Mesh& mesh, const Shape<R>& global, std::uint64_t seed) {
  const auto& ms = mesh.shape();
  const auto& c = mesh.coordinate();
  const auto xbox = local_box(From::desc, ms, c, global), ybox = local_box(To::desc, ms, c, global);
  const std::uint64_t s = seed * 1000 + std::uint64_t(mesh.rank());
  auto x = from_local<From>(mesh, randint<double>(xbox.extent, s, -5, 6), global);
  auto y = from_local<dual_t<To>>(mesh, randint<double>(ybox.extent, s + 500, -5, 6), global);
  auto ax = redistribute<To>(x);
  auto aty = redistribute<dual_t<From>>(y);
  double gap = dot(ax.to_local(), y.to_local()) - dot(x.to_local(), aty.to_local());
  mesh.comm().all_reduce(std::span<double>(&gap, 1), ReduceOp::sum);
  return gap;
}

/// One step kind From -> To on a 1-d mesh, on even, uneven and tiny extents.
template <class From, class To, class Mesh, class Report>
void check_adjoint(const Mesh& mesh, Report&& report) {
  for (const auto& g : {Shape<2>{8, 6}, Shape<2>{13, 5}, Shape<2>{1, 2}}) {
    const double gap = adjoint_gap<From, To>(mesh, g, 7);
    if (gap != 0)
      report(detail::cat(to_string(From::desc), " -> ", to_string(To::desc), " on ", mesh.size(), " ranks, ",
                         to_string(g), ": gap ", gap));
  }
}

/// Composite plans on a 2-d mesh: a swap, a Partial, nested shards, a merged all-reduce.
template <class Mesh, class Report>
void check_adjoint_composites_2d(const Mesh& m2, Report&& report) {
  static_assert(Mesh::ndim == 2);
  auto check = [&](double gap, const char* what) {
    if (gap != 0) report(detail::cat(what, " on mesh ", to_string(m2.shape()), ": gap ", gap));
  };
  check(adjoint_gap<Layout<Shard<0>, Shard<1>>, Layout<Shard<1>, Shard<0>>>(m2, Shape<2>{13, 6}, 1), "swap");
  check(adjoint_gap<Layout<Partial<>, Shard<0>>, Layout<Shard<1>, Replicate>>(m2, Shape<2>{9, 10}, 2), "P,S0->S1,R");
  check(adjoint_gap<Layout<Shard<0>, Shard<0>>, Layout<Replicate, Shard<1>>>(m2, Shape<2>{11, 3}, 3), "nested");
  check(adjoint_gap<Layout<Partial<>, Partial<>>, Layout<Replicate, Replicate>>(m2, Shape<2>{3, 3}, 4),
        "merged all_reduce");
}

/// A composite plan on a 3-d mesh: reversing three shards.
template <class Mesh, class Report>
void check_adjoint_composite_3d(const Mesh& m3, Report&& report) {
  static_assert(Mesh::ndim == 3);
  const double gap =
      adjoint_gap<Layout<Shard<0>, Shard<1>, Shard<2>>, Layout<Shard<2>, Shard<1>, Shard<0>>>(m3, Shape<3>{5, 4, 3}, 5);
  if (gap != 0) report(detail::cat("3-d swap on mesh ", to_string(m3.shape()), ": gap ", gap));
}

/// redistribute_backward on a 1-d mesh: a Replicate gradient of all_gather goes back by a local
/// chunk, a Partial one by a reduce-scatter; the backward of Partial -> Replicate is the identity.
template <class Mesh, class Report>
void check_backward_layouts(const Mesh& mesh, Report&& report) {
  static_assert(Mesh::ndim == 1);
  const auto g = randint<float>(Shape<2>{13, 5}, 9, -8, 9);
  {
    CommLog log;
    auto gr = redistribute_backward<Layout<Shard<0>>>(distribute_replicated<Layout<Replicate>>(mesh, g));
    if (log.size() != 0) report("R gradient of all_gather communicated: " + log.to_string());
    if (!equal(full_tensor(gr), g)) report("R gradient values");
  }
  {
    auto gp = from_local<Layout<Partial<>>>(mesh, g, g.shape());
    CommLog log;
    auto gs = redistribute_backward<Layout<Shard<0>>>(gp);
    if (log.count(CollectiveKind::reduce_scatter) != 1 || log.size() != 1) report("P gradient: " + log.to_string());
    if (!equal(full_tensor(gs), times(g, mesh.size()))) report("P gradient values");
  }
  {
    CommLog log;
    auto gr = redistribute_backward<Layout<Partial<>>>(distribute_replicated<Layout<Replicate>>(mesh, g));
    static_assert(std::is_same_v<typename decltype(gr)::layout, Layout<Replicate>>);
    if (log.size() != 0) report("identity backward communicated");
  }
}

}  // namespace dtensor::testing
