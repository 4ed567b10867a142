// tests/support/catch_session.hpp — the test programs' mains run Catch2 through these two
// functions, defined with Catch's implementation in tests/catch_session.cpp (compiled once, in
// the dtensor_catch_session library, instead of once per main).
#pragma once

namespace dtensor::testing {

/// Catch::Session().run(argc, argv): the test cases the command line selects.
int run_catch(int argc, char** argv);

/// The command line with one more argument, the test spec `spec` (e.g. "[nogpu]"), applied and
/// run: the command line's error code, or the number of failed test cases (0: all passed).
int run_catch_selecting(int argc, char** argv, const char* spec);

}  // namespace dtensor::testing
