// test_package.cpp — the Conan package's smoke test: a small distributed program on the threads
// backend (4 ranks, each a thread, all-reduce a vector and check the sum), plus the core.
#include <atomic>
#include <cstdio>
#include <span>
#include <vector>

#include "dtensor/comm/threads.hpp"
#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"

int main() {
  auto a = dtensor::arange<float>(dtensor::Shape<2>{2, 3});
  auto b = dtensor::arange<float>(dtensor::Shape<2>{2, 3});
  bool ok = dtensor::equal(a, b) && a(1, 2) == 5.0f;

  constexpr int n = 4;
  std::atomic<int> bad{0};
  dtensor::threads::run(n, [&](dtensor::CommPtr world) {
    std::vector<float> v(16, float(world->rank() + 1));
    world->all_reduce(std::span<float>(v), dtensor::ReduceOp::sum);
    for (float x : v)
      if (x != float(n * (n + 1) / 2)) ++bad;
  });
  ok = ok && bad == 0;
  std::printf("dtensor test_package: 4-rank all_reduce on the threads backend: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
