// The exhaustive redistribution suite of tests/unit/test_redistribute_oracle.cpp under MPI:
// every pair of layouts from {R, S(0), S(1), P(sum), P(max)}, on even, uneven and
// smaller-than-the-mesh extents, bit for bit against the single-rank oracle, on the meshes the
// job's size allows (mpi_meshes.hpp): 4 ranks (4), (2,2); 8 ranks (8), (2,4), (4,2), (2,2,2)
// (on 3-d meshes a seventh of the cases by default: DTENSOR_ORACLE_STRIDE=1 for all).
// DTENSOR_ORACLE_STRIDE=k also thins the 1-d and 2-d suites to every k-th case (all of them by
// default): the multihost CTest runs them over TCP across namespaces, where each collective
// costs a round trip through the kernel (tests/multihost/CMakeLists.txt).
// The suites are support/redistribute_cases.hpp's, shared with the threads tests.
#include "dtensor/comm/mpi.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "mpi_check.hpp"
#include "mpi_meshes.hpp"
#include "support/redistribute_cases.hpp"

using namespace dtensor;
using namespace dtensor::testing;

TEST_CASE("every layout pair on the 1-d mesh of all ranks", "[mpi][redistribute][oracle]") {
  auto world = mpi::world();
  const std::uint64_t stride = oracle_stride(1);
  auto f = collect([&](auto& report) {
    check_all_pairs(DeviceMesh<"x">(world, {world->size()}), false, report, stride);
  });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
}

TEST_CASE("every layout pair on 2-d meshes, with shard orders", "[mpi][redistribute][oracle]") {
  auto world = mpi::world();
  const std::uint64_t stride = oracle_stride(1);
  for (const auto& shape : mesh_shapes<2>(world->size())) {
    INFO("mesh " << to_string(shape) << ", every " << stride << "th case");
    auto f = collect([&](auto& report) {
      check_all_pairs(DeviceMesh<"dp", "tp">(world, shape), true, report, stride);
    });
    DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
  }
}

TEST_CASE("every layout pair on 3-d meshes", "[mpi][redistribute][oracle]") {
  // 125 x 125 layout pairs x 4 extents: all of them take eight oversubscribed processes on two
  // cores about 90 s, so by default every 7th case runs (7 is prime to the 4 extents, so the
  // chosen cases cycle through all of them); DTENSOR_ORACLE_STRIDE=1 runs them all.
  auto world = mpi::world();
  const std::uint64_t stride = oracle_stride(7);
  for (const auto& shape : mesh_shapes<3>(world->size())) {
    INFO("mesh " << to_string(shape) << ", every " << stride << "th case");
    auto f = collect([&](auto& report) {
      check_all_pairs(DeviceMesh<"pp", "dp", "tp">(world, shape), false, report, stride);
    });
    DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
  }
}

TEST_CASE("other element types move bit for bit", "[mpi][redistribute][oracle]") {
  auto world = mpi::world();
  for (const auto& shape : mesh_shapes<2>(world->size())) {
    INFO("mesh " << to_string(shape));
    auto f = collect([&](auto& report) { check_other_element_types(DeviceMesh<"dp", "tp">(world, shape), report); });
    DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
  }
}
