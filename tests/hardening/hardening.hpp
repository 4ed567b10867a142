// tests/hardening/hardening.hpp — what the hardening cases share: each rank's outcome (the
// exception's type and message), and a stopwatch for the bound on the time to failure.
//
//   auto out = outcomes(4, [](CommPtr w) { ... });      // one Outcome per rank
//   CHECK(out[0].is_error);                              // a dtensor::Error, not another type
//   CHECK_THAT(out[0].message, Catch::Contains("rank 2"));
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/comm/threads.hpp"

namespace dtensor::hardening {

/// How one rank (or one call) ended.
struct Outcome {
  bool threw = false;     // any exception
  bool is_error = false;  // a dtensor::Error
  std::string message;
};

inline Outcome outcome_of(const std::exception_ptr& e) {
  Outcome o;
  if (!e) return o;
  o.threw = true;
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    o.is_error = true;
    o.message = x.what();
  } catch (const std::exception& x) {
    o.message = x.what();
  } catch (...) {
    o.message = "unknown exception";
  }
  return o;
}

/// How `fn` ended when called once on this thread.
template <class F>
Outcome outcome_of_call(F&& fn) {
  try {
    std::forward<F>(fn)();
  } catch (...) {
    return outcome_of(std::current_exception());
  }
  return {};
}

/// threads::run_collect, each rank's exception turned into an Outcome.
template <class F>
std::vector<Outcome> outcomes(int n, F&& fn) {
  std::vector<Outcome> out;
  for (auto& e : threads::run_collect(n, std::forward<F>(fn))) out.push_back(outcome_of(e));
  return out;
}

/// Time since construction, for asserting that a fault ends well before its timeout.
class Stopwatch {
 public:
  std::chrono::milliseconds elapsed() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_);
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// A timeout far longer than any test: a case that ends sooner was released by detection.
inline constexpr std::chrono::milliseconds long_timeout{60'000};
/// What "at once" means for a detected fault, with room for a loaded machine.
inline constexpr std::chrono::milliseconds prompt{5'000};

}  // namespace dtensor::hardening
