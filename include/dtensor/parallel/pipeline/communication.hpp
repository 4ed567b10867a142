// dtensor/parallel/pipeline/communication.hpp — turns compute orders into a schedule with sends
// and receives (PyTorch's `_add_send_recv`).
//
//   auto s = pipeline::add_send_recv(StageLayout::looped(2), 2,
//       {{F(0,0), F(0,1), B(0,0), B(0,1)}, {F(1,0), B(1,0), F(1,1), B(1,1)}});
//
// Generators only decide the order of computation on each rank; this pass adds the messages.
// A forward whose next stage lives on another rank is followed by SEND_F, a full or input
// backward whose previous stage lives on another rank by SEND_B; stages on the same rank hand
// over locally, with no message. Where the receive goes is decided by running the ranks in
// lock step, one computation per rank per round: a message sent in round t is received by its
// peer at the peer's position in round t, and the receiver may use it from round t + 1. Every
// send and its receive are thus appended to the two lists at the same moment of one global
// order, and a receive is posted no later in its list than the computations of the round its
// data was sent in, so a blocking send does not wait behind work of its peer that depends on
// it. (validate.hpp checks a schedule under either send mode; the tests run every generator
// through both.) RECV only posts a receive (simulate.hpp). A compute order that can never run (a
// backward before its forward, a stage waiting for a micro-batch nobody computes) is an error
// naming the rank and the action that waits.
#pragma once

#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/parallel/pipeline/schedule.hpp"

