// dtensor/nn/cross_mesh_params.hpp — every parameter of a model to a model of the same architecture on another mesh, in memory.
//
//   // the trainer's ranks 0..7 hold `trained` on (dp 2, tp 4); a server's ranks {0, 1} hold `served` on (dp 1, tp 2):
//   nn::redistribute_parameters(trained, train_mesh.ranks(), served, serve_ranks);
//
// Each parameter of `src` goes to the parameter of the same name of `dst` with redistribute_to's
// plan (distributed/cross_mesh.hpp: the fewest bytes, uneven shards, replicas taking turns), all of
// them in flight at once, after ONE agreement for the whole model (2 (n - 1) small messages over
// the n ranks of either mesh): the element types, extents, layouts and ranks of every parameter,
// and the names that pair them. A name in one model and not the other, extents or element types
// that differ, are an error on every rank before any data moves.
//
// Every rank of either mesh calls it. A rank holds the real model of each side it is on; for a side
// it is not on, it passes a twin of that model: the same architecture on a mesh over a sim
// communicator (comm/sim.hpp) of that mesh's size, in meta memory (MetaMesh: no data) or in host
// memory (the model's own type: no new code to compile), which says the parameters' names,
// extents and layouts and is neither read nor written. `src_ranks` / `dst_ranks` are the root ranks of the two meshes (mesh.ranks() where the
// rank has the mesh); every parameter of a side lives on that one mesh. The communicator is the
// real model's mesh's root. Parameters taken over by fully_shard are not current: unshard first.
//
// A model split into pipeline stages, each on its own mesh, moves one stage at a time into a
// whole model: with DstParameters::keep_unnamed, the destination's parameters that the source does
// not name are left as they are (another stage's), and the same calls, in the same stage order on
// every rank, fill all of them (examples/train_gpt.hpp's --serve-mesh with --pp > 1). A model
// over two meshes (MoE: the experts on an (edp, ep, tp) mesh beside the dense weights' mesh) moves
// in one call per mesh: with OtherMeshes::skip, the parameters on meshes of another number of
// dimensions than the ranks given are left to the other call.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/core/meta_space.hpp"
#include "dtensor/distributed/cross_mesh.hpp"
#include "dtensor/nn/module.hpp"

