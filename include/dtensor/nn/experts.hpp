// dtensor/nn/experts.hpp — a group of expert MLPs (fc1 -> GELU -> fc2 each) on the expert mesh,
// run as one GEMM per local expert over all the rows routed to it.
//
//   nn::GroupedExperts<float, EMesh> ex("h.0.moe.experts", emesh, {.experts = 8, .dim = 64, .hidden = 256}, seed);
//   auto [y, saved] = ex.forward(rows, rows_per_local_expert);   // rows [M, dim], grouped by local expert
//   auto [drows, wctx] = ex.backward_input(std::move(saved), dy);  ex.backward_weight(std::move(wctx));
//
// Weights as in nn::Linear, one per expert: fc1 [E, hidden, dim] and bias [E, hidden], fc2
// [E, dim, hidden] and bias [E, dim], each Shard<0> (the expert index) on the expert dimension
// and replicated elsewhere (parallel::expert_params): a rank holds E / ep experts. Drawn whole
// from the seed on every rank and then split, so every expert size starts from the same experts.
// Rows are local tensors (what dispatch delivered), not DTensors: their count depends on the
// routing. backward_weight adds gradients that are Partial<sum> on the data dimension
// (parallel::expert_grads). No communication here.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/kernels/host/activations.hpp"
#include "dtensor/kernels/host/gemm.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/style.hpp"
#include "dtensor/parallel/expert_parallel.hpp"

namespace dtensor::nn {

struct ExpertsConfig {
  Extent experts = 0;
  Extent dim = 0;
  Extent hidden = 0;
  double init_std = 0.02;
  double out_std = 0.02;  // fc2 (GPT-2 scales output projections by 1/sqrt(2 * layers))
};

template <std::floating_point T, parallel::ExpertMeshType EMesh>
class GroupedExperts {
 public:
  using ParamL = parallel::expert_params<EMesh>;
  using GradL = parallel::expert_grads<EMesh>;
  using Rows = Tensor<T, 2>;

  struct Saved {
    Rows x, h;  // the input rows and fc1's output
    std::vector<std::int64_t> rows;
  };
  struct WeightCtx {
    Rows x, a, dy, dh;  // input, GELU output, output gradient, fc1 output gradient
    std::vector<std::int64_t> rows;
  };

  GroupedExperts() = default;
  GroupedExperts(std::string name, const EMesh& mesh, ExpertsConfig c, std::uint64_t seed) : name_(std::move(name)), c_(c) {
    const int ep = mesh.size(parallel::expert_dim<EMesh>);
    detail::check(c.experts > 0 && c.dim > 0 && c.hidden > 0, "nn::GroupedExperts", mesh, name_, ": experts ",
                  c.experts, ", dim ", c.dim, ", hidden ", c.hidden, " must be > 0");
    detail::check(c.experts % ep == 0, "nn::GroupedExperts", mesh, name_, ": ", c.experts,
                  " experts do not divide over the ", ep, " ranks of expert dimension \"",
                  EMesh::names[parallel::expert_dim<EMesh>], "\"");
    const Extent E = c.experts, H = c.hidden, C = c.dim;
    w1_ = P3(name_ + ".fc1.weight", distribute_replicated<ParamL>(mesh, normal<T>(Shape<3>{E, H, C}, seed, 0, c.init_std)));
    b1_ = P2(name_ + ".fc1.bias", distribute_replicated<ParamL>(mesh, zeros<T>(Shape<2>{E, H})), false);
    w2_ = P3(name_ + ".fc2.weight",
             distribute_replicated<ParamL>(mesh, normal<T>(Shape<3>{E, C, H}, seed + 1, 0, c.out_std)));
    b2_ = P2(name_ + ".fc2.bias", distribute_replicated<ParamL>(mesh, zeros<T>(Shape<2>{E, C})), false);
  }

  /// Experts held by this rank.
  Extent local_experts() const { return w1_.value().to_local().shape()[0]; }
  const ExpertsConfig& config() const noexcept { return c_; }

