// dtensor/nn/norm.hpp — LayerNorm and RMSNorm modules over the feature dimension.
//
//   nn::LayerNorm<float, Mesh> ln("ln1", mesh, 64);               // tokens<Mesh> in and out
//   nn::LayerNorm<float, Mesh, Shard<0>> ln("ln1", mesh, 64);     // sequence parallel: tokens split on "tp"
//   auto y = ln.forward(x);  auto dx = ln.backward_input(dy);  ln.backward_weight();
//   nn::RMSNorm<float, Mesh> rms("norm", mesh, 64, /*eps=*/1e-6);
//
// Weights (1 and, for LayerNorm, a bias of 0) are Replicate everywhere. The norm is row-wise,
// so it runs on any split of the tokens without communication (ops::layer_norm / rms_norm).
// Its weight gradients are sums over this rank's tokens: Partial<sum> on the data dimensions,
// and on "tp" Partial<sum> under sequence parallelism (each rank normalised its own tokens) or
// Replicate without it (every rank normalised the same tokens). The gradient syncs reduce them
// (DataParallel, parallel::sequence_parallel_grads). The kernel computes dx and the weight
// gradients in one pass: backward_input keeps the latter and backward_weight adds them.
#pragma once

#include <string>

#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/style.hpp"
#include "dtensor/ops/norm.hpp"

namespace dtensor::nn {

namespace detail {
/// What LayerNorm and RMSNorm share; Kind::layer has a bias and centres the rows.
enum class NormKind { layer, rms };

template <NormKind K, class T, class Mesh, class TpP>
class Norm {
 public:
  using XL = tokens<Mesh, TpP>;
  using X = DTensor<T, 2, Mesh, XL>;
  using PL = params<Mesh>;

  Norm() = default;
  Norm(std::string name, const Mesh& mesh, Extent dim, double eps)
      : name_(std::move(name)), dim_(dim), eps_(eps) {
    check(dim > 0 && eps > 0, op, mesh, name_, ": dim ", dim,
          ", eps ", eps, " (both must be > 0)");
    weight_ = Parameter<T, 1, Mesh, PL>(name_ + ".weight", distribute_replicated<PL>(mesh, ones<T>(Shape<1>{dim})), false);
    if constexpr (K == NormKind::layer)
      bias_ = Parameter<T, 1, Mesh, PL>(name_ + ".bias", distribute_replicated<PL>(mesh, zeros<T>(Shape<1>{dim})), false);
  }

  /// No communication.
  X forward(const X& x) {
    check(x.extent(1) == dim_, op, x.mesh(), name_, ": forward: input ", to_string(x.shape()), " does not have ",
          dim_, " features");
    x_ = x;
    if constexpr (K == NormKind::layer) {
      auto r = ops::layer_norm(x, weight_.value(), bias_.value(), eps_);
      stats_ = std::move(r.stats);
      return std::move(r.y);
    } else {
      auto r = ops::rms_norm(x, weight_.value(), eps_);
      stats_ = std::move(r.stats);
      return std::move(r.y);
    }
  }

  /// No communication.
  X backward_input(const X& dy) {
    check(dy.shape() == x_.shape() && x_.numel() > 0, op, dy.mesh(), name_, ": backward_input: gradient ",
          to_string(dy.shape()), " for a forward of ", to_string(x_.shape()));
    if constexpr (K == NormKind::layer) {
      auto g = ops::layer_norm_backward(dy, x_, weight_.value(), stats_);
      dweight_ = std::move(g.dweight);
      dbias_ = std::move(g.dbias);
      x_ = {};
      return std::move(g.dx);
    } else {
      auto g = ops::rms_norm_backward(dy, x_, weight_.value(), stats_);
      dweight_ = std::move(g.dweight);
      x_ = {};
      return std::move(g.dx);
    }
  }

  /// Adds the weight gradients computed by backward_input. No communication.
  void backward_weight() {
    check(dweight_.numel() > 0, op, weight_.mesh(), name_, ": backward_weight without a backward_input before it");
    weight_.accumulate_grad(dweight_);
    if constexpr (K == NormKind::layer) bias_.accumulate_grad(dbias_);
    dweight_ = {};
    dbias_ = {};
  }

  X backward(const X& dy) {
    auto dx = backward_input(dy);
    backward_weight();
    return dx;
  }

  /// Frees what forward kept for the backward (activation checkpointing recomputes it).
  void release() {
    x_ = {};
    stats_ = {};
  }

  template <class U>
  void collect(ParamList<U, Mesh::ndim>& out) {
    weight_.collect(out);
    if constexpr (K == NormKind::layer) bias_.collect(out);
  }
  void zero_grad() {
    weight_.zero_grad();
    if constexpr (K == NormKind::layer) bias_.zero_grad();
  }
  Parameter<T, 1, Mesh, PL>& weight() noexcept { return weight_; }
  Parameter<T, 1, Mesh, PL>& bias() noexcept { return bias_; }

 private:
  static constexpr const char* op = K == NormKind::layer ? "nn::LayerNorm" : "nn::RMSNorm";
  using GL = ops::rules::sum_rows_t<XL, 2>;

  std::string name_;
  Extent dim_ = 0;
  double eps_ = 1e-5;
  Parameter<T, 1, Mesh, PL> weight_, bias_;
  X x_;
  ops::NormStats stats_;
  DTensor<T, 1, Mesh, GL> dweight_, dbias_;
};
}  // namespace detail

template <kernels::host::FloatElement T, MeshType Mesh, Placement TpP = Replicate>
class LayerNorm : public detail::Norm<detail::NormKind::layer, T, Mesh, TpP> {
 public:
  LayerNorm() = default;
  LayerNorm(std::string name, const Mesh& mesh, Extent dim, double eps = 1e-5)
      : detail::Norm<detail::NormKind::layer, T, Mesh, TpP>(std::move(name), mesh, dim, eps) {}
};

template <kernels::host::FloatElement T, MeshType Mesh, Placement TpP = Replicate>
class RMSNorm : public detail::Norm<detail::NormKind::rms, T, Mesh, TpP> {
 public:
  RMSNorm() = default;
  RMSNorm(std::string name, const Mesh& mesh, Extent dim, double eps = 1e-6)
      : detail::Norm<detail::NormKind::rms, T, Mesh, TpP>(std::move(name), mesh, dim, eps) {}
};

}  // namespace dtensor::nn
