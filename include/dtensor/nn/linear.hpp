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
// Initialisation: W ~ N(0, init_std) and b = 0, drawn as the full tensor from the seed on every
// rank and then split (no communication), so every layout and mesh starts from the same values.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <type_traits>

#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/nn/style.hpp"
#include "dtensor/ops/matmul.hpp"
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
    auto tensors() { return std::tie(x); }  // what an activation offload moves (nn/activation_offload.hpp)
  };
  /// What backward_weight needs: the matmul's input and output gradient (and a row-wise style's
  /// bias gradient, taken before the exit's adjoint).
  struct WeightCtx {
    DTensor<T, 3, Mesh, ComputeL> x;
    DTensor<T, 3, Mesh, MatmulGradL> dy;
    DTensor<T, 1, Mesh, OutBiasGradL> dbias;
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
    auto y = ops::matmul<false, true>(entry(s.x), weight_.value());
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
  Bwd<In, WeightCtx> backward_input(Saved s, const Out& dy) const {
    detail::check(dy.extent(0) == s.x.extent(0) && dy.extent(1) == s.x.extent(1) && dy.extent(2) == out_,
                  "nn::Linear::backward_input", dy.mesh(), name_, ": gradient ", to_string(dy.shape()),
                  " does not match the forward's output [", s.x.extent(0), ", ", s.x.extent(1), ", ", out_, "]");
    WeightCtx w;
    if constexpr (Style::bias_after_exit)
      if (bias_.defined()) w.dbias = ops::bias_grad(dy);
    w.dy = redistribute_backward<MatmulOutL>(dy);  // adjoint of the exit
    if constexpr (std::is_same_v<InL, ComputeL>) w.x = std::move(s.x);
    else w.x = redistribute<ComputeL>(s.x);        // re-gathered for dW (SP)
    auto dx = redistribute_backward<InL>(ops::matmul_backward_a<false, true>(w.dy, weight_.value()));  // of the entry
    return {std::move(dx), std::move(w)};
  }

  /// Adds dW = dy^T x (and db) to the parameters' gradients. No communication.
  void backward_weight(WeightCtx w) {
    weight_.accumulate_grad(ops::matmul_backward_b<false, true>(w.dy, w.x));
    if (bias_.defined()) {
      if constexpr (Style::bias_after_exit) bias_.accumulate_grad(w.dbias);
      else bias_.accumulate_grad(ops::bias_grad(w.dy));
    }
  }

  auto parameters() { return std::tie(weight_, bias_); }

  Parameter<T, 2, Mesh, WeightL>& weight() noexcept { return weight_; }
  Parameter<T, 1, Mesh, BiasL>& bias() noexcept { return bias_; }
  bool has_bias() const noexcept { return bias_.defined(); }
  const std::string& name() const noexcept { return name_; }

 private:
  /// The entry redistribution (input layout -> the matmul's); no copy where they are the same.
  static decltype(auto) entry(const In& x) {
    if constexpr (std::is_same_v<InL, ComputeL>) return (x);
    else return redistribute<ComputeL>(x);
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
};

}  // namespace dtensor::nn
