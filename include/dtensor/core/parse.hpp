// dtensor/core/parse.hpp — strict parsing of numbers from text (environment variables, flags).
//
//   parse_integer<int>("42")            // 42
//   parse_integer<int>("4294967298")    // nullopt: out of range, never wrapped
//   parse_integer<int>("3e5"), ("12 "), ("abc"), ("")   // nullopt: not a whole decimal integer
//   parse_number("3e-3")                // 0.003; nullopt for "1.5x", "nan", ""
//
// atoi/atoll/stol accept trailing junk ("3e5" reads as 3) or wrap on overflow; these accept
// exactly one number spelled in full, in the range of the type it is used as.
#pragma once

#include <charconv>
#include <cmath>
#include <concepts>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace dtensor {

/// The value of `text` if it is one decimal integer (an optional leading '+' or '-', then
/// digits, nothing else) that fits in T; nullopt otherwise.
template <std::integral T>
std::optional<T> parse_integer(std::string_view text) {
  if (text.starts_with('+')) text.remove_prefix(1);
  if (text.empty() || text.front() == '+') return std::nullopt;
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

/// The value of `text` if it is one finite decimal number in full ("3e-3", "0.5", "2");
/// nullopt for anything else (trailing characters, "nan", "inf", out of double's range).
inline std::optional<double> parse_number(std::string_view text) {
  if (text.starts_with('+')) text.remove_prefix(1);
  if (text.empty() || text.front() == '+') return std::nullopt;
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace dtensor
