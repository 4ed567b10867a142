// tests/packaging/smoke.cpp — the program every packaging consumer builds and runs with only
// the core and the threads backend (the standard library and pthreads, nothing else): 4 ranks,
// each a thread of this process, run the distributed check of smoke_check.hpp.
#include <cstdio>
#include <exception>

#include "dtensor/comm/threads.hpp"
#include "smoke_check.hpp"

int main() {
  int bad = 0;
  try {
    dtensor::threads::run(4, [&](dtensor::CommPtr world) {
      const int b = dtensor_smoke::check(world, "threads");
      if (world->rank() == 0) bad = b;  // every rank has the same verdict
    });
  } catch (const std::exception& e) {
    std::printf("dtensor smoke (threads): %s\n", e.what());
    return 1;
  }
  return bad == 0 ? 0 : 1;
}
