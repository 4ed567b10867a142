// dtensor/comm/failed_ranks.hpp — every rank learns which ranks failed a local check, so that
// all of them throw together and none goes on alone into a collective its peers never join.
//
//   const std::string ranks = detail::failed_ranks(comm, !error.empty());   // "" or "0, 2"
//   if (!ranks.empty()) throw Error(op, error + "; failed on rank(s) " + ranks, comm->rank());
//
// One all-reduce of one int per rank over the communicator (collective: every rank calls it);
// a null communicator is this rank alone.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "dtensor/comm/communicator.hpp"

namespace dtensor::detail {

/// The ranks (of `comm`) whose `failed` was true, comma-separated; "" when none.
inline std::string failed_ranks(Communicator* comm, bool failed) {
  std::vector<int> flags(comm ? std::size_t(comm->size()) : 1, 0);
  flags[std::size_t(comm ? comm->rank() : 0)] = failed ? 1 : 0;
  if (comm) comm->all_reduce(std::span<int>(flags), ReduceOp::sum);
  std::string ranks;
  for (std::size_t r = 0; r < flags.size(); ++r)
    if (flags[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return ranks;
}

}  // namespace dtensor::detail
