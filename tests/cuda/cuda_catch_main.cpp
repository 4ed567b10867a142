// The Catch2 main of the single-process CUDA tests: the [nogpu] cases always run; the others
// only when a device is visible, else the program reports a skip (cuda_skip.hpp).
// Catch's implementation is tests/catch_session.cpp's (dtensor_catch_session).
#include "support/catch_args.hpp"
#include "support/catch_session.hpp"
#include "support/test_defaults.hpp"

#include "cuda_skip.hpp"

int main(int argc, char** argv) {
  if (dtensor::testing::only_lists(argc, argv)) return dtensor::testing::run_catch(argc, argv);
  dtensor::testing::use_test_defaults();
  if (dtensor::testing::visible_devices() > 0) return dtensor::testing::run_catch(argc, argv);
  // No GPU: only the [nogpu] cases (an empty selection is not a failure).
  if (const int failed = dtensor::testing::run_catch_selecting(argc, argv, "[nogpu]"); failed != 0) return failed;
  return dtensor::testing::skipped(argv[0]);
}
