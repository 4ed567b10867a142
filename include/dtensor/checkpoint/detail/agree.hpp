// dtensor/checkpoint/detail/agree.hpp — every rank learns whether any rank failed.
//
//   std::string error;
//   try { write_my_pieces(); } catch (const std::exception& e) { error = e.what(); }
//   agree(mesh.comm(), "checkpoint::save", error);   // throws on every rank if any rank failed
//
// Saving and loading are mostly local file work; a rank that fails must not leave the others
// waiting in the next collective, nor let them commit a checkpoint it did not finish. Each
// stage therefore ends with one all-gather of a fixed-size message per rank (512 bytes; longer
// messages are cut), and all ranks throw the same Error, naming every rank that failed.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/error.hpp"

namespace dtensor::checkpoint::detail {

inline constexpr std::size_t agree_message_bytes = 512;

inline void agree(Communicator& comm, const char* op, const std::string& local_error) {
  std::vector<std::uint8_t> mine(agree_message_bytes, 0), all(agree_message_bytes * std::size_t(comm.size()));
  std::copy_n(local_error.begin(), std::min(local_error.size(), agree_message_bytes - 1), mine.begin());
  comm.all_gather(std::span<const std::uint8_t>(mine), std::span<std::uint8_t>(all));
  std::string report;
  for (int r = 0; r < comm.size(); ++r) {
    const char* text = reinterpret_cast<const char*>(all.data() + std::size_t(r) * agree_message_bytes);
    if (text[0] != 0) report += dtensor::detail::cat(report.empty() ? "" : "; ", "rank ", r, ": ", text);
  }
  if (!report.empty()) throw Error(op, report, comm.rank());
}

using dtensor::detail::error_of;

}  // namespace dtensor::checkpoint::detail
