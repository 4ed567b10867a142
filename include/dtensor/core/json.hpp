// dtensor/core/json.hpp — what the JSON writers (trace/chrome_trace.hpp, sim/chrome_trace.hpp) share.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace dtensor::detail {

/// `text` as a JSON string, quotes included (quotes, backslashes and control characters escaped).
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace dtensor::detail
