// dtensor/parallel/moe.hpp — the mixture-of-experts feed-forward: a router, top-k token-choice routing
// and E expert feed-forwards (GELU MLPs or SwiGLUs: nn::ExpertFfn), expert parallel over the expert mesh.
//
//   using Dense = DeviceMesh<"dp", "tp">;  using EMesh = DeviceMesh<"edp", "ep", "tp">;
//   auto emesh = parallel::make_expert_mesh<EMesh>(dense, /*ep=*/2);
//   nn::MoE<float, Dense, EMesh> moe("h.0.moe", dense, emesh,
//       {.dim = 64, .hidden = 256, .router = {.experts = 8, .topk = 2, .capacity_factor = 1.25}}, seed);
//   nn::MoE<float, Dense, EMesh, nn::ExpertFfn::swiglu> llama_moe(...);   // SwiGLU experts (Mixtral, DeepSeek)
//   auto [y, saved] = moe.forward(x);             // x [B, T, C]: tokens<Dense>, as nn::MLP takes
//   saved.routing.load, .dropped, .aux_loss ...   // this rank's routing statistics (nn/router.hpp)
//   auto [dx, wctx] = moe.backward_input(std::move(saved), dy);  moe.backward_weight(std::move(wctx));
//
// Forward, per rank: logits = router(x) (an nn::Linear [E, C] without bias on the dense mesh),
// nn::route (scores, top-k, gates, capacity per sequence: no communication), then the boundary
// ops of parallel/expert_parallel.hpp on the expert mesh's "ep" group, merged by destination: a
// token's row travels once per expert rank its kept choices reach (a unit), with its (local
// expert, gate) pairs in a side array. The count exchange (one all_to_all), dispatch (one
// all_to_all_v of the units and side arrays; on arrival a row gather feeds each unit to each of
// its local experts), the GEMMs of each local expert (nn::GroupedExperts), combine (each unit's
// gate x expert output summed on the expert rank, one all_to_all_v of a row per unit back), and
// y[t] = the sum of its units' rows — y[t] = sum_j gate_tj * expert_j(x_t) over the kept choices,
// in an order that is the same on every expert size. A token whose every choice was dropped gets
// y = 0: in a block, its residual passes through.
//
// Memory spaces: the MoE runs in its meshes' space. Routing decides sizes, so it runs on the host
// (a device's logits, [tokens, experts], are copied there; so are the gates' gradients, [pairs]);
// the rows stay in the space: the units are a row gather of the tokens, the experts' rows a row
// gather of the arrived units, the sums their adjoints (scatter-adds: the embedding kernels), and
// the gates a broadcast multiply. On meta (a dry run) the routing is the balanced one
// nn::route_balanced assumes (group-limited as the config is), and the auxiliary losses are not
// computed (no scores). Backward: combine's adjoint (one all_to_all_v of a row per unit: the
// output gradient to the expert rank, where each pair's row gradient gate x dy and gate gradient
// dy . expert output are formed), the experts, the dispatch's adjoint (one all_to_all_v of a row
// per unit, the pairs' gate gradients in a side array), the gates' and the auxiliary losses'
// gradient into the router (nn::route_backward, with the config's coefficients), and the router's
// backward. So per MoE layer: forward 1 all_to_all (counts, int64 x ep x (1 + ceil(experts / ep)))
// + 2 all_to_all_v; backward 2 all_to_all_v (the forward's counts are reused); each all_to_all_v
// moves max(sent, received) rows x C elements on a rank, a row per (token, expert rank) — not per
// (token, choice) — and, for the dispatch and its adjoint, the side arrays' rows
// (DispatchPlan; docs/expert-parallel.md).
//
// The node-level dispatch (MoEConfig::node_size = L > 0; parallel/node_dispatch.hpp): "ep" as
// nodes of L consecutive ranks, split once at construction into "ep_across" and "ep_node". The
// send order and plan are then by node (a unit per (token, node), across the network), the node's
// peer forwards the arrived units to the node's expert ranks (one-stage, over "ep_node"), and
// combine and the adjoints reverse it; this rank's tokens see the same kind of plan either way.
// Per layer: forward 2 all_to_all + 4 all_to_all_v, backward 4 all_to_all_v.
//
// Parameters: the router's on the dense mesh (replicated; gradient Partial<sum> on the data
// dimension) and the experts' on the expert mesh (Shard<0> on "ep"; gradient Partial<sum> on
// "edp"). They live on two meshes of different rank, so collect them per part:
// nn::collect(moe.router(), dense_list); nn::collect(moe.experts(), expert_list), and reduce
// each with DataParallel over its mesh. for_each_parameter / zero_grad walk both.
#pragma once

