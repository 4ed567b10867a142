// dtensor/comm/hosts.hpp — which host each rank of a communicator runs on.
//
//   std::vector<std::string> hosts = dtensor::host_names(*world);   // collective: hosts[r] = rank r's
//
// A job across machines is fast only where its busiest groups stay inside a host; to say which
// do (mesh/hosts.hpp) the ranks first exchange their host names. The name is gethostname(),
// which is what MPI_Get_processor_name returns for OpenMPI and MPICH; on the threads backend
// every rank has the same one. Names are cut to host_name_bytes - 1 characters.
#pragma once

#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dtensor/comm/communicator.hpp"

namespace dtensor {

inline constexpr std::size_t host_name_bytes = 64;  // per rank in the exchange (a fixed size: MPI needs equal counts)

/// This process's host name ("?" if the system will not say).
inline std::string this_host() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) return "?";
  return std::string(name.data(), strnlen(name.data(), name.size()));
}

/// Every rank's host name, by rank in `comm`. Collective over `comm` (one all-gather of
/// host_name_bytes per rank).
inline std::vector<std::string> host_names(Communicator& comm) {
  std::array<char, host_name_bytes> mine{};
  const std::string me = this_host();
  std::memcpy(mine.data(), me.data(), std::min(me.size(), host_name_bytes - 1));
  std::vector<std::array<char, host_name_bytes>> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(mine.data()), mine.size()),
                  std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(all.data()), all.size() * host_name_bytes));
  std::vector<std::string> names;
  names.reserve(all.size());
  for (const auto& a : all) names.emplace_back(a.data(), strnlen(a.data(), a.size()));
  return names;
}

}  // namespace dtensor
