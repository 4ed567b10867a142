// dtensor/parallel/pipeline/schedule.hpp — a pipeline schedule as data.
//
//   pipeline::Schedule s{pipeline::StageLayout::looped(2), 2, {}};
//   s.actions = {{parse_action("0F0"), parse_action("0SEND_F0"), ...},   // rank 0, in order
//                {parse_action("1RECV_F0"), parse_action("1F0"), ...}};  // rank 1
//
// A schedule is, for each pipeline rank, the list of actions it runs in order (action.hpp),
// together with the stage layout the stage numbers refer to and the number of micro-batches.
// Nothing here checks it: validate.hpp does, before anything runs it.
#pragma once

#include <vector>

#include "dtensor/parallel/pipeline/action.hpp"
#include "dtensor/parallel/pipeline/stage_layout.hpp"

namespace dtensor::parallel::pipeline {

struct Schedule {
  StageLayout layout;
  int microbatches = 1;
  std::vector<std::vector<Action>> actions;  // actions[rank] in the order the rank runs them

  int ranks() const { return layout.ranks; }

  /// The same schedule without its sends and receives (what a table of compute shows).
  Schedule compute_only() const {
    Schedule result{layout, microbatches, {}};
    for (const auto& rank_actions : actions) {
      auto& kept = result.actions.emplace_back();
      for (const Action& action : rank_actions)
        if (is_compute(action.kind)) kept.push_back(action);
    }
    return result;
  }

  friend bool operator==(const Schedule&, const Schedule&) = default;
};

}  // namespace dtensor::parallel::pipeline
