// dtensor/parallel/expert_parallel.hpp — expert parallelism: the expert mesh over the ranks of the
// dense one, and dispatch / combine, the data-dependent all-to-all-v boundary ops.
//
//   using Dense = DeviceMesh<"dp", "tp">;             // attention, norms, the router
//   using Experts = DeviceMesh<"edp", "ep", "tp">;    // the same world, factored again: dp = edp * ep
//   Dense dense(world, {4, 2});
//   auto emesh = parallel::make_expert_mesh<Experts>(dense, /*ep=*/2);   // {2, 2, 2}
//
//   auto order = parallel::order_by_expert(expert_of_slot, kept, experts, ep);  // send order, rows per expert
//   auto plan = parallel::exchange_counts(ep_comm, order.rows_per_expert, dim);  // all_to_all
//   auto grouped = parallel::dispatch(ep_comm, plan, send_rows);     // all_to_all_v; rows by local expert
//   auto back = parallel::combine(ep_comm, plan, expert_out);        // all_to_all_v, reverse; send order
//   combine_backward / dispatch_backward: the adjoints (the same permutations, the other way)
//
// Meshes. The expert mesh is a second factorization of the dense mesh's ranks (torchtitan's
// dp_shard * cp * tp = efsdp * ep): its data dimension ("edp", Role::data) times its expert
// dimension ("ep", Role::expert) is the dense mesh's token size — its data dimensions times its
// context dimension, which split the tokens alike — and its tensor dimension (if any) is the
// dense one, rank for rank. make_expert_mesh builds it (collective, like every mesh) on a copy of
// the communicator of all the dense mesh's ranks, row-major, so a rank's dense (data..., context)
// index is edp * ep_size + ep and each "ep" group holds ep consecutive token chunks. Expert weights are
// Shard<0> (the expert index) on "ep" and replicated on "edp" and "tp" (expert_params); E experts
// over ep ranks split like any uneven Shard (chunk_range, placement/chunk.hpp): ceil(E / ep) per
// rank with the remainder at the tail, so 5 over 2 is 3, 2 and 5 over 4 is 2, 2, 1, 0 — a rank may
// own no expert (it still routes and sends its tokens, and receives nothing). Their
// gradients are Partial<sum> on "edp" (expert_grads), which DataParallel over the expert mesh
// reduces. Expert tensor parallelism (ETP) is not implemented: inside a tp group every rank
// routes the same tokens and runs the same experts.
//
// Dispatch and combine. A rank sends each kept (token, choice) to the rank owning its expert:
// rows ordered by expert (so by destination rank, then by its local expert), then by token and
// choice. Because the sizes depend on the data, the per-(peer, local expert) row counts are
// exchanged first (exchange_counts: one all_to_all of int64 counts, ceil(E / ep) per peer: each
// peer's experts' counts padded to the largest share, since all_to_all moves equal blocks; that is
// E counts when ep divides E), then dispatch is one
// all_to_all_v of the rows, regrouped on arrival so that each local expert's rows (from every
// source rank, in rank order) are contiguous: one GEMM per local expert. The regrouping is a row
// gather (an embedding lookup, so it runs in every memory space's kernels) with an order planned
// on the host from the counts. combine undoes the
// regrouping and sends the rows back (one all_to_all_v) in the order they left. Both are
// permutations of rows, so each one's adjoint is the other's data movement: combine_backward moves
// gradients like dispatch (no count exchange: the plan is reused), dispatch_backward like combine.
// All of them are recorded in the CommLog on the "ep" communicator.
//
// Memory spaces: rows are tensors of the model's space; the counts and row orders are small host
// vectors (they decide sizes, which the host needs anyway), uploaded as index tensors where a
// kernel needs them. The count exchange travels in the model's space (a device backend moves
// device memory). A dry run (meta, the sim backend) has no peers' counts: it assumes every rank
// routes like itself (detail::all_to_all_counts), which nn::route_balanced makes exact.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "dtensor/core/meta_space.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/kernels/embedding.hpp"
#include "dtensor/mesh/roles.hpp"
#include "dtensor/placement/chunk.hpp"
#include "dtensor/placement/layout.hpp"

