// tests/support/commlog_cases.hpp — which collectives each redistribution issues (CommLog),
// checked the same way on every backend. Each check runs on every rank of its mesh and calls
// report(message) for what differs from the plan DESIGN.md §4 prescribes, or from the oracle.
#pragma once

#include <string>
#include <vector>

#include "dtensor/dtensor.hpp"
#include "support/oracle.hpp"

namespace dtensor::testing {

/// The collectives and messages a redistribution issues on this rank.
template <class To, class X>
std::vector<CommRecord> log_of(const X& x) {
  CommLog log;
  auto y = redistribute<To>(x);
  (void)y;
  return log.records();
}

/// "all_gather(tp) all_reduce(dp*tp) ": kinds and groups, in order.
inline std::string kinds(const std::vector<CommRecord>& r) {
  std::string s;
  for (const auto& c : r) s += std::string(name_of(c.kind)) + "(" + c.group + ") ";
  return s;
}

/// On a 1-d mesh each transition issues exactly its collective (or none), with the right values.
template <class Mesh, class Report>
void check_1d_collectives(const Mesh& mesh, Report&& report) {
  static_assert(Mesh::ndim == 1);
  const std::string dim(Mesh::names[0]);
  const auto one = [&](const char* kind) { return std::string(kind) + "(" + dim + ") "; };
  const auto full = randint<float>(Shape<2>{13, 5}, 11, -8, 9);
  auto s0 = distribute_replicated<Layout<Shard<0>>>(mesh, full);
  auto p = from_local<Layout<Partial<>>>(mesh, full, full.shape());
  auto r = distribute_replicated<Layout<Replicate>>(mesh, full);
  auto expect = [&](const std::vector<CommRecord>& got, const std::string& want, const char* what) {
    if (kinds(got) != want) report(std::string(what) + ": got " + kinds(got) + ", want " + want);
  };
  expect(log_of<Layout<Replicate>>(s0), one("all_gather"), "S(0)->R");
  expect(log_of<Layout<Replicate>>(p), one("all_reduce"), "P->R");
  expect(log_of<Layout<Shard<0>>>(p), one("reduce_scatter"), "P->S(0)");
  expect(log_of<Layout<Shard<1>>>(p), one("reduce_scatter"), "P->S(1)");
  expect(log_of<Layout<Shard<1>>>(r), "", "R->S(1)");
  expect(log_of<Layout<Partial<>>>(r), "", "R->P");
  expect(log_of<Layout<Partial<>>>(s0), "", "S(0)->P");
  expect(log_of<Layout<Shard<1>>>(s0), one("all_to_all"), "S(0)->S(1)");
  expect(log_of<Layout<Shard<0>>>(s0), "", "S(0)->S(0)");
  if (!equal(full_tensor(redistribute<Layout<Shard<1>>>(s0)), full)) report("S(0)->S(1) values");
  if (!equal(full_tensor(redistribute<Layout<Shard<0>>>(p)), times(full, mesh.size()))) report("P->S(0) values");
}

/// On a 2-d mesh (S0,S1) -> (S1,S0) takes two collectives, and Partials on both dimensions
/// reduce in one all-reduce over the flattened group.
template <class Mesh, class Report>
void check_2d_swap(const Mesh& m2, Report&& report) {
  static_assert(Mesh::ndim == 2);
  const auto full = randint<float>(Shape<2>{13, 6}, 5, -8, 9);
  using To = Layout<Shard<1>, Shard<0>>;
  auto x = distribute_replicated<Layout<Shard<0>, Shard<1>>>(m2, full);
  auto log = log_of<To>(x);
  if (log.size() != 2) report("(S0,S1)->(S1,S0) issued " + kinds(log));
  if (!equal(redistribute<To>(x).to_local(), oracle_piece(full, To::desc, m2.shape(), m2.coordinate())))
    report("(S0,S1)->(S1,S0) piece");

  auto pp = from_local<Layout<Partial<>, Partial<>>>(m2, full, full.shape());
  auto logp = log_of<Layout<Replicate, Replicate>>(pp);
  const std::string flat = "all_reduce(" + std::string(Mesh::names[0]) + "*" + std::string(Mesh::names[1]) + ") ";
  if (kinds(logp) != flat) report("(P,P)->(R,R) issued " + kinds(logp) + ", want " + flat);
  if (!equal(full_tensor(pp), times(full, m2.size()))) report("(P,P) full tensor");
}

/// On a 3-d mesh (S0,S1,S2) -> (S2,S1,S0) takes two collectives.
template <class Mesh, class Report>
void check_3d_swap(const Mesh& m3, Report&& report) {
  static_assert(Mesh::ndim == 3);
  const auto cube = randint<float>(Shape<3>{5, 4, 3}, 6, -8, 9);
  using To = Layout<Shard<2>, Shard<1>, Shard<0>>;
  auto y = distribute_replicated<Layout<Shard<0>, Shard<1>, Shard<2>>>(m3, cube);
  auto log = log_of<To>(y);
  if (log.size() != 2) report("(S0,S1,S2)->(S2,S1,S0) issued " + kinds(log));
  if (!equal(redistribute<To>(y).to_local(), oracle_piece(cube, To::desc, m3.shape(), m3.coordinate())))
    report("(S0,S1,S2)->(S2,S1,S0) piece");
}

}  // namespace dtensor::testing
