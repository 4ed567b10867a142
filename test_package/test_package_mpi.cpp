// test_package_mpi.cpp — links dtensor::mpi (with_mpi=True): MPI, Boost.MPI and DTENSOR_HAS_MPI reach
// the consumer through the system-dependency build module. Runs as an MPI singleton.
#include <cstdio>

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>

#include "dtensor/core/factories.hpp"

#ifndef DTENSOR_HAS_MPI
#error "dtensor::mpi did not define DTENSOR_HAS_MPI"
#endif

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  boost::mpi::communicator world;
  auto t = dtensor::ones<float>(dtensor::Shape<1>{4});
  const bool ok = world.size() >= 1 && t[3] == 1.0f;
  std::printf("dtensor mpi smoke test: rank %d of %d: %s\n", world.rank(), world.size(), ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