namespace dtensor::parallel {

// ---------------------------------------------------------------- the expert mesh

/// The index of the mesh's expert dimension.
template <class Mesh>
inline constexpr std::size_t expert_dim = role_dim<Mesh, Role::expert>;

namespace detail {
template <class Mesh, Placement OnData, std::size_t... I>
auto expert_layout(std::index_sequence<I...>)
    -> Layout<std::conditional_t<role_of<Mesh>(I) == Role::expert, Shard<0>,
                                 std::conditional_t<is_data_dim<Mesh>(I), OnData, Replicate>>...>;

template <class Mesh>
constexpr bool is_expert_mesh() {
  for (std::size_t i = 0; i < Mesh::ndim; ++i) {
    const Role r = role_of<Mesh>(i);
    if (r != Role::data && r != Role::expert && r != Role::tensor) return false;
  }
  return count_role<Mesh, Role::expert>() == 1 && count_role<Mesh, Role::data>() <= 1;
}

/// The row-major index of a coordinate over the dimensions whose role passes `keep`.
template <class Mesh, class Keep>
int index_over(const Mesh& mesh, Keep keep) {
  int index = 0;
  for (std::size_t i = 0; i < Mesh::ndim; ++i)
    if (keep(role_of<Mesh>(i))) index = index * mesh.size(i) + mesh.coordinate(i);
  return index;
}
template <class Mesh, class Keep>
int size_over(const Mesh& mesh, Keep keep) {
  int n = 1;
  for (std::size_t i = 0; i < Mesh::ndim; ++i)
    if (keep(role_of<Mesh>(i))) n *= mesh.size(i);
  return n;
}
inline bool is_data_role(Role r) { return r == Role::data || r == Role::data_shard; }
/// The dense dimensions that split the tokens: data and context (torchtitan's dp_shard x cp =
/// efsdp x ep), whose ranks the expert mesh's data and expert dimensions factor.
inline bool is_token_role(Role r) { return is_data_role(r) || r == Role::context; }
}  // namespace detail

/// An expert mesh: one expert dimension, at most one data dimension, and a tensor dimension.
template <class Mesh>
concept ExpertMeshType = MeshType<Mesh> && detail::is_expert_mesh<Mesh>();

/// Expert weights [experts, ...]: Shard<0> on the expert dimension, Replicate elsewhere.
template <class Mesh>
using expert_params = decltype(detail::expert_layout<Mesh, Replicate>(std::make_index_sequence<Mesh::ndim>{}));
/// Their gradients: Partial<sum> on the data dimension (each rank's share of the global loss).
template <class Mesh>
using expert_grads = decltype(detail::expert_layout<Mesh, Partial<ReduceOp::sum>>(std::make_index_sequence<Mesh::ndim>{}));

/// The communicator of this rank's expert group.
template <ExpertMeshType Mesh>
Communicator& expert_group(const Mesh& mesh) {
  return mesh.group(expert_dim<Mesh>);
}

/// Throws unless `expert` factors dense's ranks as make_expert_mesh does: the same tensor
/// coordinate, and dense's data index = the expert mesh's (data, expert) index. Local.
template <MeshType DenseMesh, ExpertMeshType ExpertMesh>
void check_expert_mesh(const DenseMesh& dense, const ExpertMesh& expert) {
  auto tensor_role = [](Role r) { return r == Role::tensor; };
  auto data_or_expert = [](Role r) { return detail::is_data_role(r) || r == Role::expert; };
  const bool ok = detail::index_over(dense, tensor_role) == detail::index_over(expert, tensor_role) &&
                  detail::size_over(dense, tensor_role) == detail::size_over(expert, tensor_role) &&
                  detail::index_over(dense, detail::is_token_role) == detail::index_over(expert, data_or_expert) &&
                  detail::size_over(dense, detail::is_token_role) == detail::size_over(expert, data_or_expert);
  if (!ok)
    throw Error("parallel::check_expert_mesh",
                dtensor::detail::cat("expert mesh ", to_string(expert.shape()), " at ", to_string(expert.coordinate()),
                                     " is not a factorization of dense mesh ", to_string(dense.shape()), " at ",
                                     to_string(dense.coordinate()),
                                     " (build it with make_expert_mesh: data = edp * ep, same tensor ranks)"),
                dense.rank());
}

/// Builds the expert mesh over the ranks of `dense` with `ep` ranks on the expert dimension.
/// Collective over all of dense's ranks.
template <ExpertMeshType ExpertMesh, MeshType DenseMesh>
ExpertMesh make_expert_mesh(const DenseMesh& dense, int ep) {
  const int data = detail::size_over(dense, detail::is_token_role);
  const int tensor = detail::size_over(dense, [](Role r) { return r == Role::tensor; });
  constexpr bool has_edp = has_role<ExpertMesh, Role::data>;
  if (ep < 1 || data % ep != 0 || (!has_edp && data != ep))
    throw Error("parallel::make_expert_mesh",
                dtensor::detail::cat("expert size ", ep, " must divide the dense mesh's data x context size ", data,
                                     has_edp ? "" : " and equal it (the expert mesh has no data dimension)"),
                dense.rank());
  if (detail::size_over(dense, [](Role r) { return !detail::is_token_role(r) && r != Role::tensor; }) != 1)
    throw Error("parallel::make_expert_mesh", "the dense mesh may have data, context and tensor dimensions only", dense.rank());
  std::array<int, ExpertMesh::ndim> shape{};
  for (std::size_t i = 0; i < ExpertMesh::ndim; ++i) {
    const Role r = role_of<ExpertMesh>(i);
    shape[i] = r == Role::expert ? ep : r == Role::tensor ? tensor : data / ep;
  }
  if constexpr (!has_role<ExpertMesh, Role::tensor>)
    if (tensor != 1)
      throw Error("parallel::make_expert_mesh",
                  dtensor::detail::cat("the dense mesh has a tensor dimension of ", tensor,
                                       " ranks and the expert mesh none"),
                  dense.rank());
  // A communicator of all the dense mesh's ranks in their order (one split), for the new mesh.
  // The group is known (every rank, in order): a sim world can build it too (comm/sim.hpp). Its
  // root is the dense mesh's, its ranks the dense mesh's in the same order (rank i of the split is
  // the dense mesh's rank i), so cross-mesh moves (distributed/cross_mesh.hpp) reach the experts
  // as they reach the dense weights (a trained MoE model moved to a serving mesh).
  ExpertMesh mesh(dense.comm().split(0, dense.comm().rank(), dense.comm().size()), shape, dense.root_ptr(),
                  dense.ranks().root_ranks);
  check_expert_mesh(dense, mesh);
  return mesh;
}

// ---------------------------------------------------------------- the send order

/// Where each kept (token, choice) goes: the send order is by expert, then by slot
/// (token * topk + choice).
struct ExpertOrder {
  std::vector<std::int64_t> slot_of_row;      // [rows]: the slot each send row carries
  std::vector<std::int64_t> row_of_slot;      // [slots]: its send row, or -1 (dropped)
  std::vector<std::int64_t> rows_per_expert;  // [experts]
};

/// The send order of the kept slots (expert_of_slot[s] its expert, kept[s] != 0 if kept).
inline ExpertOrder order_by_expert(std::span<const std::int32_t> expert_of_slot, std::span<const std::uint8_t> kept,
                                   std::int64_t experts) {
  ExpertOrder o;
  o.rows_per_expert.assign(std::size_t(experts), 0);
  o.row_of_slot.assign(expert_of_slot.size(), -1);
  for (std::size_t s = 0; s < expert_of_slot.size(); ++s)
    if (kept[s]) {
      if (expert_of_slot[s] < 0 || expert_of_slot[s] >= experts)
        throw Error("parallel::order_by_expert",
                    dtensor::detail::cat("slot ", s, " routed to expert ", expert_of_slot[s], " of ", experts));
      ++o.rows_per_expert[std::size_t(expert_of_slot[s])];
    }
  std::vector<std::int64_t> next(std::size_t(experts), 0);  // counting sort: the first row of each expert
  for (std::size_t e = 1; e < next.size(); ++e) next[e] = next[e - 1] + o.rows_per_expert[e - 1];
  const std::int64_t rows = experts > 0 ? next.back() + o.rows_per_expert.back() : 0;
  o.slot_of_row.resize(std::size_t(rows));
  for (std::size_t s = 0; s < expert_of_slot.size(); ++s)
    if (kept[s]) {
      const auto r = next[std::size_t(expert_of_slot[s])]++;
      o.slot_of_row[std::size_t(r)] = std::int64_t(s);
      o.row_of_slot[s] = r;
    }
  return o;
}

// ---------------------------------------------------------------- the plan: counts exchanged

/// The sizes of one dispatch, from the count exchange: rows per (peer, local expert) each way.
/// Ranks may own different numbers of experts (chunk_range's uneven split; some none).
struct DispatchPlan {
  int ranks = 1;
  std::int64_t local_experts = 0, dim = 0;  // local_experts: this rank's (it may be 0)
  std::vector<std::int64_t> expert_offsets;  // [ranks + 1]: rank r owns experts [offsets[r], offsets[r + 1])
  std::vector<std::int64_t> send_rows;  // [expert]: rows this rank sends (by peer, then its local expert)
  std::vector<std::int64_t> recv_rows;  // [source * local_experts + le]: rows it receives
  // all_to_all_v's per-peer element counts and displacements, each way.
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
  // The received rows' order: arrival (source, local expert) and grouped (local expert, source).
  // to_grouped[g]: the arrival row that grouped row g is; to_arrival is its inverse. Both empty
  // when the two orders coincide (one local expert, or one rank).
  std::vector<std::int64_t> to_grouped, to_arrival;

