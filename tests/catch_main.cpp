// The Catch2 main of the single-process test programs (the collective check on: test_defaults.hpp).
// Catch's implementation is catch_session.cpp's (dtensor_catch_session).
#include "support/catch_session.hpp"
#include "support/test_defaults.hpp"

int main(int argc, char** argv) {
  dtensor::testing::use_test_defaults();
  return dtensor::testing::run_catch(argc, argv);
}
