// The Catch2 main of the single-process test programs (the collective check on: test_defaults.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/test_defaults.hpp"

int main(int argc, char** argv) {
  dtensor::testing::use_test_defaults();
  return Catch::Session().run(argc, argv);
}
