// dtensor/nn/linear.hpp — y = x W^T + b, with W [out, in] as in PyTorch, in any parallel style.
//
//   nn::Linear<float, Mesh> fc("fc", mesh, /*in=*/64, /*out=*/256, /*seed=*/1);
//   nn::Linear<float, Mesh, parallel::ColwiseParallel<>> q("q", mesh, 64, 64, 2);
//   auto [y, saved] = fc.forward(x);                   // x: DTensor [B, T, in] in Style::input_layout
//   auto [dx, wctx] = fc.backward_input(std::move(saved), dy);
//   fc.backward_weight(std::move(wctx));               // adds dW (and db) to the parameters' gradients
//
// Forward: entry redistribution of x to Style::compute_layout, ops::matmul<false, true>(x, W),
// bias (before the exit, or after it for row-wise styles whose matmul output is Partial), exit
// redistribution to Style::output_layout. Saved: the Linear's input *in its input layout* (before
// the entry), as Megatron saves it: under sequence parallelism a column-wise Linear keeps this
// rank's 1/t of the sequence, not the gathered input the matmul used (t times less activation
// memory), and backward_input gathers it again for the weight gradient. Backward: the adjoints
// in reverse (redistribute_backward), ops::matmul_backward_a for dx; the weight context keeps the
// matmul's input (re-gathered) and output gradient for ops::matmul_backward_b (dW) and the bias
// gradient. The collectives are the style's entry and exit, their adjoints, and in backward the
// entry once more where it moves data (the SP all-gather: parallel/tensor_parallel.hpp).
//
// FP8 (docs/fp8.md): while an nn::Fp8Autocast is on (nn/fp8_recipe.hpp), the three GEMMs run in
// FP8, Transformer Engine's HYBRID recipe: forward y = x W^T with x and W in E4M3, backward
// dx = dy W and dW = dy^T x with dy in E5M2 and x, W quantized with the forward's scales; each
// role's scale from its delayed amax history (nn::Fp8LinearScaling, kept by the Linear); the
// bias, the parameters and everything outside the GEMMs as without FP8. The scales must be equal
// on every rank holding a piece of a tensor, so each tensor's amax is max-all-reduced over every
// mesh dimension its layout splits (Shard) before the scale is taken: one all-reduce of one float
// per such dimension (of size > 1) for x and W in the forward and for dy in backward_input — a
// TP Linear's W over tp, x over dp (its batch) and, with SP or a row-wise style, tp. The result is
// then the single-device FP8 result on every layout (up to the fp32 summation order). Per-shard
// scales would avoid the all-reduce but make a sharded run quantize differently from one device.
// On the host the GEMMs are the exact emulation (kernels/host/gemm_fp8.hpp); on a GPU cuBLASLt's
// FP8 GEMMs (kernels/cuda/gemm_fp8.cuh) once a CUDA unit of the program includes nn/fp8_cuda.cuh
// (an Error names that header otherwise); a meta (dry-run) Linear records what the host's costs (kernels/meta/fp8.hpp: the amax passes, their
// all-reduces, the quantizing GEMMs as op "gemm_fp8") and quantizes with scale 1 (no values).
// Activation recomputation re-runs the forward, which would record the amaxes again and could
// quantize with another scale: not supported with FP8.
//
// Initialisation: W ~ N(0, init_std) and b = 0, drawn as the full tensor from the seed on every
// rank and then split (no communication), so every layout and mesh starts from the same values.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/kernels/meta/fp8.hpp"
#include "dtensor/nn/fp8_recipe.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/nn/style.hpp"
#include "dtensor/ops/matmul.hpp"
#include "dtensor/ops/matmul_fp8.hpp"
#include "dtensor/ops/pointwise.hpp"

namespace dtensor::nn {

struct LinearOptions {
  bool bias = true;
  double init_std = 0.02;
};

template <kernels::host::FloatElement T, MeshType Mesh, class Style = Replicated<>>
  requires LinearStyle<Style, Mesh>
class Linear {
  static_assert(require_dense_roles<"nn::Linear", Mesh>());

 public:
  using style = Style;
  using WeightL = typename Style::template weight_layout<Mesh>;
  using BiasL = typename Style::template bias_layout<Mesh>;
  using InL = typename Style::template input_layout<Mesh>;
  using ComputeL = typename Style::template compute_layout<Mesh>;
  using OutL = typename Style::template output_layout<Mesh>;
  using In = DTensor<T, 3, Mesh, InL>;
  using Out = DTensor<T, 3, Mesh, OutL>;

