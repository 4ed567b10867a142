// dtensor/sim/rank_classes.hpp — which ranks of a mesh do the same work, so that a dry run runs
// once per class instead of once per rank.
//
//   // pp: every stage differs; dp: a batch of 1000 over 128 ranks (chunks 8, ..., 8, 0);
//   // tp: 8 heads over 8 ranks (all alike)
//   auto classes = sim::rank_classes<3>({16, 128, 8}, {sim::DimensionWork::distinct(),
//                                                       sim::DimensionWork::splitting({1000}),
//                                                       sim::DimensionWork::splitting({8})});
//   classes.size();                // 16 stages x 2 (full or empty batch chunk) x 1 = 32
//   classes[0].coordinate;         // {0, 0, 0}: the class's representative
//   classes[0].ranks;              // 125 ranks do what rank {0, 0, 0} does
//
// A rank's work depends on its coordinate only through (a) the pipeline stage, every one of
// which runs other layers, and (b) the extents of the pieces it holds: under torch.chunk's rule
// (placement/chunk.hpp) the ranks of a dimension hold full chunks, then at most one partial
// chunk, then empty ones. Collectives are padded to the largest chunk of their group, so two
// ranks whose pieces have the same extents issue the same collectives too. The classes of a
// mesh are the products of the classes of its dimensions, computed from each dimension alone:
// O(sum of the dimension sizes), never O(ranks). The extents a dimension splits are given as
// that dimension sees them (for nested shards, the extent of the chunk it splits).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/shape.hpp"
#include "dtensor/placement/chunk.hpp"

namespace dtensor::sim {

/// How the coordinates of one mesh dimension differ in the work they do.
struct DimensionWork {
  bool every_coordinate_distinct = false;  // a pipeline dimension: each stage is its own class
  std::vector<Extent> split_extents;       // extents this dimension shards (torch.chunk)
  std::vector<std::string> keys;           // when given: coordinate c does the work named keys[c]

