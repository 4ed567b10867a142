// Not a Catch2 program: ranks that leave mpi::run at different times, all in step, must not
// be mistaken for departed ranks (mpi/departed_rank.cpp is the fault). Ranks 0 and 3 return
// at once after a world all-reduce and a split; ranks 1 and 2 go on, for longer than the
// point-to-point grace, in a group the departed ranks are not in and with messages between
// themselves. Every rank checks its results; the job must end with status 0.
#include <chrono>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dtensor/comm/mpi.hpp"

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  return dtensor::mpi::run(argc, argv, [](dtensor::CommPtr world) {
    world->set_timeout(std::chrono::minutes(1));
    const int n = world->size();
    std::vector<double> x(8, 1.0);
    world->all_reduce(std::span<double>(x), dtensor::ReduceOp::sum);
    if (x[0] != n) throw std::runtime_error("wrong world sum");
    const bool stays = world->rank() == 1 || world->rank() == 2;
    dtensor::CommPtr pair = world->split(stays ? 0 : 1, world->rank());
    if (!stays) return;
    if (world->rank() == 2) std::this_thread::sleep_for(1500ms);  // beyond the 1 s grace
    std::vector<double> y(4, double(world->rank()));
    pair->all_reduce(std::span<double>(y), dtensor::ReduceOp::sum);
    if (y[0] != 3.0) throw std::runtime_error("wrong pair sum");
    std::vector<int> m(3, world->rank());
    if (pair->rank() == 0) {
      pair->recv(std::span<int>(m), 1);
      if (m[0] != 2) throw std::runtime_error("wrong message");
    } else {
      std::this_thread::sleep_for(1500ms);
      pair->send(std::span<const int>(m), 0);
    }
    std::printf("rank %d: in step\n", world->rank());
  });
}
