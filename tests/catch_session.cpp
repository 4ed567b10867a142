// Catch2's implementation (CATCH_CONFIG_RUNNER), compiled once for every test program's main:
// catch_main.cpp (the unit, parity and hardening programs), mpi/mpi_catch_main.cpp and
// cuda/{cuda,nccl}_catch_main.cpp each compiled it themselves, most of each main's compile time
// (about 8 s of CPU at -O0; CI's time, docs/benchmarks.md). No dtensor header: what a main sets
// up (test_defaults.hpp, MPI) stays in the main, and this object holds Catch's code only.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "support/catch_session.hpp"

namespace dtensor::testing {

int run_catch(int argc, char** argv) { return Catch::Session().run(argc, argv); }

int run_catch_selecting(int argc, char** argv, const char* spec) {
  std::vector<char*> args(argv, argv + argc);
  std::string extra(spec);
  args.push_back(extra.data());
  Catch::Session session;
  session.configData().noThrow = false;
  if (const int rc = session.applyCommandLine(int(args.size()), args.data()); rc != 0) return rc;
  return session.run();
}

}  // namespace dtensor::testing
