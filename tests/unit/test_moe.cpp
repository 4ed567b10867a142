// Mixture of experts (nn/router.hpp, parallel/experts.hpp, parallel/moe.hpp) and expert parallelism
// (parallel/expert_parallel.hpp): gradients against finite differences (one rank, double); EP = 2
// and 4, EP x DP and EP x TP against the one-rank MoE (outputs, routing, gradients; 1e-12);
// dropping exactly the one-rank run's tokens; a capacity factor too large for int64 (dropless);
// the collectives and the merged dispatch's bytes (a row per token and expert rank, against a
// count from the routing); group-limited routing; every token to one expert; the aux loss balancing the load;
// bad input; and on meta tensors over the sim backend (the dry run): balanced routing and the
// collectives, bytes and FLOPs it implies.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/sim.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/kernels/meta/cost_log.hpp"
#include "dtensor/parallel/moe.hpp"
#include "dtensor/parallel/data_parallel.hpp"
#include "support/on_ranks.hpp"
#include "test_nn_support.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

using Dense = DeviceMesh<"dp", "tp">;
using EMesh = DeviceMesh<"edp", "ep", "tp">;
using Moe = nn::MoE<double, Dense, EMesh>;
using X = Moe::X;

constexpr Extent B = 5, T = 4, C = 6, H = 8;  // 5 sequences over 4 data ranks: 2, 1, 1, 1

nn::MoEConfig config(Extent experts, Extent topk, std::optional<double> capacity = {},
                     nn::RouterScore score = nn::RouterScore::softmax) {
  return {.dim = C,
          .hidden = H,
          .router = {.experts = experts, .topk = topk, .score = score, .capacity_factor = capacity,
                     .normalize_gates = true, .aux_loss_coeff = 0.1, .z_loss_coeff = 0.01},
          .init_std = 0.5,  // large enough that the routing is far from ties
          .out_std = 0.5};
}

const auto x_full = normal<double>(Shape<3>{B, T, C}, 21);
const auto dy_full = normal<double>(Shape<3>{B, T, C}, 22);

/// What one run produced, for comparison with the one-rank run.
struct MoeRun {
  Tensor<double, 3> y, dx;
  std::vector<Tensor<double, 3>> grads3;  // expert fc1/fc2 weights, full
  std::vector<Tensor<double, 2>> grads2;  // router weight, expert biases, full
  // This rank's routing, and where its tokens start in the global [B * T] order.
  Extent first_token = 0;
  nn::Routing<double> routing;
  std::int64_t units_sent = 0, units_received = 0, pairs_received = 0;
  // With `step`: the collectives of the forward and of backward_input + backward_weight, and
  // after one SGD step (lr 0.5 on every parameter) the parameters and a second forward's output.
  std::vector<std::tuple<CollectiveKind, std::string, std::size_t>> forward_log, backward_log;
  Extent local_experts = 0;
  Tensor<double, 3> y_after, w1_after, w2_after;
};

std::vector<std::tuple<CollectiveKind, std::string, std::size_t>> records_of(const CommLog& log) {
  std::vector<std::tuple<CollectiveKind, std::string, std::size_t>> out;
  for (const auto& r : log.records()) out.emplace_back(r.kind, r.group, r.bytes);
  return out;
}

/// Forward, backward of sum(y * dy_full) + the aux losses, and the gradient syncs.
MoeRun run_moe(const Dense& dense, const EMesh& emesh, const nn::MoEConfig& c, bool zero_router = false,
               const Tensor<double, 3>& xs = x_full, const Tensor<double, 3>& dys = dy_full, bool step = false) {
  Moe moe("moe", dense, emesh, c, 5);
  std::optional<CommLog> log;
  if (step) log.emplace();
  if (zero_router) {
    auto& w = moe.router().weight().value().local();
    std::fill_n(w.data(), w.numel(), 0.0);
  }
  auto x = distribute_replicated<nn::tokens<Dense>>(dense, xs);
  auto [y, saved] = moe.forward(x);
  MoeRun out;
  if (step) {
    out.forward_log = records_of(*log);
    log.emplace();
  }
  out.local_experts = moe.experts().local_experts();
  out.routing = saved.routing;
  out.first_token = x.local_box().offset[0] * T;
  out.units_sent = saved.plan.units_sent();
  out.units_received = saved.plan.units_received();
  out.pairs_received = saved.plan.pairs_received();
  auto [dx, w] = moe.backward_input(std::move(saved), distribute_replicated<nn::tokens<Dense>>(dense, dys));
  moe.backward_weight(std::move(w));
  if (step) {
    out.backward_log = records_of(*log);
    log.reset();
  }
  nn::ParamList<double, 2> dense_ps;
  nn::ParamList<double, 3> expert_ps;
  nn::collect(moe.router(), dense_ps);
  nn::collect(moe.experts(), expert_ps);
  parallel::DataParallel<Dense>(dense).all_reduce_gradients(dense_ps);
  parallel::DataParallel<EMesh>(emesh).all_reduce_gradients(expert_ps);
  out.y = full_tensor(y);
  out.dx = full_tensor(dx);
  out.grads2.push_back(full_tensor(moe.router().weight().grad()));
  auto [w1, b1, w2, b2] = moe.experts().parameters();
  out.grads3.push_back(full_tensor(w1.grad()));
  out.grads2.push_back(full_tensor(b1.grad()));
  out.grads3.push_back(full_tensor(w2.grad()));
  out.grads2.push_back(full_tensor(b2.grad()));
  if (step) {
    nn::for_each_parameter(moe, [](auto& p) {
      if (!p.defined()) return;  // the router has no bias
      auto& v = p.value().local();
      const auto g = p.grad_local();
      for (Extent i = 0; i < v.numel(); ++i) v[i] -= 0.5 * g[i];
    });
    out.w1_after = full_tensor(w1.value());
    out.w2_after = full_tensor(w2.value());
    out.y_after = full_tensor(moe.forward(x).y);
  }
  return out;
}

MoeRun reference(const nn::MoEConfig& c, bool zero_router = false, const Tensor<double, 3>& xs = x_full,
                 const Tensor<double, 3>& dys = dy_full, bool step = false) {
  MoeRun ref;
  threads::run(1, [&](CommPtr w) {
    Dense dense(w, {1, 1});
    ref = run_moe(dense, parallel::make_expert_mesh<EMesh>(dense, 1), c, zero_router, xs, dys, step);
  });
  return ref;
}

/// "" or what differs between this rank's run and the one-rank run.
std::string compare_moe(const MoeRun& got, const MoeRun& ref, double tol = 1e-12) {
  auto close = [&](const auto& a, const auto& b) { return compare(a, b, {.rtol = tol, .atol = tol}); };
  if (auto d = close(got.y, ref.y); !d) return "output: " + d.message;
  if (auto d = close(got.dx, ref.dx); !d) return "input gradient: " + d.message;
  for (std::size_t i = 0; i < ref.grads2.size(); ++i)
    if (auto d = close(got.grads2[i], ref.grads2[i]); !d) return detail::cat("gradient 2-d #", i, ": ", d.message);
  for (std::size_t i = 0; i < ref.grads3.size(); ++i)
    if (auto d = close(got.grads3[i], ref.grads3[i]); !d) return detail::cat("gradient 3-d #", i, ": ", d.message);
  // Routing: this rank's slots against the same tokens' slots of the one-rank run.
  const auto& r = got.routing;
  const Extent K = r.topk, first = got.first_token * K;
  for (Extent s = 0; s < r.tokens * K; ++s) {
    const auto rs = std::size_t(first + s);
    if (r.expert[std::size_t(s)] != ref.routing.expert[rs] || r.kept[std::size_t(s)] != ref.routing.kept[rs] ||
        std::abs(r.gate[std::size_t(s)] - ref.routing.gate[rs]) > tol)
      return detail::cat("routing of slot ", first + s, ": expert ", r.expert[std::size_t(s)], " kept ",
                         int(r.kept[std::size_t(s)]), " gate ", r.gate[std::size_t(s)], " vs ", ref.routing.expert[rs],
                         " ", int(ref.routing.kept[rs]), " ", ref.routing.gate[rs]);
  }
  return {};
}

struct MeshCase {
  const char* name;
  std::array<int, 2> dense;
  int ep;
};
const MeshCase mesh_cases[] = {
    {"EP=2", {2, 1}, 2}, {"EP=4", {4, 1}, 4}, {"EP=2 x DP=2", {4, 1}, 2}, {"EP=2 x TP=2", {2, 2}, 2}};

/// Every mesh case gives the one-rank run's results (within tol).
void check_parity(const nn::MoEConfig& c, bool zero_router = false, double tol = 1e-12) {
  const auto ref = reference(c, zero_router);
  for (const auto& m : mesh_cases) {
    INFO(m.name << ", " << c.router.experts << " experts, top-" << c.router.topk);
    auto f = on_ranks(m.dense[0] * m.dense[1], [&](CommPtr world, auto report) {
      Dense dense(world, m.dense);
      report(compare_moe(run_moe(dense, parallel::make_expert_mesh<EMesh>(dense, m.ep), c, zero_router), ref, tol));
    });
    CHECK(f.empty());
    for (auto& e : f) WARN(e);
  }
}

