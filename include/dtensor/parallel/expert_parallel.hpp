// dtensor/parallel/expert_parallel.hpp — expert parallelism: the expert mesh over the ranks of the
// dense one, and dispatch / combine, the data-dependent all-to-all-v boundary ops.
//
//   using Dense = DeviceMesh<"dp", "tp">;             // attention, norms, the router
//   using Experts = DeviceMesh<"edp", "ep", "tp">;    // the same world, factored again: dp = edp * ep
//   Dense dense(world, {4, 2});
//   auto emesh = parallel::make_expert_mesh<Experts>(dense, /*ep=*/2);   // {2, 2, 2}
//
//   auto order = parallel::order_by_rank(expert_of_slot, kept, topk, experts, ep);  // units and pairs
//   auto plan = parallel::exchange_counts<T, Space>(ep_comm, order, dim);   // all_to_all of counts
//   auto d = parallel::dispatch(ep_comm, plan, order, tokens, gates);       // all_to_all_v
//   auto [out, saved] = experts.forward(d.rows, d.rows_per_local_expert);  // rows by local expert
//   auto back = parallel::combine(ep_comm, plan, d, out);      // gated sum per unit, all_to_all_v back
//   combine_backward / dispatch_backward: the adjoints (a row per unit each way)
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
// Dispatch and combine, merged by destination (DeepSeek-V3's dispatch: a token is sent once per
// destination and duplicated there). A unit is a (token, expert rank) pair: a token's row goes
// once to each rank its kept choices reach, however many of them lie there; a pair is a kept
// choice (the unit, the local expert, the gate). Because the sizes depend on the data, the counts
// are exchanged first (exchange_counts: one all_to_all of int64 counts, 1 + ceil(E / ep) per
// peer: its units, then its experts' pairs padded to the largest share, since all_to_all moves
// equal blocks), then dispatch is one all_to_all_v whose message to each peer is its unit rows
// followed by the pairs' side array (per pair the unit's index, int32, and the gate, T, padded to
// whole rows, byte-copied). On arrival a row gather (an embedding lookup, so it runs in every
// memory space's kernels) builds each local expert's rows (from every source rank, in rank order)
// contiguous: one GEMM per local expert. combine sums each unit's gate x expert output on the
// expert rank (a scatter-add) and sends a row per unit back (one all_to_all_v); the token's rank
// sums its units. combine_backward sends a row per unit the other way (the output gradient; no
// count exchange: the plan is reused), and dispatch_backward sums the experts' input gradients
// per unit and sends them back with the pairs' gate gradients as a side array (one
// all_to_all_v). So the bytes scale with distinct (token, rank) pairs, not (token, choice) pairs:
// group-limited routing (nn/router.hpp) that keeps a token on M ranks sends at most M rows.
// All of them are recorded in the CommLog on the "ep" communicator. The node-level (two-stage)
// dispatch, a token across the network once per node it reaches, composes these pieces over two
// sub-groups of "ep" (parallel/node_dispatch.hpp).
//
// Memory spaces: rows are tensors of the model's space; the counts and row orders are small host
// vectors (they decide sizes, which the host needs anyway), uploaded as index tensors where a
// kernel needs them. The count exchange travels in the model's space (a device backend moves
// device memory), and so do the side arrays. A dry run (meta, the sim backend) has no peers'
// counts or side arrays: it assumes every rank routes like itself (detail::all_to_all_counts;
// dispatch reads its own pairs to itself), which nn::route_balanced makes exact.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "dtensor/core/meta_space.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/kernels/embedding.hpp"
#include "dtensor/mesh/roles.hpp"
#include "dtensor/parallel/expert_split.hpp"
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

/// What this rank sends, merged by destination: each token once per expert rank its kept choices
/// reach (a unit: a (token, rank) pair), and with each unit its kept choices there (pairs: the
/// local expert and the gate, in a side array). Units are ordered by destination rank, then
/// token; pairs by expert (so by destination, then its local expert), then token.
struct DispatchOrder {
  std::vector<std::int64_t> token_of_unit;     // [units]: the token a unit carries
  std::vector<std::int64_t> units_per_rank;    // [ranks]
  std::vector<std::int64_t> pairs_per_expert;  // [experts]
  std::vector<std::int64_t> slot_of_pair;      // [pairs]: the routing slot (token * topk + choice)
  std::vector<std::int32_t> unit_of_pair;      // [pairs]: its unit, counted within its destination's units
  std::vector<std::int64_t> expert_offsets;    // [ranks + 1]: rank r owns experts [offsets[r], offsets[r + 1])

  std::int64_t units() const { return std::int64_t(token_of_unit.size()); }
  std::int64_t pairs() const { return std::int64_t(slot_of_pair.size()); }
};

