// The Catch2 main of the MPI test programs: every rank runs every test case, in the same order.
// Listing tests (--list-tests, --list-test-names-only, ...) and --help need no MPI, so that
// scripts/mpi-test.sh can list a program's tests without mpirun.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <string_view>

#include "dtensor/comm/mpi.hpp"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--list") || a == "-l" || a == "-t" || a == "-h" || a == "--help" || a == "-?")
      return Catch::Session().run(argc, argv);
  }
  dtensor::mpi::Environment env(argc, argv);
  return Catch::Session().run(argc, argv);
}
