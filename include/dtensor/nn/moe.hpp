// dtensor/nn/moe.hpp — the mixture-of-experts feed-forward: a router, top-k token-choice routing
// and E expert MLPs, expert parallel over the expert mesh.
//
//   using Dense = DeviceMesh<"dp", "tp">;  using EMesh = DeviceMesh<"edp", "ep", "tp">;
//   auto emesh = parallel::make_expert_mesh<EMesh>(dense, /*ep=*/2);
//   nn::MoE<float, Dense, EMesh> moe("h.0.moe", dense, emesh,
//       {.dim = 64, .hidden = 256, .router = {.experts = 8, .topk = 2, .capacity_factor = 1.25}}, seed);
//   auto [y, saved] = moe.forward(x);             // x [B, T, C]: tokens<Dense>, as nn::MLP takes
//   saved.routing.load, .dropped, .aux_loss ...   // this rank's routing statistics (nn/router.hpp)
//   auto [dx, wctx] = moe.backward_input(std::move(saved), dy);  moe.backward_weight(std::move(wctx));
//
// Forward, per rank: logits = router(x) (an nn::Linear [E, C] without bias on the dense mesh),
// nn::route (scores, top-k, gates, capacity per sequence: no communication), then the boundary
// ops of parallel/expert_parallel.hpp on the expert mesh's "ep" group: the count exchange (one
// all_to_all), dispatch (one all_to_all_v of the kept (token, choice) rows), one GEMM pair per
// local expert (nn::GroupedExperts), combine (one all_to_all_v back), and y[t] = sum_j gate_tj *
// expert_j(x_t) over the kept choices, summed in choice order (so every expert size adds in the
// same order). A token whose every choice was dropped gets y = 0: in a block, its residual
// passes through. Backward: the combine's adjoint (one all_to_all_v), the experts, the
// dispatch's adjoint (one all_to_all_v), the gates' and the auxiliary losses' gradient into the
// router (nn::route_backward, with the config's coefficients), and the router's backward. So per
// MoE layer: forward 1 all_to_all (counts, int64 x experts) + 2 all_to_all_v; backward 2
// all_to_all_v (the forward's counts are reused); each all_to_all_v moves max(rows sent, rows
// received) x C elements on a rank.
//
// Parameters: the router's on the dense mesh (replicated; gradient Partial<sum> on the data
// dimension) and the experts' on the expert mesh (Shard<0> on "ep"; gradient Partial<sum> on
// "edp"). They live on two meshes of different rank, so collect them per part:
// nn::collect(moe.router(), dense_list); nn::collect(moe.experts(), expert_list), and reduce
// each with DataParallel over its mesh. for_each_parameter / zero_grad walk both.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "dtensor/nn/experts.hpp"
#include "dtensor/nn/linear.hpp"
#include "dtensor/nn/router.hpp"
#include "dtensor/parallel/expert_parallel.hpp"

namespace dtensor::nn {

struct MoEConfig {
  Extent dim = 0;
  Extent hidden = 0;  // each expert's MLP width
  RouterConfig router;
  double init_std = 0.02;
  double out_std = 0.02;
};

template <std::floating_point T, MeshType Mesh, parallel::ExpertMeshType EMesh>
class MoE {
  static_assert(require_dense_roles<"nn::MoE", Mesh>());

 public:
  using Router = Linear<T, Mesh, Replicated<>>;
  using Experts = GroupedExperts<T, EMesh>;
  using X = DTensor<T, 3, Mesh, tokens<Mesh>>;
  using In = X;
  using Out = X;

  struct Saved {
    typename Router::Saved router;
    Routing<T> routing;
    parallel::ExpertOrder order;
    parallel::DispatchPlan plan;
    typename Experts::Saved experts;
    Tensor<T, 2> expert_out;  // the experts' rows back in send order (for the gates' gradient)
  };
  using WeightCtx = std::tuple<typename Router::WeightCtx, typename Experts::WeightCtx>;  // children() order