/// The merged send order of the kept slots (expert_of_slot[s] its expert, kept[s] != 0 if kept;
/// slot s = token * topk + choice) for experts split over ranks as `expert_offsets` says: rank r
/// owns [expert_offsets[r], expert_offsets[r + 1]) (non-decreasing, from 0). The node-level
/// dispatch's first stage orders by node, with the nodes' experts (parallel/node_dispatch.hpp).
inline DispatchOrder order_by_rank(std::span<const std::int32_t> expert_of_slot, std::span<const std::uint8_t> kept,
                                   std::int64_t topk, std::vector<std::int64_t> expert_offsets) {
  const int ranks = int(expert_offsets.size()) - 1;
  const std::int64_t experts = expert_offsets.empty() ? 0 : expert_offsets.back();
  bool offsets_ok = ranks >= 1 && expert_offsets.front() == 0;
  for (int r = 0; offsets_ok && r < ranks; ++r)
    offsets_ok = expert_offsets[std::size_t(r)] <= expert_offsets[std::size_t(r) + 1];
  if (topk < 1 || experts < 1 || !offsets_ok || expert_of_slot.size() % std::size_t(topk) != 0 ||
      kept.size() != expert_of_slot.size())
    throw Error("parallel::order_by_rank",
                dtensor::detail::cat(expert_of_slot.size(), " slots (", kept.size(), " kept flags) of top-", topk, ", ",
                                     experts, " experts over ", ranks, " ranks"));
  DispatchOrder o;
  o.expert_offsets = std::move(expert_offsets);
  std::vector<int> rank_of_expert(static_cast<std::size_t>(experts));
  for (int r = 0; r < ranks; ++r)
    for (auto e = o.expert_offsets[std::size_t(r)]; e < o.expert_offsets[std::size_t(r) + 1]; ++e)
      rank_of_expert[std::size_t(e)] = r;
  const auto K = std::size_t(topk), tokens = expert_of_slot.size() / K;
  // Whether choice j of a token is the first of its kept choices bound for its rank (a new unit).
  auto opens_unit = [&](std::size_t n, std::size_t j) {
    const int r = rank_of_expert[std::size_t(expert_of_slot[n * K + j])];
    for (std::size_t i = 0; i < j; ++i)
      if (kept[n * K + i] && rank_of_expert[std::size_t(expert_of_slot[n * K + i])] == r) return false;
    return true;
  };
  o.units_per_rank.assign(std::size_t(ranks), 0);
  o.pairs_per_expert.assign(std::size_t(experts), 0);
  for (std::size_t s = 0; s < expert_of_slot.size(); ++s)
    if (kept[s]) {
      if (expert_of_slot[s] < 0 || expert_of_slot[s] >= experts)
        throw Error("parallel::order_by_rank",
                    dtensor::detail::cat("slot ", s, " routed to expert ", expert_of_slot[s], " of ", experts));
      ++o.pairs_per_expert[std::size_t(expert_of_slot[s])];
      if (opens_unit(s / K, s % K)) ++o.units_per_rank[std::size_t(rank_of_expert[std::size_t(expert_of_slot[s])])];
    }
  // Counting sorts: the next unit of each rank, the next pair of each expert.
  std::vector<std::int64_t> unit_base(std::size_t(ranks), 0), next_unit(std::size_t(ranks), 0);
  for (std::size_t r = 1; r < unit_base.size(); ++r) unit_base[r] = unit_base[r - 1] + o.units_per_rank[r - 1];
  std::vector<std::int64_t> next_pair(std::size_t(experts), 0);
  for (std::size_t e = 1; e < next_pair.size(); ++e) next_pair[e] = next_pair[e - 1] + o.pairs_per_expert[e - 1];
  o.token_of_unit.resize(std::size_t(unit_base.back() + o.units_per_rank.back()));
  o.slot_of_pair.resize(std::size_t(next_pair.back() + o.pairs_per_expert.back()));
  o.unit_of_pair.resize(o.slot_of_pair.size());
  std::vector<std::int64_t> unit_of_choice(K);  // this token's unit per choice (within its rank)
  for (std::size_t n = 0; n < tokens; ++n)
    for (std::size_t j = 0; j < K; ++j) {
      const std::size_t s = n * K + j;
      if (!kept[s]) continue;
      const auto e = std::size_t(expert_of_slot[s]);
      const auto r = std::size_t(rank_of_expert[e]);
      if (opens_unit(n, j)) {
        unit_of_choice[j] = next_unit[r]++;
        o.token_of_unit[std::size_t(unit_base[r] + unit_of_choice[j])] = std::int64_t(n);
      } else {
        for (std::size_t i = 0; i < j; ++i)
          if (kept[n * K + i] && std::size_t(rank_of_expert[std::size_t(expert_of_slot[n * K + i])]) == r) {
            unit_of_choice[j] = unit_of_choice[i];
            break;
          }
      }
      const auto p = std::size_t(next_pair[e]++);
      o.slot_of_pair[p] = std::int64_t(s);
      o.unit_of_pair[p] = std::int32_t(unit_of_choice[j]);
    }
  return o;
}

