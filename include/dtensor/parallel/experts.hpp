// dtensor/parallel/experts.hpp — a group of expert feed-forwards on the expert mesh, run as one GEMM
// per local expert and weight over all the rows routed to it: GPT's MLP (fc1 -> GELU -> fc2, with
// biases) or Llama's SwiGLU (w2(silu(x w1) * (x w3)), no biases: Mixtral's and DeepSeek's experts).
//
//   nn::GroupedExperts<float, EMesh> ex("h.0.moe.experts", emesh, {.experts = 8, .dim = 64, .hidden = 256}, seed);
//   nn::GroupedExperts<float, EMesh, nn::ExpertFfn::swiglu> sw(...);   // SwiGLU experts
//   auto [y, saved] = ex.forward(rows, rows_per_local_expert);   // rows [M, dim], grouped by local expert
//   auto [drows, wctx] = ex.backward_input(std::move(saved), dy);  ex.backward_weight(std::move(wctx));
//
// Weights as in nn::Linear, one per expert. GELU MLP: fc1 [E, hidden, dim] and bias [E, hidden],
// fc2 [E, dim, hidden] and bias [E, dim]. SwiGLU: w1 (the gate) and w3 (the up projection)
// [E, hidden, dim], w2 (down) [E, dim, hidden], as Mixtral names them (two GEMMs for the gate and
// the up projection, not nn::SwiGLU's one interleaved w13: an expert's rows are few, and separate
// weights are what checkpoints store). Each Shard<0> (the expert index) on the expert dimension
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
#include "dtensor/nn/expert_ffn.hpp"
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
  double out_std = 0.02;  // the output projection (GPT-2 scales it by 1/sqrt(2 * layers))
};

template <kernels::host::FloatElement T, parallel::ExpertMeshType EMesh, ExpertFfn F = ExpertFfn::gelu_mlp>
class GroupedExperts {
 public:
  using ParamL = parallel::expert_params<EMesh>;
  using GradL = parallel::expert_grads<EMesh>;
  using space = mesh_space_t<EMesh>;
  using Rows = Tensor<T, 2, space>;
  static constexpr ExpertFfn ffn = F;
  static constexpr bool gated = F == ExpertFfn::swiglu;

  struct Saved {
    Rows x, h;  // the input rows and fc1's output (SwiGLU: the gate's, x w1)
    Rows up;    // SwiGLU: x w3
    std::vector<std::int64_t> rows;
  };
  struct WeightCtx {
    Rows x, a, dy, dh;  // input, activation (w2's input), output gradient, fc1's (the gate's) output gradient
    Rows dup;           // SwiGLU: the up projection's output gradient
    std::vector<std::int64_t> rows;
  };

  GroupedExperts() = default;
  GroupedExperts(std::string name, const EMesh& mesh, ExpertsConfig c, std::uint64_t seed)
      : name_(std::move(name)),
        c_(checked(name_, mesh, c)),
        w1_(name_ + (gated ? ".w1.weight" : ".fc1.weight"), mesh, Shape<3>{c.experts, c.hidden, c.dim},
            Init::normal(seed, 0, c.init_std)),
        w2_(name_ + (gated ? ".w2.weight" : ".fc2.weight"), mesh, Shape<3>{c.experts, c.dim, c.hidden},
            Init::normal(seed + 1, 0, c.out_std)) {
    if constexpr (gated) {
      w3_ = P3(name_ + ".w3.weight", mesh, Shape<3>{c.experts, c.hidden, c.dim}, Init::normal(seed + 2, 0, c.init_std));
    } else {
      b1_ = P2(name_ + ".fc1.bias", mesh, Shape<2>{c.experts, c.hidden}, Init::zeros(), false);
      b2_ = P2(name_ + ".fc2.bias", mesh, Shape<2>{c.experts, c.dim}, Init::zeros(), false);
    }
  }

  /// Experts held by this rank.
  Extent local_experts() const { return w1_.value().to_local().shape()[0]; }
  const ExpertsConfig& config() const noexcept { return c_; }