namespace dtensor::parallel::pipeline {

namespace detail {

/// The message a computation sends to another rank, if any: SEND_F after a forward whose next
/// stage is elsewhere, SEND_B after a B or I whose previous stage is elsewhere.
inline std::optional<Action> message_after(const StageLayout& layout, const Action& action) {
  const int here = layout.rank_of(action.stage);
  if (action.kind == ActionKind::forward && action.stage + 1 < layout.stages() &&
      layout.rank_of(action.stage + 1) != here)
    return Action{action.stage, ActionKind::send_forward, action.microbatch};
  if (makes_input_gradient(action.kind) && action.stage > 0 && layout.rank_of(action.stage - 1) != here)
    return Action{action.stage, ActionKind::send_backward, action.microbatch};
  return std::nullopt;
}

/// The receive a computation's input comes through, if its producer lives on another rank:
/// RECV_F for a forward whose previous stage is elsewhere, RECV_B for a B or I whose next stage
/// is elsewhere (the receiving side of message_after).
inline std::optional<Action> received_input(const StageLayout& layout, const Action& action) {
  const int here = layout.rank_of(action.stage);
  if (action.kind == ActionKind::forward && action.stage > 0 && layout.rank_of(action.stage - 1) != here)
    return Action{action.stage, ActionKind::recv_forward, action.microbatch};
  if (makes_input_gradient(action.kind) && action.stage + 1 < layout.stages() &&
      layout.rank_of(action.stage + 1) != here)
    return Action{action.stage, ActionKind::recv_backward, action.microbatch};
  return std::nullopt;
}

/// What a computation on its own rank needs to have happened before it, in the order checked:
/// its forward (for B and I), its input-gradient step (for W), and its input (for F: the previous
/// stage's forward or its receive; for B and I: the next stage's backward or its receive). An
/// entry is a set of alternatives (B or I both give a gradient); empty when nothing is needed.
inline std::vector<std::vector<Action>> prerequisites(const StageLayout& layout, const Action& action) {
  const int stage = action.stage;
  const int mb = action.microbatch;
  std::vector<std::vector<Action>> needs;
  switch (action.kind) {
    case ActionKind::forward:
      if (const auto recv = received_input(layout, action)) needs.push_back({*recv});
      else if (stage > 0) needs.push_back({{stage - 1, ActionKind::forward, mb}});
      break;
    case ActionKind::backward:
    case ActionKind::backward_input:
      needs.push_back({{stage, ActionKind::forward, mb}});
      if (const auto recv = received_input(layout, action)) needs.push_back({*recv});
      else if (stage + 1 < layout.stages())
        needs.push_back({{stage + 1, ActionKind::backward, mb}, {stage + 1, ActionKind::backward_input, mb}});
      break;
    case ActionKind::backward_weight: needs.push_back({{stage, ActionKind::backward_input, mb}}); break;
    case ActionKind::send_forward: needs.push_back({{stage, ActionKind::forward, mb}}); break;
    case ActionKind::send_backward:
      needs.push_back({{stage, ActionKind::backward, mb}, {stage, ActionKind::backward_input, mb}});
      break;
    case ActionKind::recv_forward:
    case ActionKind::recv_backward: break;
  }
  return needs;
}

/// The first prerequisite of `action` that `done` lacks, or nothing when all are there.
inline std::optional<Action> first_missing(const StageLayout& layout, const Action& action, const std::set<Action>& done) {
  for (const auto& alternatives : prerequisites(layout, action)) {
    bool met = false;
    for (const Action& needed : alternatives) met = met || done.contains(needed);
    if (!met) return alternatives.front();
  }
  return std::nullopt;
}

}  // namespace detail

/// A schedule with the sends and receives that `compute` (per rank, computations only) needs.
inline Schedule add_send_recv(const StageLayout& layout, int microbatches, const std::vector<std::vector<Action>>& compute) {
  constexpr const char* op = "pipeline::add_send_recv";
  layout.check(op);
  if (int(compute.size()) != layout.ranks)
    throw Error(op, dtensor::detail::cat("got compute orders for ", compute.size(), " ranks, the layout has ", layout.ranks));
  for (int rank = 0; rank < layout.ranks; ++rank)
    for (const Action& action : compute[std::size_t(rank)]) {
      if (!is_compute(action.kind))
        throw Error(op, dtensor::detail::cat(to_string(action), " is a message; pass computations only"), rank);
      if (action.stage < 0 || action.stage >= layout.stages() || layout.rank_of(action.stage) != rank)
        throw Error(op, dtensor::detail::cat(to_string(action), ": stage ", action.stage, " is not held by this rank"), rank);
    }

  const auto ranks = std::size_t(layout.ranks);
  Schedule result{layout, microbatches, std::vector<std::vector<Action>>(ranks)};
  std::vector<std::size_t> next(ranks, 0);
  std::vector<std::set<Action>> done(ranks);  // computations run and receives usable, per rank
  for (;;) {
    bool finished = true, progress = false;
    std::vector<std::pair<std::size_t, Action>> arriving;  // usable from the next round on
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      if (next[rank] == compute[rank].size()) continue;
      finished = false;
      const Action& action = compute[rank][next[rank]];
      if (detail::first_missing(layout, action, done[rank])) continue;
      result.actions[rank].push_back(action);
      done[rank].insert(action);
      ++next[rank];
      progress = true;
      if (auto send = detail::message_after(layout, action)) {
        const Action recv = counterpart(*send);
        const auto peer = std::size_t(layout.rank_of(recv.stage));
        result.actions[rank].push_back(*send);
        result.actions[peer].push_back(recv);
        arriving.emplace_back(peer, recv);
      }
    }
    if (finished) return result;
    if (!progress) {
      std::string waits;
      for (std::size_t rank = 0; rank < ranks; ++rank) {
        if (next[rank] == compute[rank].size()) continue;
        const Action& action = compute[rank][next[rank]];
        waits += dtensor::detail::cat(waits.empty() ? "" : "; ", "rank ", rank, " step ", next[rank], " ",
                                      to_string(action), " waits for ",
                                      to_string(*detail::first_missing(layout, action, done[rank])));
      }
      throw Error(op, "the compute order can never run to the end: " + waits);
    }
    for (auto& [peer, recv] : arriving) done[peer].insert(recv);
  }
}

}  // namespace dtensor::parallel::pipeline