/// The same for `experts` experts split over `ranks` ranks as the experts' Shard<0> weights are
/// (chunk_range).
inline DispatchOrder order_by_rank(std::span<const std::int32_t> expert_of_slot, std::span<const std::uint8_t> kept,
                                   std::int64_t topk, std::int64_t experts, int ranks) {
  if (experts < 1 || ranks < 1)
    throw Error("parallel::order_by_rank",
                dtensor::detail::cat(expert_of_slot.size(), " slots (", kept.size(), " kept flags) of top-", topk, ", ",
                                     experts, " experts over ", ranks, " ranks"));
  return order_by_rank(expert_of_slot, kept, topk, expert_offsets_of(experts, ranks));
}

// ---------------------------------------------------------------- the plan: counts exchanged

namespace detail {
/// The rows of each peer's message in one all_to_all_v direction, and its element counts.
struct Transfer {
  std::vector<std::int64_t> rows;           // [ranks]
  std::vector<std::size_t> counts, displs;  // [ranks]: rows x dim elements, and where each message starts
  std::int64_t total = 0;                   // rows
  std::vector<std::int64_t> starts;         // [ranks]: the first row of each peer's message

  Transfer() = default;
  Transfer(std::vector<std::int64_t> per_peer, std::int64_t dim) : rows(std::move(per_peer)) {
    counts.resize(rows.size());
    displs.resize(rows.size());
    starts.resize(rows.size());
    for (std::size_t r = 0; r < rows.size(); ++r) {
      counts[r] = std::size_t(rows[r] * dim);
      displs[r] = std::size_t(total * dim);
      starts[r] = total;
      total += rows[r];
    }
  }
};

/// Rows of `dim` elements of `element_bytes` that `bytes` of a side array take (padded up).
inline std::int64_t side_rows(std::int64_t bytes, std::int64_t dim, std::size_t element_bytes) {
  const auto row = dim * std::int64_t(element_bytes);
  return (bytes + row - 1) / row;
}
}  // namespace detail

/// The sizes of one merged dispatch, from the count exchange: units per peer each way and pairs
/// per (peer, local expert). Ranks may own different numbers of experts (chunk_range's uneven
/// split; some none). Each message of the dispatch is a peer's unit rows followed by its side
/// array (per pair: the unit's index, int32, and the gate, T), padded to whole rows; each message
/// of dispatch_backward a peer's input-gradient rows followed by its pairs' gate gradients (T),
/// padded likewise; combine and combine_backward move unit rows alone.
struct DispatchPlan {
  int ranks = 1, rank = 0;
  std::int64_t local_experts = 0, dim = 0;  // local_experts: this rank's (it may be 0)
  std::vector<std::int64_t> expert_offsets;  // [ranks + 1]: rank r owns experts [offsets[r], offsets[r + 1])
  std::vector<std::int64_t> send_units, recv_units;  // [ranks]: units to each peer, from each source
  std::vector<std::int64_t> send_pairs;              // [ranks]: pairs this rank sends each peer
  std::vector<std::int64_t> recv_pairs;              // [source * local_experts + le]: pairs it receives
  // Where each peer's pairs start: in this rank's send order, and in the arrived side arrays (by
  // source). (Each source's first arrived unit is expert_units.starts.)
  std::vector<std::int64_t> first_pair_sent, first_pair_received;  // [ranks]
  // The all_to_all_v directions (rows per peer, element counts and displacements): the dispatch
  // (units + (index, gate) side arrays) out and in; the units alone on the tokens' side and the
  // experts' side; dispatch_backward (units + gate gradients) out of the experts' side and in.
  detail::Transfer dispatch_out, dispatch_in, token_units, expert_units, gradient_out, gradient_in;

