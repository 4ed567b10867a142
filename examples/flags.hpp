// examples/flags.hpp — command-line flags parsed strictly into the type they are used as.
//
//   o.steps = flag_value<int>("--steps", "2147483648", 1);   // UsageError: out of range
//   o.lr = positive_flag_value("--lr", "3e-3");
//
// "--steps 4294967298" must not train 2 steps (a long narrowed to int) nor "--steps 12x" 12:
// every integer flag is one whole decimal number within [lo, hi] of its own type, else a
// UsageError that names the flag and quotes the value.
#pragma once

#include <concepts>
#include <limits>
#include <stdexcept>
#include <string>

#include "dtensor/core/parse.hpp"

namespace examples {

/// A bad command line: the program prints it with its usage and exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The value of integer flag `flag` in type T, within [lo, hi].
template <std::integral T>
T flag_value(const std::string& flag, const std::string& text, T lo, T hi = std::numeric_limits<T>::max()) {
  const auto v = dtensor::parse_integer<T>(text);
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v) {
    // Digits that do not fit T are out of range; anything else is not a whole number.
    const std::size_t digits = text.find_first_not_of("+-") == 1 ? 1 : 0;
    const bool all_digits = text.size() > digits && text.find_first_not_of("0123456789", digits) == std::string::npos;
    if (all_digits) throw UsageError(flag + " " + text + " is out of range " + range);
    throw UsageError(flag + " expects a whole number, got '" + text + "'");
  }
  if (*v < lo || *v > hi) throw UsageError(flag + " " + text + " is out of range " + range);
  return *v;
}

/// The value of a flag that must be a finite number > 0.
inline double positive_flag_value(const std::string& flag, const std::string& text) {
  const auto v = dtensor::parse_number(text);
  if (!v || !(*v > 0)) throw UsageError(flag + " expects a positive number, got '" + text + "'");
  return *v;
}

}  // namespace examples
