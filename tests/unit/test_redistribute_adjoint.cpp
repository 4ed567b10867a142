// The adjoint of every redistribution step: <A x, y> == <x, A* y>, summed over ranks, and
// redistribute_backward's layouts, on the threads backend. The checks live in
// support/adjoint_cases.hpp; tests/mpi runs them under MPI.
#include <catch2/catch.hpp>

#include "dtensor/dtensor.hpp"
#include "support/adjoint_cases.hpp"
#include "support/on_ranks.hpp"

// This file's own namespace: the unit test programs compile several files as one unit
// (tests/CMakeLists.txt, DTENSOR_TEST_GROUPS), and their file-local names must not meet.
namespace test_redistribute_adjoint {

using namespace dtensor;
using namespace dtensor::testing;

TEMPLATE_LIST_TEST_CASE("adjoint of each step kind on a 1-d mesh", "[redistribute][adjoint]", AdjointStepKinds) {
  using From = typename TestType::first_type;
  using To = typename TestType::second_type;
  for (int n : {2, 3, 4}) {
    auto f = on_ranks(n, [&](CommPtr world, auto report) { check_adjoint<From, To>(DeviceMesh<"x">(world, {n}), report); });
    INFO(summary(f));
    CHECK(f.empty());
  }
}

TEST_CASE("adjoint of composite plans on 2-d and 3-d meshes", "[redistribute][adjoint]") {
  auto f = on_ranks(8, [](CommPtr world, auto report) {
    check_adjoint_composites_2d(DeviceMesh<"dp", "tp">(world, {2, 4}), report);
    check_adjoint_composite_3d(DeviceMesh<"pp", "dp", "tp">(world, {2, 2, 2}), report);
  });
  INFO(summary(f));
  CHECK(f.empty());
}

TEST_CASE("redistribute_backward returns the gradient to the input's layout", "[redistribute][backward]") {
  auto f = on_ranks(4, [](CommPtr world, auto report) { check_backward_layouts(DeviceMesh<"tp">(world, {4}), report); });
  INFO(summary(f));
  CHECK(f.empty());
}

}  // namespace test_redistribute_adjoint