  std::int64_t units_sent() const { return token_units.total; }
  std::int64_t units_received() const { return expert_units.total; }
  std::int64_t pairs_sent() const { return sum(send_pairs); }
  std::int64_t pairs_received() const { return sum(recv_pairs); }
  /// The experts rank r owns.
  Range experts_of(int r) const { return {expert_offsets[std::size_t(r)], expert_offsets[std::size_t(r) + 1]}; }
  /// Pairs of each local expert after dispatch (from every source): the rows its GEMMs run on.
  std::vector<std::int64_t> rows_per_local_expert() const {
    std::vector<std::int64_t> out(std::size_t(local_experts), 0);
    for (std::size_t i = 0; i < recv_pairs.size(); ++i) out[i % std::size_t(local_experts)] += recv_pairs[i];
    return out;
  }
  /// Pairs received from source s.
  std::int64_t pairs_from(int s) const {
    std::int64_t n = 0;
    for (std::int64_t le = 0; le < local_experts; ++le) n += recv_pairs[std::size_t(s * local_experts + le)];
    return n;
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
}  // namespace detail

/// The count exchange: one all_to_all telling each peer the units this rank sends it and the
/// pairs for each of its experts (E experts, rank r owning chunk_range(E, ranks, r) of them, as
/// the experts' Shard<0> weights hold them). Each peer gets a block of 1 + chunk_size(E, ranks)
/// counts: the units, its experts' pairs and zeros after them (all_to_all moves equal blocks).
/// T: the rows' element type (the side arrays' sizes in rows depend on it). Collective over ep.
/// Space: where the counts travel (the model's memory space; on meta see detail::all_to_all_counts).
template <class T, MemorySpace Space = host_space>
DispatchPlan exchange_counts(Communicator& ep, const DispatchOrder& order, std::int64_t dim) {
  const auto ranks = std::size_t(ep.size());
  const auto experts = Extent(order.pairs_per_expert.size());
  if (experts < 1 || dim < 1 || order.units_per_rank.size() != ranks || order.expert_offsets.size() != ranks + 1)
    ep.fail("parallel::exchange_counts",
            dtensor::detail::cat(experts, " expert counts and units for ", order.units_per_rank.size(), " ranks over ",
                                 ranks, " ranks, dim ", dim, " (both must be > 0, the ranks the group's)"));
  DispatchPlan p;
  p.ranks = ep.size();
  p.rank = ep.rank();
  p.dim = dim;
  p.expert_offsets = order.expert_offsets;
  p.local_experts = p.experts_of(ep.rank()).size();
  p.send_units = order.units_per_rank;
  std::size_t most = 0;  // the most experts a rank owns (chunk_size for chunk_range's split)
  for (int r = 0; r < p.ranks; ++r) most = std::max(most, std::size_t(p.experts_of(r).size()));
  const auto block = 1 + most, L = std::size_t(p.local_experts);
  std::vector<std::int64_t> send(ranks * block, 0), recv(ranks * block, 0);
  p.send_pairs.assign(ranks, 0);
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto mine = p.experts_of(int(r));
    send[r * block] = p.send_units[r];
    for (auto e = mine.begin; e < mine.end; ++e) {
      send[r * block + 1 + std::size_t(e - mine.begin)] = order.pairs_per_expert[std::size_t(e)];
      p.send_pairs[r] += order.pairs_per_expert[std::size_t(e)];
    }
  }
  detail::all_to_all_counts<Space>(ep, send, recv, block);
  p.recv_units.resize(ranks);
  p.recv_pairs.resize(ranks * L);
  for (std::size_t s = 0; s < ranks; ++s) {
    p.recv_units[s] = recv[s * block];
    std::copy_n(recv.begin() + std::ptrdiff_t(s * block + 1), L, p.recv_pairs.begin() + std::ptrdiff_t(s * L));
  }
  p.first_pair_sent.assign(ranks, 0);
  p.first_pair_received.assign(ranks, 0);
  for (std::size_t r = 1; r < ranks; ++r) {
    p.first_pair_sent[r] = p.first_pair_sent[r - 1] + p.send_pairs[r - 1];
    p.first_pair_received[r] = p.first_pair_received[r - 1] + p.pairs_from(int(r - 1));
  }
  // Side arrays: per pair an int32 unit index and a T gate forward, a T gate gradient backward.
  const auto forward_pair = std::int64_t(sizeof(std::int32_t) + sizeof(T)), backward_pair = std::int64_t(sizeof(T));
  std::vector<std::int64_t> d_out(ranks), d_in(ranks), g_out(ranks), g_in(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    d_out[r] = p.send_units[r] + detail::side_rows(p.send_pairs[r] * forward_pair, dim, sizeof(T));
    d_in[r] = p.recv_units[r] + detail::side_rows(p.pairs_from(int(r)) * forward_pair, dim, sizeof(T));
    g_out[r] = p.recv_units[r] + detail::side_rows(p.pairs_from(int(r)) * backward_pair, dim, sizeof(T));
    g_in[r] = p.send_units[r] + detail::side_rows(p.send_pairs[r] * backward_pair, dim, sizeof(T));
  }
  p.dispatch_out = {std::move(d_out), dim};
  p.dispatch_in = {std::move(d_in), dim};
  p.token_units = {p.send_units, dim};
  p.expert_units = {p.recv_units, dim};
  p.gradient_out = {std::move(g_out), dim};
  p.gradient_in = {std::move(g_in), dim};
  return p;
}

/// An index tensor of memory space Space with n entries, written by fill(std::int64_t* out):
/// in place on the host, through a host copy on a device, not at all on meta (no values). Every
/// space holds the same n entries, so a dry run's ledger reads what a real run holds, and the
/// host builds them without a second copy. What the row gathers and scatter-adds of the MoE take.
template <MemorySpace Space, class Fill>
Tensor<std::int64_t, 1, Space> index_tensor(std::int64_t n, Fill fill) {
  const Shape<1> shape{Extent(n)};
  if constexpr (std::is_same_v<Space, host_space>) {
    auto index = Tensor<std::int64_t, 1>::uninitialized(shape);
    fill(index.data());
    return index;
  } else if constexpr (holds_data_v<Space>) {
    auto host = Tensor<std::int64_t, 1>::uninitialized(shape);
    fill(host.data());
    return to_space<Space>(host);
  } else {
    return Tensor<std::int64_t, 1, Space>::uninitialized(shape);
  }
}

/// Row indices kept on the host, as an index tensor of memory space Space (index_tensor).
template <MemorySpace Space>
Tensor<std::int64_t, 1, Space> indices_in(const std::vector<std::int64_t>& index) {
  return index_tensor<Space>(std::int64_t(index.size()),
                             [&](std::int64_t* out) { std::copy(index.begin(), index.end(), out); });
}

