// dtensor/nn/moe_blocks.hpp — which blocks of a model have a mixture of experts, and how many.
//
//   nn::is_moe_block(layer, every, dense_first);   // block `layer` (0-based) has experts
//   nn::moe_block_count(layers, every, dense_first); // how many of `layers` blocks have them
//
// Block l has experts when l >= dense_first (the first blocks dense: DeepSeek-V3's first 3 of
// 61) and (l + 1) % every == 0 (every 1: all; 2: blocks 1, 3, 5, ...). Of L blocks that is
//   floor(L / every) - floor(min(dense_first, L) / every)
// (the multiples of `every` in [1, L] less those in [1, dense_first]). The one formula: the
// models' MoE layers (models/moe_gpt.hpp), their flags' check (models/moe_flags.hpp), the
// parameter count before a build (models/gpt_size.hpp) and the analytic estimate
// (sim/analytic.hpp) use these two.
#pragma once

#include <algorithm>

#include "dtensor/core/error.hpp"
#include "dtensor/core/shape.hpp"

namespace dtensor::nn {

namespace detail {
inline void check_moe_blocks(const char* op, Extent every, Extent dense_first) {
  if (every < 1 || dense_first < 0)
    throw Error(op, dtensor::detail::cat("every ", every, " must be >= 1 and dense_first ", dense_first, " >= 0"));
}
}  // namespace detail

/// Whether block `layer` (0-based) has a mixture of experts (see the synopsis).
inline bool is_moe_block(Extent layer, Extent every, Extent dense_first) {
  detail::check_moe_blocks("nn::is_moe_block", every, dense_first);
  return layer >= dense_first && (layer + 1) % every == 0;
}

/// How many of `layers` blocks have a mixture of experts (see the synopsis).
inline Extent moe_block_count(Extent layers, Extent every, Extent dense_first) {
  detail::check_moe_blocks("nn::moe_block_count", every, dense_first);
  if (layers < 0) throw Error("nn::moe_block_count", dtensor::detail::cat("layers ", layers, " must be >= 0"));
  return layers / every - std::min(dense_first, layers) / every;
}

}  // namespace dtensor::nn
