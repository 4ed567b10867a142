// dtensor/nn/mlp.hpp — the transformer MLP: fc1 -> GELU -> fc2.
//
//   nn::MLP<float, Mesh> mlp("mlp", mesh, /*dim=*/64, /*hidden=*/256, /*seed=*/5);
//   nn::MLP<float, Mesh, parallel::ColwiseParallel<>, parallel::RowwiseParallel<>> tp_mlp(...);   // Megatron
//   auto y = mlp.forward(x);  auto dx = mlp.backward_input(dy);  mlp.backward_weight();
//
// fc1 [hidden, dim] and fc2 [dim, hidden] are Linears in the given styles; fc1's output layout
// must be fc2's input layout (checked at compile time). Collectives: those of the two styles
// (Megatron's pair: one all-reduce forward and one backward, or an all-gather and a
// reduce-scatter each way under sequence parallelism). GELU is ops::gelu (no communication).
#pragma once

#include <string>

#include "dtensor/nn/linear.hpp"
#include "dtensor/ops/activations.hpp"

namespace dtensor::nn {

template <kernels::host::FloatElement T, MeshType Mesh, class Fc1Style = Replicated<>, class Fc2Style = Replicated<>>
class MLP {
 public:
  using Fc1 = Linear<T, Mesh, Fc1Style>;
  using Fc2 = Linear<T, Mesh, Fc2Style>;
  static_assert(std::is_same_v<typename Fc1::OutL, typename Fc2::InL>,
                "MLP: fc1's output layout must be fc2's input layout (column-wise then row-wise, or both Replicated)");
  using In = typename Fc1::In;
  using Out = typename Fc2::Out;

  MLP() = default;
  /// fc1 draws from seed, fc2 from seed + 1; fc2's init_std may be scaled (GPT-2: by 1/sqrt(2 layers)).
  MLP(std::string name, const Mesh& mesh, Extent dim, Extent hidden, std::uint64_t seed, double init_std = 0.02,
      double out_std = 0.02)
      : fc1_(name + ".fc1", mesh, dim, hidden, seed, {.bias = true, .init_std = init_std}),
        fc2_(name + ".fc2", mesh, hidden, dim, seed + 1, {.bias = true, .init_std = out_std}) {}

  Out forward(const In& x) {
    h_ = fc1_.forward(x);
    return fc2_.forward(ops::gelu(h_));
  }
  In backward_input(const Out& dy) {
    auto da = fc2_.backward_input(dy);
    auto dh = ops::gelu_backward(da, h_);
    h_ = {};
    return fc1_.backward_input(dh);
  }
  void backward_weight() {
    fc2_.backward_weight();
    fc1_.backward_weight();
  }
  In backward(const Out& dy) {
    auto dx = backward_input(dy);
    backward_weight();
    return dx;
  }
  /// Frees what forward kept for the backward (activation checkpointing recomputes it).
  void release() {
    h_ = {};
    fc1_.release();
    fc2_.release();
  }

  template <class U>
  void collect(ParamList<U, Mesh::ndim>& out) {
    fc1_.collect(out);
    fc2_.collect(out);
  }
  Fc1& fc1() noexcept { return fc1_; }
  Fc2& fc2() noexcept { return fc2_; }

 private:
  Fc1 fc1_;
  Fc2 fc2_;
  typename Fc1::Out h_;
};

}  // namespace dtensor::nn