  MoE() = default;
  MoE(std::string name, const Mesh& mesh, const EMesh& emesh, MoEConfig c, std::uint64_t seed)
      : name_(std::move(name)), c_(c), emesh_(emesh) {
    check_router_config(c.router, "nn::MoE", mesh.rank());
    parallel::check_expert_mesh(mesh, emesh);
    router_ = Router(name_ + ".router", mesh, c.dim, c.router.experts, seed, {.bias = false, .init_std = c.init_std});
    experts_ = Experts(name_ + ".experts", emesh,
                       {.experts = c.router.experts, .dim = c.dim, .hidden = c.hidden, .init_std = c.init_std,
                        .out_std = c.out_std},
                       seed + 1);
  }

  /// y = sum over kept choices of gate * expert(x). Collectives: 1 all_to_all + 2 all_to_all_v on "ep"
  /// (and, under context parallelism, the aux loss's all-reduce on the context group).
  Fwd<X, Saved> forward(const X& x) const {
    detail::check(x.extent(2) == c_.dim, "nn::MoE::forward", x.mesh(), name_, ": input ", to_string(x.shape()),
                  " does not have ", c_.dim, " features");
    auto [logits, router_saved] = router_.forward(x);
    const auto& xl = x.to_local();
    const Extent batch = xl.shape()[0], seq = xl.shape()[1], C = c_.dim, K = c_.router.topk;
    Saved s{std::move(router_saved), route(logits.to_local().span(), batch, seq, x.extent(0), c_.router, route_context(x.mesh())),
            {}, {}, {}, {}};
    s.order = parallel::order_by_expert(s.routing.expert, s.routing.kept, c_.router.experts);
    auto& ep = parallel::expert_group(emesh_);
    s.plan = parallel::exchange_counts(ep, s.order.rows_per_expert, experts_.local_experts(), C);
    auto send = Tensor<T, 2>::uninitialized(Shape<2>{Extent(s.order.slot_of_row.size()), C});
    for (std::size_t r = 0; r < s.order.slot_of_row.size(); ++r)
      std::copy_n(xl.data() + s.order.slot_of_row[r] / K * C, C, send.data() + Extent(r) * C);
    auto [rows, experts_saved] = experts_.forward(parallel::dispatch(ep, s.plan, send), s.plan.rows_per_local_expert());
    s.experts = std::move(experts_saved);
    s.expert_out = parallel::combine(ep, s.plan, rows);
    Tensor<T, 3> y(xl.shape());
    for (Extent n = 0; n < batch * seq; ++n)
      for (Extent j = 0; j < K; ++j) {
        const auto row = s.order.row_of_slot[std::size_t(n * K + j)];
        if (row < 0) continue;
        const T g = s.routing.gate[std::size_t(n * K + j)];
        const T* e = s.expert_out.data() + row * C;
        for (Extent i = 0; i < C; ++i) y.data()[n * C + i] += g * e[i];
      }
    return {X(x.mesh(), x.shape(), std::move(y)), std::move(s)};
  }

  /// Context parallelism: each sequence split over the context ranks, whose choice counts the aux
  /// loss sums (one all-reduce of batch x experts doubles on the context group; nn/router.hpp).
  static RouteContext route_context(const Mesh& mesh) {
    if constexpr (has_role<Mesh, Role::context>) {
      constexpr std::size_t cp = role_dim<Mesh, Role::context>;
      if (mesh.size(cp) > 1)
        return {.parts = mesh.size(cp),
                .sum_over_parts = [&mesh](std::span<double> v) { mesh.group(cp).all_reduce(v, ReduceOp::sum); }};
    }
    return {};
  }

