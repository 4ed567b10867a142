// dtensor/parallel/experts.hpp — a group of expert MLPs (fc1 -> GELU -> fc2 each) on the expert mesh,
// run as one GEMM per local expert over all the rows routed to it.
//
//   nn::GroupedExperts<float, EMesh> ex("h.0.moe.experts", emesh, {.experts = 8, .dim = 64, .hidden = 256}, seed);
//   auto [y, saved] = ex.forward(rows, rows_per_local_expert);   // rows [M, dim], grouped by local expert
//   auto [drows, wctx] = ex.backward_input(std::move(saved), dy);  ex.backward_weight(std::move(wctx));
//
// Weights as in nn::Linear, one per expert: fc1 [E, hidden, dim] and bias [E, hidden], fc2
// [E, dim, hidden] and bias [E, dim], each Shard<0> (the expert index) on the expert dimension
// and replicated elsewhere (parallel::expert_params): a rank holds its chunk_range of the E
// experts, any E over any ep (5 over 2: 3 and 2; 3 over 4: 1, 1, 1, 0 — a rank with no expert
// runs no GEMM and has empty [0, ...] pieces), as exchange_counts assumes. Drawn whole
// from the seed on every rank and then split (nn::Init), so every expert size starts from the
// same experts.
// Rows are local tensors (what dispatch delivered), not DTensors: their count depends on the
// routing. backward_weight adds gradients that are Partial<sum> on the data dimension
// (parallel::expert_grads). No communication here. Any memory space (the expert mesh's): every
// expert's rows and weights are views into the grouped tensors, run through the space's kernels.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/kernels/activations.hpp"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/kernels/matmul.hpp"
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

template <kernels::host::FloatElement T, parallel::ExpertMeshType EMesh>
class GroupedExperts {
 public:
  using ParamL = parallel::expert_params<EMesh>;
  using GradL = parallel::expert_grads<EMesh>;
  using space = mesh_space_t<EMesh>;
  using Rows = Tensor<T, 2, space>;

  struct Saved {
    Rows x, h;  // the input rows and fc1's output
    std::vector<std::int64_t> rows;
  };
  struct WeightCtx {
    Rows x, a, dy, dh;  // input, GELU output, output gradient, fc1 output gradient
    std::vector<std::int64_t> rows;
  };

  GroupedExperts() = default;
  GroupedExperts(std::string name, const EMesh& mesh, ExpertsConfig c, std::uint64_t seed)
      : name_(std::move(name)),
        c_(checked(name_, mesh, c)),
        w1_(name_ + ".fc1.weight", mesh, Shape<3>{c.experts, c.hidden, c.dim}, Init::normal(seed, 0, c.init_std)),
        w2_(name_ + ".fc2.weight", mesh, Shape<3>{c.experts, c.dim, c.hidden}, Init::normal(seed + 1, 0, c.out_std)),
        b1_(name_ + ".fc1.bias", mesh, Shape<2>{c.experts, c.hidden}, Init::zeros(), false),
        b2_(name_ + ".fc2.bias", mesh, Shape<2>{c.experts, c.dim}, Init::zeros(), false) {}

  /// Experts held by this rank.
  Extent local_experts() const { return w1_.value().to_local().shape()[0]; }
  const ExpertsConfig& config() const noexcept { return c_; }

