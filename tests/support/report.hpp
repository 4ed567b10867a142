// tests/support/report.hpp — failures collected as text, asserted once.
//
//   Failures f;                      // a check calls f("what failed"); "" means it passed
//   check_all_pairs(mesh, false, f);
//   INFO(summary(f.list));
//   CHECK(f.empty());
//
// The check suites (support/*_cases.hpp) report instead of asserting, because a rank must not
// stop half-way through a suite while its peers wait for it in a collective: on the threads
// backend the test thread asserts after the ranks are joined (on_ranks.hpp), under MPI the
// ranks agree on the verdict first (tests/mpi/mpi_check.hpp).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dtensor::testing {

/// A report callable that keeps every non-empty message.
struct Failures {
  std::vector<std::string> list;
  void operator()(const std::string& msg) {
    if (!msg.empty()) list.push_back(msg);
  }
  bool empty() const noexcept { return list.empty(); }
};

/// The first few failures, for a Catch2 INFO.
inline std::string summary(const std::vector<std::string>& f, std::size_t most = 5) {
  std::string s = std::to_string(f.size()) + " failure(s)";
  for (std::size_t i = 0; i < f.size() && i < most; ++i) s += "\n" + f[i];
  return s;
}

}  // namespace dtensor::testing
