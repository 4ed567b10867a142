// dtensor/checkpoint/sync_state.hpp — checkpoints of local SGD / DiLoCo, delayed gradients and
// FedAvg (parallel/sync/) that resume in the middle of a round.
//
//   auto slots = checkpoint::per_rank(checkpoint::parameter_slots(units, mesh), mesh);  // each replica's own values
//   checkpoint::append(slots, checkpoint::per_rank(checkpoint::sgd_slots(ps, inner, mesh), mesh)); // its inner optimizer
//   checkpoint::append(slots, checkpoint::diloco_slots(diloco));                       // θ_sync, outer momentum
//   checkpoint::append(slots, checkpoint::delayed_slots(delayed));                     // the pending reduced gradients
//   checkpoint::save(dir, mesh, slots, {.step = step});
//   ... // resume: the same objects built fresh, then
//   diloco.set_inner_step(step);   fed.set_round(round);   auto pending = delayed.restore(step);
//   checkpoint::load_same_mesh(dir, mesh, slots_built_the_same_way_with(checkpoint::delayed_slots(delayed, pending)));
//
// Why per rank: between two syncs the replicas of the data dimension drift apart, and so do
// their inner optimizers' moments; a checkpoint of the global tensors (slots.hpp: a Replicate
// box is written once, by coordinate 0) keeps one replica and loses the rest. per_rank() makes
// every slot a tensor of its own, "rank<r>/<i>/<name>", written by its rank, so every rank's own
// values are saved and read back by the same rank. θ_sync and the outer momentum are equal on the replicas but
// are saved the same way (small next to the model, one code path). The counters are not tensors:
// DiLoCo's inner step, FedAvg's round and the delayed gradients' issued count follow from the
// trainer's step (TrainingMeta::step) and are set through set_inner_step / set_round / restore,
// which rederive the rest (rounds, syncs, the outer optimizers' step counts; FedAvg's sampling
// is a function of (seed, round)). Such a checkpoint resumes on the mesh it was saved on only
// (the shape is checked, load_same_mesh); at a round boundary the global tensors alone suffice
// for any mesh. The format is checkpoint/format.hpp's: these are ordinary named tensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dtensor/checkpoint/load.hpp"
#include "dtensor/checkpoint/save.hpp"
#include "dtensor/checkpoint/slots.hpp"
#include "dtensor/optim/sgd.hpp"
#include "dtensor/parallel/sync/delayed_gradients.hpp"
#include "dtensor/parallel/sync/diloco.hpp"