 private:
  // The matmul's output layout (before the exit), its gradient's, and a row-wise bias gradient's.
  using MatmulOutL = ops::rules::matmul_t<ComputeL, WeightL, false, true, 3, 2>;
  using MatmulGradL = typename grad_layout<MatmulOutL>::type;
  using OutBiasGradL = ops::rules::sum_rows_t<OutL, 3>;

 public:
  /// What backward_input needs: the Linear's input, in the input layout (the entry is redone in
  /// backward where it moves data: the sequence-parallel all-gather).
  struct Saved {
    In x;
    float fp8_sx = 0, fp8_sw = 0;           // the forward's FP8 scales of x and W (0: not FP8)
    auto tensors() { return std::tie(x); }  // what an activation offload moves (nn/activation_offload.hpp)
  };
  /// What backward_weight needs: the matmul's input and output gradient (and a row-wise style's
  /// bias gradient, taken before the exit's adjoint).
  struct WeightCtx {
    DTensor<T, 3, Mesh, ComputeL> x;
    DTensor<T, 3, Mesh, MatmulGradL> dy;
    DTensor<T, 1, Mesh, OutBiasGradL> dbias;
    float fp8_sx = 0, fp8_sdy = 0;  // FP8 scales of x (the forward's) and dy (0: not FP8)
  };

  Linear() = default;
  Linear(std::string name, const Mesh& mesh, Extent in, Extent out, std::uint64_t seed, LinearOptions o = {})
      : name_(std::move(name)), in_(in), out_(out) {
    detail::check(in > 0 && out > 0 && o.init_std >= 0, "nn::Linear", mesh, name_, ": in ", in, ", out ", out,
                  ", init_std ", o.init_std, " (extents must be > 0)");
    weight_ = Parameter<T, 2, Mesh, WeightL>(name_ + ".weight", mesh, Shape<2>{out, in}, Init::normal(seed, 0, o.init_std));
    if (o.bias)
      bias_ = Parameter<T, 1, Mesh, BiasL>(name_ + ".bias", mesh, Shape<1>{out}, Init::zeros(),
                                           false);
  }

  /// y = x W^T + b. Collectives: the style's entry and exit.
  Fwd<Out, Saved> forward(const In& x) const {
    check_input(x);
    return forward_saved(Saved{x});  // the input's bytes (1/t of the sequence under SP), not the gathered copy's
  }
  /// The same for a temporary input, which becomes the saved one without a copy (the MLP's
  /// GELU output, attention's merged heads: a copy of the activation per Linear and step).
  Fwd<Out, Saved> forward(In&& x) const {
    check_input(x);
    return forward_saved(Saved{std::move(x)});
  }

 private:
  void check_input(const In& x) const {
    detail::check(x.extent(2) == in_, "nn::Linear::forward", x.mesh(), name_, ": input ", to_string(x.shape()),
                  " does not have ", in_, " features");
  }
  // The bias is added in place into the matmul's output (a temporary), not into a copy of it.
  Fwd<Out, Saved> forward_saved(Saved s) const {
    auto y = matmul_forward(s);
    if constexpr (Style::bias_after_exit) {
      auto z = redistribute<OutL>(std::move(y));  // exit: y's storage where no step runs
      if (!bias_.defined()) return {std::move(z), std::move(s)};
      return {same_layout(ops::bias_add(std::move(z), bias_.value())), std::move(s)};
    } else {
      if (bias_.defined())
        return {redistribute<OutL>(same_layout(ops::bias_add(std::move(y), bias_.value()))), std::move(s)};
      return {redistribute<OutL>(std::move(y)), std::move(s)};  // exit
    }
  }

 public:
  /// dx for dy = dL/dy. Collectives: the entry again where it moves data (SP: the all-gather of
  /// the saved shard, issued before the dx GEMM as Megatron issues it to overlap), the adjoints
  /// of the exit and the entry.
  Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const { return backward_input_impl(std::move(s), dy); }
  /// The same for a temporary dy (the MLP's GELU gradient into fc1, attention's merged dq, dk, dv
  /// into qkv): where the exit's adjoint moves no data (tp = 1) it is kept for dW without a copy
  /// (the copy of dy was ~2 % of a 1-rank step, docs/benchmarks.md).
  Bwd<In, WeightCtx> backward_input(Saved s, Out&& dy) const {
    return backward_input_impl(std::move(s), std::move(dy));
  }