  static DimensionWork distinct() { return {true, {}, {}}; }
  static DimensionWork splitting(std::vector<Extent> extents) { return {false, std::move(extents), {}}; }
  /// Coordinates with equal keys do the same work: pipeline ranks whose stages hold the same
  /// layers, embedding and head (the middle stages of an even split are one class).
  static DimensionWork keyed(std::vector<std::string> keys) { return {false, {}, std::move(keys)}; }
};

/// Ranks that do the same work: `ranks` of them, of which `coordinate` is the first.
template <std::size_t N>
struct RankClass {
  std::array<int, N> coordinate{};
  std::int64_t ranks = 0;
};

namespace detail {
/// One dimension's classes: representative coordinate and count, in coordinate order.
inline std::vector<std::pair<int, std::int64_t>> dimension_classes(int size, const DimensionWork& work) {
  std::vector<std::pair<int, std::int64_t>> classes;
  if (work.every_coordinate_distinct) {
    for (int c = 0; c < size; ++c) classes.push_back({c, 1});
    return classes;
  }
  if (!work.keys.empty()) {
    if (work.keys.size() != std::size_t(size))
      throw Error("sim::rank_classes", dtensor::detail::cat(work.keys.size(), " keys for a mesh dimension of size ", size));
    std::map<std::string, std::size_t> index_of_key;  // key -> class
    for (int c = 0; c < size; ++c) {
      auto [it, added] = index_of_key.try_emplace(work.keys[std::size_t(c)], classes.size());
      if (added) classes.push_back({c, 0});
      ++classes[it->second].second;
    }
    return classes;
  }
  std::map<std::vector<Extent>, std::size_t> index_of_pieces;  // piece extents -> class
  for (int c = 0; c < size; ++c) {
    std::vector<Extent> pieces;
    for (Extent n : work.split_extents) pieces.push_back(chunk_range(n, size, c).size());
    auto [it, added] = index_of_pieces.try_emplace(pieces, classes.size());
    if (added) classes.push_back({c, 0});
    ++classes[it->second].second;
  }
  return classes;
}
}  // namespace detail

namespace detail {
/// Every class of `classes` times every class of `more` (the latter's coordinates set where
/// `set[d]`): the product of the classes of disjoint dimensions.
template <std::size_t N>
std::vector<RankClass<N>> refine(const std::vector<RankClass<N>>& classes, const std::vector<RankClass<N>>& more,
                                 const std::array<bool, N>& set) {
  std::vector<RankClass<N>> refined;
  for (const auto& partial : classes)
    for (const auto& m : more) {
      RankClass<N> c = partial;
      for (std::size_t d = 0; d < N; ++d)
        if (set[d]) c.coordinate[d] = m.coordinate[d];
      c.ranks *= m.ranks;
      refined.push_back(c);
    }
  return refined;
}

/// One dimension's classes as RankClasses (only coordinate d set) and the mask of d.
template <std::size_t N>
std::pair<std::vector<RankClass<N>>, std::array<bool, N>> dimension_rank_classes(std::size_t d, int size,
                                                                                 const DimensionWork& work) {
  if (size < 1) throw Error("sim::rank_classes", dtensor::detail::cat("mesh dimension ", d, " has size ", size));
  for (Extent n : work.split_extents)
    if (n < 0) throw Error("sim::rank_classes", dtensor::detail::cat("negative extent ", n, " split over mesh dimension ", d));
  std::vector<RankClass<N>> out;
  for (const auto& [coordinate, count] : dimension_classes(size, work)) {
    RankClass<N> c{{}, count};
    c.coordinate[d] = coordinate;
    out.push_back(c);
  }
  std::array<bool, N> mask{};
  mask[d] = true;
  return {std::move(out), mask};
}
}  // namespace detail

/// The rank classes of a mesh of `shape` (see the synopsis), ordered by representative.
template <std::size_t N>
std::vector<RankClass<N>> rank_classes(const std::array<int, N>& shape, const std::array<DimensionWork, N>& work) {
  std::vector<RankClass<N>> classes{RankClass<N>{{}, 1}};
  for (std::size_t d = 0; d < N; ++d) {
    const auto [dim_classes, mask] = detail::dimension_rank_classes<N>(d, shape[d], work[d]);
    classes = detail::refine(classes, dim_classes, mask);
  }
  return classes;
}

namespace detail {
/// Each coordinate's class index among dimension_classes(size, work) (the same order).
inline std::vector<std::size_t> dimension_class_index(int size, const DimensionWork& work) {
  const auto classes = dimension_classes(size, work);
  std::vector<std::size_t> index(std::size_t(size), 0);
  auto same = [&](int a, int b) {
    if (work.every_coordinate_distinct) return a == b;
    if (!work.keys.empty()) return work.keys[std::size_t(a)] == work.keys[std::size_t(b)];
    for (Extent n : work.split_extents)
      if (chunk_range(n, size, a).size() != chunk_range(n, size, b).size()) return false;
    return true;
  };
  for (int c = 0; c < size; ++c)
    for (std::size_t k = 0; k < classes.size(); ++k)
      if (same(c, classes[k].first)) {
        index[std::size_t(c)] = k;
        break;
      }
  return index;
}
}  // namespace detail

/// As rank_classes, and ranks whose key(coordinate) differs are in different classes too: work
/// that depends on several dimensions' coordinates together (an expert rank's share of the
/// experts, from its position among the data x context ranks). The key reads only the
/// coordinates of the dimensions marked in `keyed` (the others are 0 when it is called); those
/// dimensions are enumerated together, so the product of their sizes is bounded (2^24).
template <std::size_t N, class Key>
std::vector<RankClass<N>> rank_classes(const std::array<int, N>& shape, const std::array<DimensionWork, N>& work,
                                       const std::array<bool, N>& keyed, Key&& key) {
  std::int64_t combos = 1;
  std::array<std::vector<std::size_t>, N> index{};
  for (std::size_t d = 0; d < N; ++d) {
    if (shape[d] < 1) throw Error("sim::rank_classes", dtensor::detail::cat("mesh dimension ", d, " has size ", shape[d]));
    if (!keyed[d]) continue;
    combos *= shape[d];
    if (combos > (std::int64_t(1) << 24))
      throw Error("sim::rank_classes", dtensor::detail::cat("the keyed dimensions have more than 2^24 coordinates together"));
    index[d] = detail::dimension_class_index(shape[d], work[d]);
  }
  // The keyed dimensions' classes: (their class indices, the key) -> representative and count.
  std::vector<RankClass<N>> keyed_classes;
  std::map<std::vector<std::int64_t>, std::size_t> class_of;
  std::array<int, N> c{};
  for (std::int64_t i = 0; i < combos; ++i) {
    std::int64_t rest = i;
    for (std::size_t d = N; d-- > 0;)
      if (keyed[d]) {
        c[d] = int(rest % shape[d]);
        rest /= shape[d];
      }
    std::vector<std::int64_t> k;
    for (std::size_t d = 0; d < N; ++d)
      if (keyed[d]) k.push_back(std::int64_t(index[d][std::size_t(c[d])]));
    k.push_back(std::int64_t(key(std::as_const(c))));
    auto [it, added] = class_of.try_emplace(std::move(k), keyed_classes.size());
    if (added) keyed_classes.push_back({c, 0});
    ++keyed_classes[it->second].ranks;
  }
  std::vector<RankClass<N>> classes{RankClass<N>{{}, 1}};
  bool keyed_done = false;
  for (std::size_t d = 0; d < N; ++d) {
    if (!keyed[d]) {
      const auto [dim_classes, mask] = detail::dimension_rank_classes<N>(d, shape[d], work[d]);
      classes = detail::refine(classes, dim_classes, mask);
    } else if (!keyed_done) {  // the keyed dimensions at once, where the first of them stands
      keyed_done = true;
      classes = detail::refine(classes, keyed_classes, keyed);
    }
  }
  return classes;
}

}  // namespace dtensor::sim
