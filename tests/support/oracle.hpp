// tests/support/oracle.hpp — the single-rank twin of a distributed tensor, for the tests.
//
// Every redistribution test compares with what one rank computes from the full tensor: the
// piece a rank must hold under a layout is the box local_box() names, cut from the full
// tensor; the logical value after Partial placements is the input times the number of
// Partial<sum> copies. Shared by the threads tests and the MPI tests (tests/mpi).
#pragma once

#include <array>
#include <random>
#include <string>
#include <vector>

#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/redistribute.hpp"

namespace dtensor::testing {

/// The piece the rank at `coord` holds when every Partial rank holds the full value (so the
/// logical tensor is `full` times partial_factor()).
template <class T, std::size_t R, std::size_t N>
Tensor<T, R> oracle_piece(const Tensor<T, R>& full, const LayoutDesc<N>& l, const std::array<int, N>& mesh_shape,
                          const std::array<int, N>& coord) {
  const auto box = local_box(l, mesh_shape, coord, full.shape());
  auto piece = Tensor<T, R>::uninitialized(box.extent);
  copy_box(full, box.offset, piece, Shape<R>{}, box.extent);
  return piece;
}

/// The number of Partial<sum> copies a layout's pieces add up.
template <std::size_t N>
int partial_factor(const LayoutDesc<N>& l, const std::array<int, N>& mesh_shape) {
  int f = 1;
  for (std::size_t i = 0; i < N; ++i)
    if (l.placements[i].is_partial() && l.placements[i].op == ReduceOp::sum) f *= mesh_shape[i];
  return f;
}

template <class T, std::size_t R>
Tensor<T, R> times(Tensor<T, R> t, int f) {
  for (Extent i = 0; i < t.numel(); ++i) t[i] = T(t[i] * T(f));
  return t;
}

/// Runs from -> to on this rank and checks it against the oracle. Returns "" or what failed.
/// Values are small integers, so every sum is exact and the checks are bit for bit. The pieces
/// live in memory space Space while they are redistributed (the oracle is always on the host).
template <class T, class Space = host_space, std::size_t R, class Mesh, std::size_t N>
std::string check_redistribution(const Mesh& mesh, const LayoutDesc<N>& from, const LayoutDesc<N>& to,
                                 const Shape<R>& global, std::uint64_t seed) {
  const auto full = randint<T>(global, seed, -8, 9);
  const auto& ms = mesh.shape();
  const auto& coord = mesh.coordinate();
  auto where = [&] {
    return detail::cat(to_string(from), " -> ", to_string(to), " of ", to_string(global), " on mesh ", to_string(ms),
                       " at ", to_string(coord), ": ");
  };
  const auto plan = plan_redistribution(from, to);
  auto out = execute(plan, to_space<Space>(oracle_piece(full, from, ms, coord)), mesh, global);
  const auto want_box = local_box(to, ms, coord, global);
  if (out.shape() != want_box.extent)
    return where() + "piece " + to_string(out.shape()) + ", expected " + to_string(want_box.extent);
  const int factor = partial_factor(from, ms);
  if (!to.has_partial()) {
    const auto want = times(oracle_piece(full, to, ms, coord), factor);
    const auto got = to_space<host_space>(out);
    if (!equal(got, want)) return where() + "piece differs: " + compare(got, want).message;
  }
  const auto all = to_space<host_space>(execute(plan_redistribution(to, replicated_layout<N>::desc), out, mesh, global));
  const auto want_all = times(full, factor);
  if (!equal(all, want_all)) return where() + "full tensor differs: " + compare(all, want_all).message;
  return {};
}

/// Every layout of N mesh dimensions whose placements come from `choices`.
template <std::size_t N>
std::vector<LayoutDesc<N>> all_layouts(const std::vector<PlacementDesc>& choices) {
  std::vector<LayoutDesc<N>> out;
  std::size_t total = 1;
  for (std::size_t i = 0; i < N; ++i) total *= choices.size();
  for (std::size_t c = 0; c < total; ++c) {
    LayoutDesc<N> l;
    std::size_t x = c;
    for (std::size_t i = 0; i < N; ++i) {
      l.placements[i] = choices[x % choices.size()];
      l.priority[i] = int(i);
      x /= choices.size();
    }
    out.push_back(l);
  }
  return out;
}

/// Whether a layout shards one tensor dimension over several mesh dimensions.
template <std::size_t N>
bool has_nested_shard(const LayoutDesc<N>& l) {
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t j = i + 1; j < N; ++j)
      if (l.placements[i].is_shard() && l.placements[i] == l.placements[j]) return true;
  return false;
}

/// The same layout with the split order of shared tensor dimensions reversed (right to left).
template <std::size_t N>
LayoutDesc<N> reversed_order(LayoutDesc<N> l) {
  for (std::size_t i = 0; i < N; ++i) l.priority[i] = int(N - 1 - i);
  return l;
}

}  // namespace dtensor::testing
