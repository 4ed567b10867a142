// dtensor/comm/config.hpp — the process-wide defaults of new communicators, and the
// environment variables that set them.
//
//   DTENSOR_TIMEOUT_MS=30000       every wait fails after 30 s (default 300000: five minutes)
//   DTENSOR_CHECK_COLLECTIVES=1    ranks compare fingerprints before each collective and each
//                                  redistribution (default: on in debug builds, off with NDEBUG)
//   DTENSOR_AGREE_BEFORE_DATA=0    no agreement before data: ranks no longer compare what each
//                                  asked of a collective before its data moves (default 1, every build)
//
// Values are parsed strictly: "3e5", "30s", "abc", "-1" or "" are errors that quote the value,
// never a silent 3 or 0. The variables are read once, when the first communicator is made.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"
#include "dtensor/core/parse.hpp"

namespace dtensor {

/// The longest timeout accepted: a year. Longer ones are almost certainly a unit mistake, and a
/// deadline computed from them could overflow the clock.
inline constexpr std::chrono::milliseconds max_timeout{365LL * 24 * 3600 * 1000};

namespace detail {

/// `timeout` if it is a valid timeout (1 ms .. max_timeout); else an Error naming `where` and
/// quoting the value.
inline std::chrono::milliseconds checked_timeout(std::chrono::milliseconds timeout, std::string_view where) {
  if (timeout.count() < 1 || timeout > max_timeout)
    throw Error(std::string(where), cat("timeout ", timeout.count(), " ms is out of range: it must be at least 1 ms ",
                                        "and at most ", max_timeout.count(), " ms (a year)"));
  return timeout;
}

/// DTENSOR_TIMEOUT_MS, or `fallback` when unset.
inline std::chrono::milliseconds timeout_from_env(std::chrono::milliseconds fallback) {
  const char* text = std::getenv("DTENSOR_TIMEOUT_MS");
  if (!text) return fallback;
  const auto ms = parse_integer<std::int64_t>(text);
  if (!ms)
    throw Error("DTENSOR_TIMEOUT_MS", cat("'", text, "' is not a whole number of milliseconds (write 300000, not ",
                                          "3e5 or 300s)"));
  return checked_timeout(std::chrono::milliseconds(*ms), cat("DTENSOR_TIMEOUT_MS='", text, "'"));
}

/// DTENSOR_CHECK_COLLECTIVES (0 or 1), or `fallback` when unset.
inline bool check_from_env(bool fallback) {
  const char* text = std::getenv("DTENSOR_CHECK_COLLECTIVES");
  if (!text) return fallback;
  const std::string_view v = text;
  if (v == "1") return true;
  if (v == "0") return false;
  throw Error("DTENSOR_CHECK_COLLECTIVES", cat("'", v, "' is neither 0 nor 1"));
}

/// DTENSOR_VERIFY_EVERY (0 .. 16: the always-on check's period, 0 off), or `fallback` when unset.
inline int verify_every_from_env(int fallback) {
  const char* text = std::getenv("DTENSOR_VERIFY_EVERY");
  if (!text) return fallback;
  const auto n = parse_integer<int>(text);
  if (!n || *n < 0 || *n > 16)
    throw Error("DTENSOR_VERIFY_EVERY", cat("'", text, "' is not a whole number of calls in 0 .. 16 (0: off)"));
  return *n;
}

/// DTENSOR_AGREE_BEFORE_DATA (0 or 1), or `fallback` when unset.
inline bool agree_from_env(bool fallback) {
  const char* text = std::getenv("DTENSOR_AGREE_BEFORE_DATA");
  if (!text) return fallback;
  const std::string_view v = text;
  if (v == "1") return true;
  if (v == "0") return false;
  throw Error("DTENSOR_AGREE_BEFORE_DATA", cat("'", v, "' is neither 0 nor 1"));
}

#ifdef NDEBUG
inline constexpr bool debug_build = false;
#else
inline constexpr bool debug_build = true;
#endif

}  // namespace detail

/// Process-wide defaults that new communicators start with (set them before making any).
struct CommDefaults {
  std::chrono::milliseconds timeout = detail::timeout_from_env(std::chrono::milliseconds(300'000));
  bool check_collectives = detail::check_from_env(detail::debug_build);
  /// The always-on check (Communicator::set_verify_every): compare every this many collectives
  /// (1 .. 16), 0 for never. On in every build type.
  int verify_every = detail::verify_every_from_env(16);
  /// Agreement before data (Communicator::set_agree_before_data): ranks compare what each asked
  /// of a collective before its data moves. On in every build type.
  bool agree_before_data = detail::agree_from_env(true);
};
inline CommDefaults& comm_defaults() {
  static CommDefaults defaults;
  return defaults;
}

}  // namespace dtensor
