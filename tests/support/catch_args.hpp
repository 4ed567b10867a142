// tests/support/catch_args.hpp — what the custom Catch2 mains need to know about their arguments.
#pragma once

#include <string_view>

namespace dtensor::testing {

/// Whether the arguments only ask Catch2 to list tests or print help (what CTest discovery and
/// scripts/mpi-test.sh do): such a run needs no MPI and no GPU, and must not be skipped.
inline bool only_lists(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--list") || a == "-l" || a == "-t" || a == "-h" || a == "--help" || a == "-?") return true;
  }
  return false;
}

}  // namespace dtensor::testing