/// out[i] = rows[index[i]]: a row gather, which is an embedding lookup (kernels/embedding.hpp).
template <kernels::host::FloatElement T, MemorySpace Space>
Tensor<T, 2, Space> gather_rows(const Tensor<T, 2, Space>& rows, const Tensor<std::int64_t, 1, Space>& index) {
  return kernels::embedding(rows, index);
}

/// What a dispatch delivered to the experts' side: the pairs' rows grouped by local expert (then
/// by source rank, then in the source's order) and, per pair, its unit and gate. Kept for
/// combine, the backward (the gates and units of each pair) and dispatch_backward.
template <class T, MemorySpace Space>
struct Dispatched {
  Tensor<T, 2, Space> rows;                         // [pairs received, dim]; emptied once the experts ran
  std::vector<std::int64_t> rows_per_local_expert;  // [local experts]
  std::vector<std::int64_t> unit_of_pair;     // [pairs]: the received unit it reads (sources' units in rank order)
  std::vector<std::int64_t> side_of_pair;     // [pairs]: its place in the sources' side arrays (in rank order)
  Tensor<std::int64_t, 1, Space> unit_index;  // unit_of_pair, in the space
  Tensor<T, 2, Space> gate;                   // [pairs, 1]
};

namespace detail {
/// Each peer's side array in a message buffer laid out by `out` (a peer's rows_per_peer rows,
/// then its side rows) as host bytes: write(peer, bytes) fills it. In place on the host; on a
/// device in a host copy of the side rows, then byte-copied into the buffer (copy_box), so a
/// side array's integers pass unchanged; not at all on meta (no values). The host and meta hold
/// nothing for it beside the buffer, so a dry run's ledger reads what a real run holds.
template <class T, MemorySpace Space, class Write>
void write_side_arrays(Tensor<T, 2, Space>& buffer, const std::vector<std::int64_t>& rows_per_peer, const Transfer& out,
                       Write write) {
  if constexpr (std::is_same_v<Space, host_space>) {
    const auto dim = buffer.shape()[1];
    for (std::size_t r = 0; r < rows_per_peer.size(); ++r)
      write(r, reinterpret_cast<unsigned char*>(buffer.data() + (out.starts[r] + rows_per_peer[r]) * dim));
  } else if constexpr (holds_data_v<Space>) {
    const auto dim = buffer.shape()[1];
    std::int64_t rows = 0;
    for (auto n : rows_per_peer) rows += n;
    Tensor<T, 2> side(Shape<2>{out.total - rows, dim});
    std::int64_t at = 0;
    for (std::size_t r = 0; r < rows_per_peer.size(); ++r) {
      write(r, reinterpret_cast<unsigned char*>(side.data() + at * dim));
      at += out.rows[r] - rows_per_peer[r];
    }
    const auto here = to_space<Space>(side);
    at = 0;
    for (std::size_t r = 0; r < rows_per_peer.size(); ++r) {
      const auto n = rows_per_peer[r], extra = out.rows[r] - n;
      copy_box(here, Shape<2>{at, 0}, buffer, Shape<2>{out.starts[r] + n, 0}, Shape<2>{extra, dim});
      at += extra;
    }
  }
}

/// The reverse on arrival: read(peer, bytes) reads each peer's side array of `arrived` (laid out
/// by `in`). In place on the host, from a host copy of the side rows on a device, not at all on
/// meta.
template <class T, MemorySpace Space, class Read>
void read_side_arrays(const Tensor<T, 2, Space>& arrived, const std::vector<std::int64_t>& rows_per_peer,
                      const Transfer& in, Read read) {
  if constexpr (std::is_same_v<Space, host_space>) {
    const auto dim = arrived.shape()[1];
    for (std::size_t r = 0; r < rows_per_peer.size(); ++r)
      read(r, reinterpret_cast<const unsigned char*>(arrived.data() + (in.starts[r] + rows_per_peer[r]) * dim));
  } else if constexpr (holds_data_v<Space>) {
    const auto dim = arrived.shape()[1];
    std::int64_t rows = 0;
    for (auto n : rows_per_peer) rows += n;
    auto side = Tensor<T, 2, Space>::uninitialized(Shape<2>{in.total - rows, dim});
    std::int64_t at = 0;
    for (std::size_t r = 0; r < rows_per_peer.size(); ++r) {
      const auto n = rows_per_peer[r], extra = in.rows[r] - n;
      copy_box(arrived, Shape<2>{in.starts[r] + n, 0}, side, Shape<2>{at, 0}, Shape<2>{extra, dim});
      at += extra;
    }
    const auto host = to_space<host_space>(side);
    at = 0;
    for (std::size_t r = 0; r < rows_per_peer.size(); ++r) {
      read(r, reinterpret_cast<const unsigned char*>(host.data() + at * dim));
      at += in.rows[r] - rows_per_peer[r];
    }
  }
}

/// One all_to_all_v of `buffer` out along `out`, received along `in`.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> exchange(Communicator& ep, const Tensor<T, 2, Space>& buffer, const Transfer& out,
                             const Transfer& in) {
  auto arrived = Tensor<T, 2, Space>::uninitialized(Shape<2>{in.total, buffer.shape()[1]});
  ep.all_to_all_v(buffer.span(), std::span<const std::size_t>(out.counts), std::span<const std::size_t>(out.displs),
                  arrived.span(), std::span<const std::size_t>(in.counts), std::span<const std::size_t>(in.displs));
  return arrived;
}

