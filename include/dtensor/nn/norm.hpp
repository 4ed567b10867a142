// dtensor/nn/norm.hpp — LayerNorm and RMSNorm modules over the feature dimension.
//
//   nn::LayerNorm<float, Mesh> ln("ln1", mesh, 64);               // tokens<Mesh> [B, T, C] in and out
//   nn::LayerNorm<float, Mesh, nn::SeqSplit> ln("ln1", mesh, 64); // sequence parallel: positions split
//   auto [y, saved] = ln.forward(x);
//   auto [dx, wctx] = ln.backward_input(std::move(saved), dy);  ln.backward_weight(std::move(wctx));
//   nn::RMSNorm<float, Mesh> rms("norm", mesh, 64, /*eps=*/1e-6);
//
// Weights (1 and, for LayerNorm, a bias of 0) are Replicate everywhere. The norm is row-wise,
// so it runs on any split of the tokens without communication (ops::layer_norm / rms_norm).
// Its weight gradients are sums over this rank's tokens: Partial<sum> on the data dimensions,
// and on the tensor dimension Partial<sum> under sequence parallelism (each rank normalised its
// own positions) or Replicate without it (every rank normalised the same tokens). The gradient
// syncs reduce them (DataParallel, parallel::sequence_parallel_grads). The kernel computes dx and
// the weight gradients in one pass: they are the weight context backward_weight adds.
#pragma once

#include <string>
#include <tuple>

#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/nn/style.hpp"
#include "dtensor/ops/norm.hpp"

namespace dtensor::nn {

namespace detail {
/// What LayerNorm and RMSNorm share; Kind::layer has a bias and centres the rows.
enum class NormKind { layer, rms };

template <NormKind K, class T, class Mesh, class TensorP>
class Norm {
  static_assert(require_dense_roles<"nn::LayerNorm / nn::RMSNorm", Mesh>());
  using GradL = ops::rules::sum_rows_t<tokens<Mesh, TensorP>, 3>;

 public:
  using XL = tokens<Mesh, TensorP>;
  using X = DTensor<T, 3, Mesh, XL>;
  using In = X;  // the module protocol's names (nn::Sequential chains by them)
  using Out = X;
  using PL = params<Mesh>;
  struct Saved {
    X x;
    ops::BasicNormStats<mesh_space_t<Mesh>> stats;
    auto tensors() { return std::tie(x, stats); }  // what an activation offload moves (nn/activation_offload.hpp)
  };
  struct WeightCtx {
    DTensor<T, 1, Mesh, GradL> dweight, dbias;
  };

  Norm() = default;
  Norm(std::string name, const Mesh& mesh, Extent dim, double eps)
      : name_(std::move(name)), dim_(dim), eps_(eps) {
    check(dim > 0 && eps > 0, op, mesh, name_, ": dim ", dim,
          ", eps ", eps, " (both must be > 0)");
    weight_ = Parameter<T, 1, Mesh, PL>(name_ + ".weight", mesh, Shape<1>{dim}, Init::ones(), false);
    if constexpr (K == NormKind::layer)
      bias_ = Parameter<T, 1, Mesh, PL>(name_ + ".bias", mesh, Shape<1>{dim}, Init::zeros(), false);
  }

  /// No communication.
  Fwd<X, Saved> forward(const X& x) const {
    check(x.extent(2) == dim_, op, x.mesh(), name_, ": forward: input ", to_string(x.shape()), " does not have ",
          dim_, " features");
    if constexpr (K == NormKind::layer) {
      auto r = ops::layer_norm(x, weight_.value(), bias_.value(), eps_);
      return {std::move(r.y), Saved{x, std::move(r.stats)}};
    } else {
      auto r = ops::rms_norm(x, weight_.value(), eps_);
      return {std::move(r.y), Saved{x, std::move(r.stats)}};
    }
  }

  /// No communication.
  Bwd<X, WeightCtx> backward_input(Saved s, const X& dy) const {
    check(dy.shape() == s.x.shape(), op, dy.mesh(), name_, ": backward_input: gradient ", to_string(dy.shape()),
          " for a forward of ", to_string(s.x.shape()));
    if constexpr (K == NormKind::layer) {
      auto g = ops::layer_norm_backward(dy, s.x, weight_.value(), s.stats);
      return {std::move(g.dx), WeightCtx{std::move(g.dweight), std::move(g.dbias)}};
    } else {
      auto g = ops::rms_norm_backward(dy, s.x, weight_.value(), s.stats);
      return {std::move(g.dx), WeightCtx{std::move(g.dweight), {}}};
    }
  }

  /// Adds the weight gradients computed by backward_input. No communication.
  void backward_weight(WeightCtx w) {
    weight_.accumulate_grad(w.dweight);
    if constexpr (K == NormKind::layer) bias_.accumulate_grad(w.dbias);
  }

  auto parameters() { return std::tie(weight_, bias_); }
  const std::string& name() const noexcept { return name_; }
  Parameter<T, 1, Mesh, PL>& weight() noexcept { return weight_; }
  Parameter<T, 1, Mesh, PL>& bias() noexcept { return bias_; }

 private:
  static constexpr const char* op = K == NormKind::layer ? "nn::LayerNorm" : "nn::RMSNorm";

  std::string name_;
  Extent dim_ = 0;
  double eps_ = 1e-5;
  Parameter<T, 1, Mesh, PL> weight_, bias_;
};
}  // namespace detail

template <kernels::host::FloatElement T, MeshType Mesh, Placement TensorP = Replicate>
class LayerNorm : public detail::Norm<detail::NormKind::layer, T, Mesh, TensorP> {
 public:
  LayerNorm() = default;
  LayerNorm(std::string name, const Mesh& mesh, Extent dim, double eps = 1e-5)
      : detail::Norm<detail::NormKind::layer, T, Mesh, TensorP>(std::move(name), mesh, dim, eps) {}
};

template <kernels::host::FloatElement T, MeshType Mesh, Placement TensorP = Replicate>
class RMSNorm : public detail::Norm<detail::NormKind::rms, T, Mesh, TensorP> {
 public:
  RMSNorm() = default;
  RMSNorm(std::string name, const Mesh& mesh, Extent dim, double eps = 1e-6)
      : detail::Norm<detail::NormKind::rms, T, Mesh, TensorP>(std::move(name), mesh, dim, eps) {}
};

}  // namespace dtensor::nn