#include <charconv>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "dtensor/core/meta_space.hpp"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/kernels/embedding.hpp"
#include "dtensor/kernels/reduce.hpp"

#include "dtensor/distributed/settings_agreement.hpp"
#include "dtensor/nn/aux_losses.hpp"
#include "dtensor/nn/linear.hpp"
#include "dtensor/nn/router.hpp"
#include "dtensor/parallel/expert_parallel.hpp"
#include "dtensor/parallel/experts.hpp"
#include "dtensor/parallel/node_dispatch.hpp"

namespace dtensor::nn {

struct MoEConfig {
  Extent dim = 0;
  Extent hidden = 0;  // each expert's MLP width
  RouterConfig router;
  double init_std = 0.02;
  double out_std = 0.02;
  // Ranks per node of the expert group for the node-level dispatch (parallel/node_dispatch.hpp:
  // a token crosses the network once per node it reaches and is forwarded inside it); it must
  // divide the expert size. 0: the one-stage dispatch (a row per (token, expert rank) over "ep").
  int node_size = 0;
};

template <kernels::host::FloatElement T, MeshType Mesh, parallel::ExpertMeshType EMesh,
          ExpertFfn F = ExpertFfn::gelu_mlp>
class MoE {
  static_assert(require_dense_roles<"nn::MoE", Mesh>());
  static_assert(std::is_same_v<mesh_space_t<Mesh>, mesh_space_t<EMesh>>,
                "nn::MoE: the dense mesh and the expert mesh must be in the same memory space");

 public:
  using space = mesh_space_t<Mesh>;
  using Router = Linear<T, Mesh, Replicated<>>;
  using Experts = GroupedExperts<T, EMesh, F>;
  using X = DTensor<T, 3, Mesh, tokens<Mesh>>;
  using In = X;
  using Out = X;
  using Rows = Tensor<T, 2, space>;
  static constexpr bool auxiliary_losses = true;  // load balancing and z-loss (nn/aux_losses.hpp)

  struct Saved {
    typename Router::Saved router;
    Routing<T> routing;
    parallel::DispatchOrder order;
    parallel::DispatchPlan plan;
    Tensor<std::int64_t, 1, space> token_of_unit;  // [units sent]: the token each unit carries
    parallel::Dispatched<T, space> received;       // the pairs this rank's experts ran (rows emptied)
    typename Experts::Saved experts;
    Rows expert_out;  // [pairs received, dim]: the experts' outputs, before the gates (the gates' gradient)
    // The node-level dispatch's stage 2 (set when config().node_size is): order and plan above
    // are then stage 1's, by node, and received is what stage 2 delivered inside the node.
    std::optional<parallel::Forwarded<T, space>> forwarded;
  };
  using WeightCtx = std::tuple<typename Router::WeightCtx, typename Experts::WeightCtx>;  // children() order

  MoE() = default;
  /// `nodes`: the node-level dispatch's groups (config node_size > 0), split once for a model's
  /// MoE blocks (models::MoELayers does: not a pair of communicators per layer); without them this
  /// MoE splits its own (collective over "ep").
  MoE(std::string name, const Mesh& mesh, const EMesh& emesh, MoEConfig c, std::uint64_t seed,
      std::optional<parallel::ExpertNodes> nodes = {})
      : name_(std::move(name)),
        c_(checked(c, mesh, emesh)),
        emesh_(emesh),
        router_(name_ + ".router", mesh, c.dim, c.router.experts, seed, {.bias = false, .init_std = c.init_std}),
        experts_(name_ + ".experts", emesh,
                 {.experts = c.router.experts,
                  .dim = c.dim,
                  .hidden = c.hidden,
                  .init_std = c.init_std,
                  .out_std = c.out_std},
                 seed + 1) {
    if (c_.node_size == 0) return;
    auto& ep = parallel::expert_group(emesh_);
    if (nodes && (nodes->node_size != c_.node_size || nodes->nodes * nodes->node_size != ep.size()))
      ep.fail("nn::MoE",
              dtensor::detail::cat(name_, ": node groups of ", nodes->nodes, " nodes of ", nodes->node_size,
                                   " ranks for node size ", c_.node_size, " over an expert group of ", ep.size()));
    nodes_ = nodes ? std::move(nodes) : parallel::split_into_nodes(ep, c_.node_size);
  }

