// dtensor/distributed/agreement.hpp — the desync check of a redistribution.
//
//   check_redistribution_agreement<To>(x);   // first thing redistribute<To>(x) does
//
// A redistribution is collective over the mesh, and its collectives are sized by what each
// rank believes: its layouts and the global extents. Ranks that disagree (one holds Shard<0>,
// another Shard<1>; or different extents with the same byte count) issue collectives of equal
// size that silently mix unrelated elements. With the communicator's check switch on
// (Communicator::check_collectives: on in debug builds and in the test suite), every rank of
// the mesh compares a fingerprint of (element type, global extents, mesh shape, source layout,
// target layout; numbers, Fingerprint::of_redistribution) first, and all of them throw, one line per rank, if any differs.
//
// Agreement before data (on in every build): the same fingerprint travels with each collective
// the redistribution issues, compared by the ranks of that collective's group before any data
// moves (RedistributionAgreement, Communicator::agrees_before_data).
//
// Only a redistribution that communicates is checked: one that needs no collective stays free
// of communication (a rank may call it alone). A rank that skips such a check while the others
// make it is still caught, by the fingerprint of whatever collective it issues next.
#pragma once

#include <string>

#include "dtensor/core/dtype.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/distributed/plan.hpp"

namespace dtensor {

/// "float32 [4, 4] on mesh [2, 2]: (S(0), R) -> (R, R)" — what ranks must agree about.
template <LayoutType From, LayoutType To, Element T, std::size_t R, std::size_t N>
std::string describe_redistribution(const Shape<R>& global, const std::array<int, N>& mesh_shape) {
  return detail::cat(name_of(dtype_of<T>), " ", to_string(global), " on mesh ", to_string(mesh_shape), ": ",
                     to_string(From::desc), " -> ", to_string(To::desc));
}

/// What a redistribution agrees on, alive for as long as the redistribution issues collectives:
/// with agreement before data on (Communicator::agrees_before_data, every build), its
/// fingerprint travels with each of those collectives (detail::call_context) and the ranks of
/// each collective's group compare it before any data moves.
class RedistributionAgreement {
 public:
  RedistributionAgreement() = default;
  explicit RedistributionAgreement(const detail::Fingerprint& f) : fingerprint_(f), scope_(&fingerprint_) {}
  RedistributionAgreement(const RedistributionAgreement&) = delete;
  RedistributionAgreement& operator=(const RedistributionAgreement&) = delete;

 private:
  detail::Fingerprint fingerprint_{};
  detail::CallContextScope scope_{detail::call_context};  // default: leaves the context as it is
};

/// For a redistribution that communicates: with the check switch of x's mesh on, throws on
/// every rank unless all ranks of the mesh redistribute the same tensor (element type, global
/// extents) between the same layouts (the always-on check folds the same fingerprint); with
/// agreement before data on, returns the scope in which the redistribution's collectives carry
/// it. Keep the result alive while the redistribution issues its collectives.
template <LayoutType To, Element T, std::size_t R, class Mesh, class From, class Space>
[[nodiscard]] RedistributionAgreement check_redistribution_agreement(const DTensor<T, R, Mesh, From, Space>& x) {
  if constexpr (layout_plan<From, To>.collectives() > 0) {
    Communicator& comm = x.mesh().comm();
    if (!comm.checks_agreement() && !comm.agrees_before_data()) return {};
    // Numbers, not describe_redistribution's text: formatting it on every redistribution was
    // most of the always-on check's own cost (docs/errors.md); it is formatted on a mismatch.
    const auto f = detail::Fingerprint::of_redistribution(dtype_of<T>, x.shape(), x.mesh().shape(), From::desc,
                                                          To::desc);
    if (comm.checks_agreement()) comm.check_agreement("redistribute", f);
    if (comm.agrees_before_data()) return RedistributionAgreement(f);
  }
  return {};
}

}  // namespace dtensor