/// The merged dispatch's traffic on one rank, computed here from the one-rank run's routing: the
/// units (a token's row once per expert rank its kept choices reach) and pairs (kept choices) it
/// sends each peer of its "ep" group and receives from each, and the bytes of its collectives.
struct Traffic {
  std::int64_t units_sent = 0, units_received = 0, pairs_sent = 0, pairs_received = 0;
  std::size_t counts = 0, dispatch = 0, combine = 0, dispatch_backward = 0;  // bytes, as the CommLog records them
};
Traffic traffic(const nn::Routing<double>& ref, const Dense& dense, const EMesh& emesh, Extent experts, Shape<3> x) {
  const int ep = emesh.group<"ep">().size(), me = emesh.coordinate<"ep">();
  const Extent k = ref.topk;
  // Units and pairs from source rank `from` (its ep coordinate) to rank `to`.
  auto between = [&](int from, int to) {
    const auto box = local_box(nn::tokens<Dense>::desc, dense.shape(), {emesh.coordinate<"edp">() * ep + from, 0}, x);
    const auto mine = chunk_range(experts, ep, to);
    std::int64_t units = 0, pairs = 0;
    for (Extent n = box.offset[0] * T; n < (box.offset[0] + box.extent[0]) * T; ++n) {
      bool any = false;
      for (Extent j = 0; j < k; ++j) {
        const auto s = std::size_t(n * k + j);
        if (ref.kept[s] && ref.expert[s] >= mine.begin && ref.expert[s] < mine.end) ++pairs, any = true;
      }
      units += any ? 1 : 0;
    }
    return std::pair{units, pairs};
  };
  auto rows = [](std::int64_t bytes) { return (bytes + C * 8 - 1) / (C * 8); };  // a side array's rows
  Traffic t;
  std::int64_t d_out = 0, d_in = 0, g_out = 0, g_in = 0;
  for (int peer = 0; peer < ep; ++peer) {
    const auto [u_out, p_out] = between(me, peer);
    const auto [u_in, p_in] = between(peer, me);
    t.units_sent += u_out, t.pairs_sent += p_out, t.units_received += u_in, t.pairs_received += p_in;
    d_out += u_out + rows(p_out * (4 + 8)), d_in += u_in + rows(p_in * (4 + 8));  // int32 unit + double gate
    g_out += u_in + rows(p_in * 8), g_in += u_out + rows(p_out * 8);              // double gate gradients
  }
  const auto bytes = [](std::int64_t r) { return std::size_t(r * C) * sizeof(double); };
  t.counts = std::size_t(ep * (1 + chunk_size(experts, ep))) * sizeof(std::int64_t);
  t.dispatch = bytes(std::max(d_out, d_in));
  t.combine = bytes(std::max(t.units_sent, t.units_received));
  t.dispatch_backward = bytes(std::max(g_out, g_in));
  return t;
}

/// The collectives of a forward and of a backward with that traffic.
using Record = std::tuple<CollectiveKind, std::string, std::size_t>;
std::vector<Record> forward_records(const Traffic& t) {
  return {Record{CollectiveKind::all_to_all, "ep", t.counts}, Record{CollectiveKind::all_to_all_v, "ep", t.dispatch},
          Record{CollectiveKind::all_to_all_v, "ep", t.combine}};
}
std::vector<Record> backward_records(const Traffic& t) {
  return {Record{CollectiveKind::all_to_all_v, "ep", t.combine},
          Record{CollectiveKind::all_to_all_v, "ep", t.dispatch_backward}};
}

}  // namespace

TEST_CASE("MoE: gradients match finite differences, with the aux and z losses (GELU and SwiGLU experts)", "[moe]") {
  auto check_gradients = [&]<class M>(nn::RouterScore score, Extent k) {
    threads::run(1, [&](CommPtr w) {
      Dense dense(w, {1, 1});
      auto emesh = parallel::make_expert_mesh<EMesh>(dense, 1);
      M moe("moe", dense, emesh, config(4, k, {}, score), 5);
      auto x = distribute_replicated<nn::tokens<Dense>>(dense, x_full);
      const auto& cfg = moe.config().router;
      // J = sum(y * dy) + aux_coeff * aux + z_coeff * z, whose gradient backward computes.
      auto objective = [&] {
        auto [y, s] = moe.forward(x);
        double j = cfg.aux_loss_coeff * s.routing.aux_loss + cfg.z_loss_coeff * s.routing.z_loss;
        for (Extent i = 0; i < y.to_local().numel(); ++i) j += y.to_local()[i] * dy_full[i];
        return j;
      };
      nn::zero_grad(moe);
      auto [y, s] = moe.forward(x);
      const auto routing = s.routing;
      auto [dx, wc] = moe.backward_input(std::move(s), distribute_replicated<nn::tokens<Dense>>(dense, dy_full));
      moe.backward_weight(std::move(wc));
      const auto dxl = dx.to_local();
      CHECK(fd_span("dx", x.local().span(), dxl.span(), objective) == "");
      nn::for_each_parameter(moe, [&](auto& p) {
        if (!p.defined()) return;  // the router has no bias
        const auto g = p.grad_local();
        CHECK(fd_span(p.name(), p.value().local().span(), g.span(), objective) == "");
      });
      // The routing did not change under the perturbations (else the differences are meaningless).
      CHECK(moe.forward(x).saved.routing.expert == routing.expert);
    });
  };
  for (auto score : {nn::RouterScore::softmax, nn::RouterScore::sigmoid})
    for (Extent k : {1, 2}) {
      INFO("top-" << k << (score == nn::RouterScore::softmax ? " softmax" : " sigmoid"));
      check_gradients.template operator()<Moe>(score, k);
    }
  // SwiGLU experts (w1, w3, w2; no biases): every weight's gradient, and the input's.
  using SwiGLUMoe = nn::MoE<double, Dense, EMesh, nn::ExpertFfn::swiglu>;
  std::size_t expert_weights = 0;
  threads::run(1, [&](CommPtr w) {
    Dense dense(w, {1, 1});
    SwiGLUMoe moe("moe", dense, parallel::make_expert_mesh<EMesh>(dense, 1), config(4, 2), 5);
    nn::for_each_parameter(moe.experts(), [&](auto& p) { expert_weights += p.defined() ? 1 : 0; });
  });
  CHECK(expert_weights == 3);
  for (Extent k : {1, 2}) {
    INFO("SwiGLU experts, top-" << k);
    check_gradients.template operator()<SwiGLUMoe>(nn::RouterScore::softmax, k);
  }
}

TEST_CASE("MoE: EP=2 and EP=4 (and with DP, TP) match the one-rank MoE when nothing drops", "[moe][parity]") {
  for (Extent experts : {4, 8})
    for (Extent k : {1, 2}) check_parity(config(experts, k));
  // A capacity that drops nothing (factor E: seq * topk slots per expert) is the dropless run.
  const auto big = config(4, 2, 4.0);
  CHECK(reference(big).routing.dropped == 0);
  check_parity(big);
  check_parity(config(8, 2, {}, nn::RouterScore::sigmoid));
}

TEST_CASE("MoE: a capacity factor too large for int64 (1e300, inf) is dropless, not an overflow", "[moe][drop]") {
  // Regression: ceil(1e300 * seq * topk / experts) converted to int64 overflowed to a negative
  // capacity and every choice was dropped (output all zeros). The capacity saturates at the
  // sequence's length (a token picks an expert once), which is the dropless run.
  const auto dropless = reference(config(4, 2));
  for (double factor : {1e300, std::numeric_limits<double>::infinity(), 1e18, double(std::numeric_limits<std::int64_t>::max())}) {
    INFO("capacity factor " << factor);
    const auto c = config(4, 2, factor);
    CHECK(nn::expert_capacity(c.router, T) == T);
    CHECK(nn::expert_capacity(c.router, Extent(1) << 40) == Extent(1) << 40);
    const auto r = reference(c);
    CHECK(r.routing.dropped == 0);
    CHECK(compare_moe(r, dropless).empty());
  }
  // A factor that binds is unchanged: ceil(0.5 * 4 * 2 / 4) = 1 slot.
  CHECK(nn::expert_capacity(config(4, 2, 0.5).router, T) == 1);
}

TEST_CASE("MoE: a batch smaller than the mesh (a rank without tokens)", "[moe][parity]") {
  const auto xs = normal<double>(Shape<3>{3, T, C}, 41), dys = normal<double>(Shape<3>{3, T, C}, 42);
  for (Extent k : {1, 2}) {
    const auto c = config(8, k, 0.75);
    const auto ref = reference(c, false, xs, dys);
    auto f = on_ranks(4, [&](CommPtr world, auto report) {
      Dense dense(world, {4, 1});  // 3 sequences over 4 data ranks: 1, 1, 1, 0
      report(compare_moe(run_moe(dense, parallel::make_expert_mesh<EMesh>(dense, 4), c, false, xs, dys), ref));
    });
    CHECK(f.empty());
    for (auto& e : f) WARN(e);
  }
}