  /// y = sum over kept choices of gate * expert(x). Collectives: 1 all_to_all + 2 all_to_all_v on "ep",
  /// a row per (token, expert rank) each
  /// (and, under context parallelism, the aux loss's all-reduce on the context group).
  Fwd<X, Saved> forward(const X& x) const {
    detail::check(x.extent(2) == c_.dim, "nn::MoE::forward", x.mesh(), name_, ": input ", to_string(x.shape()),
                  " does not have ", c_.dim, " features");
    auto [logits, router_saved] = router_.forward(x);
    const auto& xl = x.to_local();
    const Extent batch = xl.shape()[0], seq = xl.shape()[1], C = c_.dim;
    Saved s{std::move(router_saved),
            route_tokens(logits, batch, seq, x.extent(0), x.extent(1), x.mesh()),
            {},
            {},
            {},
            {},
            {},
            {},
            {}};
    // The weighted auxiliary losses (this rank's shares) into the enclosing forward's loss (nn/aux_losses.hpp).
    add_auxiliary_loss(c_.router.aux_loss_coeff * s.routing.aux_loss + c_.router.z_loss_coeff * s.routing.z_loss);
    auto& ep = parallel::expert_group(emesh_);
    const std::span<const T> gates(s.routing.gate);
    if (nodes_) {  // stage 1 across the nodes, stage 2 inside this node
      s.order = parallel::order_by_node(s.routing.expert, s.routing.kept, c_.router.topk, c_.router.experts, ep.size(),
                                        nodes_->node_size);
      s.plan = parallel::exchange_counts<T, space>(*nodes_->across, s.order, C);
      auto& f = s.forwarded.emplace(parallel::dispatch_across(*nodes_, s.plan, s.order, token_rows(xl), gates,
                                                              c_.router.topk, c_.router.experts));
      s.received = parallel::dispatch(*nodes_->within, f.plan, f.order, f.messages, f.gates());
      f.messages = {};
    } else {
      s.order = parallel::order_by_rank(s.routing.expert, s.routing.kept, c_.router.topk, c_.router.experts, ep.size());
      s.plan = parallel::exchange_counts<T, space>(ep, s.order, C);
      s.received = parallel::dispatch(ep, s.plan, s.order, token_rows(xl), gates);
    }
    s.token_of_unit = parallel::indices_in<space>(s.order.token_of_unit);
    auto [rows, experts_saved] = experts_.forward(std::move(s.received.rows), s.received.rows_per_local_expert);
    s.received.rows = {};
    s.experts = std::move(experts_saved);
    auto back = parallel::combine(experts_group(), experts_plan(s), s.received, rows);
    if (nodes_) back = parallel::combine_across(*nodes_->across, s.plan, *s.forwarded, back);
    s.expert_out = std::move(rows);
    // y[t] = the sum of its units' rows (each a sum of gate x expert output on its expert rank):
    // the scatter-add that is the gather's adjoint, in send order (by rank, then token).
    Rows y(Shape<2>{batch * seq, C});
    kernels::embedding_backward(y, s.token_of_unit, back);
    return {X(x.mesh(), x.shape(), std::move(y).template reshape<3>(xl.shape())), std::move(s)};
  }

  /// Context parallelism: each sequence split over the context ranks, whose choice counts the aux
  /// loss sums (one all-reduce of batch x experts doubles on the context group; nn/router.hpp).
  /// `full_seq`: the global sequence length (the context ranks' parts may differ by one token).
  static RouteContext route_context(const Mesh& mesh, Extent full_seq) {
    if constexpr (has_role<Mesh, Role::context>) {
      constexpr std::size_t cp = role_dim<Mesh, Role::context>;
      if (mesh.size(cp) > 1)
        return {.parts = mesh.size(cp),
                .sum_over_parts = [&mesh](std::span<double> v) { mesh.group(cp).all_reduce(v, ReduceOp::sum); },
                .full_seq = full_seq};
    }
    return {};
  }

