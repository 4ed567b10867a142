// The DTensor API under MPI: the collectives each redistribution issues (CommLog, as in
// tests/unit/test_dtensor_api.cpp) and the faults of tests/unit/test_dtensor_faults.cpp that
// make sense across processes. Each fault must end in a dtensor::Error with a clear message on
// every rank that should see it, and must not hang. (A rank that throws mid-collective ends
// the job through mpi::run — mpi_abort_on_exception; a rank that never arrives makes the
// others time out — test_comm_mpi.) And parallel/sync/'s DiLoCo and FedAvg, the same cases as
// tests/unit/test_sync.cpp on threads (support/sync_cases.hpp). And redistribute_to between random
// pairs of meshes over the processes (support/cross_mesh_cases.hpp).
#include "dtensor/comm/mpi.hpp"
#include "dtensor/dtensor.hpp"
#include "mpi_check.hpp"
#include "mpi_meshes.hpp"
#include "support/commlog_cases.hpp"
#include "support/cross_mesh_cases.hpp"
#include "support/fault_cases.hpp"
#include "support/sync_cases.hpp"

using namespace dtensor;
using namespace dtensor::testing;

TEST_CASE("1-d mesh: each transition issues exactly its collective", "[mpi][redistribute][commlog]") {
  auto world = mpi::world();
  auto f = collect([&](auto& report) { check_1d_collectives(DeviceMesh<"tp">(world, {world->size()}), report); });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
}

TEST_CASE("2-d and 3-d meshes: swapping shards takes two collectives", "[mpi][redistribute][commlog]") {
  auto world = mpi::world();
  auto f = collect([&](auto& report) {
    for (const auto& s : mesh_shapes<2>(world->size())) check_2d_swap(DeviceMesh<"dp", "tp">(world, s), report);
    for (const auto& s : mesh_shapes<3>(world->size())) check_3d_swap(DeviceMesh<"pp", "dp", "tp">(world, s), report);
  });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
}

TEST_CASE("a mesh whose size is not the communicator's is an error on every rank", "[mpi][faults]") {
  auto world = mpi::world();
  const auto msg = error_of([&] { build_mismatched_mesh(world); });
  INFO(msg);
  DTENSOR_MPI_REQUIRE(mismatched_mesh_problem(msg, world->size()).empty());
}

TEST_CASE("from_local with a piece of the wrong extents", "[mpi][faults]") {
  auto world = mpi::world();
  for (bool all : {false, true}) {
    const auto msg = error_of([&] { from_local_bad_piece(world, all); });
    INFO((all ? "check_all_ranks: " : "local check: ") << msg);
    DTENSOR_MPI_REQUIRE(from_local_problem(msg, world->rank(), world->size(), all).empty());
  }
}

TEST_CASE("ranks issuing different collectives throw on every rank with the check on", "[mpi][faults]") {
  auto world = mpi::world();
  const auto msg = error_of([&] { mismatched_collectives(world); });
  INFO(msg);
  DTENSOR_MPI_REQUIRE(mismatched_collectives_problem(msg).empty());
}

TEST_CASE("DiLoCo and FedAvg over MPI match their one-rank oracles (the threads cases)", "[mpi][sync]") {
  auto world = mpi::world();
  auto f = collect([&](auto& report) {
    if (world->size() % 2 != 0) return;  // the cases want an even number of ranks
    sync_cases::diloco_case(world, false, report);
    sync_cases::fedavg_case(world, report);
  });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
}

TEST_CASE("redistribute_to: random pairs of meshes over the processes move data exactly with the least bytes",
          "[mpi][cross_mesh]") {
  auto world = mpi::world();
  auto f = collect([&](auto& report) { cross::check_cross_mesh_pairs(world, report, 3); });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
}