  std::int64_t rows_sent() const { return sum(send_rows); }
  /// The experts rank r owns.
  Range experts_of(int r) const { return {expert_offsets[std::size_t(r)], expert_offsets[std::size_t(r) + 1]}; }
  std::int64_t rows_received() const { return sum(recv_rows); }
  /// Rows of each local expert after dispatch (from every source).
  std::vector<std::int64_t> rows_per_local_expert() const {
    std::vector<std::int64_t> out(std::size_t(local_experts), 0);
    for (std::size_t i = 0; i < recv_rows.size(); ++i) out[i % std::size_t(local_experts)] += recv_rows[i];
    return out;
  }

 private:
  static std::int64_t sum(const std::vector<std::int64_t>& v) {
    std::int64_t s = 0;
    for (auto x : v) s += x;
    return s;
  }
};

namespace detail {
/// The count exchange's all_to_all (blocks of `block` counts per peer), through a buffer of memory
/// space Space (a device backend moves device memory only). A space without data (the dry run's
/// meta) cannot learn its peers' counts: it assumes every rank of the group routes like this one
/// (exact for nn::route_balanced, the routing a dry run uses), so every source sends this rank
/// what this rank sends itself: its own block, from each.
template <MemorySpace Space>
void all_to_all_counts(Communicator& ep, const std::vector<std::int64_t>& send, std::vector<std::int64_t>& recv,
                       std::size_t block) {
  if constexpr (std::is_same_v<Space, host_space>) {
    ep.all_to_all(std::span<const std::int64_t>(send), std::span<std::int64_t>(recv));
  } else {
    const Shape<1> n{Extent(send.size())};
    const auto send_here = to_space<Space>(Tensor<std::int64_t, 1>::view(const_cast<std::int64_t*>(send.data()), n));
    auto recv_here = Tensor<std::int64_t, 1, Space>::uninitialized(n);
    ep.all_to_all(send_here.span(), recv_here.span());
    if constexpr (holds_data_v<Space>) {
      const auto back = to_space<host_space>(recv_here);
      std::copy_n(back.data(), recv.size(), recv.begin());
    } else {
      const auto own = send.begin() + std::ptrdiff_t(std::size_t(ep.rank()) * block);
      for (std::size_t s = 0; s < recv.size() / block; ++s)
        std::copy_n(own, block, recv.begin() + std::ptrdiff_t(s * block));
    }
  }
}

/// The row orders of the received rows (DispatchPlan::to_grouped, to_arrival).
inline void plan_regrouping(DispatchPlan& p) {
  const auto L = std::size_t(p.local_experts), R = std::size_t(p.ranks);
  if (L <= 1 || R == 1) return;  // arrival order is grouped order (or nothing arrives)
  std::vector<std::int64_t> arrival(R * L);  // first row of block (source, le) in arrival order
  std::int64_t row = 0;
  for (std::size_t s = 0; s < R; ++s)
    for (std::size_t le = 0; le < L; ++le) arrival[s * L + le] = row, row += p.recv_rows[s * L + le];
  p.to_grouped.resize(std::size_t(row));
  p.to_arrival.resize(std::size_t(row));
  std::int64_t grouped = 0;
  for (std::size_t le = 0; le < L; ++le)
    for (std::size_t s = 0; s < R; ++s)
      for (std::int64_t i = 0; i < p.recv_rows[s * L + le]; ++i, ++grouped) {
        p.to_grouped[std::size_t(grouped)] = arrival[s * L + le] + i;
        p.to_arrival[std::size_t(arrival[s * L + le] + i)] = grouped;
      }
}
}  // namespace detail

/// The count exchange: one all_to_all of rows_per_expert (this rank's rows for every expert;
/// E = rows_per_expert.size() experts, rank r owning chunk_range(E, ranks, r) of them, as the
/// experts' Shard<0> weights hold them). Each peer gets a block of chunk_size(E, ranks) counts,
/// its experts' and zeros after them (all_to_all moves equal blocks). Collective over ep.
/// Space: where the counts travel (the model's memory space; on meta see detail::all_to_all_counts).
template <MemorySpace Space = host_space>
DispatchPlan exchange_counts(Communicator& ep, std::span<const std::int64_t> rows_per_expert, std::int64_t dim) {
  const auto ranks = std::size_t(ep.size());
  const auto experts = Extent(rows_per_expert.size());
  if (experts < 1 || dim < 1)
    ep.fail("parallel::exchange_counts",
            dtensor::detail::cat(experts, " expert counts over ", ranks, " ranks, dim ", dim, " (both must be > 0)"));
  DispatchPlan p;
  p.ranks = ep.size();
  p.dim = dim;
  p.expert_offsets.resize(ranks + 1);
  for (std::size_t r = 0; r < ranks; ++r) p.expert_offsets[r] = chunk_range(experts, p.ranks, int(r)).begin;
  p.expert_offsets[ranks] = experts;
  p.local_experts = p.experts_of(ep.rank()).size();
  p.send_rows.assign(rows_per_expert.begin(), rows_per_expert.end());
  const auto block = std::size_t(chunk_size(experts, p.ranks)), L = std::size_t(p.local_experts);
  std::vector<std::int64_t> send(ranks * block, 0), recv(ranks * block, 0);
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto mine = p.experts_of(int(r));
    std::copy(p.send_rows.begin() + mine.begin, p.send_rows.begin() + mine.end, send.begin() + std::ptrdiff_t(r * block));
  }
  detail::all_to_all_counts<Space>(ep, send, recv, block);
  p.recv_rows.resize(ranks * L);
  for (std::size_t s = 0; s < ranks; ++s)
    std::copy_n(recv.begin() + std::ptrdiff_t(s * block), L, p.recv_rows.begin() + std::ptrdiff_t(s * L));
  auto sum_dim = [&](auto first, auto last) {
    std::size_t n = 0;
    for (; first != last; ++first) n += std::size_t(*first * dim);
    return n;
  };
  p.send_counts.assign(ranks, 0);
  p.recv_counts.assign(ranks, 0);
  p.send_displs.assign(ranks, 0);
  p.recv_displs.assign(ranks, 0);
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto mine = p.experts_of(int(r));
    p.send_counts[r] = sum_dim(p.send_rows.begin() + mine.begin, p.send_rows.begin() + mine.end);
    p.recv_counts[r] = sum_dim(p.recv_rows.begin() + std::ptrdiff_t(r * L), p.recv_rows.begin() + std::ptrdiff_t((r + 1) * L));
    if (r > 0) {
      p.send_displs[r] = p.send_displs[r - 1] + p.send_counts[r - 1];
      p.recv_displs[r] = p.recv_displs[r - 1] + p.recv_counts[r - 1];
    }
  }
  detail::plan_regrouping(p);
  return p;
}

