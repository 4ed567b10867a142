// dtensor/parallel/node_dispatch.hpp — the node-level (two-stage) dispatch and combine of expert
// parallelism: DeepSeek-V3's, where a token crosses the network once per node it reaches and is
// forwarded inside the node (over NVLink) to the expert ranks there.
//
//   auto nodes = parallel::split_into_nodes(ep_comm, /*node_size=*/8);    // 2 splits of ep (setup)
//   auto order = parallel::order_by_node(expert_of_slot, kept, topk, experts, ep_comm.size(), 8);
//   auto plan = parallel::exchange_counts<T, Space>(*nodes.across, order, dim);     // all_to_all
//   auto fw = parallel::dispatch_across(nodes, plan, order, tokens, gates, topk, experts);
//                                                // all_to_all_v across + all_to_all within (counts)
//   auto d = parallel::dispatch(*nodes.within, fw.plan, fw.order, fw.messages, fw.gates());
//   ... the experts on d as after the one-stage dispatch ...
//   auto units = parallel::combine_across(*nodes.across, plan, fw,
//                                         parallel::combine(*nodes.within, fw.plan, d, out));
//   combine_backward_nodes / dispatch_backward_across: the adjoints (with combine_backward and
//   dispatch_backward on `within` between them)
//
// The expert group of E ranks is seen as N = E / L nodes of L consecutive ranks (rank = node x L
// + local index), which is how make_expert_mesh lays out ep (its ranks consecutive in the world)
// and how a launcher fills nodes. Two sub-groups of ep, split once at setup: `across` — the N
// ranks with this rank's local index, one per node (rank = node) — and `within` — this node's L
// ranks (rank = local index).
//
// Stage 1 (across): the merged dispatch of parallel/expert_parallel.hpp with the nodes as the
// destinations: a unit is a (token, node) pair, sent to the rank of that node with the sender's
// local index, and its pairs (the kept choices on that node: the node's expert, the gate) travel
// in the side array. Stage 2 (within): on arrival the node's peer routes the arrived units as
// tokens (each with its pairs as its choices, at most top-k) and runs the one-stage merged
// dispatch over the node's L ranks: a (unit, expert rank) row per rank. Combine reverses it: the
// expert ranks send back a row per stage-2 unit (its gated sum, as one-stage), the node's peer
// sums those of one stage-1 unit (a scatter-add), and one row per (token, node) crosses the
// network back. Backward: the output gradient of each (token, node) across, forwarded inside the
// node; the experts' input gradients summed per stage-2 unit on the expert rank, then per (token,
// node) on the node's peer, and sent back across with the pairs' gate gradients.
//
// Collectives per MoE layer: forward 2 all_to_all (counts: across, then within) + 4 all_to_all_v
// (dispatch across, dispatch within, combine within, combine across); backward 4 all_to_all_v
// (the same groups in reverse). Across, the rows are one per (token, node) — node-limited
// routing (M groups of a node's experts) bounds them by M per token — instead of one per (token,
// expert rank). The sum order of a token's output changes (per node, then over nodes), so a
// result equals the one-stage dispatch's to rounding; with L = 1 (a node per rank) or L = E (one
// node) the sums are the one-stage ones, bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/kernels/embedding.hpp"
#include "dtensor/parallel/expert_parallel.hpp"

