// dtensor/parallel/pipeline/stage_layout.hpp — which rank holds which pipeline stage.
//
//   auto layout = pipeline::StageLayout::looped(4, 2);  // 8 stages: rank r holds r and r + 4
//   auto v = pipeline::StageLayout::v_shape(4);         // 8 stages: rank r holds r and 7 - r
//   layout.rank_of(5) == 1;  v.rank_of(5) == 2;
//
// A model is cut into `stages()` consecutive stages; each of the `ranks` pipeline ranks holds
// `stages_per_rank` of them. Looped (round-robin, PyTorch's "loop" style) is what GPipe, 1F1B
// (one stage per rank) and interleaved 1F1B (v per rank) use; the V shape (PyTorch's "v" style)
// is zero-bubble V's: the first and last stages sit on rank 0, and the middle two on the last
// rank, so the forward pass turns around there without a message.
#pragma once

#include <vector>

#include "dtensor/core/error.hpp"

namespace dtensor::parallel::pipeline {

enum class StagePlacement { looped, v_shape };

struct StageLayout {
  int ranks = 1;
  int stages_per_rank = 1;
  StagePlacement placement = StagePlacement::looped;

  /// `stages_per_rank` stages on each of `ranks` ranks, stage s on rank s % ranks.
  static StageLayout looped(int ranks, int stages_per_rank = 1) {
    StageLayout layout{ranks, stages_per_rank, StagePlacement::looped};
    layout.check("pipeline::StageLayout::looped");
    return layout;
  }
  /// Two stages per rank, rank r holding stages r and 2 * ranks - 1 - r.
  static StageLayout v_shape(int ranks) {
    StageLayout layout{ranks, 2, StagePlacement::v_shape};
    layout.check("pipeline::StageLayout::v_shape");
    return layout;
  }

  /// Throws unless the layout describes at least one stage on each of at least one rank.
  void check(const char* op) const {
    if (ranks < 1) throw Error(op, dtensor::detail::cat("a pipeline needs at least one rank, got ", ranks));
    if (stages_per_rank < 1)
      throw Error(op, dtensor::detail::cat("each rank needs at least one stage, got stages_per_rank = ", stages_per_rank));
    if (placement == StagePlacement::v_shape && stages_per_rank != 2)
      throw Error(op, dtensor::detail::cat("the V shape puts exactly 2 stages on each rank, got ", stages_per_rank));
  }

  int stages() const { return ranks * stages_per_rank; }

  int rank_of(int stage) const {
    if (stage < 0 || stage >= stages())
      throw Error("pipeline::StageLayout::rank_of", dtensor::detail::cat("stage ", stage, " is not in [0, ", stages(), ")"));
    if (placement == StagePlacement::v_shape && stage >= ranks) return 2 * ranks - 1 - stage;
    return stage % ranks;
  }

  /// The stages of one rank, in increasing order.
  std::vector<int> stages_of(int rank) const {
    if (rank < 0 || rank >= ranks)
      throw Error("pipeline::StageLayout::stages_of", dtensor::detail::cat("rank ", rank, " is not in [0, ", ranks, ")"));
    std::vector<int> result;
    for (int stage = 0; stage < stages(); ++stage)
      if (rank_of(stage) == rank) result.push_back(stage);
    return result;
  }

  friend bool operator==(const StageLayout&, const StageLayout&) = default;
};

}  // namespace dtensor::parallel::pipeline