  /// dx through the experts and the router (gates, aux and z losses). Collectives: 2 all_to_all_v on "ep".
  Bwd<X, WeightCtx> backward_input(Saved s, const X& dy) const {
    const auto& dyl = dy.to_local();
    const Extent C = c_.dim, tokens = s.routing.tokens;
    detail::check(dyl.numel() == tokens * C && dy.extent(2) == C, "nn::MoE::backward_input", dy.mesh(), name_,
                  ": gradient ", to_string(dy.shape()), " for ", tokens, " tokens of ", C, " features");
    // Each unit's output gradient to its expert rank, there each pair's: its rows' gradient is
    // gate x dy[its unit], its gate's dy[its unit] . expert output.
    const auto dy_units = parallel::gather_rows(token_rows(dyl), s.token_of_unit);
    const auto dy_in = nodes_ ? parallel::combine_backward_nodes(*nodes_, s.plan, *s.forwarded, dy_units)
                              : parallel::combine_backward(parallel::expert_group(emesh_), s.plan, dy_units);
    const auto dy_of_pair = parallel::gather_rows(dy_in, s.received.unit_index);
    const auto dgate_of_pair = on_host(kernels::sum(kernels::mul(dy_of_pair, s.expert_out), 1));
    auto [dgrouped, experts_w] =
        experts_.backward_input(std::move(s.experts), kernels::mul_broadcast(dy_of_pair, s.received.gate));
    auto back = parallel::dispatch_backward(experts_group(), experts_plan(s), s.received, dgrouped,
                                            std::span<const T>(dgate_of_pair));
    if (nodes_) back = parallel::dispatch_backward_across(*nodes_->across, s.plan, *s.forwarded, back);
    auto [dx, router_w] =
        router_.backward_input(std::move(s.router), router_gradient(s.routing, gate_gradients(s, back.gates), dy));
    // dx += the tokens' share of the experts' input gradient: a scatter-add in send order,
    // straight from the arrived messages (their side arrays' rows skipped).
    auto dx_rows = token_rows(dx.local());
    kernels::embedding_shard_backward(dx_rows, parallel::token_of_gradient_rows<space>(s.plan, s.order), back.rows,
                                      Extent(0));
    return {std::move(dx), WeightCtx{std::move(router_w), std::move(experts_w)}};
  }

  void backward_weight(WeightCtx w) { backward_weight_children(*this, std::move(w)); }

  auto children() { return std::tie(router_, experts_); }
  Router& router() noexcept { return router_; }
  Experts& experts() noexcept { return experts_; }
  const MoEConfig& config() const noexcept { return c_; }
  const EMesh& expert_mesh() const noexcept { return emesh_; }

 private:
  /// The group the experts' rows arrive over and its plan: "ep", or the node's ranks under the
  /// node-level dispatch (its stage 2).
  Communicator& experts_group() const { return nodes_ ? *nodes_->within : parallel::expert_group(emesh_); }
  static const parallel::DispatchPlan& experts_plan(const Saved& s) { return s.forwarded ? s.forwarded->plan : s.plan; }

  /// The routing of this rank's tokens: nn::route on the logits (brought to the host: a
  /// [tokens, experts] copy on a device), or on a space without data (a dry run) the balanced
  /// routing it assumes (nn::route_balanced).
  template <class Logits>
  Routing<T> route_tokens(const Logits& logits, Extent batch, Extent seq, Extent global_batch, Extent full_seq,
                          const Mesh& mesh) const {
    if (!holds_data_v<space> || c_.router.force_balanced) {
      return route_balanced<T>(batch, seq, global_batch, c_.router, route_context(mesh, full_seq));
    } else if constexpr (std::is_same_v<space, host_space>) {
      return route(logits.to_local().span(), batch, seq, global_batch, c_.router, route_context(mesh, full_seq));
    } else {
      const auto host = to_space<host_space>(logits.to_local());
      return route(host.span(), batch, seq, global_batch, c_.router, route_context(mesh, full_seq));
    }
  }

  /// A [batch, seq, dim] tensor as its [tokens, dim] rows (a view).
  static Rows token_rows(const Tensor<T, 3, space>& t) {
    return view_of(t, 0, Shape<2>{t.extent(0) * t.extent(1), t.extent(2)});
  }

