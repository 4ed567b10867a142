// Randomized property test: thousands of random (mesh of 1-3 dimensions, tensor of rank 1-3,
// extents including 0, uneven and smaller than the mesh, layouts with any placements and
// shard orders) cases, each checked bit for bit against the single-rank oracle. Seeded and
// reproducible: a failure prints its case; DTENSOR_RANDOM_CASES sets the count per mesh (250).
// The generator lives in support/redistribute_cases.hpp; tests/mpi runs it under MPI.
#include <catch2/catch.hpp>

#include "dtensor/mesh/device_mesh.hpp"
#include "support/on_ranks.hpp"
#include "support/redistribute_cases.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_redistribute_random {

using namespace dtensor;
using namespace dtensor::testing;

namespace {

template <class Mesh, std::size_t N>
std::vector<std::string> run_random(const std::array<int, N>& shape, std::uint64_t seed) {
  int n = 1;
  for (int s : shape) n *= s;
  return on_ranks(n, [&](CommPtr world, auto report) { check_random(Mesh(world, shape), seed, random_cases(250), report); });
}

}  // namespace

TEST_CASE("random redistributions match the oracle", "[redistribute][random]") {
  std::vector<std::string> f;
  auto add = [&](std::vector<std::string> more) { f.insert(f.end(), more.begin(), more.end()); };
  std::uint64_t seed = 2026;
  for (int n : {1, 2, 3, 4, 5, 8}) add(run_random<DeviceMesh<"x">, 1>({n}, seed++));
  for (auto s : {std::array{2, 2}, std::array{3, 2}, std::array{2, 4}, std::array{4, 2}, std::array{1, 3}})
    add(run_random<DeviceMesh<"a", "b">, 2>(s, seed++));
  for (auto s : {std::array{2, 2, 2}, std::array{1, 2, 3}, std::array{2, 1, 2}, std::array{3, 1, 2}})
    add(run_random<DeviceMesh<"a", "b", "c">, 3>(s, seed++));
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace test_redistribute_random
