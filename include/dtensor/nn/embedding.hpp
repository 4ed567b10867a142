// dtensor/nn/embedding.hpp — a lookup table [V, C] of learned rows.
//
//   nn::Embedding<float, Mesh> wpe("wpe", mesh, /*rows=*/T, /*dim=*/C, /*seed=*/3);        // replicated
//   nn::Embedding<float, Mesh, parallel::VocabParallel<>> wte("wte", mesh, V, C, 4);       // vocabulary split
//   auto h = wte.forward(ids);   // ids [N] int32 in Style::ids_layout -> [N, C] in Style::output_layout
//   wte.backward(dh);            // the table's gradient (ids have none)
//
// Forward: ops::embedding on this rank's rows of the table, then the style's exit (the lookup's
// layout -> output_layout). Backward: the exit's adjoint, then ops::embedding_backward (a
// scatter-add in token order). Collectives: only the exit and its adjoint (parallel/ documents
// VocabParallel's; Replicated has none). Init: N(0, init_std) drawn whole from the seed.
#pragma once

#include <cstdint>
#include <string>

#include "dtensor/core/factories.hpp"
#include "dtensor/distributed/distribute.hpp"
#include "dtensor/nn/style.hpp"
#include "dtensor/ops/embedding.hpp"

namespace dtensor::nn {

template <kernels::host::FloatElement T, MeshType Mesh, class Style = Replicated<>, class Id = std::int32_t>
  requires EmbeddingStyle<Style, Mesh>
class Embedding {
 public:
  using WL = typename Style::template weight_layout<Mesh>;
  using IdsL = typename Style::template ids_layout<Mesh>;
  using OutL = typename Style::template output_layout<Mesh>;
  using Ids = DTensor<Id, 1, Mesh, IdsL>;
  using Out = DTensor<T, 2, Mesh, OutL>;

  Embedding() = default;
  Embedding(std::string name, const Mesh& mesh, Extent rows, Extent dim, std::uint64_t seed, double init_std = 0.02)
      : name_(std::move(name)) {
    detail::check(rows > 0 && dim > 0 && init_std >= 0, "nn::Embedding", mesh, name_, ": rows ", rows, ", dim ", dim,
                  ", init_std ", init_std);
    weight_ = Parameter<T, 2, Mesh, WL>(name_ + ".weight",
                                        distribute_replicated<WL>(mesh, normal<T>(Shape<2>{rows, dim}, seed, 0, init_std)));
  }

  /// Collectives: the style's exit.
  Out forward(const Ids& ids) {
    ids_ = ids;
    return redistribute<OutL>(ops::embedding(weight_.value(), ids));
  }

  /// Adds the table's gradient. Collectives: the adjoint of the exit.
  void backward(const Out& dy) {
    detail::check(ids_.extent(0) == dy.extent(0) && dy.extent(0) > 0, "nn::Embedding::backward", dy.mesh(), name_,
                  ": gradient ", to_string(dy.shape()), " for ", ids_.extent(0), " ids (no forward?)");
    weight_.accumulate_grad(ops::embedding_backward(redistribute_backward<LookupL>(dy), ids_, weight_.value()));
    ids_ = {};
  }
  /// The zero-bubble split: ids carry no gradient, so the whole backward is the weight's.
  void backward_weight(const Out& dy) { backward(dy); }

  /// Frees what forward kept (the ids).
  void release() { ids_ = {}; }

  template <class U>
  void collect(ParamList<U, Mesh::ndim>& out) { weight_.collect(out); }
  void zero_grad() { weight_.zero_grad(); }
  Parameter<T, 2, Mesh, WL>& weight() noexcept { return weight_; }

 private:
  using LookupL = ops::rules::embedding_t<WL, IdsL, 1>;

  std::string name_;
  Parameter<T, 2, Mesh, WL> weight_;
  Ids ids_;
};

}  // namespace dtensor::nn