TEST_CASE("MoE: expert counts that do not divide over ep (5 over 2, 7 over 4, 3 over 4) match the one-rank MoE",
          "[moe][parity][uneven]") {
  // The experts split like any uneven Shard<0> (chunk_range): 5 over 2 is 3 + 2, 7 over 4 is
  // 2 + 2 + 2 + 1, 3 over 4 is 1 + 1 + 1 + 0 (the last rank owns no expert but routes its tokens).
  // Forward, backward, the gradient syncs and one SGD step against one rank (double, 1e-12), the
  // same collectives as an even split (1 all_to_all + 2 all_to_all_v forward, 2 backward), the
  // count exchange's all_to_all moving ceil(E / ep) counts per peer, and the rows each rank
  // receives those of its own experts.
  struct Case {
    Extent experts;
    std::array<int, 2> dense;
    int ep;
  };
  for (const Case m : {Case{5, {2, 1}, 2}, Case{5, {4, 1}, 2}, Case{7, {4, 1}, 4}, Case{3, {4, 1}, 4},
                       Case{5, {2, 2}, 2}})
    for (Extent k : {1, 2}) {
      INFO(m.experts << " experts over ep " << m.ep << ", dense " << m.dense[0] << " x " << m.dense[1] << ", top-" << k);
      const auto c = config(m.experts, k);
      const auto ref = reference(c, false, x_full, dy_full, true);
      auto f = on_ranks(m.dense[0] * m.dense[1], [&](CommPtr world, auto report) {
        Dense dense(world, m.dense);
        const auto emesh = parallel::make_expert_mesh<EMesh>(dense, m.ep);
        const auto run = run_moe(dense, emesh, c, false, x_full, dy_full, true);
        report(compare_moe(run, ref, 1e-12));
        auto close = [](const auto& a, const auto& b) { return compare(a, b, {.rtol = 1e-12, .atol = 1e-12}); };
        if (auto d = close(run.y_after, ref.y_after); !d) report("output after a step: " + d.message);
        if (auto d = close(run.w1_after, ref.w1_after); !d) report("fc1 after a step: " + d.message);
        if (auto d = close(run.w2_after, ref.w2_after); !d) report("fc2 after a step: " + d.message);
        const auto mine = chunk_range(m.experts, m.ep, emesh.coordinate<"ep">());
        if (run.local_experts != mine.size())
          report(detail::cat("holds ", run.local_experts, " experts, expected ", mine.size()));
        // Units and pairs received, and every collective's bytes: from the one-rank run's routing.
        const auto t = traffic(ref.routing, dense, emesh, m.experts, x_full.shape());
        if (run.units_received != t.units_received || run.pairs_received != t.pairs_received)
          report(detail::cat("received ", run.units_received, " units and ", run.pairs_received, " pairs, expected ",
                             t.units_received, " and ", t.pairs_received));
        if (run.forward_log != forward_records(t) || run.backward_log != backward_records(t))
          report(detail::cat("collectives: ", run.forward_log.size(), " forward, ", run.backward_log.size(),
                             " backward, not 1 all_to_all of ", t.counts, " bytes + all_to_all_v of ", t.dispatch,
                             " and ", t.combine, " bytes, and all_to_all_v of ", t.combine, " and ",
                             t.dispatch_backward));
      });
      CHECK(f.empty());
      for (auto& e : f) WARN(e);
    }
}

TEST_CASE(
    "parallel::order_by_rank and exchange_counts: units, pairs, uneven ownership, and on meta every rank routing alike",
    "[moe][uneven]") {
  // Top-2 over 7 experts on 4 ranks (owning 0-1, 2-3, 4-5, 6): token 0 picks 0 and 1 (one unit
  // to rank 0), token 1 picks 6 and 2 (units to ranks 1 and 3), token 2 picks 3 and 2 (one unit
  // to rank 1, two pairs), token 3 picks 5 (kept) and 4 (dropped): one unit to rank 2.
  const std::vector<std::int32_t> expert{0, 1, 6, 2, 3, 2, 5, 4};
  const std::vector<std::uint8_t> kept{1, 1, 1, 1, 1, 1, 1, 0};
  const auto o = parallel::order_by_rank(expert, kept, 2, 7, 4);
  CHECK(o.units_per_rank == std::vector<std::int64_t>{1, 2, 1, 1});
  CHECK(o.token_of_unit == std::vector<std::int64_t>{0, 1, 2, 3, 1});  // by rank, then token
  CHECK(o.pairs_per_expert == std::vector<std::int64_t>{1, 1, 2, 1, 0, 1, 1});
  // Pairs by expert, then token: expert 0 (slot 0), 1 (slot 1), 2 (slots 3, 5), 3 (slot 4), 5 (slot 6), 6 (slot 2).
  CHECK(o.slot_of_pair == std::vector<std::int64_t>{0, 1, 3, 5, 4, 6, 2});
  CHECK(o.unit_of_pair == std::vector<std::int32_t>{0, 0, 0, 1, 1, 0, 0});
  // Each rank sends expert e (10 * rank + e) pairs and peer r (100 + r) units.
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    const int me = world->rank();
    parallel::DispatchOrder order;
    order.expert_offsets = {0, 2, 4, 6, 7};
    order.units_per_rank = {100, 101, 102, 103};
    for (std::int64_t e = 0; e < 7; ++e) order.pairs_per_expert.push_back(10 * me + e);
    const auto p = parallel::exchange_counts<double>(*world, order, 3);
    const Extent L = me < 3 ? 2 : 1;
    std::vector<std::int64_t> pairs;
    for (int s = 0; s < 4; ++s)
      for (Extent le = 0; le < L; ++le) pairs.push_back(10 * s + order.expert_offsets[std::size_t(me)] + le);
    if (p.local_experts != L || p.recv_pairs != pairs)
      report(detail::cat("rank ", me, ": received pair counts differ"));
    if (p.recv_units != std::vector<std::int64_t>(4, 100 + me))
      report(detail::cat("rank ", me, ": received unit counts"));
    for (int r = 0; r < 4; ++r) {
      std::int64_t sent = 0;
      for (auto e = order.expert_offsets[std::size_t(r)]; e < order.expert_offsets[std::size_t(r) + 1]; ++e)
        sent += order.pairs_per_expert[std::size_t(e)];
      // The dispatch's message: the units, then (int32 + double) per pair in rows of 3 doubles.
      const auto rows = 100 + r + (sent * 12 + 23) / 24;
      if (p.send_pairs[std::size_t(r)] != sent || p.dispatch_out.counts[std::size_t(r)] != std::size_t(rows * 3))
        report(detail::cat("rank ", me, ": send counts to ", r));
    }
    if (p.rows_per_local_expert().size() != std::size_t(L)) report("rows per local expert");
  });
  CHECK(f.empty());
  for (auto& e : f) WARN(e);
  // On meta (no peers' counts): every source sends this rank what it sends itself.
  for (int rank : {0, 3}) {
    auto world = sim::world(rank, 4);
    parallel::DispatchOrder order;
    order.expert_offsets = {0, 2, 4, 6, 7};
    order.units_per_rank = {5, 6, 7, 8};
    order.pairs_per_expert = {1, 2, 3, 4, 5, 6, 7};
    const auto p = parallel::exchange_counts<float, meta_space>(*world, order, 3);
    const std::vector<std::int64_t> expect = rank == 0 ? std::vector<std::int64_t>{1, 2, 1, 2, 1, 2, 1, 2}
                                                       : std::vector<std::int64_t>{7, 7, 7, 7};
    CHECK(p.recv_pairs == expect);
    CHECK(p.recv_units == std::vector<std::int64_t>(4, rank == 0 ? 5 : 8));
  }
}

TEST_CASE("MoE: a small capacity drops exactly the one-rank run's choices, in precedence order", "[moe][drop]") {
  for (Extent k : {1, 2}) {
    const auto c = config(4, k, 0.5);  // ceil(0.5 * 4 * k / 4) slots per expert per sequence
    const auto ref = reference(c);
    const auto& r = ref.routing;
    REQUIRE(r.dropped > 0);
    // Precedence: per sequence and expert, the kept choices are the first `capacity` in
    // (choice, position) order.
    for (Extent b = 0; b < B; ++b)
      for (Extent e = 0; e < 4; ++e) {
        Extent seen = 0;
        for (Extent j = 0; j < k; ++j)
          for (Extent t = 0; t < T; ++t) {
            const auto slot = std::size_t((b * T + t) * k + j);
            if (r.expert[slot] != e) continue;
            CHECK(bool(r.kept[slot]) == (seen < r.capacity));
            ++seen;
          }
      }
    // A token whose every choice was dropped gets y = 0 (the block's residual passes through), and
    // its input gradient comes from the router alone.
    int all_dropped = 0;
    for (Extent n = 0; n < B * T; ++n) {
      bool any = false;
      for (Extent j = 0; j < k; ++j) any = any || r.kept[std::size_t(n * k + j)];
      if (any) continue;
      ++all_dropped;
      for (Extent i = 0; i < C; ++i) CHECK(ref.y[n * C + i] == 0.0);
    }
    if (k == 1) CHECK(all_dropped > 0);
    check_parity(c);
  }
}

TEST_CASE("MoE: the merged dispatch's collectives and bytes, from the routing (one row per token and rank)",
          "[moe][commlog]") {
  // Per layer: 1 all_to_all (counts) + 2 all_to_all_v forward, 2 all_to_all_v backward, whose
  // bytes the CommLog records against the traffic computed here from the one-rank routing: a
  // token's row travels once per expert rank its kept choices reach, so with top-2 a token whose
  // two choices share a rank sends one row, and a rank sends fewer rows than kept choices. With
  // and without a capacity that drops, with and without group-limited routing (a group per rank
  // of EP 2: each token's choices on one rank).
  for (Extent k : {1, 2})
    for (bool limited : {false, true}) {
      auto c = config(8, k, limited ? std::optional<double>{} : std::optional<double>{0.75});
      if (limited) c.router.groups = 2, c.router.topk_groups = 1;
      const auto ref = reference(c);
      std::atomic<std::int64_t> shared_tokens{0};
      for (const auto& m : mesh_cases) {
        INFO(m.name << " top-" << k << (limited ? ", group-limited" : ", capacity 0.75"));
        auto f = on_ranks(m.dense[0] * m.dense[1], [&](CommPtr world, auto report) {
          Dense dense(world, m.dense);
          auto emesh = parallel::make_expert_mesh<EMesh>(dense, m.ep);
          Moe moe("moe", dense, emesh, c, 5);
          auto x = distribute_replicated<nn::tokens<Dense>>(dense, x_full);
          const auto t = traffic(ref.routing, dense, emesh, 8, x.shape());
          CommLog fl;
          auto [y, saved] = moe.forward(x);
          const auto forward = records_of(fl);
          const auto& p = saved.plan;
          if (p.units_sent() != t.units_sent || p.units_received() != t.units_received ||
              p.pairs_sent() != t.pairs_sent || p.pairs_received() != t.pairs_received)
            report(detail::cat("plan: units ", p.units_sent(), "/", p.units_received(), ", pairs ", p.pairs_sent(), "/",
                               p.pairs_received(), "; expected ", t.units_sent, "/", t.units_received, ", ",
                               t.pairs_sent, "/", t.pairs_received));
          // This rank's tokens whose kept choices share a rank: each saves one row.
          const auto box = x.local_box();
          std::int64_t shared = 0;
          for (Extent n = box.offset[0] * T; k == 2 && n < (box.offset[0] + box.extent[0]) * T; ++n) {
            const auto s = std::size_t(n * 2);
            const auto mine = [&](std::size_t slot) { return ref.routing.expert[slot] / chunk_size(8, m.ep); };
            if (ref.routing.kept[s] && ref.routing.kept[s + 1] && mine(s) == mine(s + 1)) ++shared;
          }
          if (t.units_sent != t.pairs_sent - shared)
            report(detail::cat(t.units_sent, " units for ", t.pairs_sent, " kept choices, ", shared, " shared"));
          if (emesh.coordinate<"tp">() == 0) shared_tokens += shared;
          auto dy = distribute_replicated<nn::tokens<Dense>>(dense, dy_full);
          CommLog bl;
          auto [dx, w] = moe.backward_input(std::move(saved), dy);
          moe.backward_weight(std::move(w));
          if (forward != forward_records(t) || records_of(bl) != backward_records(t))
            report(detail::cat("expected all_to_all of ", t.counts, " bytes, all_to_all_v of ", t.dispatch, " and ",
                               t.combine, " forward and of ", t.combine, " and ", t.dispatch_backward,
                               " backward; issued:\n", fl.to_string(), bl.to_string()));
        });
        CHECK(f.empty());
        for (auto& e : f) WARN(e);
      }
      // The case tests the merging: some tokens' two choices shared a rank (all of them when limited).
      if (k == 2) CHECK(shared_tokens > 0);
    }
}

