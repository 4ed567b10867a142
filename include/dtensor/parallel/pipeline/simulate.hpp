// dtensor/parallel/pipeline/simulate.hpp — runs a schedule on paper: when each action starts and
// ends, how long each rank idles, and whether the ranks get stuck.
//
//   auto t = pipeline::simulate(pipeline::one_f_one_b(4, 8), {.forward = 1, .backward_input = 1,
//                                                             .backward_weight = 1});
//   t.idle_fraction(0);   // (p - 1) / (m + p - 1) = 3 / 11
//
// Every rank runs its actions in order, with the meaning PyTorch's pipelining runtime gives them.
// A RECV posts a receive and never blocks; the computation that uses the received value waits
// until it has arrived, i.e. until its SEND ran. With asynchronous sends a SEND completes at
// once; with blocking sends it waits until the peer has posted the matching RECV. A computation
// takes its cost (a full backward B costs I + W; the backward of an overlapped pair, DualPipeV's,
// less the pair's saving: Costs) and starts when its rank is free and its received input is
// there; everything it needs from its own rank comes earlier in its list (validate.hpp checks
// that). Messages take no time. When no rank can move and some have actions left, the schedule
// deadlocks; `deadlock` lists each stuck rank's next action and the action of another rank it
// waits for.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "dtensor/parallel/pipeline/communication.hpp"

namespace dtensor::parallel::pipeline {

enum class SendMode { blocking, asynchronous };

/// Time units per computation of one micro-batch on one stage.
///
/// Overlapped pairs (DualPipeV's [F; B], PyTorch's OVERLAP_F_B cells: simulate's `overlapped`):
/// `forward_hideable` and `backward_hideable` are the parts of a forward's and a full backward's
/// cost that can run behind the other micro-batch's compute when a rank runs them as a pair
/// (DeepSeek-V3 hides its expert all-to-alls so). Each backward of a pair takes `pair_saving()`
/// less: the pair's two communications each hide behind the other half's compute. With zeros
/// (the default) nothing changes. The saving is charged to the backward, so the forward's output
/// leaves at the forward's end as without the overlap (a slight optimism for its successor).
struct Costs {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
  double forward_hideable = 0;   // of forward
  double backward_hideable = 0;  // of backward_input + backward_weight

  /// How much shorter a forward and a full backward take when run as an overlapped pair.
  double pair_saving() const {
    const double backward = backward_input + backward_weight;
    return std::min(forward_hideable, std::max(0.0, backward - backward_hideable)) +
           std::min(backward_hideable, std::max(0.0, forward - forward_hideable));
  }

  double of(ActionKind kind) const {
    switch (kind) {
      case ActionKind::forward: return forward;
      case ActionKind::backward: return backward_input + backward_weight;
      case ActionKind::backward_input: return backward_input;
      case ActionKind::backward_weight: return backward_weight;
      default: return 0;  // messages are free
    }
  }
};

struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

/// A rank that cannot go on: its next action and the action of rank `peer` it waits for (the
/// SEND of its input, or, for a blocking SEND, the RECV that must be posted).
struct Blocked {
  int rank = 0;
  std::size_t step = 0;
  Action action;
  int peer = 0;
  Action waits_for;
};

struct Timeline {
  std::vector<std::vector<TimedAction>> actions;  // per rank, what ran, in order
  std::vector<Blocked> deadlock;                  // empty when every rank ran to the end
  double makespan = 0;                            // when the last action ends