  /// Adds dW = dy^T x (and db) to the parameters' gradients. No communication.
  void backward_weight(WeightCtx w) {
    if (w.fp8_sdy > 0)  // FP8: dW = dy^T x, dy in E5M2, x in E4M3 with the forward's scale
      weight_.accumulate_grad(fp8_matmul<true, false>(Fp8LinearGemm::grad_weight, w.dy, w.fp8_sdy, w.x, w.fp8_sx));
    else weight_.accumulate_grad(ops::matmul_backward_b<false, true>(w.dy, w.x));
    if (bias_.defined()) {
      if constexpr (Style::bias_after_exit) bias_.accumulate_grad(w.dbias);
      else bias_.accumulate_grad(ops::bias_grad(w.dy));
    }
  }

 private:
  template <class D>
  Bwd<In, WeightCtx> backward_input_impl(Saved s, D&& dy) const {
    detail::check(dy.extent(0) == s.x.extent(0) && dy.extent(1) == s.x.extent(1) && dy.extent(2) == out_,
                  "nn::Linear::backward_input", dy.mesh(), name_, ": gradient ", to_string(dy.shape()),
                  " does not match the forward's output [", s.x.extent(0), ", ", s.x.extent(1), ", ", out_, "]");
    WeightCtx w;
    if constexpr (Style::bias_after_exit)
      if (bias_.defined()) w.dbias = ops::bias_grad(dy);
    w.dy = redistribute_backward<MatmulOutL>(std::forward<D>(dy));  // adjoint of the exit; dy is not read after
    if constexpr (std::is_same_v<InL, ComputeL>) w.x = std::move(s.x);
    else w.x = redistribute<ComputeL>(std::move(s.x));  // re-gathered for dW (SP); s.x's storage where no step runs
    if (s.fp8_sx > 0) {  // FP8: dx = dy W, dy in E5M2, W in E4M3 with the forward's scale
      w.fp8_sx = s.fp8_sx;
      w.fp8_sdy = fp8_scale(Fp8Role::grad_output, w.dy);
      auto dx = redistribute_backward<InL>(
          fp8_matmul<false, false>(Fp8LinearGemm::grad_input, w.dy, w.fp8_sdy, weight_.value(), s.fp8_sw));
      return {std::move(dx), std::move(w)};
    }
    auto dx = redistribute_backward<InL>(ops::matmul_backward_a<false, true>(w.dy, weight_.value()));  // of the entry
    return {std::move(dx), std::move(w)};
  }

 public:
  auto parameters() { return std::tie(weight_, bias_); }

  Parameter<T, 2, Mesh, WeightL>& weight() noexcept { return weight_; }
  Parameter<T, 1, Mesh, BiasL>& bias() noexcept { return bias_; }
  bool has_bias() const noexcept { return bias_.defined(); }
  const std::string& name() const noexcept { return name_; }
  /// The FP8 amax histories (empty before the first FP8 forward).
  const std::optional<Fp8LinearScaling>& fp8_scaling_state() const noexcept { return fp8_; }

 private:
  /// The entry redistribution (input layout -> the matmul's); no copy where they are the same.
  static decltype(auto) entry(const In& x) {
    if constexpr (std::is_same_v<InL, ComputeL>) return (x);
    else return redistribute<ComputeL>(x);
  }

  /// Whether the entry moves data on this mesh: false where the two layouts place alike, or
  /// every step's group is one rank (a 1-rank run, tp = 1).
  static bool entry_moves(const Mesh& mesh) {
    if constexpr (std::is_same_v<InL, ComputeL>) return false;
    else {
      constexpr auto plan = dtensor::detail::checked_plan<InL, ComputeL>();
      for (const auto& step : plan)
        if (step.group_size(mesh.shape()) > 1) return true;
      return false;
    }
  }

  /// x W^T: in FP8 under nn::Fp8Autocast (recording the scales in s), else ops::matmul.
  auto matmul_forward(Saved& s) const {
    if constexpr (!std::is_same_v<InL, ComputeL>) {
      // Where the entry moves no data, the saved input itself is the matmul's: it is moved into
      // the compute layout (redistribute of a temporary keeps the storage, with the same checks
      // as the copying one) and its storage handed back afterwards. The copy of the input this
      // saves was 4 % of a 1-rank step (docs/benchmarks.md).
      if (!entry_moves(s.x.mesh())) {
        auto x = redistribute<ComputeL>(std::move(s.x));
        auto y = matmul_forward_on(s, x);
        const auto mesh = x.mesh();
        const auto shape = x.shape();
        s.x = In(mesh, shape, std::move(x.local()));  // the same piece: the layouts place alike here
        return y;
      }
    }
    return matmul_forward_on(s, entry(s.x));
  }

