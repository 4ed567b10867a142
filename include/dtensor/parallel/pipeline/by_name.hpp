// dtensor/parallel/pipeline/by_name.hpp — a schedule generator picked by name, as a command line
// names it (`--schedule gpipe|1f1b|interleaved|zb|zbv|dualpipev`).
//
//   auto s = pipeline::make_schedule(pipeline::parse_schedule_kind("zbv"), 4, 8);
//
// `stages_per_rank` is the v of interleaved 1F1B; the other schedules fix it (1, and 2 for ZB-V and DualPipeV)
// and reject any other value, so that a flag cannot be silently ignored.
#pragma once

#include <string_view>

#include "dtensor/parallel/pipeline/generate_dualpipe.hpp"
#include "dtensor/parallel/pipeline/generate_zero_bubble.hpp"

namespace dtensor::parallel::pipeline {

enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zero_bubble_h1, zero_bubble_v, dual_pipe_v };

inline ScheduleKind parse_schedule_kind(std::string_view name) {
  if (name == "gpipe") return ScheduleKind::gpipe;
  if (name == "1f1b") return ScheduleKind::one_f_one_b;
  if (name == "interleaved") return ScheduleKind::interleaved;
  if (name == "zb" || name == "zbh1") return ScheduleKind::zero_bubble_h1;
  if (name == "zbv") return ScheduleKind::zero_bubble_v;
  if (name == "dualpipev") return ScheduleKind::dual_pipe_v;
  throw Error("pipeline::parse_schedule_kind",
              dtensor::detail::cat("unknown schedule '", name, "': expected gpipe, 1f1b, interleaved, zb, zbv or dualpipev"));
}

/// The stages each rank holds under a schedule kind; 0 for interleaved, where the caller chooses.
inline int fixed_stages_per_rank(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::interleaved: return 0;
    case ScheduleKind::zero_bubble_v:
    case ScheduleKind::dual_pipe_v: return 2;
    default: return 1;
  }
}

/// `stages_per_rank` = 0 takes the kind's own (2 for interleaved).
inline Schedule make_schedule(ScheduleKind kind, int ranks, int microbatches, int stages_per_rank = 0) {
  const int fixed = fixed_stages_per_rank(kind);
  if (stages_per_rank == 0) stages_per_rank = fixed == 0 ? 2 : fixed;
  if (fixed != 0 && stages_per_rank != fixed)
    throw Error("pipeline::make_schedule",
                dtensor::detail::cat("this schedule puts ", fixed, " stage(s) on each rank, got stages_per_rank = ",
                                     stages_per_rank, " (only interleaved takes a choice)"));
  switch (kind) {
    case ScheduleKind::gpipe: return gpipe(ranks, microbatches);
    case ScheduleKind::one_f_one_b: return one_f_one_b(ranks, microbatches);
    case ScheduleKind::interleaved: return interleaved_1f1b(ranks, microbatches, stages_per_rank);
    case ScheduleKind::zero_bubble_h1: return zero_bubble_h1(ranks, microbatches);
    case ScheduleKind::zero_bubble_v: return zero_bubble_v(ranks, microbatches);
    case ScheduleKind::dual_pipe_v: return dual_pipe_v(ranks, microbatches);
  }
  throw Error("pipeline::make_schedule", "unknown schedule kind");
}

}  // namespace dtensor::parallel::pipeline