  /// Time rank `rank` spent computing.
  double busy(int rank) const {
    double total = 0;
    for (const TimedAction& timed : actions.at(std::size_t(rank)))
      if (is_compute(timed.action.kind)) total += timed.end - timed.start;
    return total;
  }
  /// The share of the makespan rank `rank` spent not computing (its bubble).
  double idle_fraction(int rank) const { return makespan > 0 ? 1 - busy(rank) / makespan : 0; }
  /// The mean idle fraction over the ranks: the schedule's bubble.
  double bubble() const {
    if (actions.empty()) return 0;
    double total = 0;
    for (int rank = 0; rank < int(actions.size()); ++rank) total += idle_fraction(rank);
    return total / double(actions.size());
  }
};

/// How many of rank `rank`'s actions are in `overlapped` (sorted): its overlapped pairs.
inline int overlapped_pairs(const Schedule& schedule, int rank, const std::vector<Action>& overlapped) {
  const auto& list = schedule.actions.at(std::size_t(rank));
  return int(std::count_if(list.begin(), list.end(), [&](const Action& a) {
    return std::binary_search(overlapped.begin(), overlapped.end(), a);
  }));
}

/// The schedule with costs per rank (`per_rank[r]` for every stage rank r holds): uneven stages,
/// a first stage with the embedding, a last with the head. `overlapped` (sorted): the backwards
/// that run as an overlapped pair with the forward before them (dual_pipe_v_overlapped), each
/// Costs::pair_saving shorter.
namespace detail {
/// An action's hash (its stage, kind and micro-batch): the simulation's tables of the sends that
/// ran and the receives posted, looked up once or twice per action (a tree was a third of a
/// 64-rank interleaved pipeline's simulation: the published rows' fits simulate it hundreds of times).
struct ActionHash {
  std::size_t operator()(const Action& a) const noexcept {
    const std::uint64_t key = (std::uint64_t(std::uint32_t(a.stage)) << 32) ^
                              (std::uint64_t(std::uint32_t(a.microbatch)) << 8) ^ std::uint64_t(a.kind);
    return std::hash<std::uint64_t>{}(key * 0x9E3779B97F4A7C15ull);
  }
};
}  // namespace detail

inline Timeline simulate(const Schedule& schedule, const std::vector<Costs>& per_rank,
                         SendMode mode = SendMode::asynchronous, const std::vector<Action>& overlapped = {}) {
  constexpr const char* op = "pipeline::simulate";
  schedule.layout.check(op);
  if (!std::is_sorted(overlapped.begin(), overlapped.end()))
    throw Error(op, "the overlapped backwards must be sorted (pipeline::dual_pipe_v_overlapped gives them so)");
  const auto ranks = std::size_t(schedule.ranks());
  if (per_rank.size() != ranks)
    throw Error(op, dtensor::detail::cat(per_rank.size(), " cost entries for a schedule of ", ranks, " ranks"));
  if (schedule.actions.size() != ranks)
    throw Error(op, dtensor::detail::cat("the schedule has action lists for ", schedule.actions.size(),
                                         " ranks, its layout ", ranks));
  Timeline timeline;
  timeline.actions.resize(ranks);
  std::vector<std::size_t> next(ranks, 0);
  std::vector<double> clock(ranks, 0);
  std::unordered_map<Action, double, detail::ActionHash> sent;    // sends that ran, and when their data left
  std::unordered_map<Action, double, detail::ActionHash> posted;  // receives posted, and when
  std::size_t total = 0;
  for (const auto& list : schedule.actions) total += list.size();
  sent.reserve(total / 2), posted.reserve(total / 2);

  auto head = [&](std::size_t rank) -> const Action* {
    const auto& list = schedule.actions[rank];
    return next[rank] < list.size() ? &list[next[rank]] : nullptr;
  };
  auto run = [&](std::size_t rank, double start, double end) {
    timeline.actions[rank].push_back({*head(rank), start, end});
    clock[rank] = end;
    ++next[rank];
  };
  // The action `action` waits for on another rank, if it cannot run yet; its start time if it can.
  auto ready = [&](std::size_t rank, const Action& action, double& start) -> std::optional<Action> {
    start = clock[rank];
    if (is_compute(action.kind)) {
      for (const auto& alternatives : detail::prerequisites(schedule.layout, action)) {
        if (alternatives.size() != 1 || !is_recv(alternatives.front().kind)) continue;
        const Action send = counterpart(alternatives.front());
        auto arrived = sent.find(send);
        if (arrived == sent.end()) return send;
        start = std::max(start, arrived->second);
      }
      return std::nullopt;
    }
    if (action.kind == ActionKind::send_forward || action.kind == ActionKind::send_backward) {
      if (mode == SendMode::asynchronous) return std::nullopt;
      const Action recv = counterpart(action);
      auto post = posted.find(recv);
      if (post == posted.end()) return recv;
      start = std::max(start, post->second);
    }
    return std::nullopt;  // posting a receive never waits
  };
  // What each blocked rank waits for (the send or receive `ready` named): until it has run, the
  // rank cannot move, so the sweeps below test that one entry instead of asking `ready` again
  // (which lists the action's prerequisites anew each time).
  std::vector<std::optional<Action>> awaiting(ranks);
  auto step = [&](std::size_t rank) {
    const Action* action = head(rank);
    if (action == nullptr) return false;
    if (const auto& w = awaiting[rank]) {
      if (is_send(w->kind) ? !sent.contains(*w) : !posted.contains(*w)) return false;
      awaiting[rank].reset();
    }
    double start = 0;
    if ((awaiting[rank] = ready(rank, *action, start))) return false;
    double duration = per_rank[rank].of(action->kind);
    if (std::binary_search(overlapped.begin(), overlapped.end(), *action)) duration -= per_rank[rank].pair_saving();
    const double end = start + duration;
    if (is_send(action->kind)) sent.emplace(*action, end);
    if (is_recv(action->kind)) posted.emplace(*action, end);
    run(rank, start, end);
    return true;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t rank = 0; rank < ranks; ++rank)
      while (step(rank)) progress = true;
  }
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    for (const TimedAction& timed : timeline.actions[rank]) timeline.makespan = std::max(timeline.makespan, timed.end);
    if (const Action* stuck = head(rank)) {
      double unused = 0;
      const Action awaited = *ready(rank, *stuck, unused);
      timeline.deadlock.push_back({int(rank), next[rank], *stuck, schedule.layout.rank_of(awaited.stage), awaited});
    }
  }
  return timeline;
}

/// Every rank at the same costs.
inline Timeline simulate(const Schedule& schedule, const Costs& costs = {}, SendMode mode = SendMode::asynchronous,
                         const std::vector<Action>& overlapped = {}) {
  return simulate(schedule, std::vector<Costs>(std::size_t(std::max(schedule.ranks(), 0)), costs), mode, overlapped);
}

}  // namespace dtensor::parallel::pipeline
