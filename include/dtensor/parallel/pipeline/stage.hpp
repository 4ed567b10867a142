// dtensor/parallel/pipeline/stage.hpp — what the pipeline executor needs of a stage.
//
//   static_assert(pipeline::require_stage<MyStage>());    // each missing member named in its own message
//
// A stage is one contiguous part of a model on one pipeline rank, keeping what its backward needs
// per micro-batch (a schedule holds several in flight and runs their backwards in any order).
// pipeline::split (split.hpp) cuts such stages from any nn::LayeredModel; docs/pipeline.md
// ("The stage protocol") says what each member means:
//   X, Input, Target, Loss              the activation that crosses stages, the model's input (the
//                                       first stage reads it), the target (the last stage's loss
//                                       reads it), the loss
//   index(), is_first(), is_last(), mesh()
//   forward(mb, optional<X> x, input, target) -> optional<X>       x empty on the first stage; nothing
//                                                                 back on the last, which keeps the loss
//   backward_input(mb, optional<X> dy, dloss) -> optional<X>       dy empty on the last stage
//   backward_weight(mb);  backward(mb, dy, dloss) -> optional<X>   (both parts at once)
//   take_loss(mb) -> Loss                                          last stage
//   saved_count(), weight_pending_count()                          micro-batches held
//   activation_shape(input) -> Shape                               what a receiving stage allocates
// Optional: take_auxiliary_loss(mb) -> double (auxiliary losses of a stage other than the last,
// which the executor adds to the step's loss). FSDP inside a stage needs the unit protocol
// besides (nn/units.hpp).
#pragma once

#include <concepts>
#include <cstddef>
#include <optional>

namespace dtensor::parallel::pipeline {

template <class S>
concept PipelineStage = requires {
  typename S::X;
  typename S::Input;
  typename S::Target;
  typename S::Loss;
} && requires(S& s, const S& cs, int mb, std::optional<typename S::X> x, const typename S::Input& input,
              const typename S::Target& target, double dloss) {
  { cs.index() } -> std::convertible_to<int>;
  { cs.is_first() } -> std::convertible_to<bool>;
  { cs.is_last() } -> std::convertible_to<bool>;
  cs.mesh();
  { s.forward(mb, x, input, target) } -> std::same_as<std::optional<typename S::X>>;
  { s.backward_input(mb, x, dloss) } -> std::same_as<std::optional<typename S::X>>;
  s.backward_weight(mb);
  { s.backward(mb, x, dloss) } -> std::same_as<std::optional<typename S::X>>;
  { s.take_loss(mb) } -> std::convertible_to<typename S::Loss>;
  { cs.saved_count() } -> std::convertible_to<std::size_t>;
  { cs.weight_pending_count() } -> std::convertible_to<std::size_t>;
  cs.activation_shape(input);
};

/// Checked one group at a time, so that the error names what a stage lacks.
template <class S>
constexpr bool require_stage() {
  static_assert(requires { typename S::X; typename S::Input; typename S::Target; typename S::Loss; },
                "a pipeline stage needs the types X (the activation between stages), Input, Target and Loss");
  static_assert(requires(const S& cs) {
    cs.index();
    cs.is_first();
    cs.is_last();
    cs.mesh();
  }, "a pipeline stage needs index(), is_first(), is_last() and mesh()");
  static_assert(PipelineStage<S>,
                "a pipeline stage needs forward(mb, optional<X>, input, target), backward_input(mb, optional<X>, dloss), "
                "backward_weight(mb), backward(mb, optional<X>, dloss) (each optional<X>), take_loss(mb), "
                "saved_count(), weight_pending_count() and activation_shape(input): parallel/pipeline/stage.hpp");
  return PipelineStage<S>;
}

}  // namespace dtensor::parallel::pipeline