  /// y = fc2(gelu(fc1(x))) for each local expert's rows (rows[le] of them, in order).
  Fwd<Rows, Saved> forward(Rows x, std::vector<std::int64_t> rows) const {
    check_rows("nn::GroupedExperts::forward", x, rows);
    const Extent C = c_.dim, H = c_.hidden;
    Saved s{std::move(x), Rows::uninitialized(Shape<2>{total(rows), H}), std::move(rows)};
    auto a = Rows::uninitialized(s.h.shape());
    auto y = Rows::uninitialized(Shape<2>{s.x.shape()[0], C});
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      const T* xs = s.x.data() + first * C;
      T* hs = s.h.data() + first * H;
      T* as = a.data() + first * H;
      add_bias_rows(hs, b1(le), m, H, [&](T* out) {
        kernels::host::gemm<T>(false, true, T(1), xs, w1(le), T(0), out, m, H, C, C, C, H);
      });
      for (Extent i = 0; i < m * H; ++i) as[i] = kernels::host::detail::gelu(hs[i]);
      add_bias_rows(y.data() + first * C, b2(le), m, C, [&](T* out) {
        kernels::host::gemm<T>(false, true, T(1), as, w2(le), T(0), out, m, C, H, H, H, C);
      });
    });
    return {std::move(y), std::move(s)};
  }

  /// The input rows' gradient; the weight context keeps what the weight gradients need.
  Bwd<Rows, WeightCtx> backward_input(Saved s, const Rows& dy) const {
    check_rows("nn::GroupedExperts::backward_input", dy, s.rows);
    const Extent C = c_.dim, H = c_.hidden;
    WeightCtx w{std::move(s.x), Rows::uninitialized(s.h.shape()), dy, Rows::uninitialized(s.h.shape()), std::move(s.rows)};
    auto dx = Rows::uninitialized(w.x.shape());
    each_expert(w.rows, [&](Extent le, Extent first, Extent m) {
      T* dh = w.dh.data() + first * H;
      const T* h = s.h.data() + first * H;
      kernels::host::gemm<T>(false, false, T(1), dy.data() + first * C, w2(le), T(0), dh, m, H, C, C, H, H);  // dA
      for (Extent i = 0; i < m * H; ++i) {
        w.a.data()[first * H + i] = kernels::host::detail::gelu(h[i]);
        dh[i] = dh[i] * kernels::host::detail::gelu_prime(h[i]);
      }
      kernels::host::gemm<T>(false, false, T(1), dh, w1(le), T(0), dx.data() + first * C, m, C, H, H, C, C);
    });
    return {std::move(dx), std::move(w)};
  }

  /// Adds dW1 = dH^T X, dW2 = dY^T A and the biases' gradients (Partial<sum> on the data dimension).
  void backward_weight(WeightCtx w) {
    const Extent C = c_.dim, H = c_.hidden, L = local_experts();
    Tensor<T, 3> dw1(Shape<3>{L, H, C}), dw2(Shape<3>{L, C, H});
    Tensor<T, 2> db1(Shape<2>{L, H}), db2(Shape<2>{L, C});
    each_expert(w.rows, [&](Extent le, Extent first, Extent m) {
      const T* dy = w.dy.data() + first * C;
      const T* dh = w.dh.data() + first * H;
      kernels::host::gemm<T>(true, false, T(1), dh, w.x.data() + first * C, T(0), dw1.data() + le * H * C, H, C, m, H, C, C);
      kernels::host::gemm<T>(true, false, T(1), dy, w.a.data() + first * H, T(0), dw2.data() + le * C * H, C, H, m, C, H, H);
      column_sums(dh, m, H, db1.data() + le * H);
      column_sums(dy, m, C, db2.data() + le * C);
    });
    const auto& mesh = w1_.mesh();
    const Extent E = c_.experts;
    w1_.accumulate_grad(DTensor<T, 3, EMesh, GradL>(mesh, Shape<3>{E, H, C}, std::move(dw1)));
    b1_.accumulate_grad(DTensor<T, 2, EMesh, GradL>(mesh, Shape<2>{E, H}, std::move(db1)));
    w2_.accumulate_grad(DTensor<T, 3, EMesh, GradL>(mesh, Shape<3>{E, C, H}, std::move(dw2)));
    b2_.accumulate_grad(DTensor<T, 2, EMesh, GradL>(mesh, Shape<2>{E, C}, std::move(db2)));
  }

  auto parameters() { return std::tie(w1_, b1_, w2_, b2_); }

 private:
  using P3 = Parameter<T, 3, EMesh, ParamL>;
  using P2 = Parameter<T, 2, EMesh, ParamL>;

  const T* w1(Extent le) const { return w1_.value().to_local().data() + le * c_.hidden * c_.dim; }
  const T* w2(Extent le) const { return w2_.value().to_local().data() + le * c_.dim * c_.hidden; }
  const T* b1(Extent le) const { return b1_.value().to_local().data() + le * c_.hidden; }
  const T* b2(Extent le) const { return b2_.value().to_local().data() + le * c_.dim; }

  static Extent total(const std::vector<std::int64_t>& rows) {
    Extent n = 0;
    for (auto r : rows) n += r;
    return n;
  }
  /// fn(local expert, its first row, its rows) for every local expert with rows.
  template <class F>
  static void each_expert(const std::vector<std::int64_t>& rows, F fn) {
    Extent first = 0;
    for (std::size_t le = 0; le < rows.size(); ++le) {
      if (rows[le] > 0) fn(Extent(le), first, rows[le]);
      first += rows[le];
    }
  }
  /// gemm_into(out) writes [m, n] at out; then the bias row is added to every row.
  template <class Gemm>
  static void add_bias_rows(T* out, const T* bias, Extent m, Extent n, Gemm gemm_into) {
    gemm_into(out);
    for (Extent i = 0; i < m; ++i)
      for (Extent j = 0; j < n; ++j) out[i * n + j] += bias[j];
  }
  static void column_sums(const T* x, Extent m, Extent n, T* out) {
    for (Extent i = 0; i < m; ++i)
      for (Extent j = 0; j < n; ++j) out[j] += x[i * n + j];
  }
  void check_rows(const char* op, const Rows& x, const std::vector<std::int64_t>& rows) const {
    detail::check(Extent(rows.size()) == local_experts() && x.shape()[0] == total(rows) && x.shape()[1] == c_.dim, op,
                  w1_.mesh(), name_, ": rows ", to_string(x.shape()), " for ", rows.size(), " local experts (",
                  local_experts(), " held, ", total(rows), " rows routed, dim ", c_.dim, ")");
  }

  std::string name_;
  ExpertsConfig c_;
  P3 w1_, w2_;
  P2 b1_, b2_;
};

}  // namespace dtensor::nn
