// Not a Catch2 program: rank 1 throws while every other rank waits for it in an all-reduce with
// a 10-minute timeout. dtensor::mpi::run must print rank 1's error and MPI_Abort the job, so
// the run ends at once instead of hanging (CTest checks the message; its TIMEOUT, the hang).
#include <chrono>
#include <span>
#include <stdexcept>
#include <vector>

#include "dtensor/comm/mpi.hpp"

int main(int argc, char** argv) {
  return dtensor::mpi::run(argc, argv, [](dtensor::CommPtr world) {
    world->set_timeout(std::chrono::minutes(10));
    std::vector<float> x(16, 1.0f);
    if (world->rank() == 1) throw std::runtime_error("rank 1 gives up before the all_reduce");
    world->all_reduce(std::span<float>(x), dtensor::ReduceOp::sum);
  });
}
