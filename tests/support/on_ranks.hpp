// tests/support/on_ranks.hpp — run a check on n ranks of the threads backend and collect what
// each rank reports, so the test thread (not a rank) makes the Catch2 assertions.
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/comm/threads.hpp"
#include "support/report.hpp"

namespace dtensor::testing {

/// threads::run; tests/cuda passes cuda_threads::run's equivalent instead.
struct ThreadsRunner {
  template <class F>
  void operator()(int n, F&& fn) const { threads::run(n, std::forward<F>(fn)); }
};

/// fn(world, report) runs on every rank; report(msg) records a failure. Returns all failures.
template <class F, class Runner = ThreadsRunner>
std::vector<std::string> on_ranks(int n, F&& fn, Runner run = {}) {
  std::mutex m;
  std::vector<std::string> failures;
  run(n, [&](CommPtr world) {
    auto report = [&](const std::string& msg) {
      if (msg.empty()) return;
      std::lock_guard lock(m);
      failures.push_back("rank " + std::to_string(world->rank()) + ": " + msg);
    };
    fn(world, report);
  });
  return failures;
}

}  // namespace dtensor::testing
