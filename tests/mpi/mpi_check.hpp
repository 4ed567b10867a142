// tests/mpi/mpi_check.hpp — checks that all ranks agree on, for the MPI tests.
//
//   DTENSOR_MPI_REQUIRE(out == expected);     // every rank passes or every rank fails
//   auto msg = dtensor::testing::error_of([&] { world->all_gather(s, bad); });
//   DTENSOR_MPI_REQUIRE(contains(msg, "all_gather"));
//   auto f = dtensor::testing::collect([&](auto& report) { check_all_pairs(mesh, true, report); });
//   DTENSOR_MPI_REQUIRE_NO_FAILURES(f);       // a suite of support/*_cases.hpp, agreed on
//
// A plain REQUIRE that fails on one rank ends that rank's test case while the others go on to
// the next collective and wait for it forever. Here each rank evaluates its condition (an
// exception counts as false), the ranks exchange their verdicts, and every rank then passes or
// fails together; a failing rank prints what failed on it to stderr. The exchange uses a private
// duplicate of MPI_COMM_WORLD, so it never mixes with the traffic under test or shows up in a
// CommLog, and it waits with dtensor's timeout: a peer that never arrives aborts the job.
#pragma once

#include <catch2/catch.hpp>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/comm/mpi.hpp"
#include "support/report.hpp"

namespace dtensor::testing {

struct Verdict {
  bool all_passed = true;
  std::string failed_on;  // "world ranks 1 3" when some failed
};

inline MPI_Comm verdict_comm() {
  static MPI_Comm c = [] {
    MPI_Comm d;
    MPI_Comm_dup(MPI_COMM_WORLD, &d);
    return d;
  }();
  return c;
}

/// Every rank's `ok`, exchanged: all ranks get the same Verdict.
inline Verdict agree(bool ok) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int mine = ok ? 1 : 0;
  std::vector<int> all(static_cast<std::size_t>(n));
  MPI_Request req;
  MPI_Iallgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, verdict_comm(), &req);
  bool done = false;
  mpi::detail::poll(req, MPI_STATUS_IGNORE, comm_defaults().timeout, done);
  if (!done) {
    std::fprintf(stderr, "mpi_check: ranks did not all reach the same check; aborting\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  Verdict v;
  for (int r = 0; r < n; ++r)
    if (!all[std::size_t(r)]) {
      v.all_passed = false;
      v.failed_on += (v.failed_on.empty() ? "failed on world ranks " : " ") + std::to_string(r);
    }
  return v;
}

/// Evaluates cond() on this rank (an exception is a failure), reports a local failure, agrees.
template <class F>
Verdict check_on_all_ranks(F&& cond, const char* expr, const char* file, int line) {
  bool ok = false;
  std::string why;
  try {
    ok = static_cast<bool>(cond());
  } catch (const std::exception& e) {
    why = std::string(" (threw: ") + e.what() + ")";
  } catch (...) {
    why = " (threw a non-standard exception)";
  }
  if (!ok) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    std::fprintf(stderr, "%s:%d: rank %d: FAILED %s%s\n", file, line, r, expr, why.c_str());
  }
  return agree(ok);
}

using dtensor::detail::error_of;  // the message of the exception fn() throws, or ""

/// Runs suite(report) on this rank and returns what it reported, each line prefixed with the
/// rank; an exception ends the suite on this rank and is reported too. (Its peers then fail
/// in their next collective after the communicators' timeout, DTENSOR_TIMEOUT_MS, and report
/// that in turn: a failure never hangs the job.)
template <class F>
Failures collect(F&& suite) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  const std::string prefix = "rank " + std::to_string(r) + ": ";
  Failures f;
  auto report = [&](const std::string& msg) {
    if (!msg.empty()) f.list.push_back(prefix + msg);
  };
  try {
    suite(report);
  } catch (const std::exception& e) {
    f.list.push_back(prefix + "threw: " + e.what());
  }
  return f;
}

inline bool contains(std::string_view text, std::initializer_list<std::string_view> parts) {
  for (auto p : parts)
    if (text.find(p) == std::string_view::npos) return false;
  return true;
}
inline bool contains(std::string_view text, std::string_view part) { return contains(text, {part}); }

}  // namespace dtensor::testing

#define DTENSOR_MPI_CHECK_IMPL_(macro, ...)                                                                        \
  do {                                                                                                             \
    const ::dtensor::testing::Verdict dtensor_verdict_ = ::dtensor::testing::check_on_all_ranks(                  \
        [&]() -> bool { return static_cast<bool>(__VA_ARGS__); }, #__VA_ARGS__, __FILE__, __LINE__);               \
    INFO(#__VA_ARGS__ << ": " << dtensor_verdict_.failed_on);                                                      \
    macro(dtensor_verdict_.all_passed);                                                                            \
  } while (0)

/// REQUIRE that holds on every rank; all ranks fail together (and end the test case together).
#define DTENSOR_MPI_REQUIRE(...) DTENSOR_MPI_CHECK_IMPL_(REQUIRE, __VA_ARGS__)
/// CHECK that holds on every rank; all ranks record the failure and go on together.
#define DTENSOR_MPI_CHECK(...) DTENSOR_MPI_CHECK_IMPL_(CHECK, __VA_ARGS__)

/// REQUIRE that a Failures collection is empty on every rank; each rank shows its own failures.
#define DTENSOR_MPI_REQUIRE_NO_FAILURES(failures)                                                                  \
  do {                                                                                                             \
    INFO(::dtensor::testing::summary((failures).list));                                                            \
    DTENSOR_MPI_REQUIRE((failures).empty());                                                                       \
  } while (0)
