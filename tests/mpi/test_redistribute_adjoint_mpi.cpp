// The adjoint checks of tests/unit/test_redistribute_adjoint.cpp under MPI: <A x, y> ==
// <x, A* y> summed over ranks for each step kind on the 1-d mesh of all ranks, for composite
// plans on the 2-d and 3-d meshes the job's size allows, and redistribute_backward's layouts.
// The checks are support/adjoint_cases.hpp's, shared with the threads tests.
#include "dtensor/comm/mpi.hpp"
#include "dtensor/dtensor.hpp"
#include "mpi_check.hpp"
#include "mpi_meshes.hpp"
#include "support/adjoint_cases.hpp"

using namespace dtensor;
using namespace dtensor::testing;

TEMPLATE_LIST_TEST_CASE("adjoint of each step kind on a 1-d mesh", "[mpi][redistribute][adjoint]", AdjointStepKinds) {
  using From = typename TestType::first_type;
  using To = typename TestType::second_type;
  auto world = mpi::world();
  auto f = collect([&](auto& report) { check_adjoint<From, To>(DeviceMesh<"x">(world, {world->size()}), report); });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
}

TEST_CASE("adjoint of composite plans on 2-d and 3-d meshes", "[mpi][redistribute][adjoint]") {
  auto world = mpi::world();
  auto f = collect([&](auto& report) {
    for (const auto& s : mesh_shapes<2>(world->size())) check_adjoint_composites_2d(DeviceMesh<"dp", "tp">(world, s), report);
    for (const auto& s : mesh_shapes<3>(world->size()))
      check_adjoint_composite_3d(DeviceMesh<"pp", "dp", "tp">(world, s), report);
  });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
}

TEST_CASE("redistribute_backward returns the gradient to the input's layout", "[mpi][redistribute][backward]") {
  auto world = mpi::world();
  auto f = collect([&](auto& report) { check_backward_layouts(DeviceMesh<"tp">(world, {world->size()}), report); });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
}