TEST_CASE("MoE on meta over the sim backend: balanced routing and the collectives, bytes and FLOPs it implies",
          "[moe][meta]") {
  // A dry run's MoE (nn::route_balanced): every expert gets rows / E of every rank's choices, and
  // a token's two choices lie E / 2 experts apart, on two ranks when ep > 1 (the unlimited
  // routing's spread), so each rank sends and receives tokens x min(topk, ep) units, rows / ep
  // pairs to and from each peer. Analytic figures: the collectives of the threads run (the
  // [commlog] case above) with those units' and side arrays' bytes, and GEMM FLOPs 2 m n k: the
  // router (tokens x C x E), the experts' fc1 and fc2 (rows x C x H each).
  using MetaDense = MetaMesh<"dp", "tp">;
  using MetaExperts = MetaMesh<"edp", "ep", "tp">;
  using MetaMoe = nn::MoE<float, MetaDense, MetaExperts>;
  constexpr Extent batch = 8, seq = 4, experts = 8, topk = 2;
  constexpr std::int64_t tokens = batch / 4 * seq, rows = tokens * topk;
  const nn::MoEConfig c{.dim = C, .hidden = H, .router = {.experts = experts, .topk = topk, .capacity_factor = 1.25}};
  for (int ep : {1, 2, 4})
    for (int rank : {0, 5}) {
      INFO("ep " << ep << ", rank " << rank);
      MetaDense dense(sim::world(rank, 8), {4, 2});
      auto emesh = parallel::make_expert_mesh<MetaExperts>(dense, ep);
      MetaMoe moe("moe", dense, emesh, c, 5);
      auto x = distribute_replicated<nn::tokens<MetaDense>>(dense, Tensor<float, 3, meta_space>(Shape<3>{batch, seq, C}));
      CommLog forward_log;
      kernels::meta::CostLog forward_cost;
      auto [y, saved] = moe.forward(x);
      CHECK(y.shape() == x.shape());
      CHECK(saved.routing.dropped == 0);
      CHECK(saved.routing.load == std::vector<std::int64_t>(experts, rows / experts));
      const std::int64_t units = tokens * std::min<std::int64_t>(topk, ep), pairs_per_peer = rows / ep;
      CHECK(saved.plan.units_sent() == units);
      CHECK(saved.plan.units_received() == units);
      CHECK(saved.plan.pairs_received() == rows);
      // Side arrays per peer: (int32 + float) per pair forward, a float per pair backward, in rows of C floats.
      auto side = [&](std::int64_t bytes) { return (bytes + C * 4 - 1) / (C * 4); };
      const auto row_bytes = [](std::int64_t r) { return std::size_t(r * C) * sizeof(float); };
      const auto dispatch = row_bytes(units + ep * side(pairs_per_peer * 8));
      const auto gradients = row_bytes(units + ep * side(pairs_per_peer * 4));
      using R = std::tuple<CollectiveKind, std::string, std::size_t>;
      CHECK(records_of(forward_log) == std::vector<R>{R{CollectiveKind::all_to_all, "ep",
                                                        std::size_t(ep * (1 + experts / ep)) * sizeof(std::int64_t)},
                                                      R{CollectiveKind::all_to_all_v, "ep", dispatch},
                                                      R{CollectiveKind::all_to_all_v, "ep", row_bytes(units)}});
      CHECK(forward_cost.flops("gemm") == 2 * tokens * C * experts + 2 * (2 * rows * C * H));
      CommLog backward_log;
      kernels::meta::CostLog backward_cost;
      auto dy = distribute_replicated<nn::tokens<MetaDense>>(dense, Tensor<float, 3, meta_space>(Shape<3>{batch, seq, C}));
      auto [dx, w] = moe.backward_input(std::move(saved), dy);
      moe.backward_weight(std::move(w));
      CHECK(dx.shape() == x.shape());
      CHECK(records_of(backward_log) == std::vector<R>{R{CollectiveKind::all_to_all_v, "ep", row_bytes(units)},
                                                       R{CollectiveKind::all_to_all_v, "ep", gradients}});
      // dx and dW of the router; dA, dX, dW1 and dW2 of the experts.
      CHECK(backward_cost.flops("gemm") == 2 * (2 * tokens * C * experts) + 4 * (2 * rows * C * H));
    }
}

TEST_CASE("MoE with forced balanced routing: the threads run issues, rank by rank, what the dry run predicts",
          "[moe][meta]") {
  // RouterConfig::force_balanced routes as the dry run assumes (nn::route_balanced), so the real
  // run's collectives (kind, group, bytes; forward and backward) are the meta run's over sim.
  using MetaDense = MetaMesh<"dp", "tp">;
  using MetaExperts = MetaMesh<"edp", "ep", "tp">;
  using Record = std::tuple<CollectiveKind, std::string, std::size_t>;
  constexpr Extent batch = 8, seq = 4;
  nn::MoEConfig c{.dim = C, .hidden = H, .router = {.experts = 8, .topk = 2, .capacity_factor = 1.25}};
  c.router.force_balanced = true;
  auto records = [](const CommLog& log) {
    std::vector<Record> out;
    for (const auto& r : log.records()) out.emplace_back(r.kind, r.group, r.bytes);
    return out;
  };
  // One forward and backward_input (dy = x) on `dense` and its expert mesh; the collectives.
  auto step = [&](const auto& dense, const auto& emesh, const auto& x) {
    nn::MoE<float, std::remove_cvref_t<decltype(dense)>, std::remove_cvref_t<decltype(emesh)>> moe("moe", dense, emesh, c, 5);
    CommLog log;
    auto [y, saved] = moe.forward(x);
    auto [dx, w] = moe.backward_input(std::move(saved), x);
    return records(log);
  };
  for (int ep : {2, 4}) {
    INFO("ep " << ep);
    std::vector<std::vector<Record>> real(8);
    threads::run(8, [&](CommPtr world) {
      Dense dense(world, {4, 2});
      const auto emesh = parallel::make_expert_mesh<EMesh>(dense, ep);
      const auto x = distribute_replicated<nn::tokens<Dense>>(dense, normal<float>(Shape<3>{batch, seq, C}, 3));
      real[std::size_t(world->rank())] = step(dense, emesh, x);
    });
    for (int rank = 0; rank < 8; ++rank) {
      INFO("rank " << rank);
      MetaDense dense(sim::world(rank, 8), {4, 2});
      const auto emesh = parallel::make_expert_mesh<MetaExperts>(dense, ep);
      const auto x =
          distribute_replicated<nn::tokens<MetaDense>>(dense, Tensor<float, 3, meta_space>(Shape<3>{batch, seq, C}));
      const auto dry = step(dense, emesh, x);
      CHECK(dry.size() == 5);
      CHECK(dry == real[std::size_t(rank)]);
    }
  }
}

TEST_CASE("MoE: every token routed to one expert works (one rank receives them all)", "[moe][skew]") {
  // A zero router scores every expert alike; ties go to the lowest index: all tokens to expert 0.
  auto c = config(8, 1);
  const auto ref = reference(c, true);
  REQUIRE(std::all_of(ref.routing.expert.begin(), ref.routing.expert.end(), [](auto e) { return e == 0; }));
  check_parity(c, true);
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    Dense dense(world, {4, 1});
    auto run = run_moe(dense, parallel::make_expert_mesh<EMesh>(dense, 4), c, true);
    const std::int64_t expect = dense.rank() == 0 ? B * T : 0;  // rank 0 owns expert 0
    if (run.units_received != expect) report(detail::cat("received ", run.units_received, " units, expected ", expect));
  });
  CHECK(f.empty());
  for (auto& e : f) WARN(e);
}

