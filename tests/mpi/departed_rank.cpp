// Not a Catch2 program: rank 2 returns from the function given to mpi::run after the first
// all-reduce, while every other rank waits for it in a second one with the default timeout
// (5 minutes). Its departure notice must release them at once: they fail with an Error naming
// world rank 2 and the collective it never called, and mpi::run aborts the job. CTest checks
// the message, and its TIMEOUT (100 s, far below the 300 s timeout) that it came promptly.
#include <span>
#include <vector>

#include "dtensor/comm/mpi.hpp"

int main(int argc, char** argv) {
  return dtensor::mpi::run(argc, argv, [](dtensor::CommPtr world) {
    world->set_timeout(std::chrono::minutes(5));
    std::vector<float> x(16, 1.0f);
    world->all_reduce(std::span<float>(x), dtensor::ReduceOp::sum);
    if (world->rank() == 2) return;  // leaves, as a rank given a smaller --steps would
    world->all_reduce(std::span<float>(x), dtensor::ReduceOp::sum);
  });
}