template <class T, MemorySpace Space>
void check_rows(Communicator& ep, const Tensor<T, 2, Space>& rows, std::int64_t expected, std::int64_t dim,
                const char* op, const char* what) {
  if (rows.shape()[0] != expected || rows.shape()[1] != dim)
    ep.fail(op, dtensor::detail::cat(what, " ", to_string(rows.shape()), ", the plan has ", expected, " x ", dim));
}
}  // namespace detail

namespace detail {
/// What one dispatch exchange delivered: the messages as they came (each source's unit rows, then
/// its side array's rows) and, per pair in the sources' side order (by source, then its order:
/// local expert, then unit), the unit it names within its source's units and its gate.
template <class T, MemorySpace Space>
struct ArrivedUnits {
  Tensor<T, 2, Space> messages;  // [the plan's dispatch_in.total, dim]
  std::vector<std::int32_t> unit;
  std::vector<T> gate;
};

/// The dispatch's exchange: each unit's row once to its destination with its pairs' (unit, gate)
/// side array. One all_to_all_v on ep.
template <class T, MemorySpace Space>
ArrivedUnits<T, Space> send_units(Communicator& ep, const DispatchPlan& p, const DispatchOrder& order,
                                  const Tensor<T, 2, Space>& token_rows, std::span<const T> gate_of_slot,
                                  const char* op) {
  if (token_rows.shape()[1] != p.dim || order.units() != p.units_sent() || order.pairs() != p.pairs_sent())
    ep.fail(op, dtensor::detail::cat("token rows ", to_string(token_rows.shape()), ", ", order.units(), " units and ",
                                     order.pairs(), " pairs; the plan sends ", p.units_sent(), " units and ",
                                     p.pairs_sent(), " pairs of ", p.dim));
  const auto R = std::size_t(p.ranks);
  // The message buffer: the units' token rows gathered straight into their places (a side
  // array's rows read token 0 and are then overwritten by the side array).
  const auto send_index = index_tensor<Space>(p.dispatch_out.total, [&](std::int64_t* index) {
    std::fill_n(index, p.dispatch_out.total, 0);
    for (std::size_t r = 0, unit = 0; r < R; ++r)
      for (std::int64_t u = 0; u < p.send_units[r]; ++u, ++unit)
        index[p.dispatch_out.starts[r] + u] = order.token_of_unit[unit];
  });
  auto buffer = gather_rows(token_rows, send_index);
  // The side arrays, peer by peer: the pairs' unit indices (int32), then their gates (T).
  detail::write_side_arrays(buffer, p.send_units, p.dispatch_out, [&](std::size_t r, unsigned char* bytes) {
    const auto n = std::size_t(p.send_pairs[r]), pair = std::size_t(p.first_pair_sent[r]);
    for (std::size_t i = 0; i < n; ++i) {
      std::memcpy(bytes + i * sizeof(std::int32_t), &order.unit_of_pair[pair + i], sizeof(std::int32_t));
      const T gate = gate_of_slot[std::size_t(order.slot_of_pair[pair + i])];
      std::memcpy(bytes + n * sizeof(std::int32_t) + i * sizeof(T), &gate, sizeof(T));
    }
  });
  ArrivedUnits<T, Space> in{exchange(ep, buffer, p.dispatch_out, p.dispatch_in), {}, {}};
  const auto& arrived = in.messages;
  // The arrived side arrays: source s's pairs ordered by its local expert, then unit. A space
  // without data reads none: every source is taken to send what this rank sends itself (as the
  // count exchange assumes there), whose unit indices the order holds.
  auto& unit_in = in.unit;
  auto& gate_in = in.gate;
  unit_in.resize(std::size_t(p.pairs_received()));
  gate_in.resize(unit_in.size());
  const auto& side_first = p.first_pair_received;  // per source: its first pair
  if constexpr (holds_data_v<Space>) {
    detail::read_side_arrays(arrived, p.recv_units, p.dispatch_in, [&](std::size_t s, const unsigned char* bytes) {
      const auto n = std::size_t(p.pairs_from(int(s))), pair = std::size_t(side_first[s]);
      for (std::size_t i = 0; i < n; ++i) {
        std::memcpy(&unit_in[pair + i], bytes + i * sizeof(std::int32_t), sizeof(std::int32_t));
        std::memcpy(&gate_in[pair + i], bytes + n * sizeof(std::int32_t) + i * sizeof(T), sizeof(T));
      }
    });
  } else {
    const auto own = std::size_t(p.expert_offsets[std::size_t(p.rank)]);  // the own pairs to itself start at
    std::size_t own_first = 0;
    for (std::size_t e = 0; e < own; ++e) own_first += std::size_t(order.pairs_per_expert[e]);
    for (std::size_t s = 0; s < R; ++s)
      std::copy_n(order.unit_of_pair.begin() + std::ptrdiff_t(own_first), p.pairs_from(int(s)),
                  unit_in.begin() + side_first[s]);
  }
  for (std::size_t s = 0; s < R; ++s)
    for (std::int64_t i = 0; i < p.pairs_from(int(s)); ++i) {
      const auto unit = unit_in[std::size_t(side_first[s] + i)];
      if (unit < 0 || unit >= p.recv_units[s])
        ep.fail(op, dtensor::detail::cat("pair ", i, " from rank ", s, " names unit ", unit, " of ", p.recv_units[s]));
    }
  return in;
}
}  // namespace detail

