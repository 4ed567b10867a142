// The Catch2 main of the MPI test programs: every rank runs every test case, in the same order.
// Listing tests (--list-tests, --list-test-names-only, ...) and --help need no MPI, so that
// scripts/mpi-test.sh can list a program's tests without mpirun. The collective check is on
// (support/test_defaults.hpp). Catch's implementation is tests/catch_session.cpp's
// (dtensor_catch_session).
#include "support/catch_args.hpp"
#include "support/catch_session.hpp"
#include "support/test_defaults.hpp"

#include <cstdio>

#include "dtensor/comm/env_agreement.hpp"
#include "dtensor/comm/mpi.hpp"

int main(int argc, char** argv) {
  if (dtensor::testing::only_lists(argc, argv)) return dtensor::testing::run_catch(argc, argv);
  dtensor::mpi::Environment env(argc, argv);
  dtensor::testing::use_test_defaults();
  // As dtensor::mpi::run does: ranks on other hosts get DTENSOR_TIMEOUT_MS only if mpirun
  // forwards it (-x); a rank running with another timeout is reported before any test.
  try {
    dtensor::require_same_environment(*dtensor::mpi::world(), "mpi test main (start-up)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return dtensor::testing::run_catch(argc, argv);
}
