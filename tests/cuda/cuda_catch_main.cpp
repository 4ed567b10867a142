// The Catch2 main of the single-process CUDA tests: the [nogpu] cases always run; the others
// only when a device is visible, else the program reports a skip (cuda_skip.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_args.hpp"
#include "support/test_defaults.hpp"
#include <vector>

#include "cuda_skip.hpp"

int main(int argc, char** argv) {
  if (dtensor::testing::only_lists(argc, argv)) return Catch::Session().run(argc, argv);
  dtensor::testing::use_test_defaults();
  if (dtensor::testing::visible_devices() > 0) return Catch::Session().run(argc, argv);
  // No GPU: only the [nogpu] cases (an empty selection is not a failure).
  std::vector<char*> args(argv, argv + argc);
  char tag[] = "[nogpu]";
  args.push_back(tag);
  Catch::Session session;
  session.configData().noThrow = false;
  if (const int rc = session.applyCommandLine(int(args.size()), args.data()); rc != 0) return rc;
  const int failed = session.run();
  if (failed != 0) return failed;
  return dtensor::testing::skipped(argv[0]);
}
