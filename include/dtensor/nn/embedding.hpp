// dtensor/nn/embedding.hpp — a lookup table [V, C] of learned rows.
//
//   nn::Embedding<float, Mesh> wpe("wpe", mesh, /*rows=*/T, /*dim=*/C, /*seed=*/3);        // replicated
//   nn::Embedding<float, Mesh, parallel::VocabParallel<>> wte("wte", mesh, V, C, 4);       // vocabulary split
//   auto [h, saved] = wte.forward(ids);   // ids [B, T] int32 in Style::ids_layout -> [B, T, C] in Style::output_layout
//   auto [none, wctx] = wte.backward_input(std::move(saved), dh);   // ids have no gradient
//   wte.backward_weight(std::move(wctx));                           // the table's gradient
//
// Forward: ops::embedding on this rank's rows of the table, then the style's exit (the lookup's
// layout -> output_layout); saved: the ids. backward_input: the exit's adjoint (the whole
// backward's communication); backward_weight: ops::embedding_backward (a scatter-add in token
// order), so a zero-bubble schedule can defer it like any weight gradient. Collectives: only the exit and its adjoint (parallel/ documents
// VocabParallel's; Replicated has none). Init: N(0, init_std) drawn whole from the seed.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/nn/module.hpp"
#include "dtensor/nn/style.hpp"
#include "dtensor/ops/embedding.hpp"

namespace dtensor::nn {

template <kernels::host::FloatElement T, MeshType Mesh, class Style = Replicated<>, class Id = std::int32_t>
  requires EmbeddingStyle<Style, Mesh>
class Embedding {
  static_assert(require_dense_roles<"nn::Embedding", Mesh>());

 public:
  using WeightL = typename Style::template weight_layout<Mesh>;
  using IdsL = typename Style::template ids_layout<Mesh>;
  using OutL = typename Style::template output_layout<Mesh>;
  using Ids = DTensor<Id, 2, Mesh, IdsL>;
  using Out = DTensor<T, 3, Mesh, OutL>;

 private:
  using LookupL = ops::rules::embedding_t<WeightL, IdsL, 2>;

 public:
  struct Saved {
    Ids ids;
  };
  struct WeightCtx {
    Ids ids;
    DTensor<T, 3, Mesh, typename grad_layout<LookupL>::type> dy;  // in the lookup's layout
  };

  Embedding() = default;
  Embedding(std::string name, const Mesh& mesh, Extent rows, Extent dim, std::uint64_t seed, double init_std = 0.02)
      : name_(std::move(name)) {
    detail::check(rows > 0 && dim > 0 && init_std >= 0, "nn::Embedding", mesh, name_, ": rows ", rows, ", dim ", dim,
                  ", init_std ", init_std);
    weight_ = Parameter<T, 2, Mesh, WeightL>(
        name_ + ".weight", mesh, Shape<2>{rows, dim}, Init::normal(seed, 0, init_std));
  }

  /// Collectives: the style's exit.
  Fwd<Out, Saved> forward(const Ids& ids) const {
    return {redistribute<OutL>(ops::embedding(weight_.value(), ids)), Saved{ids}};
  }

  /// Ids have no gradient: the first member is empty. Collectives: the adjoint of the exit.
  Bwd<Nothing, WeightCtx> backward_input(Saved s, const Out& dy) const {
    detail::check(s.ids.extent(0) == dy.extent(0) && s.ids.extent(1) == dy.extent(1), "nn::Embedding::backward_input",
                  dy.mesh(), name_, ": gradient ", to_string(dy.shape()), " for ids ", to_string(s.ids.shape()));
    return {Nothing{}, WeightCtx{std::move(s.ids), redistribute_backward<LookupL>(dy)}};
  }

  /// Adds the table's gradient (a scatter-add). No communication.
  void backward_weight(WeightCtx w) {
    weight_.accumulate_grad(ops::embedding_backward(w.dy, w.ids, weight_.value()));
  }

  auto parameters() { return std::tie(weight_); }
  Parameter<T, 2, Mesh, WeightL>& weight() noexcept { return weight_; }

 private:
  std::string name_;
  Parameter<T, 2, Mesh, WeightL> weight_;
};

}  // namespace dtensor::nn