/// Row indices kept on the host, as an index tensor of memory space Space (a view on the host,
/// a copy elsewhere; nothing on meta): what the row gathers of the MoE take.
template <MemorySpace Space>
Tensor<std::int64_t, 1, Space> indices_in(const std::vector<std::int64_t>& index) {
  const auto host = Tensor<std::int64_t, 1>::view(const_cast<std::int64_t*>(index.data()), Shape<1>{Extent(index.size())});
  if constexpr (std::is_same_v<Space, host_space>) return host;
  else return to_space<Space>(host);
}

/// out[i] = rows[index[i]]: a row gather, which is an embedding lookup (kernels/embedding.hpp).
template <kernels::host::FloatElement T, MemorySpace Space>
Tensor<T, 2, Space> gather_rows(const Tensor<T, 2, Space>& rows, const Tensor<std::int64_t, 1, Space>& index) {
  return kernels::embedding(rows, index);
}

namespace detail {
/// Rows out along the plan (forward: send counts out, receive counts in), regrouped by local expert.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> exchange_out(Communicator& ep, const DispatchPlan& p, const Tensor<T, 2, Space>& rows, const char* op) {
  if (rows.shape()[0] != p.rows_sent() || rows.shape()[1] != p.dim)
    ep.fail(op, dtensor::detail::cat("rows ", to_string(rows.shape()), ", the plan sends ", p.rows_sent(), " x ", p.dim));
  auto arrived = Tensor<T, 2, Space>::uninitialized(Shape<2>{p.rows_received(), p.dim});
  ep.all_to_all_v(rows.span(), std::span<const std::size_t>(p.send_counts), std::span<const std::size_t>(p.send_displs),
                  arrived.span(), std::span<const std::size_t>(p.recv_counts),
                  std::span<const std::size_t>(p.recv_displs));
  if (p.to_grouped.empty()) return arrived;
  return gather_rows(arrived, indices_in<Space>(p.to_grouped));
}