  template <class X>
  auto matmul_forward_on(Saved& s, const X& x) const {
    if (use_fp8()) {
      s.fp8_sx = fp8_scale(Fp8Role::input, x);
      s.fp8_sw = fp8_scale(Fp8Role::weight, weight_.value());
      return fp8_matmul<false, true>(Fp8LinearGemm::forward, x, s.fp8_sx, weight_.value(), s.fp8_sw);
    }
    return ops::matmul<false, true>(x, weight_.value());
  }

  bool use_fp8() const {
    if (!fp8_autocast_enabled()) return false;
    using Space = typename In::space;
    // The space's kernels, or a clear error before any work (a GPU's: nn/fp8_cuda.cuh); a dry run
    // (no data) records the FP8 GEMMs' cost with scale 1 (below).
    if constexpr (holds_data_v<Space>) detail::fp8_linear_kernels<T, Space>();
    return true;
  }

  /// The scale of this use of t's role, then t's amax recorded: the amax of the whole tensor, max-
  /// all-reduced over every mesh dimension that splits it (see the synopsis). The work is
  /// detail::Fp8LinearKernels' (nn/fp8_recipe.hpp), on t's piece: this names the dimensions.
  template <class X>
  float fp8_scale(Fp8Role role, const X& t) const {
    using L = typename X::layout;
    if constexpr (L::desc.has_partial())
      detail::check(false, "nn::Linear", t.mesh(), name_,
                    ": FP8 scaling of a Partial tensor (its pieces are not its values)");
    std::array<Communicator*, Mesh::ndim> groups{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < Mesh::ndim; ++i)
      if (L::desc.placements[i].is_shard() && t.mesh().size(i) > 1) groups[n++] = &t.mesh().group(i);
    const auto& l = t.to_local();
    if constexpr (!holds_data_v<typename X::space>) {
      // A dry run: the amax's pass and its all-reduces as the host's, no values (scale 1).
      (void)role;
      kernels::meta::amax<T>(l.numel());
      float a = 0;
      for (std::size_t i = 0; i < n; ++i) groups[i]->all_reduce(std::span<float>(&a, 1), ReduceOp::max);
      return 1.f;
    } else {
      return detail::fp8_linear_kernels<T, typename X::space>().scale(fp8_, role, l.data(), l.numel(),
                                                                      std::span(groups.data(), n));
    }
  }

  /// ops::matmul<TA, TB>(a, b) (its checks, shapes and layouts) with the product of the pieces
  /// computed in FP8: ops::matmul_fp8 on this rank's pieces, by detail::Fp8LinearKernels.
  template <bool TA, bool TB, class A, class B>
  static auto fp8_matmul(Fp8LinearGemm gemm, const A& a, float sa, const B& b, float sb) {
    using Space = typename A::space;
    using L = ops::rules::matmul_t<typename A::layout, typename B::layout, TA, TB, A::rank, B::rank>;
    constexpr std::size_t RO = ops::rules::matmul_rank<A::rank, B::rank, TA, TB>;
    const auto [global, local_shape] = ops::detail::matmul_shapes<"matmul", TA, TB>(a, b);
    const auto& al = a.to_local();
    const auto& bl = b.to_local();
    const Extent ra = kernels::detail::leading_rows(al.shape()), ca = al.extent(A::rank - 1);
    const Extent rb = kernels::detail::leading_rows(bl.shape()), cb = bl.extent(B::rank - 1);
    auto c = Tensor<T, RO, Space>::uninitialized(local_shape);
    if constexpr (holds_data_v<Space>)
      detail::fp8_linear_kernels<T, Space>().gemm(gemm, al.data(), ra, ca, sa, bl.data(), rb, cb, sb, c.data());
    else {
      (void)gemm, (void)sa, (void)sb;
      kernels::meta::gemm_fp8_quantizing<T>(TA, TB, ra, ca, rb, cb);
    }
    return ops::detail::make<T, RO, L>(a.mesh(), global, std::move(c));
  }

  /// bias_add keeps the layout in every style (checked here, at compile time).
  template <class Y>
  static auto same_layout(Y y) {
    static_assert(std::is_same_v<typename Y::layout, std::conditional_t<Style::bias_after_exit, OutL, MatmulOutL>>,
                  "a Linear style whose bias changes the layout of the output");
    return y;
  }

  std::string name_;
  Extent in_ = 0, out_ = 0;
  Parameter<T, 2, Mesh, WeightL> weight_;
  Parameter<T, 1, Mesh, BiasL> bias_;
  mutable std::optional<Fp8LinearScaling> fp8_;  // the FP8 amax histories: updated by each forward and backward
};

}  // namespace dtensor::nn