TEST_CASE("MoE: the aux loss gradient moves the load towards uniform", "[moe][aux]") {
  threads::run(1, [&](CommPtr w) {
    Dense dense(w, {1, 1});
    auto emesh = parallel::make_expert_mesh<EMesh>(dense, 1);
    auto c = config(4, 1);
    c.router.aux_loss_coeff = 1.0;
    c.router.z_loss_coeff = 0.0;
    c.init_std = 0.3;
    Moe moe("moe", dense, emesh, c, 9);
    // Feature 0 is 1 for every token and the router favours expert 0 on it: a skewed start.
    auto xs = normal<double>(Shape<3>{8, 16, C}, 31);
    for (Extent n = 0; n < 8 * 16; ++n) xs[n * C] = 1.0;
    moe.router().weight().value().local()(0, 0) = 3.0;
    auto x = distribute_replicated<nn::tokens<Dense>>(dense, xs);
    const X zero_dy(dense, x.shape(), Tensor<double, 3>(x.to_local().shape()));  // the aux loss alone
    auto max_share = [](const nn::Routing<double>& r) {
      return double(*std::max_element(r.load.begin(), r.load.end())) / double(r.tokens);
    };
    std::vector<double> shares, losses;
    for (int step = 0; step < 30; ++step) {
      nn::zero_grad(moe);
      auto [y, s] = moe.forward(x);
      shares.push_back(max_share(s.routing));
      losses.push_back(s.routing.aux_loss);
      auto [dx, wc] = moe.backward_input(std::move(s), zero_dy);
      moe.backward_weight(std::move(wc));
      auto& wl = moe.router().weight().value().local();
      const auto g = moe.router().weight().grad_local();
      for (Extent i = 0; i < wl.numel(); ++i) wl[i] -= 2.0 * g[i];
    }
    INFO("max expert share per step: " << shares.front() << " -> " << shares.back());
    CHECK(shares.front() > 0.6);
    CHECK(shares.back() < 0.4);
    CHECK(losses.back() < losses.front());
  });
}

TEST_CASE("MoE: bad input gives clear errors", "[moe][errors]") {
  auto message_of = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  threads::run(4, [&](CommPtr world) {
    Dense dense(world, {4, 1});
    auto ep4 = parallel::make_expert_mesh<EMesh>(dense, 4);
    CHECK_THAT(message_of([&] { parallel::exchange_counts<double>(ep4.group<"ep">(), parallel::DispatchOrder{}, C); }),
               Catch::Contains("0 expert counts and units for 0 ranks over 4 ranks"));
    CHECK_THAT(message_of([&] { Moe("moe", dense, ep4, config(4, 5), 1); }), Catch::Contains("topk 5 of 4 experts"));
    CHECK_THAT(message_of([&] { Moe("moe", dense, ep4, config(4, 1, 0.0), 1); }),
               Catch::Contains("capacity factor 0 must be > 0"));
    CHECK_THAT(message_of([&] { Moe("moe", dense, ep4, config(4, 1, -1.0), 1); }),
               Catch::Contains("capacity factor -1 must be > 0"));
    CHECK_THAT(message_of([&] { parallel::make_expert_mesh<EMesh>(dense, 3); }),
               Catch::Contains("expert size 3 must divide the dense mesh's data x context size 4"));
    auto ep2 = parallel::make_expert_mesh<EMesh>(dense, 2);
    Moe moe("moe", dense, ep2, config(4, 1), 1);
    auto bad = distribute_replicated<nn::tokens<Dense>>(dense, normal<double>(Shape<3>{4, 2, C + 1}, 1));
    CHECK_THAT(message_of([&] { moe.forward(bad); }), Catch::Contains("does not have 6 features"));
  });
}

