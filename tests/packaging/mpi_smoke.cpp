// tests/packaging/mpi_smoke.cpp — the consumer program of the mpi component: it links
// dtensor::mpi (MPI, Boost.MPI and DTENSOR_HAS_MPI come from the target's usage requirements)
// and runs the distributed check of smoke_check.hpp on the MPI backend, one rank per process:
//   mpirun -n 4 ./smoke_mpi
#include "dtensor/comm/mpi.hpp"
#include "smoke_check.hpp"

#ifndef DTENSOR_HAS_MPI
#error "dtensor::mpi did not define DTENSOR_HAS_MPI"
#endif

int main(int argc, char** argv) {
  // An exception on any rank prints it and MPI_Aborts the job (dtensor::mpi::run).
  return dtensor::mpi::run(argc, argv, [](dtensor::CommPtr world) { return dtensor_smoke::check(world, "mpi") == 0 ? 0 : 1; });
}
