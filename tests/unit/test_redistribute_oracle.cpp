// Exhaustive oracle tests of redistribution on the threads backend: every pair of layouts
// from {R, S(0), S(1), P(sum), P(max)} on meshes (4), (2,2), (4,2), (2,2,2), with even,
// uneven and smaller-than-the-mesh extents, checked bit for bit against the single-rank twin.
// The suites live in support/redistribute_cases.hpp; tests/mpi runs them under MPI.
#include <catch2/catch.hpp>

#include "dtensor/mesh/device_mesh.hpp"
#include "support/on_ranks.hpp"
#include "support/redistribute_cases.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

template <class Mesh, std::size_t N>
std::vector<std::string> all_pairs(const std::array<int, N>& shape, bool with_orders) {
  int n = 1;
  for (int s : shape) n *= s;
  return on_ranks(n, [&](CommPtr world, auto report) { check_all_pairs(Mesh(world, shape), with_orders, report); });
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
    check_other_element_types(DeviceMesh<"dp", "tp">(world, {2, 2}), report);
  });
  INFO(summary(f));
  CHECK(f.empty());
}
