// The Catch2 main of the MPI test programs: every rank runs every test case, in the same order.
// Listing tests (--list-tests, --list-test-names-only, ...) and --help need no MPI, so that
// scripts/mpi-test.sh can list a program's tests without mpirun. The collective check is on
// (support/test_defaults.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_args.hpp"
#include "support/test_defaults.hpp"

#include "dtensor/comm/mpi.hpp"

int main(int argc, char** argv) {
  if (dtensor::testing::only_lists(argc, argv)) return Catch::Session().run(argc, argv);
  dtensor::mpi::Environment env(argc, argv);
  dtensor::testing::use_test_defaults();
  return Catch::Session().run(argc, argv);
}