TEST_CASE("Group-limited routing: each token's top-k from its best groups, and EP equal to one rank", "[moe][groups]") {
  // The reference, written here from the definition (nn/router.hpp): a group's score is the sum of
  // its top two expert scores, the token keeps its M best groups (ties to the lower group), and
  // its top-k is taken over their experts (ties to the lower expert).
  constexpr Extent E = 8, G = 4, M = 2, K = 3, per = E / G, n_tok = 40;
  const auto logits = normal<double>(Shape<2>{n_tok, E}, 31, 0, 2);
  nn::RouterConfig rc;
  rc.experts = E, rc.topk = K, rc.groups = G, rc.topk_groups = M;
  const auto r = nn::route<double>(logits.span(), 5, 8, 5, rc);
  int limited_tokens = 0;
  for (Extent n = 0; n < n_tok; ++n) {
    const double* p = r.scores.data() + n * E;
    std::vector<std::pair<double, Extent>> groups;
    for (Extent g = 0; g < G; ++g) {
      std::vector<double> in(p + g * per, p + (g + 1) * per);
      std::sort(in.rbegin(), in.rend());
      groups.push_back({in[0] + in[1], g});
    }
    std::stable_sort(groups.begin(), groups.end(), [](auto a, auto b) { return a.first > b.first; });
    std::vector<std::pair<double, Extent>> allowed;
    for (Extent m = 0; m < M; ++m)
      for (Extent e = groups[std::size_t(m)].second * per; e < (groups[std::size_t(m)].second + 1) * per; ++e)
        allowed.push_back({p[e], e});
    std::sort(allowed.begin(), allowed.end(),
              [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    std::vector<Extent> best(K);
    for (Extent j = 0; j < K; ++j) best[std::size_t(j)] = allowed[std::size_t(j)].second;
    std::vector<Extent> got;
    for (Extent j = 0; j < K; ++j) got.push_back(r.expert[std::size_t(n * K + j)]);
    CHECK(got == best);
    // Without the limit the token would have left its best groups for some of its choices.
    std::vector<std::pair<double, Extent>> all;
    for (Extent e = 0; e < E; ++e) all.push_back({p[e], e});
    std::sort(all.begin(), all.end(),
              [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    std::set<Extent> spanned;
    for (Extent j = 0; j < K; ++j) spanned.insert(all[std::size_t(j)].second / per);
    limited_tokens += spanned.size() > std::size_t(M) ? 1 : 0;
  }
  CHECK(limited_tokens > 0);  // the limit changed some tokens' choices: the case tests something
  // topk_groups = groups (or 0) is the unlimited routing.
  auto all_groups = rc;
  all_groups.topk_groups = G;
  auto plain = rc;
  plain.groups = 1, plain.topk_groups = 0;
  CHECK(nn::route<double>(logits.span(), 5, 8, 5, all_groups).expert ==
        nn::route<double>(logits.span(), 5, 8, 5, plain).expert);
  // A group per expert rank (G = ep): device-limited routing, EP 2 and 4 equal to one rank.
  auto grouped = config(8, 3);
  grouped.router.groups = 4;
  grouped.router.topk_groups = 2;
  check_parity(grouped);
  grouped.router.groups = 2;
  grouped.router.topk_groups = 1;
  check_parity(grouped);
  // Top-1 and top-2 with the limit (the merged dispatch sends a top-2 token one row when its
  // group is one rank's experts), uneven: 6 experts in 3 groups over EP 4 (2, 2, 2, 0).
  for (Extent k : {1, 2}) {
    auto limited = config(8, k);
    limited.router.groups = 4, limited.router.topk_groups = 2;
    check_parity(limited);
    limited.router.groups = 2, limited.router.topk_groups = 1;
    check_parity(limited);
    auto uneven = config(6, k);
    uneven.router.groups = 3, uneven.router.topk_groups = 1;
    check_parity(uneven);
  }
  // Bad configurations name the groups.
  auto bad = rc;
  bad.groups = 3;
  CHECK_THROWS_WITH(nn::check_router_config(bad, "nn::route"),
                    Catch::Contains("routing groups 3 (top 2 of them) over 8 experts"));
  bad = rc;
  bad.topk_groups = 1;
  CHECK_THROWS_WITH(nn::check_router_config(bad, "nn::route"),
                    Catch::Contains("topk 3 from 1 of 4 groups of 2 experts"));
}

TEST_CASE("Balanced routing (the dry run's) imitates the group limit and stays balanced", "[moe][groups][meta]") {
  // nn::route_balanced: each token's top-k distinct and within its topk_groups groups (every
  // group when unlimited), every expert the same share of E tokens' choices, and without a limit
  // a token's choices as far apart as they go: on min(topk, ranks) expert ranks when consecutive
  // experts split over the ranks.
  struct Case {
    Extent experts, topk, groups, topk_groups;
  };
  for (const Case c : {Case{8, 2, 1, 0}, Case{8, 3, 4, 2}, Case{8, 2, 2, 1}, Case{16, 4, 4, 1}, Case{256, 8, 8, 4},
                       Case{6, 2, 3, 2}, Case{8, 8, 4, 0}}) {
    INFO(c.experts << " experts, top-" << c.topk << ", groups " << c.groups << " top " << c.topk_groups);
    nn::RouterConfig rc;
    rc.experts = c.experts, rc.topk = c.topk, rc.groups = c.groups, rc.topk_groups = c.topk_groups;
    const Extent tokens = 2 * c.experts, per = c.experts / c.groups;
    const auto r = nn::route_balanced<double>(2, c.experts, 2, rc);
    const Extent allowed = nn::group_limited(rc) ? c.topk_groups : c.groups;
    for (Extent n = 0; n < tokens; ++n) {
      std::set<Extent> experts, groups;
      for (Extent j = 0; j < c.topk; ++j) {
        experts.insert(r.expert[std::size_t(n * c.topk + j)]);
        groups.insert(r.expert[std::size_t(n * c.topk + j)] / per);
      }
      CHECK(experts.size() == std::size_t(c.topk));
      CHECK(groups.size() <= std::size_t(allowed));
      CHECK(groups.size() == std::size_t(std::min(c.topk, allowed)));  // spread over as many groups as allowed
    }
    CHECK(r.load == std::vector<std::int64_t>(std::size_t(c.experts), tokens * c.topk / c.experts));
  }
  // Unlimited top-2 of 8 experts over 4 ranks (2 experts each): the two choices on two ranks.
  nn::RouterConfig rc;
  rc.experts = 8, rc.topk = 2;
  const auto r = nn::route_balanced<double>(1, 8, 1, rc);
  for (Extent n = 0; n < 8; ++n) CHECK(r.expert[std::size_t(2 * n)] / 2 != r.expert[std::size_t(2 * n + 1)] / 2);
}

TEST_CASE("Routing a sequence split over context ranks equals routing it whole (dropless)", "[moe][context]") {
  // 3 sequences of 8 tokens; each split over 2 context ranks (positions 0-3 and 4-7, as a
  // context rank holds them): the same choices and gates per token, aux and z shares that add up
  // to the whole's, and each token's logit gradient the whole's.
  constexpr Extent batch = 3, seq = 8, experts = 4, parts = 2, part_seq = seq / parts;
  const auto logits = normal<double>(Shape<2>{batch * seq, experts}, 31);
  const auto dgate_all = normal<double>(Shape<2>{batch * seq, 2}, 32);
  const nn::RouterConfig rc{.experts = experts, .topk = 2, .score = nn::RouterScore::softmax, .capacity_factor = std::nullopt,
                            .normalize_gates = true, .aux_loss_coeff = 0.1, .z_loss_coeff = 0.01};
  const auto whole = nn::route<double>(logits.span(), batch, seq, batch, rc);
  const auto whole_dlogits = nn::route_backward(whole, std::span<const double>(dgate_all.span()), rc);
  auto token = [&](Extent b, Extent part, Extent t) { return b * seq + part * part_seq + t; };
  std::vector<double> aux(parts), z(parts);
  auto failures = on_ranks(int(parts), [&](CommPtr world, auto report) {
    const Extent part = world->rank();
    std::vector<double> mine, dgate;
    for (Extent b = 0; b < batch; ++b)
      for (Extent t = 0; t < part_seq; ++t) {
        const Extent n = token(b, part, t);
        mine.insert(mine.end(), logits.data() + n * experts, logits.data() + (n + 1) * experts);
        dgate.insert(dgate.end(), dgate_all.data() + n * 2, dgate_all.data() + n * 2 + 2);
      }
    const nn::RouteContext context{.parts = parts, .sum_over_parts = [&](std::span<double> v) {
                                     world->all_reduce(v, ReduceOp::sum);
                                   }};
    const auto r = nn::route<double>(std::span<const double>(mine), batch, part_seq, batch, rc, context);
    const auto dlogits = nn::route_backward(r, std::span<const double>(dgate), rc);
    aux[std::size_t(part)] = r.aux_loss, z[std::size_t(part)] = r.z_loss;
    for (Extent b = 0; b < batch; ++b)
      for (Extent t = 0; t < part_seq; ++t) {
        const Extent n = token(b, part, t), local = b * part_seq + t;
        for (Extent j = 0; j < 2; ++j)
          if (r.expert[std::size_t(local * 2 + j)] != whole.expert[std::size_t(n * 2 + j)] ||
              r.gate[std::size_t(local * 2 + j)] != whole.gate[std::size_t(n * 2 + j)])
            report(detail::cat("token ", n, ": choice ", j, " differs"));
        for (Extent e = 0; e < experts; ++e)
          if (std::abs(dlogits[std::size_t(local * experts + e)] - whole_dlogits[std::size_t(n * experts + e)]) > 1e-14)
            report(detail::cat("token ", n, ": dlogit ", e, " ", dlogits[std::size_t(local * experts + e)], " vs ",
                               whole_dlogits[std::size_t(n * experts + e)]));
      }
    // A capacity below the whole sequence's length could drop: refused under context parallelism.
    nn::RouterConfig capped = rc;
    capped.capacity_factor = 1.0;  // 4 slots per expert for 8 tokens
    try {
      nn::route<double>(std::span<const double>(mine), batch, part_seq, batch, capped, context);
      report("a binding capacity was accepted under context parallelism");
    } catch (const Error& e) {
      if (std::string(e.what()).find("capacity groups are whole sequences") == std::string::npos) report(e.what());
    }
  });
  CHECK(failures.empty());
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(aux[0] + aux[1] == Approx(whole.aux_loss).epsilon(1e-13));
  CHECK(z[0] + z[1] == Approx(whole.z_loss).epsilon(1e-13));
  CHECK(whole.aux_loss > 0);
}

TEST_CASE("nn::add_unit of a module part: its parameters on the named mesh only", "[moe][units]") {
  // A MoE has parameters on two meshes: a unit on the expert mesh made from the module holds the
  // experts' (w1 and its bias, w2 and its bias), not the router's (dense mesh), in order.
  threads::run(1, [&](CommPtr w) {
    Dense dense(w, {1, 1});
    Moe moe("moe", dense, parallel::make_expert_mesh<EMesh>(dense, 1), config(4, 2), 5);
    std::vector<nn::ParamUnit<double, 3>> units;
    nn::add_unit<double, EMesh>(units, "experts", moe);
    REQUIRE(units.size() == 1);
    std::vector<std::string> names, expected;
    for (const auto& p : units[0].params) names.push_back(p.name);
    nn::for_each_parameter_on<EMesh>(moe, [&](auto& p) {
      if (p.defined()) expected.push_back(p.name());
    });
    CHECK(names == expected);
    CHECK(names.size() == 4);
    CHECK(units[0].group->name() == "experts");
  });
}

namespace {

/// c [m, n] = op(a) op(b) of FP8 values, in double: a quantized to FA by sa and b to FB by sb as
/// kernels::host::quantize does (float(float(v) * s), then the satfinite conversion), the
/// products of the FP8 values summed, divided by the scales. a is [m, k] ([k, m] with ta), b
/// [k, n] ([n, k] with tb), row-major.
template <class FA, class FB>
std::vector<double> fp8_product(const double* a, float sa, const double* b, float sb, Extent m, Extent n, Extent k,
                                bool ta, bool tb) {
  const auto q = [](auto f8, double v, float s) { return double(float(decltype(f8)(float(float(v) * s)))); };
  std::vector<double> c(std::size_t(m * n), 0.0);
  for (Extent i = 0; i < m; ++i)
    for (Extent j = 0; j < n; ++j) {
      double sum = 0;
      for (Extent p = 0; p < k; ++p)
        sum += q(FA{}, ta ? a[p * m + i] : a[i * k + p], sa) * q(FB{}, tb ? b[j * k + p] : b[p * n + j], sb);
      c[std::size_t(i * n + j)] = sum / double(sa) / double(sb);
    }
  return c;
}
/// The delayed-scaling recipe's first scale of n values: fp8_max / max |float(v)|.
template <class F8>
float first_scale(const double* v, Extent n) {
  float m = 0;
  for (Extent i = 0; i < n; ++i) m = std::max(m, std::abs(float(v[i])));
  return F8::max_value() / m;
}
/// "" or where got [m, n] (a pitch-n view at `got`) differs from want beyond 1e-5 (the fp32
/// summation of the emulation against the double sum here, on values of order 1).
std::string close_to(const double* got, const std::vector<double>& want, const char* what) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= 1e-5 * (1 + std::abs(want[i]))))
      return detail::cat(what, "[", i, "]: ", got[i], " vs the FP8 reference ", want[i]);
  return {};
}

}  // namespace

TEST_CASE("MoE FP8: every expert GEMM is the FP8 emulation with its expert's own delayed scales", "[moe][fp8]") {
  // SwiGLU experts on one rank, 3 experts with 3, 0 and 5 rows: under nn::Fp8Autocast each of the
  // five GEMMs per expert (h = x w1^T, up = x w3^T, y = a w2^T; dA = dY W2, dX = dH W1 + dUp W3;
  // dW1 = dH^T X, dW3 = dUp^T X, dW2 = dY^T A) equals the product of the FP8 values, E4M3 x E4M3
  // forward and E5M2 x E4M3 backward, with per-expert scales (each expert's own amax: the first
  // use's scale), against a double sum; a second forward of 3 x the rows quantizes with the first
  // use's scales (delayed: its large values saturate).
  using Experts = nn::GroupedExperts<double, EMesh, nn::ExpertFfn::swiglu>;
  using E4 = float8_e4m3;
  using E5 = float8_e5m2;
  constexpr Extent E = 3, D = 8, F = 12, M = 8;
  const std::vector<std::int64_t> rows{3, 0, 5};
  const std::vector<Extent> first{0, 3, 3};
  const auto x = normal<double>(Shape<2>{M, D}, 31);
  const auto dy = normal<double>(Shape<2>{M, D}, 32);
  auto x3 = x;
  for (Extent i = 0; i < x3.numel(); ++i) x3[i] *= 3;
  threads::run(1, [&](CommPtr w) {
    Dense dense(w, {1, 1});
    auto emesh = parallel::make_expert_mesh<EMesh>(dense, 1);
    Experts ex("ex", emesh, {.experts = E, .dim = D, .hidden = F, .init_std = 0.5, .out_std = 0.5}, 7);
    const auto y_unquantized = ex.forward(x, rows).y;  // before the autocast: no FP8
    const nn::Fp8Autocast fp8;
    auto [y, saved] = ex.forward(x, rows);
    REQUIRE(saved.fp8.size() == std::size_t(E));
    const auto a = kernels::mul(kernels::silu(saved.h), saved.up);
    auto [w1, w3, w2] = ex.parameters();
    const double* W1 = w1.value().to_local().data();
    const double* W3 = w3.value().to_local().data();
    const double* W2 = w2.value().to_local().data();
    const std::vector<float> none(std::size_t{E}, 0.f);
    auto sx = none, sw1 = none, sw3 = none, sw2 = none;
    double differs = 0;
    for (Extent e = 0; e < E; ++e) {
      INFO("expert " << e);
      const Extent m = rows[std::size_t(e)], r = first[std::size_t(e)];
      sw1[std::size_t(e)] = first_scale<E4>(W1 + e * F * D, F * D);
      sw3[std::size_t(e)] = first_scale<E4>(W3 + e * F * D, F * D);
      sw2[std::size_t(e)] = first_scale<E4>(W2 + e * D * F, D * F);
      CHECK(saved.fp8[std::size_t(e)].w1 == sw1[std::size_t(e)]);
      CHECK(saved.fp8[std::size_t(e)].w2 == sw2[std::size_t(e)]);
      if (m == 0) continue;
      sx[std::size_t(e)] = first_scale<E4>(x.data() + r * D, m * D);
      const float sa = first_scale<E4>(a.data() + r * F, m * F);
      CHECK(saved.fp8[std::size_t(e)].x == sx[std::size_t(e)]);
      CHECK(saved.fp8[std::size_t(e)].a == sa);
      CHECK(close_to(saved.h.data() + r * F,
                     fp8_product<E4, E4>(x.data() + r * D, sx[std::size_t(e)], W1 + e * F * D, sw1[std::size_t(e)], m,
                                         F, D, false, true),
                     "h") == "");
      CHECK(close_to(saved.up.data() + r * F,
                     fp8_product<E4, E4>(x.data() + r * D, sx[std::size_t(e)], W3 + e * F * D, sw3[std::size_t(e)], m,
                                         F, D, false, true),
                     "up") == "");
      CHECK(
          close_to(y.data() + r * D,
                   fp8_product<E4, E4>(a.data() + r * F, sa, W2 + e * D * F, sw2[std::size_t(e)], m, D, F, false, true),
                   "y") == "");
      for (Extent i = r * D; i < (r + m) * D; ++i) differs = std::max(differs, std::abs(y[i] - y_unquantized[i]));
    }
    CHECK(differs > 1e-3);  // the GEMMs did quantize
    const auto h = saved.h;
    auto [dx, ctx] = ex.backward_input(std::move(saved), dy);
    const auto silu_h = kernels::silu(h);
    const auto dh = ctx.dh, dup = ctx.dup;
    auto sdy = none, sdh = none, sdup = none;
    for (Extent e = 0; e < E; ++e) {
      const Extent m = rows[std::size_t(e)], r = first[std::size_t(e)];
      if (m == 0) continue;
      INFO("expert " << e);
      sdy[std::size_t(e)] = first_scale<E5>(dy.data() + r * D, m * D);
      sdh[std::size_t(e)] = first_scale<E5>(dh.data() + r * F, m * F);
      sdup[std::size_t(e)] = first_scale<E5>(dup.data() + r * F, m * F);
      CHECK(ctx.fp8[std::size_t(e)].dy == sdy[std::size_t(e)]);
      CHECK(ctx.fp8[std::size_t(e)].dh == sdh[std::size_t(e)]);
      CHECK(ctx.fp8[std::size_t(e)].dup == sdup[std::size_t(e)]);
      // dUp = dA silu(h), dA = dY W2 (FP8).
      auto dup_want = fp8_product<E5, E4>(dy.data() + r * D, sdy[std::size_t(e)], W2 + e * D * F, sw2[std::size_t(e)],
                                          m, F, D, false, false);
      for (Extent i = 0; i < m * F; ++i) dup_want[std::size_t(i)] *= silu_h[r * F + i];
      CHECK(close_to(dup.data() + r * F, dup_want, "dup") == "");
      auto dx_want = fp8_product<E5, E4>(dh.data() + r * F, sdh[std::size_t(e)], W1 + e * F * D, sw1[std::size_t(e)], m,
                                         D, F, false, false);
      const auto dx_up = fp8_product<E5, E4>(dup.data() + r * F, sdup[std::size_t(e)], W3 + e * F * D,
                                             sw3[std::size_t(e)], m, D, F, false, false);
      for (std::size_t i = 0; i < dx_want.size(); ++i) dx_want[i] += dx_up[i];
      CHECK(close_to(dx.data() + r * D, dx_want, "dx") == "");
    }
    const auto a_ctx = ctx.a;
    ex.backward_weight(std::move(ctx));
    const auto g1 = w1.grad_local(), g3 = w3.grad_local(), g2 = w2.grad_local();
    for (Extent e = 0; e < E; ++e) {
      const Extent m = rows[std::size_t(e)], r = first[std::size_t(e)];
      INFO("expert " << e);
      if (m == 0) {  // no rows: zero gradients
        for (Extent i = e * F * D; i < (e + 1) * F * D; ++i) CHECK((g1[i] == 0 && g3[i] == 0 && g2[i] == 0));
        continue;
      }
      const float sa = first_scale<E4>(a_ctx.data() + r * F, m * F);
      CHECK(close_to(g1.data() + e * F * D,
                     fp8_product<E5, E4>(dh.data() + r * F, sdh[std::size_t(e)], x.data() + r * D, sx[std::size_t(e)],
                                         F, D, m, true, false),
                     "dW1") == "");
      CHECK(close_to(g3.data() + e * F * D,
                     fp8_product<E5, E4>(dup.data() + r * F, sdup[std::size_t(e)], x.data() + r * D, sx[std::size_t(e)],
                                         F, D, m, true, false),
                     "dW3") == "");
      CHECK(close_to(g2.data() + e * D * F,
                     fp8_product<E5, E4>(dy.data() + r * D, sdy[std::size_t(e)], a_ctx.data() + r * F, sa, D, F, m,
                                         true, false),
                     "dW2") == "");
    }
    // The second use: x's scale is the first use's (delayed), so 3 x saturates where x was near its amax.
    auto second = ex.forward(x3, rows);
    for (Extent e : {Extent(0), Extent(2)}) {
      INFO("expert " << e << ", second use");
      const Extent m = rows[std::size_t(e)], r = first[std::size_t(e)];
      CHECK(second.saved.fp8[std::size_t(e)].x == sx[std::size_t(e)]);
      CHECK(close_to(second.saved.h.data() + r * F,
                     fp8_product<E4, E4>(x3.data() + r * D, sx[std::size_t(e)], W1 + e * F * D, sw1[std::size_t(e)], m,
                                         F, D, false, true),
                     "h") == "");
    }
  });
}

TEST_CASE("MoE FP8: EP=2 and EP=4 (with DP, TP) match the one-rank FP8 MoE; the amaxes all-reduced over edp",
          "[moe][fp8][parity]") {
  // Under nn::Fp8Autocast the router (an nn::Linear) and the experts compute in FP8. Every mesh
  // quantizes as one rank does (the router's amaxes over dp, the experts' rows' per expert over
  // "edp"), so the runs equal the one-rank FP8 run up to the fp32 summation order (1e-6).
  const auto c = config(4, 2);
  const auto bf16_ref = reference(c);
  const nn::Fp8Autocast fp8;
  const auto fp8_ref = reference(c);
  CHECK(compare_moe(fp8_ref, bf16_ref, 1e-4) != "");  // FP8 quantized
  // The output in FP8 close to the unquantized one: the relative norm of the difference (E4M3's
  // 3 mantissa bits; the FP8 router may also pick other experts for a near tie): 0.059 when written.
  double diff = 0, norm = 0;
  for (Extent i = 0; i < bf16_ref.y.numel(); ++i)
    diff += std::pow(fp8_ref.y[i] - bf16_ref.y[i], 2), norm += std::pow(bf16_ref.y[i], 2);
  CAPTURE(std::sqrt(diff / norm));
  CHECK(std::sqrt(diff / norm) < 0.1);
  check_parity(c, false, 1e-6);
  check_parity(config(5, 1), false, 1e-6);  // 5 experts over ep 2 and 4: 3 + 2, 2 + 2 + 1 + 0
  // EP=2 x DP=2 ("edp" 2): forward all-reduces x's and then w2's input's amaxes over "edp" (a
  // float per local expert), backward dy's and then dH's (GELU experts: one hidden gradient).
  auto f = on_ranks(4, [&](CommPtr world, auto report) {
    Dense dense(world, {4, 1});
    auto emesh = parallel::make_expert_mesh<EMesh>(dense, 2);
    const auto run = run_moe(dense, emesh, c, false, x_full, dy_full, true);
    const Record amaxes{CollectiveKind::all_reduce, "edp", std::size_t(4 * run.local_experts)};
    const auto count = [&](const std::vector<Record>& log) { return std::count(log.begin(), log.end(), amaxes); };
    report(count(run.forward_log) == 2 && count(run.backward_log) == 2
               ? std::string()
               : detail::cat("edp amax all-reduces: forward ", count(run.forward_log), ", backward ",
                             count(run.backward_log), " (want 2, 2)"));
  });
  CHECK(f.empty());
  for (auto& e : f) WARN(e);
}

namespace {
/// A mesh of the node-level dispatch: an expert group of `ep` ranks in nodes of `node_size`.
struct NodeCase {
  const char* name;
  std::array<int, 2> dense;
  int ep, node_size;
};
const NodeCase node_cases[] = {{"EP=4 in nodes of 2", {4, 1}, 4, 2},
                               {"EP=6 in nodes of 3", {6, 1}, 6, 3},
                               {"EP=6 in nodes of 2", {6, 1}, 6, 2},
                               {"EP=4 in nodes of 2 x TP=2", {4, 2}, 4, 2},
                               {"EP=2 in nodes of 2 x DP=2", {4, 1}, 2, 2}};

/// Rows of this rank's tokens that cross to another node: per token, the distinct expert ranks
/// (one-stage) or nodes (node-level) its kept choices reach outside its own node, from the
/// one-rank routing. `me`: this rank's ep coordinate.
std::int64_t rows_across(const nn::Routing<double>& ref, const X& x, Extent experts, int ep, int node_size, int me,
                         bool per_node) {
  const auto box = x.local_box();
  const Extent k = ref.topk;
  std::int64_t rows = 0;
  for (Extent n = box.offset[0] * T; n < (box.offset[0] + box.extent[0]) * T; ++n) {
    std::set<int> reached;
    for (Extent j = 0; j < k; ++j) {
      const auto s = std::size_t(n * k + j);
      if (!ref.kept[s]) continue;
      int rank = 0;
      while (chunk_range(experts, ep, rank).end <= ref.expert[s]) ++rank;
      if (rank / node_size != me / node_size) reached.insert(per_node ? rank / node_size : rank);
    }
    rows += std::int64_t(reached.size());
  }
  return rows;
}
}  // namespace

TEST_CASE("MoE node-level dispatch: equal to one rank (double, 1e-12), top-2 and 3, node-limited or not, uneven",
          "[moe][nodes][parity]") {
  // The two-stage dispatch (parallel/node_dispatch.hpp) against the one-rank MoE: outputs, input
  // gradients, every parameter gradient and the routing. The combine sums a token's outputs per
  // node, then over nodes, so the order of the sums differs from the one-rank run's: 1e-12
  // relative and absolute in double (the differences are rounding, ~1e-16). Uneven: 5 sequences
  // over 4 or 6 data ranks (a rank without tokens on 6), 7 experts over 4 ranks (2, 2, 2, 1) and
  // 5 over 6 (a rank without experts).
  for (Extent k : {2, 3})
    for (Extent experts : {12, 7, 5})
      for (bool limited : {false, true}) {
        if (limited && experts != 12) continue;  // groups of a node's experts need E divisible
        for (const auto& m : node_cases) {
          if (k > experts || (experts == 7 && m.ep == 6 && m.node_size == 2)) continue;  // a node without experts
          auto c = config(experts, k);
          c.node_size = m.node_size;
          if (limited) {
            const int nodes = m.ep / m.node_size;
            if (nodes < 2 || experts % nodes != 0) continue;
            c.router.groups = nodes;  // a group per node: each token reaches at most topk_groups nodes
            c.router.topk_groups = nodes - 1;
          }
          INFO(m.name << ", " << experts << " experts, top-" << k << (limited ? ", node-limited" : ""));
          auto one_rank = c;
          one_rank.node_size = 0;
          const auto ref = reference(one_rank);
          auto f = on_ranks(m.dense[0] * m.dense[1], [&](CommPtr world, auto report) {
            Dense dense(world, m.dense);
            report(compare_moe(run_moe(dense, parallel::make_expert_mesh<EMesh>(dense, m.ep), c), ref));
          });
          CHECK(f.empty());
          for (auto& e : f) WARN(e);
        }
      }
}

TEST_CASE("MoE node-level dispatch: nodes of 1 rank and one node of all ranks give the one-stage results",
          "[moe][nodes]") {
  // L = 1: stage 2 is a rank's own experts, each node's sum one term, so every result is the
  // one-stage dispatch's bit for bit. L = E: stage 1 is a rank to itself and the outputs, every
  // parameter gradient and the weights after a step are bit for bit the same; the input gradient
  // adds a token's expert terms summed in the node to the router's term (one-stage: one by one),
  // so it agrees to rounding (1e-14 relative and absolute in double).
  auto exact = [](const auto& a, const auto& b) { return compare(a, b, {.rtol = 0, .atol = 0}); };
  for (Extent k : {1, 2}) {
    auto c = config(7, k);
    for (int node_size : {1, 4}) {
      INFO("nodes of " << node_size << ", top-" << k);
      auto f = on_ranks(4, [&](CommPtr world, auto report) {
        Dense dense(world, {4, 1});
        const auto emesh = parallel::make_expert_mesh<EMesh>(dense, 4);
        const auto one = run_moe(dense, emesh, c, false, x_full, dy_full, true);
        auto nodes = c;
        nodes.node_size = node_size;
        const auto two = run_moe(dense, emesh, nodes, false, x_full, dy_full, true);
        if (auto d = exact(two.y, one.y); !d) report("output: " + d.message);
        if (auto d = node_size == 1 ? exact(two.dx, one.dx) : compare(two.dx, one.dx, {.rtol = 1e-14, .atol = 1e-14});
            !d)
          report("input gradient: " + d.message);
        for (std::size_t i = 0; i < one.grads2.size(); ++i)
          if (auto d = exact(two.grads2[i], one.grads2[i]); !d)
            report(detail::cat("gradient 2-d #", i, ": ", d.message));
        for (std::size_t i = 0; i < one.grads3.size(); ++i)
          if (auto d = exact(two.grads3[i], one.grads3[i]); !d)
            report(detail::cat("gradient 3-d #", i, ": ", d.message));
        if (auto d = exact(two.y_after, one.y_after); !d) report("after a step: " + d.message);
      });
      CHECK(f.empty());
      for (auto& e : f) WARN(e);
    }
  }
}

TEST_CASE("MoE node-level dispatch: the collectives on each group, and fewer rows across nodes",
          "[moe][nodes][commlog]") {
  // Per layer, forward: counts across (all_to_all), the units across (all_to_all_v), counts
  // inside the node (all_to_all), the units inside (all_to_all_v), the experts' rows back inside
  // and the (token, node) rows back across; backward the four all_to_all_v in reverse. A token
  // crosses to another node once per node its choices reach there, not once per expert rank:
  // the rows this rank sends to other nodes are counted here from the one-rank routing, both
  // ways, and with top-3 over 2 ranks per node some tokens have several choices on one node.
  using K = CollectiveKind;
  const std::vector<std::pair<K, std::string>> forward_expected = {
      {K::all_to_all, "ep_across"}, {K::all_to_all_v, "ep_across"}, {K::all_to_all, "ep_node"},
      {K::all_to_all_v, "ep_node"}, {K::all_to_all_v, "ep_node"},   {K::all_to_all_v, "ep_across"}};
  const std::vector<std::pair<K, std::string>> backward_expected = {{K::all_to_all_v, "ep_across"},
                                                                    {K::all_to_all_v, "ep_node"},
                                                                    {K::all_to_all_v, "ep_node"},
                                                                    {K::all_to_all_v, "ep_across"}};
  auto kinds = [](const CommLog& log) {
    std::vector<std::pair<K, std::string>> out;
    for (const auto& r : log.records()) out.emplace_back(r.kind, r.group);
    return out;
  };
  for (bool limited : {false, true}) {
    auto c = config(12, 3);
    if (limited) c.router.groups = 3, c.router.topk_groups = 2;  // a group per node of 2 ranks: <= 2 nodes
    const auto ref = reference(c);
    std::atomic<std::int64_t> one_stage_rows{0}, node_rows{0};
    auto f = on_ranks(6, [&](CommPtr world, auto report) {
      Dense dense(world, {6, 1});
      auto emesh = parallel::make_expert_mesh<EMesh>(dense, 6);
      auto nodes = c;
      nodes.node_size = 2;
      Moe moe("moe", dense, emesh, nodes, 5);
      auto x = distribute_replicated<nn::tokens<Dense>>(dense, x_full);
      CommLog fl;
      auto [y, saved] = moe.forward(x);
      const auto forward = kinds(fl);
      const auto& p = saved.plan;  // stage 1's: by node
      const int me = emesh.coordinate<"ep">();
      std::int64_t sent_across = 0;
      for (int node = 0; node < p.ranks; ++node)
        if (node != me / 2) sent_across += p.send_units[std::size_t(node)];
      const auto expected_node = rows_across(ref.routing, x, 12, 6, 2, me, true);
      const auto expected_rank = rows_across(ref.routing, x, 12, 6, 2, me, false);
      if (sent_across != expected_node)
        report(detail::cat("rows sent to other nodes: ", sent_across, ", expected ", expected_node));
      // The one-stage dispatch of the same routing: a row per (token, expert rank) to other nodes.
      {
        const auto one = parallel::order_by_rank(saved.routing.expert, saved.routing.kept, 3, 12, 6);
        std::int64_t one_across = 0;
        for (int r = 0; r < 6; ++r)
          if (r / 2 != me / 2) one_across += one.units_per_rank[std::size_t(r)];
        if (one_across != expected_rank)
          report(detail::cat("one-stage rows to other nodes: ", one_across, ", expected ", expected_rank));
      }
      one_stage_rows += expected_rank;
      node_rows += expected_node;
      // The byte count of the last forward record: combine across, one row per stage-1 unit each way.
      const auto combine_bytes = std::size_t(std::max(p.units_sent(), p.units_received()) * C) * sizeof(double);
      if (fl.records().size() != forward_expected.size() || fl.records().back().bytes != combine_bytes)
        report(detail::cat("combine across: expected ", combine_bytes, " bytes"));
      auto dy = distribute_replicated<nn::tokens<Dense>>(dense, dy_full);
      CommLog bl;
      auto [dx, w] = moe.backward_input(std::move(saved), dy);
      moe.backward_weight(std::move(w));
      if (forward != forward_expected || kinds(bl) != backward_expected)
        report("issued:\n" + fl.to_string() + bl.to_string());
    });
    CHECK(f.empty());
    for (auto& e : f) WARN(e);
    INFO((limited ? "node-limited: " : "") << node_rows << " rows across nodes, one-stage " << one_stage_rows);
    CHECK(node_rows < one_stage_rows);  // some tokens had several choices on one node
  }
}

TEST_CASE("MoE node-level dispatch: a node size that does not divide the expert size is refused",
          "[moe][nodes][errors]") {
  // Building the layer on 6 ranks with `c` must throw on every rank, with each of `needles`.
  auto refused = [](nn::MoEConfig c, std::vector<std::string> needles) {
    auto f = on_ranks(6, [&](CommPtr world, auto report) {
      Dense dense(world, {6, 1});
      auto emesh = parallel::make_expert_mesh<EMesh>(dense, 6);
      try {
        Moe moe("moe", dense, emesh, c, 5);
        report("no error");
      } catch (const Error& e) {
        for (const auto& needle : needles)
          if (std::string(e.what()).find(needle) == std::string::npos) report(detail::cat("message: ", e.what()));
      }
    });
    CHECK(f.empty());
    for (auto& e : f) WARN(e);
  };
  auto c = config(6, 2);
  c.node_size = 4;
  refused(c, {"parallel::split_into_nodes", "an expert group of 6 ranks does not split into nodes of 4 ranks"});
  // 7 experts over 6 ranks are 2, 2, 2, 1, 0, 0: in nodes of 2 the last node has none.
  auto empty_node = config(7, 2);
  empty_node.node_size = 2;
  refused(empty_node, {"7 experts over 6 expert ranks leave node 2 (ranks 4..5) without an expert"});
  CHECK_THROWS_WITH(parallel::order_by_node({}, {}, 2, 6, 6, 4),
                    Catch::Contains("6 experts over 6 expert ranks in nodes of 4"));
}