namespace dtensor::parallel {

/// The expert group as nodes of `node_size` consecutive ranks: its two sub-groups.
struct ExpertNodes {
  // Labelled as mesh dimensions (the CommLog's groups; sim::Topology places them): "ep_across" and
  // "ep_node" for an expert dimension "ep", which the expert mesh factors as (ep_across, ep_node).
  CommPtr across;  // this rank's local index on every node ("ep_across": nodes ranks; rank = node)
  CommPtr within;  // this rank's node ("ep_node": node_size ranks; rank = the local index)
  int nodes = 1, node_size = 1;
};

/// Splits the expert group `ep` into nodes of `node_size` consecutive ranks. Collective over ep:
/// two splits of known groups (so a sim world builds them too).
inline ExpertNodes split_into_nodes(Communicator& ep, int node_size) {
  if (node_size < 1 || ep.size() % node_size != 0)
    ep.fail("parallel::split_into_nodes",
            dtensor::detail::cat("an expert group of ", ep.size(), " ranks does not split into nodes of ", node_size,
                                 " ranks (the node size must be at least 1 and divide the expert size)"));
  ExpertNodes n;
  n.node_size = node_size;
  n.nodes = ep.size() / node_size;
  const int node = ep.rank() / node_size, local = ep.rank() % node_size;
  n.across = ep.split(local, node, n.nodes);
  n.across->set_label(ep.label() + "_across");
  n.within = ep.split(node, local, node_size);
  n.within->set_label(ep.label() + "_node");
  return n;
}

/// Stage 1's send order: the kept slots merged by destination node (a unit per (token, node)).
inline DispatchOrder order_by_node(std::span<const std::int32_t> expert_of_slot, std::span<const std::uint8_t> kept,
                                   std::int64_t topk, std::int64_t experts, int ranks, int node_size) {
  if (experts < 1 || node_size < 1 || ranks < 1 || ranks % node_size != 0)
    throw Error("parallel::order_by_node",
                dtensor::detail::cat(experts, " experts over ", ranks, " expert ranks in nodes of ", node_size,
                                     " (the node size must divide the expert size)"));
  return order_by_rank(expert_of_slot, kept, topk, node_expert_offsets(experts, ranks, node_size));
}

/// What stage 1 delivered to a node's peer, and stage 2's routing of it inside the node.
template <class T, MemorySpace Space>
struct Forwarded {
  // Stage 1's arrived messages (each source's unit rows, then its side array's rows): stage 2's
  // tokens are their rows. Emptied once stage 2 has sent them.
  Tensor<T, 2, Space> messages;
  DispatchOrder order;                     // stage 2: the arrived units to the node's expert ranks
  DispatchPlan plan;                       // stage 2's counts, exchanged within the node
  std::vector<T> gate_of_slot;             // stage 2's gates (slot = message row x topk + choice)
  std::vector<std::int64_t> slot_of_side;  // [stage-1 pairs received, in the sources' side order]: its stage-2 slot
  std::vector<std::int64_t> unit_of_forwarded;     // [stage-2 units sent]: the stage-1 unit it carries (received order)
  Tensor<std::int64_t, 1, Space> forwarded_index;  // unit_of_forwarded, in the space

  std::span<const T> gates() const { return gate_of_slot; }
};

/// Stage 1 and stage 2's count exchange: each (token, node) unit across to the node's peer with
/// its pairs (node expert, gate), and there the arrived units' send order to the node's expert
/// ranks and its counts. One all_to_all_v across, one all_to_all within.
template <class T, MemorySpace Space>
Forwarded<T, Space> dispatch_across(const ExpertNodes& nodes, const DispatchPlan& p, const DispatchOrder& order,
                                    const Tensor<T, 2, Space>& token_rows, std::span<const T> gate_of_slot,
                                    std::int64_t topk, std::int64_t experts) {
  const char* op = "parallel::dispatch_across";
  auto& across = *nodes.across;
  auto in = detail::send_units(across, p, order, token_rows, gate_of_slot, op);
  Forwarded<T, Space> f;
  const auto rows = std::size_t(p.dispatch_in.total), K = std::size_t(topk), Le = std::size_t(p.local_experts);
  // The arrived pairs as stage 2's routing: a unit's pairs are its choices, in the order of its
  // node experts (a source's side array is ordered by node expert, then unit).
  std::vector<std::int32_t> expert_of_slot(rows * K, 0);
  std::vector<std::uint8_t> kept(rows * K, 0);
  std::vector<std::int64_t> choices(rows, 0);
  f.gate_of_slot.assign(rows * K, T(0));
  f.slot_of_side.resize(in.unit.size());
  for (std::size_t s = 0, at = 0; s < std::size_t(p.ranks); ++s)
    for (std::size_t le = 0; le < Le; ++le)
      for (std::int64_t i = 0; i < p.recv_pairs[s * Le + le]; ++i, ++at) {
        const auto row = std::size_t(p.dispatch_in.starts[s] + in.unit[at]);
        if (std::size_t(choices[row]) == K)
          across.fail(
              op, dtensor::detail::cat("unit ", in.unit[at], " from node ", s, " has more than top-", topk, " pairs"));
        const auto slot = row * K + std::size_t(choices[row]++);
        expert_of_slot[slot] = std::int32_t(le);
        kept[slot] = 1;
        f.gate_of_slot[slot] = in.gate[at];
        f.slot_of_side[at] = std::int64_t(slot);
      }
  // This node's experts over its ranks, counted from the node's first.
  const auto per_rank = expert_offsets_of(experts, nodes.nodes * nodes.node_size);
  const auto first = std::size_t(across.rank() * nodes.node_size);
  std::vector<std::int64_t> offsets(std::size_t(nodes.node_size) + 1);
  for (std::size_t l = 0; l < offsets.size(); ++l) offsets[l] = per_rank[first + l] - per_rank[first];
  f.order = order_by_rank(expert_of_slot, kept, topk, std::move(offsets));
  f.plan = exchange_counts<T, Space>(*nodes.within, f.order, p.dim);
  // Each stage-2 unit's stage-1 unit, in received order (sources in rank order).
  std::vector<std::int64_t> unit_of_row(rows, -1);
  for (std::size_t s = 0; s < std::size_t(p.ranks); ++s)
    for (std::int64_t u = 0; u < p.recv_units[s]; ++u)
      unit_of_row[std::size_t(p.dispatch_in.starts[s] + u)] = p.expert_units.starts[s] + u;
  f.unit_of_forwarded.resize(f.order.token_of_unit.size());
  for (std::size_t u = 0; u < f.unit_of_forwarded.size(); ++u)
    f.unit_of_forwarded[u] = unit_of_row[std::size_t(f.order.token_of_unit[u])];
  f.forwarded_index = indices_in<Space>(f.unit_of_forwarded);
  f.messages = std::move(in.messages);
  return f;
}

/// Combine's last stage on a node's peer: the node's rows (one per stage-2 unit, as combine over
/// `within` returned them) summed per (token, node) unit, which go back across: the tokens' rank
/// gets [units sent, dim] in its stage-1 send order. One all_to_all_v across.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> combine_across(Communicator& across, const DispatchPlan& p, const Forwarded<T, Space>& f,
                                   const Tensor<T, 2, Space>& from_node) {
  detail::check_rows(across, from_node, f.plan.units_sent(), p.dim, "parallel::combine_across", "node rows");
  Tensor<T, 2, Space> units(Shape<2>{p.units_received(), p.dim});
  kernels::embedding_backward(units, f.forwarded_index, from_node);
  return detail::exchange(across, units, p.expert_units, p.token_units);
}

