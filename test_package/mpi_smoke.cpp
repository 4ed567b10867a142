// tests/packaging/mpi_smoke.cpp — the consumer program of the mpi component: it links
// dtensor::mpi (MPI, Boost.MPI and DTENSOR_HAS_MPI come from the target's usage requirements)
// and runs the distributed check of smoke_check.hpp on the MPI backend, one rank per process:
//   DTENSOR_SMOKE_RANKS=4 mpirun -n 4 ./smoke_mpi
// DTENSOR_SMOKE_RANKS, when set, is the number of ranks the job must have: an mpirun of another
// MPI than the one linked starts n singletons, each of which would pass the check on its own.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtensor/comm/mpi.hpp"
#include "smoke_check.hpp"

#ifndef DTENSOR_HAS_MPI
#error "dtensor::mpi did not define DTENSOR_HAS_MPI"
#endif

int main(int argc, char** argv) {
  // An exception on any rank prints it and MPI_Aborts the job (dtensor::mpi::run).
  return dtensor::mpi::run(argc, argv, [](dtensor::CommPtr world) {
    if (const char* want = std::getenv("DTENSOR_SMOKE_RANKS"); want && std::stoi(want) != world->size()) {
      std::printf("dtensor smoke (mpi): rank %d: the job has %d ranks, expected %s (is mpirun from the MPI "
                  "this program links?)\n", world->rank(), world->size(), want);
      return 1;
    }
    return dtensor_smoke::check(world, "mpi") == 0 ? 0 : 1;
  });
}