namespace dtensor::nn {

namespace detail {
struct PendingMove {
  virtual ~PendingMove() = default;
  virtual void wait() = 0;
};
/// A parameter of a twin: on a meta mesh, or on a mesh over the sim backend (no peers).
template <class P>
bool is_twin(const P& p) {
  if constexpr (!holds_data_v<typename P::space>) return true;
  else return p.mesh().root().backend() == "sim";
}
template <Element T, std::size_t R, MemorySpace Space>
struct PendingMoveOf final : PendingMove {
  dtensor::detail::CrossMeshExchange<T, R, Space> ex;
  void wait() override { ex.wait(); }
};
}  // namespace detail

/// What a whole-model move sent: parameters, links and bytes over all of them (this rank's view of
/// the plans, the same on every rank).
struct ModelMoveTotals {
  std::size_t parameters = 0, links = 0, bytes = 0, minimum_bytes = 0, local_bytes = 0;
};

/// Whether every parameter of the destination must be named by the source (`all`: a whole model to
/// a whole model), or those it does not name are left as they are (`keep_unnamed`: one pipeline
/// stage into a whole model).
enum class DstParameters { all, keep_unnamed };

/// Whether a parameter on a mesh of another number of dimensions than the ranks given is an error
/// (`error`) or left to another call (`skip`: MoE experts on their own mesh).
enum class OtherMeshes { error, skip };

/// Copies every parameter of `src` (on the mesh of root ranks `src_ranks`) into the parameter of
/// the same name of `dst` (on `dst_ranks`), each in dst's layout. See the top of this file.
template <class SrcModel, class DstModel, std::size_t NS, std::size_t ND>
ModelMoveTotals redistribute_parameters(SrcModel& src, const MeshRanks<NS>& src_ranks, DstModel& dst,
                                        const MeshRanks<ND>& dst_ranks, int tag = 0,
                                        DstParameters which = DstParameters::all,
                                        OtherMeshes others = OtherMeshes::error) {
  // Whether a parameter is one this call moves (with `skip`, those on meshes of the ranks' dimensions).
  auto taken = [others](const auto& p, std::size_t n) {
    return others == OtherMeshes::error || std::remove_cvref_t<decltype(p)>::mesh_ndim == n;
  };
  // Which sides this rank is on: the model that is not a twin, and its root communicator.
  Communicator* root = nullptr;
  Communicator* dst_root = nullptr;
  bool in_src = false, in_dst = false;
  for_each_parameter(src, [&](auto& p) {
    if (p.defined() && taken(p, NS) && !in_src && !detail::is_twin(p)) root = &p.mesh().root(), in_src = true;
  });
  for_each_parameter(dst, [&](auto& q) {
    if (q.defined() && taken(q, ND) && !in_dst && !detail::is_twin(q)) dst_root = &q.mesh().root(), in_dst = true;
  });
  if (!root) root = dst_root;
  if (!root)
    throw Error("redistribute_parameters", "both models are meta twins: this rank is on neither mesh, and calls nothing");
  const int me = root->rank();
  const auto ranks = dtensor::detail::ranks_of_either(src_ranks, dst_ranks);
  dtensor::detail::check_in_either(me, ranks, "source ranks " + to_string(src_ranks.shape) + ", destination ranks " +
                                                  to_string(dst_ranks.shape));
  std::string error;
  if (in_src != dtensor::detail::lists(src_ranks, me))
    error = dtensor::detail::cat("root rank ", me, in_src ? " holds a real source model but is not" : " holds a twin of the source model but is",
                                 " in the source ranks");
  else if (in_src && in_dst && root != dst_root)
    error = "the source and destination models' meshes are on different root communicators";
  else if (in_dst != dtensor::detail::lists(dst_ranks, me))
    error = dtensor::detail::cat("root rank ", me, in_dst ? " holds a real destination model but is not" : " holds a twin of the destination model but is",
                                 " in the destination ranks");

  // Pair the parameters by name and plan each move; start them after the agreement.
  ModelMoveTotals totals;
  std::uint64_t fingerprint = 14695981039346656037ull;
  std::string first_what;
  std::vector<std::function<std::unique_ptr<detail::PendingMove>()>> starts;
  std::size_t dst_count = 0;
  for_each_parameter(dst, [&](auto& q) { dst_count += q.defined() && taken(q, ND) ? 1 : 0; });
  for_each_parameter(src, [&](auto& p) {
    if (!p.defined() || !taken(p, NS) || !error.empty()) return;
    bool found = false;
    for_each_parameter(dst, [&](auto& q) {
      if (!q.defined() || !taken(q, ND) || found || q.name() != p.name() || !error.empty()) return;
      found = true;
      using P = std::remove_cvref_t<decltype(p)>;
      using Q = std::remove_cvref_t<decltype(q)>;
      using T = typename P::element_type;
      using PV = typename P::value_type;
      using QV = typename Q::value_type;
      constexpr std::size_t R = PV::rank;
      if constexpr (!std::is_same_v<T, typename Q::element_type> || R != QV::rank || P::mesh_ndim != NS ||
                    Q::mesh_ndim != ND ||
                    (holds_data_v<typename P::space> && holds_data_v<typename Q::space> &&
                     !std::is_same_v<typename P::space, typename Q::space>)) {
        error = dtensor::detail::cat(p.name(), ": element types, tensor ranks, mesh ranks or memory spaces differ between the models");
      } else {
        if (p.value().shape() != q.value().shape()) {
          error = dtensor::detail::cat(p.name(), ": extents ", to_string(p.value().shape()), " in the source model, ",
                                       to_string(q.value().shape()), " in the destination");
          return;
        }
        auto m = dtensor::detail::prepare_cross_mesh<T>(P::layout::desc, src_ranks, Q::layout::desc, dst_ranks,
                                                        p.value().shape());
        if (!m.error.empty()) {
          error = p.name() + ": " + m.error;
          return;
        }
        fingerprint = dtensor::detail::fnv(fingerprint, std::int64_t(m.fingerprint));
        for (char ch : p.name()) fingerprint = dtensor::detail::fnv(fingerprint, ch);
        if (first_what.empty()) first_what = m.what;
        ++totals.parameters;
        totals.links += m.plan.links();
        totals.bytes += m.plan.bytes();
        totals.minimum_bytes += m.plan.minimum_bytes();
        totals.local_bytes += m.plan.local_bytes();
        starts.push_back([&p, &q, plan = std::move(m.plan), root, tag, in_src, in_dst]() -> std::unique_ptr<detail::PendingMove> {
          // The exchange's space is the real side's (a meta twin holds nothing to send or fill).
          using Space = std::conditional_t<holds_data_v<typename P::space>, typename P::space, typename Q::space>;
          auto out = std::make_unique<detail::PendingMoveOf<T, R, Space>>();
          (void)p;  // a meta twin's side reads nothing
          (void)q;
          const Tensor<T, R, Space>* s = nullptr;
          Tensor<T, R, Space>* d = nullptr;
          Box<R> sb{}, db{};
          if constexpr (std::is_same_v<typename P::space, Space>)
            if (in_src) s = &p.value().to_local(), sb = p.value().local_box();
          if constexpr (std::is_same_v<typename Q::space, Space>)
            if (in_dst) d = &q.value().local(), db = q.value().local_box();
          out->ex.start(plan, *root, s, sb, d, db, tag);
          return out;
        });
      }
    });
    if (!found && error.empty()) error = p.name() + ": no parameter of that name in the destination model";
  });
  if (error.empty() && which == DstParameters::all && totals.parameters != dst_count)
    error = dtensor::detail::cat("the destination model has ", dst_count, " parameters, the source ", totals.parameters);
  fingerprint = dtensor::detail::fnv(fingerprint, std::int64_t(totals.parameters));
  fingerprint = dtensor::detail::fnv(fingerprint, std::int64_t(which) | std::int64_t(others) << 1);
  const std::string what = error.empty() ? dtensor::detail::cat(totals.parameters, " parameters, the first ", first_what) : error;
  dtensor::detail::agree_on_cross_mesh_plan(
      *root, ranks, dtensor::detail::CrossMeshSummary::make(fingerprint, me, !error.empty(), what), tag);
  std::vector<std::unique_ptr<detail::PendingMove>> pending;
  pending.reserve(starts.size());
  for (auto& s : starts) pending.push_back(s());
  for (auto& p : pending) p->wait();
  return totals;
}

}  // namespace dtensor::nn