  /// y = fc2(gelu(fc1(x))), or w2(silu(x w1) * (x w3)), for each local expert's rows (rows[le]
  /// of them, in order).
  Fwd<Rows, Saved> forward(Rows x, std::vector<std::int64_t> rows) const {
    check_rows("nn::GroupedExperts::forward", x, rows);
    const Extent C = c_.dim, H = c_.hidden, M = total(rows);
    Saved s{std::move(x), Rows::uninitialized(Shape<2>{M, H}), gated ? Rows::uninitialized(Shape<2>{M, H}) : Rows(),
            std::move(rows)};
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      auto h = rows_of(s.h, first, m);
      kernels::matmul_rows_into(h, rows_of(s.x, first, m), weight(w1_, le, H, C), false, true);
      if constexpr (gated) {
        auto up = rows_of(s.up, first, m);
        kernels::matmul_rows_into(up, rows_of(s.x, first, m), weight(w3_, le, H, C), false, true);
      } else {
        kernels::add_bias_(h, bias(b1_, le, H));
      }
    });
    const auto a = activation(s);
    auto y = Rows::uninitialized(Shape<2>{M, C});
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      auto out = rows_of(y, first, m);
      kernels::matmul_rows_into(out, rows_of(a, first, m), weight(w2_, le, C, H), false, true);
      if constexpr (!gated) kernels::add_bias_(out, bias(b2_, le, C));
    });
    return {std::move(y), std::move(s)};
  }

  /// The input rows' gradient; the weight context keeps what the weight gradients need.
  Bwd<Rows, WeightCtx> backward_input(Saved s, const Rows& dy) const {
    check_rows("nn::GroupedExperts::backward_input", dy, s.rows);
    const Extent C = c_.dim, H = c_.hidden;
    auto da = Rows::uninitialized(s.h.shape());
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      auto out = rows_of(da, first, m);
      kernels::matmul_rows_into(out, rows_of(dy, first, m), weight(w2_, le, C, H));  // dA = dY W2
    });
    WeightCtx w{.x = std::move(s.x), .a = activation(s), .dy = dy, .dh = {}, .dup = {}, .rows = std::move(s.rows)};
    if constexpr (gated) {
      w.dh = kernels::silu_backward(s.h, kernels::mul(da, s.up));  // d gate = silu'(g) (dA up)
      w.dup = kernels::mul(da, kernels::silu(s.h));                // d up = dA silu(g)
    } else {
      w.dh = kernels::gelu_backward(s.h, da);
    }
    auto dx = Rows::uninitialized(w.x.shape());
    each_expert(w.rows, [&](Extent le, Extent first, Extent m) {
      auto out = rows_of(dx, first, m);
      kernels::matmul_rows_into(out, rows_of(w.dh, first, m), weight(w1_, le, H, C));  // dX = dH W1
      if constexpr (gated)                                                             // + dUp W3
        kernels::matmul_rows_into(out, rows_of(w.dup, first, m), weight(w3_, le, H, C), false, false, T(1), T(1));
    });
    return {std::move(dx), std::move(w)};
  }

  /// Adds dW1 = dH^T X, dW2 = dY^T A (SwiGLU: dW3 = dUp^T X; GELU: the biases') as gradients
  /// Partial<sum> on the data dimension.
  void backward_weight(WeightCtx w) {
    const Extent C = c_.dim, H = c_.hidden, L = local_experts();
    Tensor<T, 3, space> dw1(Shape<3>{L, H, C}), dw2(Shape<3>{L, C, H}), dw3(Shape<3>{gated ? L : 0, H, C});
    Tensor<T, 2, space> db1(Shape<2>{gated ? 0 : L, H}), db2(Shape<2>{gated ? 0 : L, C});
    each_expert(w.rows, [&](Extent le, Extent first, Extent m) {
      auto dw1_e = view_of(dw1, le * H * C, Shape<2>{H, C});
      auto dw2_e = view_of(dw2, le * C * H, Shape<2>{C, H});
      if constexpr (gated) {
        auto dw3_e = view_of(dw3, le * H * C, Shape<2>{H, C});
        kernels::linear_backward_weight(rows_of(w.x, first, m), rows_of(w.dh, first, m), dw1_e);
        kernels::linear_backward_weight(rows_of(w.x, first, m), rows_of(w.dup, first, m), dw3_e);
        kernels::linear_backward_weight(rows_of(w.a, first, m), rows_of(w.dy, first, m), dw2_e);
      } else {
        auto db1_e = view_of(db1, le * H, Shape<1>{H});
        auto db2_e = view_of(db2, le * C, Shape<1>{C});
        kernels::linear_backward_weight(rows_of(w.x, first, m), rows_of(w.dh, first, m), dw1_e, &db1_e);
        kernels::linear_backward_weight(rows_of(w.a, first, m), rows_of(w.dy, first, m), dw2_e, &db2_e);
      }
    });
    const auto& mesh = w1_.mesh();
    const Extent E = c_.experts;
    w1_.accumulate_grad(DTensor<T, 3, EMesh, GradL>(mesh, Shape<3>{E, H, C}, std::move(dw1)));
    if constexpr (gated) {
      w3_.accumulate_grad(DTensor<T, 3, EMesh, GradL>(mesh, Shape<3>{E, H, C}, std::move(dw3)));
    } else {
      b1_.accumulate_grad(DTensor<T, 2, EMesh, GradL>(mesh, Shape<2>{E, H}, std::move(db1)));
      b2_.accumulate_grad(DTensor<T, 2, EMesh, GradL>(mesh, Shape<2>{E, C}, std::move(db2)));
    }
    w2_.accumulate_grad(DTensor<T, 3, EMesh, GradL>(mesh, Shape<3>{E, C, H}, std::move(dw2)));
  }

  /// GELU: fc1's weight and bias, fc2's; SwiGLU: w1, w3, w2 (Mixtral's order of the names).
  auto parameters() {
    if constexpr (gated) return std::tie(w1_, w3_, w2_);
    else return std::tie(w1_, b1_, w2_, b2_);
  }

 private:
  using P3 = Parameter<T, 3, EMesh, ParamL>;
  using P2 = Parameter<T, 2, EMesh, ParamL>;

  /// w2's input: gelu(h), or silu(gate) * up. Computed again in backward rather than kept (the
  /// experts' rows are the MoE's largest activations).
  static Rows activation(const Saved& s) {
    if constexpr (gated) return kernels::mul(kernels::silu(s.h), s.up);
    else return kernels::gelu(s.h);
  }
  /// Local expert le's [rows, cols] weight and [n] bias: views into the parameters' local pieces.
  static Tensor<T, 2, space> weight(const P3& w, Extent le, Extent rows, Extent cols) {
    return view_of(w.value().to_local(), le * rows * cols, Shape<2>{rows, cols});
  }
  static Tensor<T, 1, space> bias(const P2& b, Extent le, Extent n) {
    return view_of(b.value().to_local(), le * n, Shape<1>{n});
  }
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
  template <class Fn>
  static void each_expert(const std::vector<std::int64_t>& rows, Fn fn) {
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
  P3 w3_;       // SwiGLU only
  P2 b1_, b2_;  // GELU MLP only
};

}  // namespace dtensor::nn
