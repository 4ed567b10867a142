// dtensor/trace/text_file.hpp — writing a whole text file (a trace, a plot), or a clear error.
//
//   trace::detail::write_text_file("trace.json", json, "trace::write_chrome_trace");
#pragma once

#include <fstream>
#include <string>

#include "dtensor/core/error.hpp"

namespace dtensor::trace::detail {

/// Replaces `path` with `text`; throws a dtensor::Error naming `op` and the path if it cannot.
inline void write_text_file(const std::string& path, const std::string& text, const char* op) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw Error(op, "cannot open '" + path + "' for writing");
  file << text;
  file.close();
  if (!file) throw Error(op, "writing '" + path + "' failed");
}

}  // namespace dtensor::trace::detail

namespace dtensor::trace {
/// Writes a text file whole or throws an Error naming `op` and the path (programs' trace files too).
using detail::write_text_file;
}  // namespace dtensor::trace