  /// y = fc2(gelu(fc1(x))) for each local expert's rows (rows[le] of them, in order).
  Fwd<Rows, Saved> forward(Rows x, std::vector<std::int64_t> rows) const {
    check_rows("nn::GroupedExperts::forward", x, rows);
    const Extent C = c_.dim, H = c_.hidden;
    Saved s{std::move(x), Rows::uninitialized(Shape<2>{total(rows), H}), std::move(rows)};
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      auto h = rows_of(s.h, first, m);
      kernels::matmul_rows_into(h, rows_of(s.x, first, m), w1(le), false, true);
      kernels::add_bias_(h, b1(le));
    });
    const auto a = kernels::gelu(s.h);
    auto y = Rows::uninitialized(Shape<2>{s.x.shape()[0], C});
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      auto out = rows_of(y, first, m);
      kernels::matmul_rows_into(out, rows_of(a, first, m), w2(le), false, true);
      kernels::add_bias_(out, b2(le));
    });
    return {std::move(y), std::move(s)};
  }

  /// The input rows' gradient; the weight context keeps what the weight gradients need.
  Bwd<Rows, WeightCtx> backward_input(Saved s, const Rows& dy) const {
    check_rows("nn::GroupedExperts::backward_input", dy, s.rows);
    auto da = Rows::uninitialized(s.h.shape());
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      auto out = rows_of(da, first, m);
      kernels::matmul_rows_into(out, rows_of(dy, first, m), w2(le));  // dA = dY W2
    });
    WeightCtx w{std::move(s.x), kernels::gelu(s.h), dy, kernels::gelu_backward(s.h, da), std::move(s.rows)};
    auto dx = Rows::uninitialized(w.x.shape());
    each_expert(w.rows, [&](Extent le, Extent first, Extent m) {
      auto out = rows_of(dx, first, m);
      kernels::matmul_rows_into(out, rows_of(w.dh, first, m), w1(le));  // dX = dH W1
    });
    return {std::move(dx), std::move(w)};
  }

  /// Adds dW1 = dH^T X, dW2 = dY^T A and the biases' gradients (Partial<sum> on the data dimension).
  void backward_weight(WeightCtx w) {
    const Extent C = c_.dim, H = c_.hidden, L = local_experts();
    Tensor<T, 3, space> dw1(Shape<3>{L, H, C}), dw2(Shape<3>{L, C, H});
    Tensor<T, 2, space> db1(Shape<2>{L, H}), db2(Shape<2>{L, C});
    each_expert(w.rows, [&](Extent le, Extent first, Extent m) {
      auto dw1_e = view_of(dw1, le * H * C, Shape<2>{H, C});
      auto dw2_e = view_of(dw2, le * C * H, Shape<2>{C, H});
      auto db1_e = view_of(db1, le * H, Shape<1>{H});
      auto db2_e = view_of(db2, le * C, Shape<1>{C});
      kernels::linear_backward_weight(rows_of(w.x, first, m), rows_of(w.dh, first, m), dw1_e, &db1_e);
      kernels::linear_backward_weight(rows_of(w.a, first, m), rows_of(w.dy, first, m), dw2_e, &db2_e);
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

  // Local expert le's weights and biases: views into the parameters' local pieces.
  Tensor<T, 2, space> w1(Extent le) const {
    return view_of(w1_.value().to_local(), le * c_.hidden * c_.dim, Shape<2>{c_.hidden, c_.dim});
  }
  Tensor<T, 2, space> w2(Extent le) const {
    return view_of(w2_.value().to_local(), le * c_.dim * c_.hidden, Shape<2>{c_.dim, c_.hidden});
  }
  Tensor<T, 1, space> b1(Extent le) const { return view_of(b1_.value().to_local(), le * c_.hidden, Shape<1>{c_.hidden}); }
  Tensor<T, 1, space> b2(Extent le) const { return view_of(b2_.value().to_local(), le * c_.dim, Shape<1>{c_.dim}); }
  /// Rows [first, first + m) of a [rows, cols] tensor, as a view.
  static Rows rows_of(const Rows& t, Extent first, Extent m) {
    return view_of(t, first * t.extent(1), Shape<2>{m, t.extent(1)});
  }

  /// c, once its extents are checked against the expert mesh.
  static const ExpertsConfig& checked(const std::string& name, const EMesh& mesh, const ExpertsConfig& c) {
    detail::check(c.experts > 0 && c.dim > 0 && c.hidden > 0, "nn::GroupedExperts", mesh, name, ": experts ",
                  c.experts, ", dim ", c.dim, ", hidden ", c.hidden, " must be > 0");
    return c;
  }

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
