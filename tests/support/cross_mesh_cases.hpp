// tests/support/cross_mesh_cases.hpp — redistribute_to between random pairs of meshes, checked
// against the full tensor and the plan's bytes; shared by the threads tests
// (tests/unit/test_dtensor_api.cpp) and the MPI tests (tests/mpi/test_dtensor_mpi.cpp).
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/distributed/cross_mesh.hpp"
#include "support/oracle.hpp"

namespace dtensor::testing {

namespace cross {
using M1 = DeviceMesh<"a">;
using M2 = DeviceMesh<"a", "b">;
using M3 = DeviceMesh<"a", "b", "c">;
using M4 = DeviceMesh<"a", "b", "c", "d">;

/// A random mesh of N dimensions (sizes 1..3, at most `world` ranks) over random ranks of the world, in random order.
template <std::size_t N>
MeshRanks<N> random_ranks(std::mt19937& rng, int world) {
  MeshRanks<N> m;
  int n = 1;
  for (auto& s : m.shape) n *= (s = 1 + int(rng() % 3));
  while (n > world) {
    auto& s = m.shape[rng() % N];
    if (s > 1) n = n / s * (s - 1), --s;
  }
  std::vector<int> all(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) all[std::size_t(r)] = r;
  std::shuffle(all.begin(), all.end(), rng);
  m.root_ranks.assign(all.begin(), all.begin() + n);
  return m;
}

// The bytes of the plan's agreement (cross_mesh.hpp): a 256-byte summary to the leader, a 520-byte verdict back.
template <std::size_t R>
std::pair<std::size_t, std::size_t> agreement_bytes(const CrossMeshPlan<R>& plan, int me) {
  const std::size_t n = plan.ranks.size();
  if (n < 2) return {0, 0};
  if (me == plan.ranks.front()) return {(n - 1) * sizeof(detail::CrossMeshVerdict), (n - 1) * sizeof(detail::CrossMeshSummary)};
  return {sizeof(detail::CrossMeshSummary), sizeof(detail::CrossMeshVerdict)};
}

/// `iters` random pairs of meshes (types SrcMesh, DstMesh) over the 8 ranks of `world`, global extents that
/// rarely divide: every destination rank's piece equals the full tensor's box bit for bit, and the bytes
/// each rank sends and receives (the CommLog) are the plan's, whose total is the minimum.
template <class SrcMesh, class SrcL, class DstMesh, class DstL, std::size_t R>
void check_cross_mesh(const CommPtr& world, const std::function<void(const std::string&)>& report, unsigned seed,
                      int iters, bool same_ranks = false) {
  for (int it = 0; it < iters; ++it) {
    std::mt19937 rng(seed * 1000u + unsigned(it));  // the same choices on every rank
    const auto src = random_ranks<SrcMesh::ndim>(rng, world->size());
    auto dst = random_ranks<DstMesh::ndim>(rng, world->size());
    if constexpr (SrcMesh::ndim == DstMesh::ndim)
      if (same_ranks && it % 2 == 0) dst = src;
    Shape<R> global;
    for (auto& e : global) e = Extent(1 + rng() % 11);
    const auto full = arange<float>(global);
    const auto sm = mesh_on_ranks<SrcMesh>(world, src.shape, src.root_ranks);
    const auto dm = mesh_on_ranks<DstMesh>(world, dst.shape, dst.root_ranks);
    const int me = world->rank();
    const std::string what = detail::cat("iteration ", it, ": ", to_string(global), " ", detail::describe_side(SrcL::desc, src),
                                         " -> ", detail::describe_side(DstL::desc, dst), ": ");
    CommLog log;
    std::optional<CrossMeshPlan<R>> plan;
    std::optional<DTensor<float, R, DstMesh, DstL>> y;
    try {
      if (sm) {
        DTensor<float, R, SrcMesh, SrcL> x(*sm, global, oracle_piece(full, SrcL::desc, sm->shape(), sm->coordinate()));
        if (dm) {
          auto p = redistribute_to_async<DstL>(x, *dm);
          plan = p.plan();
          y = p.take();
        } else {
          auto p = redistribute_to_async<DstL>(x, dst);
          plan = p.plan();
          p.wait();
        }
      } else if (dm) {
        auto p = redistribute_from_async<SrcL, DstL, float>(src, *dm, global);
        plan = p.plan();
        y = p.take();
      }
    } catch (const std::exception& e) {
      report(what + e.what());
      return;
    }
    if (!plan) {
      if (log.size() != 0) report(what + "a rank of neither mesh communicated: " + log.to_string());
      continue;
    }
    if (y && !equal(y->to_local(), oracle_piece(full, DstL::desc, dm->shape(), dm->coordinate())))
      report(what + "destination piece differs from the full tensor's box");
    if (plan->bytes() != plan->minimum_bytes())
      report(what + detail::cat("plan moves ", plan->bytes(), " B, the minimum is ", plan->minimum_bytes(), "\n", plan->to_string()));
    std::size_t sent = 0, received = 0;
    for (const auto& r : log.records()) {
      if (r.kind == CollectiveKind::send) sent += r.bytes;
      if (r.kind == CollectiveKind::recv) received += r.bytes;
    }
    const auto [agree_sent, agree_received] = agreement_bytes(*plan, me);
    if (sent != plan->sent_by(me) + agree_sent || received != plan->received_by(me) + agree_received)
      report(what + detail::cat("sent ", sent, " B and received ", received, " B; the plan says ", plan->sent_by(me), " + ",
                                agree_sent, " and ", plan->received_by(me), " + ", agree_received, "\n", log.to_string()));
  }
}
/// The pairs the tests run: 1-d to 4-d meshes, nested, reordered and replicated layouts, 2-d and 3-d tensors.
inline void check_cross_mesh_pairs(const CommPtr& world, const std::function<void(const std::string&)>& report, int iters) {
  check_cross_mesh<M2, Layout<Shard<0>, Replicate>, M1, Layout<Shard<1>>, 2>(world, report, 1, iters);
  check_cross_mesh<M1, Layout<Replicate>, M3, Layout<Shard<0>, Shard<1>, Shard<0>>, 2>(world, report, 2, iters);
  check_cross_mesh<M4, Layout<Shard<0>, Shard<1>, Replicate, Shard<0>>, M2, Layout<Shard<1>, Shard<1>>::ordered<1, 0>, 2>(
      world, report, 3, iters);
  check_cross_mesh<M3, Layout<Replicate, Shard<2>, Shard<0>>, M4, Layout<Shard<1>, Replicate, Shard<2>, Shard<0>>, 3>(
      world, report, 4, iters);
  check_cross_mesh<M2, Layout<Replicate, Replicate>, M2, Layout<Shard<0>, Shard<1>>, 2>(world, report, 5, iters, true);
}
}  // namespace cross

}  // namespace dtensor::testing
