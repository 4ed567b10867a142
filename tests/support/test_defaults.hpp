// tests/support/test_defaults.hpp — the communicator defaults every test program runs with.
#pragma once

#include <cstdlib>

#include "dtensor/comm/config.hpp"

namespace dtensor::testing {

/// The collective check (fingerprints before each collective and redistribution) is on in the
/// test suite, in every build type, so that a desync is an Error, not a wrong number; set
/// DTENSOR_CHECK_COLLECTIVES=0 to run without it.
inline void use_test_defaults() {
  if (!std::getenv("DTENSOR_CHECK_COLLECTIVES")) comm_defaults().check_collectives = true;
}

}  // namespace dtensor::testing
