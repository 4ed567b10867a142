// Exhaustive oracle tests of redistribution on the threads backend: every pair of layouts
// from {R, S(0), S(1), P(sum), P(max)} on meshes (4), (2,2), (4,2), (2,2,2), with even,
// uneven and smaller-than-the-mesh extents, checked bit for bit against the single-rank twin.
#include <catch2/catch.hpp>

#include "support/on_ranks.hpp"
#include "support/oracle.hpp"
#include "dtensor/mesh/device_mesh.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

const std::vector<PlacementDesc> kChoices = {PlacementDesc::replicate(), PlacementDesc::shard(0),
                                             PlacementDesc::shard(1), PlacementDesc::partial(ReduceOp::sum),
                                             PlacementDesc::partial(ReduceOp::max)};
const std::vector<Shape<2>> kShapes = {{8, 12}, {13, 5}, {1, 3}, {5, 13}};

template <class Mesh, std::size_t N>
std::vector<std::string> all_pairs(const std::array<int, N>& shape, bool with_orders) {
  int n = 1;
  for (int s : shape) n *= s;
  return on_ranks(n, [&](CommPtr world, auto report) {
    Mesh mesh(world, shape);
    auto layouts = all_layouts<N>(kChoices);
    if (with_orders)  // nested shards split right to left as well
      for (std::size_t i = 0, e = layouts.size(); i < e; ++i)
        if (has_nested_shard(layouts[i])) layouts.push_back(reversed_order(layouts[i]));
    std::uint64_t seed = 1;
    for (const auto& from : layouts)
      for (const auto& to : layouts) {
        if (redistribution_error(from, to)) continue;
        for (const auto& g : kShapes) report(check_redistribution<float>(mesh, from, to, g, seed++));
      }
  });
}

}  // namespace

TEST_CASE("every layout pair on a 1-d mesh of 4", "[redistribute][oracle]") {
  auto f = all_pairs<DeviceMesh<"x">, 1>({4}, false);
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("every layout pair on a (2, 2) mesh, with shard orders", "[redistribute][oracle]") {
  auto f = all_pairs<DeviceMesh<"dp", "tp">, 2>({2, 2}, true);
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("every layout pair on a (4, 2) mesh, with shard orders", "[redistribute][oracle]") {
  auto f = all_pairs<DeviceMesh<"dp", "tp">, 2>({4, 2}, true);
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("every layout pair on a (2, 2, 2) mesh", "[redistribute][oracle][slow]") {
  auto f = all_pairs<DeviceMesh<"pp", "dp", "tp">, 3>({2, 2, 2}, false);
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("other element types move bit for bit", "[redistribute][oracle]") {
  auto f = on_ranks(4, [](CommPtr world, auto report) {
    DeviceMesh<"dp", "tp"> mesh(world, {2, 2});
    const LayoutDesc<2> a{{PlacementDesc::shard(0), PlacementDesc::shard(1)}, {0, 1}};
    const LayoutDesc<2> b{{PlacementDesc::shard(1), PlacementDesc::partial()}, {0, 1}};
    const LayoutDesc<2> r{{PlacementDesc::replicate(), PlacementDesc::shard(0)}, {0, 1}};
    for (const auto& [from, to] : {std::pair{a, r}, {r, a}, {a, b}, {b, r}}) {
      report(check_redistribution<double>(mesh, from, to, Shape<2>{7, 5}, 3));
      report(check_redistribution<std::int32_t>(mesh, from, to, Shape<2>{7, 5}, 4));
      report(check_redistribution<std::int64_t>(mesh, from, to, Shape<2>{3, 9}, 5));
      report(check_redistribution<bfloat16>(mesh, from, to, Shape<2>{6, 2}, 6));
    }
  });
  INFO(summary(f));
  CHECK(f.empty());
}