namespace dtensor::checkpoint {

template <class T>
void append(Slots<T>& to, Slots<T> from) {
  to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
}

/// Each slot as a tensor of its own, "rank<r>/<i>/<name>" (r = mesh.rank(), i its index), of
/// the box's extents, written by this rank: a rank may hold several boxes of one tensor (FSDP
/// cuts rows), and a saved tensor must be covered whole by its pieces.
template <class T, MeshType Mesh>
Slots<T> per_rank(Slots<T> slots, const Mesh& mesh) {
  const std::string prefix = "rank" + std::to_string(mesh.rank()) + "/";
  for (std::size_t i = 0; i < slots.size(); ++i) {
    auto& s = slots[i];
    s.name = prefix + std::to_string(i) + "/" + s.name;
    s.layout = "this rank's box " + to_string(s.box) + " of " + to_string(s.shape) + " (" + s.layout + ")";
    s.shape = s.box.extent;
    std::fill(s.box.offset.begin(), s.box.offset.end(), Extent(0));
    s.writer = true;
  }
  return slots;
}

namespace detail {
/// One rank-private 1-D tensor "rank<r>/<name>" over `data`.
template <class T>
Slot<T> rank_slot(int rank, const std::string& name, std::span<T> data) {
  const std::vector<Extent> shape{Extent(data.size())};
  return {"rank" + std::to_string(rank) + "/" + name, shape, Region{std::vector<Extent>{0}, shape}, data.data(),
          "rank " + std::to_string(rank) + " only", true};
}
}  // namespace detail

/// The parameters' local pieces of a list (the values an optimizer steps), as this rank's own
/// tensors "rank<r>/<prefix>/<name>".
template <class T, std::size_t N, class Space, MeshType Mesh>
Slots<T> list_slots(const nn::ParamList<T, N, Space>& ps, const Mesh& mesh, const std::string& prefix = "param") {
  Slots<T> out;
  for (const auto& p : ps) out.push_back(detail::rank_slot(mesh.rank(), prefix + "/" + p.name, p.value));
  return out;
}

/// An optim::SGD's momentum over list `ps` (what it was built on), as this rank's own tensors
/// "rank<r>/<prefix>.momentum/<name>" (none without momentum). Its step count is the caller's
/// (set_steps).
template <class T, std::size_t N, class Space, MeshType Mesh>
Slots<T> sgd_slots(const nn::ParamList<T, N, Space>& ps, optim::SGD<T, N, Space>& sgd, const Mesh& mesh,
                   const std::string& prefix = "sgd") {
  Slots<T> out;
  auto& buf = sgd.momentum_buffer();
  if (buf.all().empty()) return out;
  for (std::size_t k = 0; k < ps.size(); ++k)
    out.push_back(detail::rank_slot(mesh.rank(), prefix + ".momentum/" + ps[k].name, buf.of(k)));
  return out;
}

/// A count that differs between ranks (an inner optimizer's step count: FedAvg's sampled clients
/// step, the others do not; TrainingMeta keeps rank 0's only) as this rank's own one-element
/// tensor "rank<r>/<name>" over `cell`. Exact while the count fits T's mantissa: checked here
/// for a save (`count`), and on the way back by the caller reading `cell`.
template <class T, MeshType Mesh>
Slot<T> count_slot(const std::string& name, T& cell, long count, const Mesh& mesh) {
  if (count < 0 || double(count) >= std::ldexp(1.0, std::numeric_limits<T>::digits))
    throw Error("checkpoint::count_slot", dtensor::detail::cat(name, " = ", count, " is not exact in a ",
                                                              std::numeric_limits<T>::digits, "-bit mantissa"),
                mesh.rank());
  cell = T(count);
  return detail::rank_slot(mesh.rank(), name, std::span<T>(&cell, 1));
}

/// DiLoCo's state: θ_sync ("diloco.anchor/<k>") and each fragment's outer momentum
/// ("diloco.outer<f>.momentum/<k>"), this rank's; named by its rank in `mesh` (the whole mesh,
/// when DiLoCo runs on a sub-mesh: a pipeline stage's). The inner step: set_inner_step on resume.
// D is a parallel::sync::DiLoCo, taken whole: nvcc's front end fails to deduce DiLoCo<T, M, Dim>
// through the fixed_string Dim (g++ and clang do), so T is D::value_type.
template <class D, MeshType Mesh>
  requires requires(D& d) { d.anchor(); d.outer(0); d.num_fragments(); }
Slots<typename D::value_type> diloco_slots(D& d, const Mesh& mesh) {
  using T = typename D::value_type;
  if (d.in_flight() > 0)
    throw Error("checkpoint::diloco_slots", dtensor::detail::cat(d.in_flight(), " overlapped outer all-reduce(s) in flight at "
                                                                 "inner step ", d.inner_step(), ": save between overlaps"),
                mesh.rank());
  Slots<T> out;
  auto& anchor = d.anchor();
  const auto [first, last] = d.fragment(d.num_fragments() - 1);
  for (std::size_t k = 0; k < last; ++k)
    out.push_back(detail::rank_slot(mesh.rank(), "diloco.anchor/" + std::to_string(k), anchor.of(k)));
  for (std::size_t f = 0; f < d.num_fragments(); ++f) {
    auto& buf = d.outer(f).momentum_buffer();
    if (buf.all().empty()) continue;
    const auto [begin, end] = d.fragment(f);
    for (std::size_t k = begin; k < end; ++k)
      out.push_back(detail::rank_slot(mesh.rank(), "diloco.outer" + std::to_string(f) + ".momentum/" + std::to_string(k),
                                      buf.of(k - begin)));
  }
  return out;
}

/// The delayed gradients' pending reduced gradients ("delayed.pending<i>", oldest first): for a
/// save, `pending` = d.settle() (waits for what is in flight); for a load, d.restore(issued).
// D is a parallel::sync::DelayedGradients (taken whole, as diloco_slots takes its DiLoCo).
template <class D, MeshType Mesh>
  requires requires(D& d) { d.settle(); }
Slots<typename D::value_type> delayed_slots(const D&, const std::vector<std::span<typename D::value_type>>& pending,
                                            const Mesh& mesh) {
  using T = typename D::value_type;
  Slots<T> out;
  for (std::size_t i = 0; i < pending.size(); ++i)
    out.push_back(detail::rank_slot(mesh.rank(), "delayed.pending" + std::to_string(i), pending[i]));
  return out;
}

/// Throws unless the checkpoint at `dir` was saved on a mesh of this one's names and shape: the
/// per-rank tensors are read back by the rank that wrote them.
template <MeshType Mesh>
void check_same_mesh(const std::filesystem::path& dir, const Mesh& mesh, const char* op) {
  const Manifest m = read_manifest(dir);
  std::vector<std::string> names;
  std::vector<int> shape;
  for (std::size_t i = 0; i < Mesh::ndim; ++i) {
    names.emplace_back(Mesh::names[i]);
    shape.push_back(mesh.shape()[i]);
  }
  auto describe = [](const std::vector<std::string>& n, const std::vector<int>& s) {
    std::string out = "(";
    for (std::size_t i = 0; i < n.size(); ++i) out += (i ? ", " : "") + n[i] + " " + std::to_string(i < s.size() ? s[i] : -1);
    return out + ")";
  };
  if (m.mesh_names != names || m.mesh_shape != shape)
    throw Error(op, dtensor::detail::cat("the checkpoint at ", dir.string(), " was saved on mesh ", describe(m.mesh_names, m.mesh_shape),
                                         ", this is ", describe(names, shape),
                                         ": its per-rank sync state (each replica's own parameters mid-round) resumes on the "
                                         "same mesh only"),
                mesh.rank());
}

/// load() after check_same_mesh: for slots that include per_rank / rank-private tensors.
template <class T, MeshType Mesh>
TrainingMeta load_same_mesh(const std::filesystem::path& dir, const Mesh& mesh, Slots<T>& slots, const LoadOptions& o = {}) {
  check_same_mesh(dir, mesh, "checkpoint::load_same_mesh");
  return load(dir, mesh, slots, o);
}

}  // namespace dtensor::checkpoint