/// Sends each unit's row once to its expert rank with its pairs' (unit, gate) side array; returns
/// the pairs' rows grouped by local expert (a row gather of the arrived units: a unit with two
/// choices on the rank feeds both experts) with each pair's unit and gate. token_rows: this
/// rank's tokens [tokens, dim]; gate_of_slot: the routing's gates. One all_to_all_v on ep.
template <class T, MemorySpace Space>
Dispatched<T, Space> dispatch(Communicator& ep, const DispatchPlan& p, const DispatchOrder& order,
                              const Tensor<T, 2, Space>& token_rows, std::span<const T> gate_of_slot) {
  const auto in = detail::send_units(ep, p, order, token_rows, gate_of_slot, "parallel::dispatch");
  const auto& unit_in = in.unit;
  const auto& gate_in = in.gate;
  const auto R = std::size_t(p.ranks), L = std::size_t(p.local_experts);
  const auto& side_first = p.first_pair_received;
  const auto& unit_first = p.expert_units.starts;
  // Grouped order: by local expert, then source, then the source's order.
  Dispatched<T, Space> d;
  d.rows_per_local_expert = p.rows_per_local_expert();
  d.unit_of_pair.resize(unit_in.size());
  d.side_of_pair.resize(unit_in.size());
  std::vector<std::int64_t> arrival_row(unit_in.size());
  auto gate = Tensor<T, 2>::uninitialized(Shape<2>{Extent(unit_in.size()), 1});
  std::size_t g = 0;
  for (std::size_t le = 0; le < L; ++le)
    for (std::size_t s = 0; s < R; ++s) {
      std::int64_t within = 0;  // the source's pairs of local experts before le
      for (std::size_t l = 0; l < le; ++l) within += p.recv_pairs[s * L + l];
      for (std::int64_t i = 0; i < p.recv_pairs[s * L + le]; ++i, ++g) {
        const auto at = std::size_t(side_first[s] + within + i);
        d.side_of_pair[g] = std::int64_t(at);
        d.unit_of_pair[g] = unit_first[s] + unit_in[at];
        arrival_row[g] = p.dispatch_in.starts[s] + unit_in[at];
        gate.data()[g] = gate_in[at];
      }
    }
  d.rows = gather_rows(in.messages, indices_in<Space>(arrival_row));
  d.unit_index = indices_in<Space>(d.unit_of_pair);
  d.gate = into_space<Space>(std::move(gate));
  return d;
}

/// Sends the experts' rows back, one per unit: on this (the experts') rank each unit's row is the
/// sum of its pairs' gate x expert output (in grouped order: by local expert), and the tokens'
/// rank receives them in its send order [units sent, dim]. One all_to_all_v on ep.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> combine(Communicator& ep, const DispatchPlan& p, const Dispatched<T, Space>& d,
                            const Tensor<T, 2, Space>& expert_out) {
  detail::check_rows(ep, expert_out, p.pairs_received(), p.dim, "parallel::combine", "expert rows");
  Tensor<T, 2, Space> units(Shape<2>{p.units_received(), p.dim});
  if constexpr (std::is_same_v<Space, host_space>)  // the gate multiply fused into the scatter-add
    kernels::host::embedding_backward_scaled(units, d.unit_index, expert_out, d.gate);
  else if constexpr (holds_data_v<Space>)
    kernels::embedding_backward(units, d.unit_index, kernels::mul_broadcast(expert_out, d.gate));
  else  // meta: the scatter-add's cost without the product's temporary, as the host holds none
    kernels::embedding_backward(units, d.unit_index, expert_out);
  return detail::exchange(ep, units, p.expert_units, p.token_units);
}

/// The adjoint of combine's exchange: the output gradient of each unit [units sent, dim] to the
/// experts' rank, which gets one row per unit it received [units received, dim] (the experts'
/// rank forms each pair's gradient and gate gradient from it). One all_to_all_v on ep.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> combine_backward(Communicator& ep, const DispatchPlan& p, const Tensor<T, 2, Space>& d_units) {
  detail::check_rows(ep, d_units, p.units_sent(), p.dim, "parallel::combine_backward", "unit gradients");
  return detail::exchange(ep, d_units, p.token_units, p.expert_units);
}