/// The reverse: rows grouped by local expert back to the ranks (and order) they came from.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> exchange_back(Communicator& ep, const DispatchPlan& p, const Tensor<T, 2, Space>& grouped,
                                  const char* op) {
  if (grouped.shape()[0] != p.rows_received() || grouped.shape()[1] != p.dim)
    ep.fail(op, dtensor::detail::cat("rows ", to_string(grouped.shape()), ", the plan received ", p.rows_received(),
                                     " x ", p.dim));
  auto back = Tensor<T, 2, Space>::uninitialized(Shape<2>{p.rows_sent(), p.dim});
  auto send = [&](const Tensor<T, 2, Space>& arrival) {
    ep.all_to_all_v(arrival.span(), std::span<const std::size_t>(p.recv_counts),
                    std::span<const std::size_t>(p.recv_displs), back.span(), std::span<const std::size_t>(p.send_counts),
                    std::span<const std::size_t>(p.send_displs));
  };
  if (p.to_arrival.empty()) send(grouped);
  else send(gather_rows(grouped, indices_in<Space>(p.to_arrival)));
  return back;
}
}  // namespace detail

/// Sends rows [rows_sent, dim] (in send order) to their experts' ranks; returns the received rows
/// [rows_received, dim], grouped by local expert. One all_to_all_v on ep.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> dispatch(Communicator& ep, const DispatchPlan& p, const Tensor<T, 2, Space>& rows) {
  return detail::exchange_out(ep, p, rows, "parallel::dispatch");
}
/// Sends the experts' rows [rows_received, dim] (grouped by local expert) back; returns them in
/// this rank's send order [rows_sent, dim]. One all_to_all_v on ep.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> combine(Communicator& ep, const DispatchPlan& p, const Tensor<T, 2, Space>& grouped) {
  return detail::exchange_back(ep, p, grouped, "parallel::combine");
}
/// The adjoint of combine: gradients in send order to the experts' ranks. One all_to_all_v.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> combine_backward(Communicator& ep, const DispatchPlan& p, const Tensor<T, 2, Space>& d_rows) {
  return detail::exchange_out(ep, p, d_rows, "parallel::combine_backward");
}
/// The adjoint of dispatch: the experts' input gradients back to the tokens' ranks. One all_to_all_v.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> dispatch_backward(Communicator& ep, const DispatchPlan& p, const Tensor<T, 2, Space>& d_grouped) {
  return detail::exchange_back(ep, p, d_grouped, "parallel::dispatch_backward");
}

}  // namespace dtensor::parallel
