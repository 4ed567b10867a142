// tests/support/fault_cases.hpp — bad input at the DTensor level, for every backend: each
// scenario runs on every rank of `world`, and each *_problem(message, ...) says what is wrong
// with the message that rank got ("" when it is the Error the scenario must produce).
//
//   std::string msg = error_of([&] { mismatched_collectives(world); });   // on each rank
//   report(mismatched_collectives_problem(msg));
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <string_view>

#include "dtensor/dtensor.hpp"

namespace dtensor::testing {

/// "" when `msg` contains every part, else what is missing.
inline std::string expect_parts(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts)
    if (msg.find(p) == std::string::npos) return "message \"" + msg + "\" lacks \"" + p + "\"";
  return {};
}

/// A (2, n/2 + 1) mesh, never the size n of the communicator: every rank throws.
inline std::array<int, 2> mismatched_mesh_shape(int n) { return {2, n / 2 + 1}; }
inline void build_mismatched_mesh(const CommPtr& world) {
  (void)DeviceMesh<"dp", "tp">(world, mismatched_mesh_shape(world->size()));
}
inline std::string mismatched_mesh_problem(const std::string& msg, int n) {
  const auto s = mismatched_mesh_shape(n);
  return expect_parts(msg, {"DeviceMesh", detail::cat(to_string(s), " has ", s[0] * s[1], " ranks"),
                            detail::cat("communicator has ", n)});
}

/// A Shard<0> tensor of 4n - 3 rows (chunks of 4, the last of 1) where rank 2 passes 5 rows.
/// Checked locally, only rank 2 throws; with check_all_ranks every rank does, naming rank 2.
inline Shape<2> bad_piece_global(int n) { return {Extent(4 * n - 3), 3}; }
inline void from_local_bad_piece(const CommPtr& world, bool check_all_ranks) {
  DeviceMesh<"tp"> mesh(world, {world->size()});
  const int r = world->rank(), n = world->size();
  const Extent rows = r == 2 ? 5 : (r == n - 1 ? 1 : 4);
  (void)from_local<Layout<Shard<0>>>(mesh, zeros<float>(Shape<2>{rows, 3}), bad_piece_global(n), check_all_ranks);
}
inline std::string from_local_problem(const std::string& msg, int rank, int n, bool check_all_ranks) {
  const std::string global = to_string(bad_piece_global(n));
  if (check_all_ranks) return expect_parts(msg, {"from_local", "rank 2: global " + global + ", piece [5, 3]"});
  // A rank with a good piece returns normally, unless (threads backend) rank 2's failure
  // aborted the run while it was still leaving the mesh's last split: then its Error names rank 2.
  if (rank != 2) return msg.empty() || msg.find("rank 2") != std::string::npos ? "" : "good piece threw: " + msg;
  return expect_parts(msg, {"local piece [5, 3]", "[4, 3]", global});
}

/// With the check switch on, rank 1 asks for S0 -> S1 (an all_to_all) while the others ask
/// for S0 -> R (an all_gather): every rank throws before any data moves, listing what each
/// asked for (the redistribution's fingerprint, distributed/agreement.hpp).
inline void mismatched_collectives(const CommPtr& world) {
  DeviceMesh<"tp"> mesh(world, {world->size()});
  mesh.comm().set_check_collectives(true);
  mesh.group(0).set_check_collectives(true);
  auto x = distribute_replicated<Layout<Shard<0>>>(mesh, arange<float>(Shape<2>{8, 4}));
  if (world->rank() == 1)
    (void)redistribute<Layout<Shard<1>>>(x);
  else
    (void)redistribute<Layout<Replicate>>(x);
}
inline std::string mismatched_collectives_problem(const std::string& msg) {
  return expect_parts(msg, {"redistribute[tp]", "ranks disagree", "rank 1: float32 [8, 4] on mesh [", "(S(0)) -> (S(1))",
                            "rank 0: float32 [8, 4] on mesh [", "(S(0)) -> (R)"});
}

}  // namespace dtensor::testing