  /// dx through the experts and the router (gates, aux and z losses). Collectives: 2 all_to_all_v on "ep".
  Bwd<X, WeightCtx> backward_input(Saved s, const X& dy) const {
    const auto& dyl = dy.to_local();
    const Extent C = c_.dim, K = c_.router.topk, tokens = s.routing.tokens;
    detail::check(dyl.numel() == tokens * C && dy.extent(2) == C, "nn::MoE::backward_input", dy.mesh(), name_,
                  ": gradient ", to_string(dy.shape()), " for ", tokens, " tokens of ", C, " features");
    // Adjoint of the weighted sum: each kept row's gradient is gate * dy, each gate's dy . row.
    auto d_rows = Tensor<T, 2>::uninitialized(s.expert_out.shape());
    std::vector<T> dgate(std::size_t(tokens * K), T(0));
    for (std::size_t slot = 0; slot < s.order.row_of_slot.size(); ++slot) {
      const auto row = s.order.row_of_slot[slot];
      if (row < 0) continue;
      const T g = s.routing.gate[slot];
      const T* d = dyl.data() + Extent(slot) / K * C;
      const T* e = s.expert_out.data() + row * C;
      T dot = 0;
      for (Extent i = 0; i < C; ++i) {
        d_rows.data()[row * C + i] = g * d[i];
        dot += d[i] * e[i];
      }
      dgate[slot] = dot;
    }
    auto& ep = parallel::expert_group(emesh_);
    auto [dgrouped, experts_w] = experts_.backward_input(std::move(s.experts), parallel::combine_backward(ep, s.plan, d_rows));
    const auto dsend = parallel::dispatch_backward(ep, s.plan, dgrouped);
    // The router: gates and auxiliary losses.
    RouterConfig weighted = c_.router;  // the auxiliary losses' gradients, weighted like the loss's (set_loss_scale)
    weighted.aux_loss_coeff *= loss_scale_;
    weighted.z_loss_coeff *= loss_scale_;
    const auto dlogits_local = route_backward(s.routing, std::span<const T>(dgate), weighted);
    Tensor<T, 3> dl(Shape<3>{dyl.shape()[0], dyl.shape()[1], c_.router.experts});
    std::copy(dlogits_local.begin(), dlogits_local.end(), dl.data());
    const Shape<3> logits_shape{dy.extent(0), dy.extent(1), c_.router.experts};
    auto [dx, router_w] =
        router_.backward_input(std::move(s.router), typename Router::Out(dy.mesh(), logits_shape, std::move(dl)));
    // dx += the tokens' share of the experts' input gradient, in choice order.
    auto& dxl = dx.local();
    for (Extent n = 0; n < tokens; ++n)
      for (Extent j = 0; j < K; ++j) {
        const auto row = s.order.row_of_slot[std::size_t(n * K + j)];
        if (row < 0) continue;
        for (Extent i = 0; i < C; ++i) dxl.data()[n * C + i] += dsend.data()[row * C + i];
      }
    return {std::move(dx), WeightCtx{std::move(router_w), std::move(experts_w)}};
  }

  void backward_weight(WeightCtx w) { backward_weight_children(*this, std::move(w)); }

  /// The weight of the auxiliary losses in the next backward_input: the dloss the caller's loss
  /// is differentiated with (a pipeline's 1/M per micro-batch), 1 by default. The gates'
  /// gradient comes through dy and is weighted already; the auxiliary losses enter here.
  void set_loss_scale(double scale) const noexcept { loss_scale_ = scale; }

  auto children() { return std::tie(router_, experts_); }
  Router& router() noexcept { return router_; }
  Experts& experts() noexcept { return experts_; }
  const MoEConfig& config() const noexcept { return c_; }
  const EMesh& expert_mesh() const noexcept { return emesh_; }

 private:
  std::string name_;
  MoEConfig c_;
  EMesh emesh_;
  Router router_;
  Experts experts_;
  mutable double loss_scale_ = 1;  // set_loss_scale: a weight, not state of the model
};

}  // namespace dtensor::nn
