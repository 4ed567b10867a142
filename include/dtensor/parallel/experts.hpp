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
// (parallel::expert_grads). No communication here but FP8's amaxes (below). Any memory space (the
// expert mesh's): every expert's rows and weights are views into the grouped tensors, run through
// the space's kernels.
//
// FP8 (docs/fp8.md, "The routed experts"): while an nn::Fp8Autocast lives, every expert GEMM is
// an FP8 Linear's (nn/linear.hpp): forward x W^T in E4M3 x E4M3, dX = dY W and dW = dY^T X with
// dY in E5M2, the same host emulation (nn::detail::Fp8LinearKernels) and delayed-scaling recipe.
// Scales are per expert and per tensor: each local expert keeps an nn::Fp8LinearScaling per
// weight (w1, w3, w2; GELU: fc1, fc2), so an expert's rows are quantized by their own amax, not
// by the busiest expert's (DeepSeek-V3 scales finer still: 1 x 128 activation tiles and 128 x 128
// weight blocks, current rather than delayed; not done here). An expert's rows lie on one rank
// of each "ep" group but on every "edp" rank: their amaxes (a vector of one float per local
// expert) are max-all-reduced over "edp" — two all-reduces in the forward (x, then w2's input)
// and two in backward_input (dY, then the two hidden gradients together; GELU: one) — so every
// mesh quantizes as one rank does. Every local expert records every use, rows or none (an amax
// of 0 keeps its scale), so the histories agree on every mesh too. The weights are whole on their
// rank: no all-reduce. dX = dH W1 + dUp W3 is two FP8 GEMMs summed in T. Host and meta (the dry
// run records the amax passes, the all-reduces and the quantizing GEMMs as kernels/meta/fp8.hpp's
// "amax", "quantize_fp8", "gemm_fp8", scale 1); on a GPU the kernels of nn/fp8_cuda.cuh.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "dtensor/kernels/activations.hpp"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/kernels/matmul.hpp"
#include "dtensor/kernels/meta/fp8.hpp"
#include "dtensor/nn/expert_ffn.hpp"
#include "dtensor/nn/fp8_recipe.hpp"
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

  /// A local expert's FP8 scales of one use (0: not FP8): the forward's for its input x, w2's
  /// input a and the weights, backward_input's for the output gradients (dy of w2, dh of w1, dup of w3).
  struct Fp8Scales {
    float x = 0, a = 0, w1 = 0, w3 = 0, w2 = 0, dy = 0, dh = 0, dup = 0;
  };
  struct Saved {
    Rows x, h;  // the input rows and fc1's output (SwiGLU: the gate's, x w1)
    Rows up;    // SwiGLU: x w3
    std::vector<std::int64_t> rows;
    std::vector<Fp8Scales> fp8;  // per local expert under FP8, else empty
  };
  struct WeightCtx {
    Rows x, a, dy, dh;  // input, activation (w2's input), output gradient, fc1's (the gate's) output gradient
    Rows dup;           // SwiGLU: the up projection's output gradient
    std::vector<std::int64_t> rows;
    std::vector<Fp8Scales> fp8;  // the forward's and backward_input's, per local expert under FP8
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
    Saved s{std::move(x),
            Rows::uninitialized(Shape<2>{M, H}),
            gated ? Rows::uninitialized(Shape<2>{M, H}) : Rows(),
            std::move(rows),
            {}};
    const bool fp8 = use_fp8();
    if (fp8) {
      s.fp8.resize(std::size_t(local_experts()));
      weight_scales(s.fp8);
      row_scales(s.fp8, s.rows, {RowUse{Fp8Role::input, &s.x, 0, &Fp8Scales::x, gated ? 1 : -1}});
    }
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      const Fp8Scales f = fp8 ? s.fp8[std::size_t(le)] : Fp8Scales{};
      auto h = rows_of(s.h, first, m);
      forward_gemm(h, rows_of(s.x, first, m), f.x, weight(w1_, le, H, C), f.w1);
      if constexpr (gated) {
        auto up = rows_of(s.up, first, m);
        forward_gemm(up, rows_of(s.x, first, m), f.x, weight(w3_, le, H, C), f.w3);
      } else {
        kernels::add_bias_(h, bias(b1_, le, H));
      }
    });
    const auto a = activation(s);
    if (fp8) row_scales(s.fp8, s.rows, {RowUse{Fp8Role::input, &a, 2, &Fp8Scales::a}});
    auto y = Rows::uninitialized(Shape<2>{M, C});
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      const Fp8Scales f = fp8 ? s.fp8[std::size_t(le)] : Fp8Scales{};
      auto out = rows_of(y, first, m);
      forward_gemm(out, rows_of(a, first, m), f.a, weight(w2_, le, C, H), f.w2);
      if constexpr (!gated) kernels::add_bias_(out, bias(b2_, le, C));
    });
    return {std::move(y), std::move(s)};
  }

  /// The input rows' gradient; the weight context keeps what the weight gradients need.
  Bwd<Rows, WeightCtx> backward_input(Saved s, const Rows& dy) const {
    check_rows("nn::GroupedExperts::backward_input", dy, s.rows);
    const Extent C = c_.dim, H = c_.hidden;
    const bool fp8 = !s.fp8.empty();  // as the forward of these rows ran
    if (fp8) row_scales(s.fp8, s.rows, {RowUse{Fp8Role::grad_output, &dy, 2, &Fp8Scales::dy}});
    auto da = Rows::uninitialized(s.h.shape());
    each_expert(s.rows, [&](Extent le, Extent first, Extent m) {
      const Fp8Scales f = fp8 ? s.fp8[std::size_t(le)] : Fp8Scales{};
      auto out = rows_of(da, first, m);
      grad_input_gemm(out, rows_of(dy, first, m), f.dy, weight(w2_, le, C, H), f.w2, false);  // dA = dY W2
    });
    WeightCtx w{.x = std::move(s.x),
                .a = activation(s),
                .dy = dy,
                .dh = {},
                .dup = {},
                .rows = std::move(s.rows),
                .fp8 = std::move(s.fp8)};
    if constexpr (gated) {
      w.dh = kernels::silu_backward(s.h, kernels::mul(da, s.up));  // d gate = silu'(g) (dA up)
      w.dup = kernels::mul(da, kernels::silu(s.h));                // d up = dA silu(g)
      if (fp8)
        row_scales(w.fp8, w.rows,
                   {RowUse{Fp8Role::grad_output, &w.dh, 0, &Fp8Scales::dh},
                    {Fp8Role::grad_output, &w.dup, 1, &Fp8Scales::dup}});
    } else {
      w.dh = kernels::gelu_backward(s.h, da);
      if (fp8) row_scales(w.fp8, w.rows, {RowUse{Fp8Role::grad_output, &w.dh, 0, &Fp8Scales::dh}});
    }
    auto dx = Rows::uninitialized(w.x.shape());
    each_expert(w.rows, [&](Extent le, Extent first, Extent m) {
      const Fp8Scales f = fp8 ? w.fp8[std::size_t(le)] : Fp8Scales{};
      auto out = rows_of(dx, first, m);
      grad_input_gemm(out, rows_of(w.dh, first, m), f.dh, weight(w1_, le, H, C), f.w1, false);  // dX = dH W1
      if constexpr (gated)                                                                      // + dUp W3
        grad_input_gemm(out, rows_of(w.dup, first, m), f.dup, weight(w3_, le, H, C), f.w3, true);
    });
    return {std::move(dx), std::move(w)};
  }

  /// Adds dW1 = dH^T X, dW2 = dY^T A (SwiGLU: dW3 = dUp^T X; GELU: the biases') as gradients
  /// Partial<sum> on the data dimension.
  void backward_weight(WeightCtx w) {
    const Extent C = c_.dim, H = c_.hidden, L = local_experts();
    Tensor<T, 3, space> dw1(Shape<3>{L, H, C}), dw2(Shape<3>{L, C, H}), dw3(Shape<3>{gated ? L : 0, H, C});
    Tensor<T, 2, space> db1(Shape<2>{gated ? 0 : L, H}), db2(Shape<2>{gated ? 0 : L, C});
    const bool fp8 = !w.fp8.empty();
    each_expert(w.rows, [&](Extent le, Extent first, Extent m) {
      const Fp8Scales f = fp8 ? w.fp8[std::size_t(le)] : Fp8Scales{};
      auto dw1_e = view_of(dw1, le * H * C, Shape<2>{H, C});
      auto dw2_e = view_of(dw2, le * C * H, Shape<2>{C, H});
      if constexpr (gated) {
        auto dw3_e = view_of(dw3, le * H * C, Shape<2>{H, C});
        grad_weight_gemm(rows_of(w.x, first, m), f.x, rows_of(w.dh, first, m), f.dh, dw1_e, nullptr);
        grad_weight_gemm(rows_of(w.x, first, m), f.x, rows_of(w.dup, first, m), f.dup, dw3_e, nullptr);
        grad_weight_gemm(rows_of(w.a, first, m), f.a, rows_of(w.dy, first, m), f.dy, dw2_e, nullptr);
      } else {
        auto db1_e = view_of(db1, le * H, Shape<1>{H});
        auto db2_e = view_of(db2, le * C, Shape<1>{C});
        grad_weight_gemm(rows_of(w.x, first, m), f.x, rows_of(w.dh, first, m), f.dh, dw1_e, &db1_e);
        grad_weight_gemm(rows_of(w.a, first, m), f.a, rows_of(w.dy, first, m), f.dy, dw2_e, &db2_e);
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
  // ---------------------------------------------------------------- FP8 (see the synopsis)

  /// Whether the GEMMs run in FP8 now: under nn::Fp8Autocast, on the host (the emulation) and on
  /// meta (its costs).
  static bool use_fp8() {
    if (!fp8_autocast_enabled()) return false;
    if constexpr (holds_data_v<space>) detail::fp8_linear_kernels<T, space>("nn::GroupedExperts");
    return true;
  }

  /// Local expert le's history of `role` for weight g (0: w1 or fc1, 1: w3, 2: w2 or fc2), made
  /// with the autocast's recipe at the first FP8 use.
  AmaxHistory& history(Extent le, int g, Fp8Role role) const {
    if (fp8_.empty()) fp8_.resize(std::size_t(local_experts()) * 3, Fp8LinearScaling(fp8_autocast_recipe()));
    auto& s = fp8_[std::size_t(le) * 3 + std::size_t(g)];
    return role == Fp8Role::input ? s.input : role == Fp8Role::weight ? s.weight : s.grad_output;
  }
  /// The scale of this use from the history, then amax recorded (nn::Linear's sequence).
  float scale_and_record(Extent le, int g, Fp8Role role, float amax) const {
    if (!holds_data_v<space>) return 1.f;  // a dry run: no values
    AmaxHistory& h = history(le, g, role);
    const float s = h.scale(amax);
    h.record(amax);
    return s;
  }
  /// max |t| (a NaN as +inf, as nn::Linear: the all-reduce keeps it on every rank); on meta the
  /// pass's cost.
  static float amax_of(const Tensor<T, 2, space>& t) {
    if constexpr (holds_data_v<space>) {
      return detail::fp8_linear_kernels<T, space>("nn::GroupedExperts").amax(t.data(), t.numel());
    } else {
      kernels::meta::amax<T>(t.numel());
      return 0;
    }
  }

  /// Every local expert's weight scales of this forward (whole on this rank: no all-reduce).
  void weight_scales(std::vector<Fp8Scales>& f) const {
    const Extent C = c_.dim, H = c_.hidden;
    for (Extent le = 0; le < local_experts(); ++le) {
      auto& e = f[std::size_t(le)];
      e.w1 = scale_and_record(le, 0, Fp8Role::weight, amax_of(weight(w1_, le, H, C)));
      if constexpr (gated) e.w3 = scale_and_record(le, 1, Fp8Role::weight, amax_of(weight(w3_, le, H, C)));
      e.w2 = scale_and_record(le, 2, Fp8Role::weight, amax_of(weight(w2_, le, C, H)));
    }
  }

  /// A row tensor quantized for weight g's GEMM in `role`, its scale to `field`; `also`: another
  /// weight whose GEMM quantizes the same tensor (x for w3), its history kept alike (the same scale).
  struct RowUse {
    Fp8Role role;
    const Rows* t;
    int g;
    float Fp8Scales::* field;
    int also = -1;
  };
  /// For each use, per local expert: the amax of that expert's rows, max-all-reduced over "edp"
  /// (one all-reduce for all the uses), then its scale. Every local expert records, with rows or not.
  void row_scales(std::vector<Fp8Scales>& f, const std::vector<std::int64_t>& rows,
                  std::initializer_list<RowUse> uses) const {
    const Extent L = local_experts();
    std::vector<float> amax(uses.size() * std::size_t(L), 0.f);
    std::size_t u = 0;
    for (const RowUse& use : uses) {
      each_expert(rows, [&](Extent le, Extent first, Extent m) {
        amax[u * std::size_t(L) + std::size_t(le)] = amax_of(rows_of(*use.t, first, m));
      });
      ++u;
    }
    if (L > 0)
      if (Communicator* g = data_group()) g->all_reduce(std::span<float>(amax), ReduceOp::max);
    u = 0;
    for (const RowUse& use : uses) {
      for (Extent le = 0; le < L; ++le) {
        const float a = amax[u * std::size_t(L) + std::size_t(le)];
        f[std::size_t(le)].*use.field = scale_and_record(le, use.g, use.role, a);
        if (use.also >= 0) scale_and_record(le, use.also, use.role, a);
      }
      ++u;
    }
  }
  /// The expert mesh's data dimension ("edp") where it splits the rows, else none.
  Communicator* data_group() const {
    if constexpr (has_role<EMesh, Role::data>) {
      constexpr std::size_t d = role_dim<EMesh, Role::data>;
      if (w1_.mesh().size(d) > 1) return &w1_.mesh().group(d);
    }
    return nullptr;
  }

  /// FP8 GEMM gemm of the dense row-major a [ra, ca] and b [rb, cb] quantized by sa and sb into c:
  /// nn::Linear's (detail::Fp8LinearKernels on the host; on meta its records).
  static void fp8_gemm(Fp8LinearGemm gemm, bool ta, bool tb, const T* a, Extent ra, Extent ca, float sa, const T* b,
                       Extent rb, Extent cb, float sb, T* c) {
    if constexpr (holds_data_v<space>)
      detail::fp8_linear_kernels<T, space>("nn::GroupedExperts").gemm(gemm, a, ra, ca, sa, b, rb, cb, sb, c);
    else {
      (void)gemm, (void)a, (void)sa, (void)b, (void)sb, (void)c;
      kernels::meta::gemm_fp8_quantizing<T>(ta, tb, ra, ca, rb, cb);
    }
  }
  /// out = x w^T: x [m, k], w [n, k] (FP8 when sx > 0).
  static void forward_gemm(Rows& out, const Rows& x, float sx, const Tensor<T, 2, space>& w, float sw) {
    if (sx > 0)
      fp8_gemm(Fp8LinearGemm::forward, false, true, x.data(), x.extent(0), x.extent(1), sx, w.data(), w.extent(0),
               w.extent(1), sw, out.data());
    else kernels::matmul_rows_into(out, x, w, false, true);
  }
  /// out (+)= dy w: dy [m, n], w [n, k]. Accumulating in FP8: the GEMM into a temporary, added in T.
  static void grad_input_gemm(Rows& out, const Rows& dy, float sdy, const Tensor<T, 2, space>& w, float sw,
                              bool accumulate) {
    if (sdy > 0) {
      const auto gemm = [&](T* c) {
        fp8_gemm(Fp8LinearGemm::grad_input, false, false, dy.data(), dy.extent(0), dy.extent(1), sdy, w.data(),
                 w.extent(0), w.extent(1), sw, c);
      };
      if (!accumulate) return gemm(out.data());
      auto product = Rows::uninitialized(out.shape());
      gemm(product.data());
      kernels::add_(out, product);
    } else {
      kernels::matmul_rows_into(out, dy, w, false, false, T(1), accumulate ? T(1) : T(0));
    }
  }
  /// dw = dy^T x: x [m, k], dy [m, n], dw [n, k]; db = the sum of dy's rows when given (in T).
  static void grad_weight_gemm(const Rows& x, float sx, const Rows& dy, float sdy, Tensor<T, 2, space>& dw,
                               Tensor<T, 1, space>* db) {
    if (sdy > 0) {
      fp8_gemm(Fp8LinearGemm::grad_weight, true, false, dy.data(), dy.extent(0), dy.extent(1), sdy, x.data(),
               x.extent(0), x.extent(1), sx, dw.data());
      if (db) kernels::SpaceGemm<space>::bias_grad_into(*db, dy, false);
    } else {
      kernels::linear_backward_weight(x, dy, dw, db);
    }
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
  P3 w3_;                                      // SwiGLU only
  P2 b1_, b2_;                                 // GELU MLP only
  mutable std::vector<Fp8LinearScaling> fp8_;  // FP8: 3 per local expert (w1, w3, w2), by each forward and backward
};

}  // namespace dtensor::nn
