// Exhaustive oracle tests of redistribution on the threads backend: every pair of layouts
// from {R, S(0), S(1), P(sum), P(max)} on meshes (4), (2,2), (4,2), (2,2,2), with even,
// uneven and smaller-than-the-mesh extents, checked bit for bit against the single-rank twin.
// The suites live in support/redistribute_cases.hpp; tests/mpi runs them under MPI.
#include <catch2/catch.hpp>

#include "dtensor/mesh/device_mesh.hpp"
#include "support/on_ranks.hpp"
#include "support/redistribute_cases.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_redistribute_oracle {

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

TEST_CASE("an all-to-all sends strided blocks of the input when its chunks are even", "[redistribute][oracle]") {
  // The pairs above check the data on both paths; this checks which path each shape takes.
  // Shard(0) -> Shard(1) of a [2, 12] piece to 4 ranks: rank j's part is columns 3j..3j+2.
  const Tensor<float, 2> even(Shape<2>{2, 12});
  std::vector<Box<2>> parts;
  for (Extent j = 0; j < 4; ++j) parts.push_back({{4, 3 * j}, {2, 3}});
  const auto strided = detail::strided_send_blocks(parts, Box<2>{{4, 0}, {2, 12}}, Shape<2>{2, 3}, even);
  REQUIRE(strided.has_value());
  CHECK((strided->rows == 2 && strided->run == 3 && strided->row_stride == 12 && strided->block_stride == 3));
  // Uneven chunks of 13 columns (4, 4, 4, 1) travel padded: packed.
  const Tensor<float, 2> uneven(Shape<2>{2, 13});
  std::vector<Box<2>> uneven_parts;
  for (Extent j = 0; j < 4; ++j) uneven_parts.push_back({{0, 4 * j}, {2, j < 3 ? 4 : 1}});
  CHECK_FALSE(detail::strided_send_blocks(uneven_parts, Box<2>{{0, 0}, {2, 13}}, Shape<2>{2, 4}, uneven));
  // Shard(1) -> Shard(0): the parts are row blocks, back to back already: no description needed.
  const Tensor<float, 2> rows(Shape<2>{8, 3});
  std::vector<Box<2>> row_parts;
  for (Extent j = 0; j < 4; ++j) row_parts.push_back({{2 * j, 3}, {2, 3}});
  CHECK_FALSE(detail::strided_send_blocks(row_parts, Box<2>{{0, 3}, {8, 3}}, Shape<2>{2, 3}, rows));
}

}  // namespace test_redistribute_oracle
