// dtensor/nn/linear.hpp — y = x W^T + b, with W [out, in] as in PyTorch, in any parallel style.
//
//   nn::Linear<float, Mesh> fc("fc", mesh, /*in=*/64, /*out=*/256, /*seed=*/1);
//   nn::Linear<float, Mesh, parallel::ColwiseParallel<>> q("q", mesh, 64, 64, 2);
//   auto y  = fc.forward(x);            // x: DTensor [tokens, in] in Style::input_layout
//   auto dx = fc.backward_input(dy);    // the input gradient (keeps dy for the weight gradient)
//   fc.backward_weight();               // adds dW (and db) to the parameters' gradients
//   fc.collect(params);                 // "fc.weight", "fc.bias"
//
// Forward: entry redistribution of x to Style::compute_layout, ops::matmul<false, true>(x, W),
// bias (before the exit, or after it for row-wise styles whose matmul output is Partial), exit
// redistribution to Style::output_layout. Backward: the adjoints in reverse (redistribute_backward),
// ops::matmul_backward_a for dx and ops::matmul_backward_b for dW. The only collectives are the
// style's entry and exit and their adjoints (see parallel/tensor_parallel.hpp for each style).
//
// Initialisation: W ~ N(0, init_std) and b = 0, drawn as the full tensor from the seed on every
// rank and then split (no communication), so every layout and mesh starts from the same values.
#pragma once

#include <cstdint>
#include <string>

#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
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
 public:
  using style = Style;
  using WL = typename Style::template weight_layout<Mesh>;
  using BL = typename Style::template bias_layout<Mesh>;
  using InL = typename Style::template input_layout<Mesh>;
  using CL = typename Style::template compute_layout<Mesh>;
  using OutL = typename Style::template output_layout<Mesh>;
  using In = DTensor<T, 2, Mesh, InL>;
  using Out = DTensor<T, 2, Mesh, OutL>;

  Linear() = default;
  Linear(std::string name, const Mesh& mesh, Extent in, Extent out, std::uint64_t seed, LinearOptions o = {})
      : name_(std::move(name)), in_(in), out_(out), has_bias_(o.bias) {
    detail::check(in > 0 && out > 0 && o.init_std >= 0, "nn::Linear", mesh, name_, ": in ", in, ", out ", out,
                  ", init_std ", o.init_std, " (extents must be > 0)");
    weight_ = Parameter<T, 2, Mesh, WL>(name_ + ".weight",
                                        distribute_replicated<WL>(mesh, normal<T>(Shape<2>{out, in}, seed, 0, o.init_std)));
    if (has_bias_) bias_ = Parameter<T, 1, Mesh, BL>(name_ + ".bias", distribute_replicated<BL>(mesh, zeros<T>(Shape<1>{out})), false);
  }

  /// y = x W^T + b. Collectives: the style's entry and exit.
  Out forward(const In& x) {
    detail::check(x.extent(1) == in_, "nn::Linear::forward", x.mesh(), name_, ": input ", to_string(x.shape()),
                  " does not have ", in_, " features");
    xc_ = redistribute<CL>(x);  // entry
    auto y = ops::matmul<false, true>(xc_, weight_.value());
    if constexpr (Style::bias_after_exit) {
      auto z = redistribute<OutL>(y);  // exit
      if (!has_bias_) return z;
      return same_layout(ops::bias_add(z, bias_.value()));
    } else {
      if (has_bias_) return redistribute<OutL>(same_layout(ops::bias_add(y, bias_.value())));
      return redistribute<OutL>(y);  // exit
    }
  }

  /// dx for dy = dL/dy. Collectives: the adjoints of the exit and the entry. Keeps dy (in the
  /// matmul's output layout) for backward_weight.
  In backward_input(const Out& dy) {
    detail::check(dy.shape() == Shape<2>{xc_.extent(0), out_}, "nn::Linear::backward_input", dy.mesh(), name_,
                  ": gradient ", to_string(dy.shape()), " does not match the forward's output [", xc_.extent(0), ", ",
                  out_, "] (no forward?)");
    if constexpr (Style::bias_after_exit)
      if (has_bias_) dbias_ = ops::bias_grad(dy);
    dyc_ = redistribute_backward<YL>(dy);  // adjoint of the exit
    return redistribute_backward<InL>(ops::matmul_backward_a<false, true>(dyc_, weight_.value()));  // adjoint of the entry
  }

  /// Adds dW = dy^T x (and db) to the parameters' gradients; frees what forward kept. No communication.
  void backward_weight() {
    detail::check(dyc_.numel() > 0 || xc_.extent(0) == 0, "nn::Linear::backward_weight", weight_.mesh(), name_,
                  ": no backward_input before it");
    weight_.accumulate_grad(ops::matmul_backward_b<false, true>(dyc_, xc_));
    if (has_bias_) {
      if constexpr (Style::bias_after_exit) bias_.accumulate_grad(dbias_);
      else bias_.accumulate_grad(ops::bias_grad(dyc_));
    }
    xc_ = {};
    dyc_ = {};
  }

  In backward(const Out& dy) {
    auto dx = backward_input(dy);
    backward_weight();
    return dx;
  }

  /// Frees what forward kept for the backward (activation checkpointing recomputes it).
  void release() {
    xc_ = {};
    dyc_ = {};
  }

  template <class U>
  void collect(ParamList<U, Mesh::ndim>& out) {
    weight_.collect(out);
    if (has_bias_) bias_.collect(out);
  }
  void zero_grad() {
    weight_.zero_grad();
    if (has_bias_) bias_.zero_grad();
  }

  Parameter<T, 2, Mesh, WL>& weight() noexcept { return weight_; }
  Parameter<T, 1, Mesh, BL>& bias() noexcept { return bias_; }
  bool has_bias() const noexcept { return has_bias_; }
  const std::string& name() const noexcept { return name_; }

 private:
  // The matmul's output layout (before the exit), and the bias gradient of a row-wise style.
  using YL = ops::rules::matmul_t<CL, WL, false, true, 2, 2>;
  using DBiasL = ops::rules::sum_rows_t<OutL, 2>;

  /// bias_add keeps the layout in every style (checked here, at compile time).
  template <class Y>
  static auto same_layout(Y y) {
    static_assert(std::is_same_v<typename Y::layout, std::conditional_t<Style::bias_after_exit, OutL, YL>>,
                  "a Linear style whose bias changes the layout of the output");
    return y;
  }

  std::string name_;
  Extent in_ = 0, out_ = 0;
  bool has_bias_ = true;
  Parameter<T, 2, Mesh, WL> weight_;
  Parameter<T, 1, Mesh, BL> bias_;
  DTensor<T, 2, Mesh, CL> xc_;
  DTensor<T, 2, Mesh, typename grad_layout<YL>::type> dyc_;
  DTensor<T, 1, Mesh, DBiasL> dbias_;
};

}  // namespace dtensor::nn