/// What dispatch_backward delivers to the tokens' rank.
template <class T, MemorySpace Space>
struct DispatchGradients {
  // [the plan's gradient_in.total, dim]: the arrived messages as they came, each peer's unit rows
  // (each unit's input gradient, summed over its pairs; in send order) then its side array's
  // rows. Not compacted: the token's rank scatter-adds the unit rows straight from here
  // (token_of_gradient_rows names their tokens and skips the side rows).
  Tensor<T, 2, Space> rows;
  std::vector<T> gates;  // [pairs sent]: each sent pair's gate gradient (empty on a space without data)
};

/// The token of each row dispatch_backward delivers (DispatchGradients::rows): a unit row's
/// token, -1 for a side array's row, which kernels::embedding_shard_backward skips.
template <MemorySpace Space>
Tensor<std::int64_t, 1, Space> token_of_gradient_rows(const DispatchPlan& p, const DispatchOrder& order) {
  return index_tensor<Space>(p.gradient_in.total, [&](std::int64_t* token) {
    std::size_t unit = 0;
    for (std::size_t r = 0; r < std::size_t(p.ranks); ++r) {
      const auto first = p.gradient_in.starts[r], units = p.send_units[r];
      for (std::int64_t u = 0; u < units; ++u) token[first + u] = order.token_of_unit[unit++];
      std::fill_n(token + first + units, p.gradient_in.rows[r] - units, std::int64_t(-1));
    }
  });
}

namespace detail {
/// dispatch_backward's exchange: `buffer` [the plan's gradient_out.total, dim] holds each received
/// unit's input gradient in its source's message rows; the pairs' gate gradients (in the sources'
/// side order; none on a space without data) are written after them, and the messages go back to
/// the tokens' ranks. One all_to_all_v on ep.
template <class T, MemorySpace Space>
DispatchGradients<T, Space> return_gradients(Communicator& ep, const DispatchPlan& p, Tensor<T, 2, Space> buffer,
                                             const std::vector<T>& gates_in_side_order) {
  if constexpr (holds_data_v<Space>) {
    write_side_arrays(buffer, p.recv_units, p.gradient_out, [&](std::size_t s, unsigned char* bytes) {
      std::memcpy(bytes, gates_in_side_order.data() + p.first_pair_received[s],
                  std::size_t(p.pairs_from(int(s))) * sizeof(T));
    });
  }
  DispatchGradients<T, Space> out{exchange(ep, buffer, p.gradient_out, p.gradient_in), {}};
  if constexpr (holds_data_v<Space>) {
    out.gates.resize(std::size_t(p.pairs_sent()));
    read_side_arrays(out.rows, p.send_units, p.gradient_in, [&](std::size_t r, const unsigned char* bytes) {
      std::memcpy(out.gates.data() + p.first_pair_sent[r], bytes, std::size_t(p.send_pairs[r]) * sizeof(T));
    });
  }
  return out;
}
}  // namespace detail

/// The adjoint of dispatch: the pairs' input gradients [pairs received, dim] (grouped), summed per
/// unit on this rank, and the pairs' gate gradients (host, grouped order) travel back with them as
/// a side array. One all_to_all_v on ep.
template <class T, MemorySpace Space>
DispatchGradients<T, Space> dispatch_backward(Communicator& ep, const DispatchPlan& p, const Dispatched<T, Space>& d,
                                              const Tensor<T, 2, Space>& d_rows, std::span<const T> d_gates) {
  const char* op = "parallel::dispatch_backward";
  detail::check_rows(ep, d_rows, p.pairs_received(), p.dim, op, "pair gradients");
  const bool with_gates = holds_data_v<Space>;
  if (with_gates && std::int64_t(d_gates.size()) != p.pairs_received())
    ep.fail(op, dtensor::detail::cat(d_gates.size(), " gate gradients for ", p.pairs_received(), " pairs"));
  const auto R = std::size_t(p.ranks), L = std::size_t(p.local_experts);
  const auto& unit_first = p.expert_units.starts;  // per source: its first unit
  // The units' input gradients summed straight into their message rows: each pair's row is its
  // unit's row in its source's message, walking the grouped order (by local expert, then
  // source) as dispatch built it.
  const auto message_row = index_tensor<Space>(p.pairs_received(), [&](std::int64_t* row) {
    std::size_t g = 0;
    for (std::size_t le = 0; le < L; ++le)
      for (std::size_t s = 0; s < R; ++s)
        for (std::int64_t i = 0; i < p.recv_pairs[s * L + le]; ++i, ++g)
          row[g] = p.gradient_out.starts[s] + d.unit_of_pair[g] - unit_first[s];
  });
  Tensor<T, 2, Space> buffer(Shape<2>{p.gradient_out.total, p.dim});
  kernels::embedding_backward(buffer, message_row, d_rows);
  std::vector<T> in_side_order(d_gates.size());
  for (std::size_t g = 0; g < d_gates.size(); ++g) in_side_order[std::size_t(d.side_of_pair[g])] = d_gates[g];
  return detail::return_gradients(ep, p, std::move(buffer), in_side_order);
}

}  // namespace dtensor::parallel