  /// A [pairs, 1] tensor's values on the host (none on a space without data).
  static std::vector<T> on_host(const Rows& per_pair) {
    if constexpr (std::is_same_v<space, host_space>) return {per_pair.data(), per_pair.data() + per_pair.numel()};
    else if constexpr (holds_data_v<space>) {
      const auto host = to_space<host_space>(per_pair);
      return {host.data(), host.data() + host.numel()};
    } else return {};
  }

  /// Each slot's gate gradient (0 for a dropped one) from the sent pairs' (dispatch_backward's).
  std::vector<T> gate_gradients(const Saved& s, const std::vector<T>& per_pair) const {
    std::vector<T> dgate(s.routing.expert.size(), T(0));
    for (std::size_t p = 0; p < per_pair.size(); ++p) dgate[std::size_t(s.order.slot_of_pair[p])] = per_pair[p];
    return dgate;
  }

  /// The router's output gradient: the gates' and the auxiliary losses' (nn::route_backward, on
  /// the host), weighted by the loss scale; none to compute on a space without data.
  typename Router::Out router_gradient(const Routing<T>& r, const std::vector<T>& dgate, const X& dy) const {
    const Shape<3> global{dy.extent(0), dy.extent(1), c_.router.experts};
    const Shape<3> local{dy.to_local().extent(0), dy.to_local().extent(1), c_.router.experts};
    if constexpr (!holds_data_v<space>) {
      return typename Router::Out(dy.mesh(), global, Tensor<T, 3, space>::uninitialized(local));
    } else if (r.scores.empty()) {  // balanced routing: the gates do not depend on the logits
      return typename Router::Out(dy.mesh(), global, Tensor<T, 3, space>(local));
    } else {
      // The auxiliary losses' gradients, weighted like the loss's: the dloss of the enclosing
      // backward (nn::auxiliary_loss_scale; a pipeline's 1/M per micro-batch, 1 by default). The
      // gates' gradient comes through dy and is weighted already.
      RouterConfig weighted = c_.router;
      weighted.aux_loss_coeff *= auxiliary_loss_scale();
      weighted.z_loss_coeff *= auxiliary_loss_scale();
      auto d = route_backward(r, std::span<const T>(dgate), weighted);
      return typename Router::Out(dy.mesh(), global, to_space<space>(Tensor<T, 3>::view(d.data(), local)));
    }
  }

  /// c, once the router's configuration and the expert mesh are checked.
  /// The shortest text that reads back as `v`: values that differ never print alike.
  static std::string shortest(double v) {
    char buf[40];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    return std::string(buf, end);
  }
  static const MoEConfig& checked(const MoEConfig& c, const Mesh& mesh, const EMesh& emesh) {
    check_router_config(c.router, "nn::MoE", mesh.rank());
    parallel::check_expert_mesh(mesh, emesh);
    // Ranks that route differently (another top-k, capacity or expert count) exchange counts
    // and rows that do not match: a truncation, a hang or silently wrong outputs. One
    // all-gather per layer at setup, in every build (distributed/settings_agreement.hpp).
    const auto& r = c.router;
    require_same_settings(mesh.comm(), "nn::MoE",
                          {{"experts", dtensor::detail::cat(r.experts)},
                           {"top-k", dtensor::detail::cat(r.topk)},
                           {"capacity factor", r.capacity_factor ? shortest(*r.capacity_factor) : "none"},
                           {"score", dtensor::detail::cat(int(r.score))},
                           {"normalize gates", r.normalize_gates ? "true" : "false"},
                           {"force balanced", r.force_balanced ? "true" : "false"},
                           {"routing groups", dtensor::detail::cat(r.groups, " top ", r.topk_groups)},
                           {"dim", dtensor::detail::cat(c.dim)},
                           {"experts' feed-forward", name_of(F)},
                           {"hidden", dtensor::detail::cat(c.hidden)},
                           {"node size", dtensor::detail::cat(c.node_size)}});
    if (c.node_size < 0)
      throw Error("nn::MoE", dtensor::detail::cat("node size ", c.node_size, " (0: the one-stage dispatch)"),
                  mesh.rank());
    if (c.node_size > 0)
      parallel::check_nodes_own_experts(r.experts, parallel::expert_group(emesh).size(), c.node_size, mesh.rank());
    return c;
  }

  std::string name_;
  MoEConfig c_;
  EMesh emesh_;
  std::optional<parallel::ExpertNodes> nodes_;  // set when c_.node_size is: the node-level dispatch
  Router router_;
  Experts experts_;
};

}  // namespace dtensor::nn
