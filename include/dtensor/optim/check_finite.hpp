// dtensor/optim/check_finite.hpp — stop a training run at the first NaN or Inf, saying where.
//
//   optim::check_finite_loss(loss, step);                // the loss of step `step`
//   optim::check_finite(params, step, "after the update", rank);   // every parameter's local piece
//   optim::check_finite(params, step, "gradient", rank, /*grads=*/true);
//
// A diverging run otherwise goes on for thousands of steps printing "loss nan". These checks
// are opt-in (train_gpt --check-finite), cost one pass over the values, and communicate
// nothing: a rank whose piece went bad throws on its own; the backend then releases its peers
// (threads: at once; MPI: mpi::run aborts the job). The loss is the same on every rank, so its
// check throws everywhere.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "dtensor/core/bfloat16.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/nn/parameter.hpp"

namespace dtensor::optim {

/// The index of the first NaN or Inf in `values`, if any.
template <class T>
std::optional<std::size_t> first_non_finite(std::span<const T> values) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(double(values[i]))) return i;
  return std::nullopt;
}

/// Throws an Error naming the step unless `loss` is finite.
inline void check_finite_loss(double loss, long long step) {
  if (!std::isfinite(loss))
    throw Error("check_finite", dtensor::detail::cat("step ", step, ": the loss is ", loss,
                                            " (training diverged: lower the learning rate, clip gradients)"));
}

/// Throws an Error naming the step, `what` ("parameter", "gradient"), the first parameter (in
/// list order) whose local piece holds a NaN or Inf, the element and its value.
/// `grads`: check the gradients instead of the values.
/// Pieces in device memory are copied to the host first; meta pieces hold nothing to check.
template <class T, std::size_t N, class Space>
void check_finite(const nn::ParamList<T, N, Space>& params, long long step, const char* what, int rank = Error::no_rank,
                  bool grads = false) {
  if constexpr (!holds_data_v<Space>) return;
  auto check = [&](const auto& p, auto piece) {  // piece: a span of T, or of a narrow gradient's type
    using E = typename decltype(piece)::element_type;
    Tensor<E, 1> host_copy;
    if constexpr (!Space::host_accessible) host_copy = to_space<host_space>(nn::detail::flat_view<Space>(piece));
    const std::span<const E> values = Space::host_accessible ? std::span<const E>(piece) : std::span<const E>(host_copy.span());
    if (const auto i = first_non_finite(values))
      throw Error("check_finite",
                  dtensor::detail::cat("step ", step, ": ", what, " '", p.name, "' holds ", double(values[*i]),
                              " at local element ", *i, " of ", values.size()),
                  rank);
  };
  for (const auto& p : params) {
    if (grads) p.visit_grad([&](auto g) { check(p, g); });
    else check(p, p.value);
  }
}

}  // namespace dtensor::optim