/// The adjoint of combine_across and of combine within: each (token, node) unit's output gradient
/// [units sent, dim] across to the node's peer, which forwards it to the node's expert ranks: the
/// expert rank gets a row per stage-2 unit it received. Two all_to_all_v: across, within.
template <class T, MemorySpace Space>
Tensor<T, 2, Space> combine_backward_nodes(const ExpertNodes& nodes, const DispatchPlan& p,
                                           const Forwarded<T, Space>& f, const Tensor<T, 2, Space>& d_units) {
  const auto at_peer = combine_backward(*nodes.across, p, d_units);
  return combine_backward(*nodes.within, f.plan, gather_rows(at_peer, f.forwarded_index));
}

/// The adjoint of dispatch_across, on a node's peer: the node's input gradients (dispatch_backward
/// over `within`: a row per stage-2 unit and its pairs' gate gradients) summed per (token, node)
/// unit and sent back across with the stage-1 pairs' gate gradients: the tokens' rank gets what
/// dispatch_backward delivers after the one-stage dispatch. One all_to_all_v across.
template <class T, MemorySpace Space>
DispatchGradients<T, Space> dispatch_backward_across(Communicator& across, const DispatchPlan& p,
                                                     const Forwarded<T, Space>& f,
                                                     const DispatchGradients<T, Space>& from_node) {
  const auto& q = f.plan;
  // Each received stage-1 unit's row in the message back to its source.
  std::vector<std::int64_t> message_row(std::size_t(p.units_received()));
  for (std::size_t s = 0; s < std::size_t(p.ranks); ++s)
    for (std::int64_t u = 0; u < p.recv_units[s]; ++u)
      message_row[std::size_t(p.expert_units.starts[s] + u)] = p.gradient_out.starts[s] + u;
  // The node's unit rows summed into them (its side arrays' rows skipped: -1).
  const auto into = index_tensor<Space>(q.gradient_in.total, [&](std::int64_t* index) {
    std::size_t unit = 0;
    for (std::size_t r = 0; r < std::size_t(q.ranks); ++r) {
      const auto start = q.gradient_in.starts[r], units = q.send_units[r];
      for (std::int64_t u = 0; u < units; ++u) index[start + u] = message_row[std::size_t(f.unit_of_forwarded[unit++])];
      std::fill_n(index + start + units, q.gradient_in.rows[r] - units, std::int64_t(-1));
    }
  });
  Tensor<T, 2, Space> buffer(Shape<2>{p.gradient_out.total, p.dim});
  kernels::embedding_shard_backward(buffer, into, from_node.rows, Extent(0));
  // The stage-1 pairs' gate gradients: each is its stage-2 pair's (none on a space without data).
  std::vector<T> gates;
  if (!from_node.gates.empty()) {
    std::vector<std::int64_t> pair_of_slot(f.gate_of_slot.size(), -1);
    for (std::size_t i = 0; i < f.order.slot_of_pair.size(); ++i)
      pair_of_slot[std::size_t(f.order.slot_of_pair[i])] = std::int64_t(i);
    gates.resize(f.slot_of_side.size());
    for (std::size_t at = 0; at < gates.size(); ++at)
      gates[at] = from_node.gates[std::size_t(pair_of_slot[std::size_t(f.slot_of_side[at])])];
  }
  return detail::return_gradients(across, p, std::move(buffer), gates);
}

}  // namespace dtensor::parallel
