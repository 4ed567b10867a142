// dtensor/parallel/pipeline/validate.hpp — checks a schedule before anything runs it, and counts
// the activations it keeps.
//
//   auto report = pipeline::validate(schedule);                  // throws on the first broken rule
//   report.peak_saved[0];                                        // activations rank 0 holds at most
//   auto result = pipeline::inspect(schedule, {.sends = SendMode::asynchronous});
//   if (result.violation) std::cout << result.violation->message;
//
// The rules, checked in this order, each action in rank order then step order:
//   action    the micro-batch is in [0, m); the stage exists and is held by this rank; a message
//             goes to another rank (SEND_F not from the last stage, RECV_F not on stage 0, ...).
//   once      each computation and message appears at most once; a (stage, micro-batch) has
//             either a full backward B or an I and a W, not both.
//   order     on its rank an action comes after what it needs: B and I after their F; W after
//             its I; F after its input (the previous stage's F on the same rank, or its RECV_F);
//             B and I after their output gradient (the next stage's B/I on the same rank, or
//             RECV_B); a send after the computation whose result it sends.
//   complete  every (stage, micro-batch) has its F and its backward (B, or I and W).
//   matching  every receive has its send on the peer rank and every send its receive.
//   deadlock  the ranks, running their lists with blocking or asynchronous sends, all reach the
//             end (simulate.hpp).
// A violation names the rule, the rank, the step (the position in that rank's list) and the
// action. The memory report counts, after each step of each rank, the activations saved by
// forwards whose input gradient (B or I) has not run, and the weight-gradient contexts saved by
// I's whose W has not run; and their peaks per rank.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/parallel/pipeline/communication.hpp"
#include "dtensor/parallel/pipeline/simulate.hpp"

namespace dtensor::parallel::pipeline {

struct ValidateOptions {
  SendMode sends = SendMode::blocking;
};

struct Violation {
  std::string rule;     // "action", "once", "order", "complete", "matching" or "deadlock"
  int rank = -1;        // -1 when the rule is about the schedule as a whole
  std::ptrdiff_t step = -1;  // position in the rank's list; -1 when the action is missing
  std::string action;   // the action at fault, in PyTorch's notation
  std::string message;  // all of the above in words
};

struct MemoryReport {
  std::vector<std::vector<int>> saved;           // [rank][step]: activations held after the step
  std::vector<std::vector<int>> weight_pending;  // [rank][step]: I's whose W has not run
  std::vector<int> peak_saved;
  std::vector<int> peak_weight_pending;
};

struct Inspection {
  std::optional<Violation> violation;
  MemoryReport memory;  // filled whether or not a rule is broken
};

namespace detail {

inline Violation violation_at(std::string rule, int rank, std::ptrdiff_t step, const Action& action, const std::string& what) {
  std::string text = to_string(action);
  std::string message = dtensor::detail::cat("rule '", rule, "' broken by ", text, " on rank ", rank);
  if (step >= 0) message += dtensor::detail::cat(" at step ", step);
  message += ": " + what;
  return {std::move(rule), rank, step, std::move(text), std::move(message)};
}

inline MemoryReport count_memory(const Schedule& schedule) {
  MemoryReport report;
  for (const auto& list : schedule.actions) {
    auto& saved = report.saved.emplace_back();
    auto& pending = report.weight_pending.emplace_back();
    int held = 0, contexts = 0, peak_held = 0, peak_contexts = 0;
    for (const Action& action : list) {
      if (action.kind == ActionKind::forward) ++held;
      if (makes_input_gradient(action.kind)) --held;
      if (action.kind == ActionKind::backward_input) ++contexts;
      if (action.kind == ActionKind::backward_weight) --contexts;
      saved.push_back(held);
      pending.push_back(contexts);
      peak_held = std::max(peak_held, held);
      peak_contexts = std::max(peak_contexts, contexts);
    }
    report.peak_saved.push_back(peak_held);
    report.peak_weight_pending.push_back(peak_contexts);
  }
  return report;
}

/// Rule 'action': what can be said of one action alone.
inline std::optional<std::string> malformed(const Schedule& schedule, int rank, const Action& action) {
  const StageLayout& layout = schedule.layout;
  if (action.microbatch < 0 || action.microbatch >= schedule.microbatches)
    return dtensor::detail::cat("micro-batch ", action.microbatch, " is not in [0, ", schedule.microbatches, ")");
  if (action.stage < 0 || action.stage >= layout.stages())
    return dtensor::detail::cat("stage ", action.stage, " is not in [0, ", layout.stages(), ")");
  if (layout.rank_of(action.stage) != rank)
    return dtensor::detail::cat("stage ", action.stage, " is held by rank ", layout.rank_of(action.stage));
  if (is_compute(action.kind)) return std::nullopt;
  const Action other_half = counterpart(action);
  if (other_half.stage < 0 || other_half.stage >= layout.stages())
    return dtensor::detail::cat("there is no stage ", other_half.stage, " to ",
                                is_send(action.kind) ? "receive this message" : "send this message");
  if (layout.rank_of(other_half.stage) == rank)
    return dtensor::detail::cat("stage ", other_half.stage, " is on the same rank: it hands over locally, with no message");
  return std::nullopt;
}

/// Rule 'order': words for a prerequisite that has not run yet.
inline std::string missing_words(const Action& action, const Action& needed) {
  const std::string text = to_string(needed);
  if (needed.kind == ActionKind::forward && action.kind != ActionKind::forward)
    return "it runs before its forward " + text;
  if (action.kind == ActionKind::backward_weight) return "the weight gradient runs before its input gradient " + text;
  if (is_send(action.kind)) return "it sends before " + text + " has computed what it sends";
  if (is_recv(needed.kind)) return "its input has not arrived: " + text + " must come first";
  return "it needs " + text + " first";
}

inline std::optional<Violation> first_violation(const Schedule& schedule, SendMode sends) {
  const StageLayout& layout = schedule.layout;
  // Rules 'action', 'once', 'order', one action at a time.
  std::set<Action> seen_anywhere;
  for (int rank = 0; rank < layout.ranks; ++rank) {
    std::set<Action> done;
    const auto& list = schedule.actions[std::size_t(rank)];
    for (std::size_t step = 0; step < list.size(); ++step) {
      const Action& action = list[step];
      const auto at = std::ptrdiff_t(step);
      if (auto what = malformed(schedule, rank, action)) return violation_at("action", rank, at, action, *what);
      if (seen_anywhere.contains(action)) return violation_at("once", rank, at, action, "it appears a second time");
      const Action full{action.stage, ActionKind::backward, action.microbatch};
      const Action input{action.stage, ActionKind::backward_input, action.microbatch};
      if (action.kind == ActionKind::backward_input && seen_anywhere.contains(full))
        return violation_at("once", rank, at, action, "the full backward " + to_string(full) + " already ran");
      if (action.kind == ActionKind::backward && seen_anywhere.contains(input))
        return violation_at("once", rank, at, action, "it is split into " + to_string(input) + " and a W already");
      if (action.kind == ActionKind::backward_weight && seen_anywhere.contains(full))
        return violation_at("once", rank, at, action, "the full backward " + to_string(full) + " already computed the weight gradient");
      if (auto needed = first_missing(layout, action, done))
        return violation_at("order", rank, at, action, missing_words(action, *needed));
      seen_anywhere.insert(action);
      done.insert(action);
    }
  }
  // Rule 'complete': each (stage, micro-batch) forward and backward.
  for (int stage = 0; stage < layout.stages(); ++stage)
    for (int mb = 0; mb < schedule.microbatches; ++mb) {
      const int rank = layout.rank_of(stage);
      auto missing = [&](ActionKind kind, const std::string& what) {
        const Action action{stage, kind, mb};
        return violation_at("complete", rank, -1, action, "the schedule never runs it" + what);
      };
      if (!seen_anywhere.contains({stage, ActionKind::forward, mb})) return missing(ActionKind::forward, "");
      const bool full = seen_anywhere.contains({stage, ActionKind::backward, mb});
      const bool input = seen_anywhere.contains({stage, ActionKind::backward_input, mb});
      const bool weight = seen_anywhere.contains({stage, ActionKind::backward_weight, mb});
      if (!full && !input) return missing(ActionKind::backward, " (nor its I and W)");
      if (input && !weight) return missing(ActionKind::backward_weight, " after its I");
    }
  // Rule 'matching': both halves of every message.
  for (int rank = 0; rank < layout.ranks; ++rank) {
    const auto& list = schedule.actions[std::size_t(rank)];
    for (std::size_t step = 0; step < list.size(); ++step) {
      const Action& action = list[step];
      if (is_compute(action.kind)) continue;
      const Action other_half = counterpart(action);
      if (!seen_anywhere.contains(other_half))
        return violation_at("matching", rank, std::ptrdiff_t(step), action,
                            dtensor::detail::cat(is_recv(action.kind) ? "no matching send " : "no matching receive ",
                                                 to_string(other_half), " on rank ", layout.rank_of(other_half.stage)));
    }
  }
  // Rule 'deadlock'.
  const Timeline timeline = simulate(schedule, Costs{}, sends);
  if (!timeline.deadlock.empty()) {
    std::string waits;
    for (const Blocked& blocked : timeline.deadlock)
      waits += dtensor::detail::cat(waits.empty() ? "" : "; ", "rank ", blocked.rank, " step ", blocked.step, " ",
                                    to_string(blocked.action), " waits for rank ", blocked.peer, " to ",
                                    is_recv(blocked.waits_for.kind) ? "post " : "run ", to_string(blocked.waits_for));
    const Blocked& first = timeline.deadlock.front();
    return violation_at("deadlock", first.rank, std::ptrdiff_t(first.step), first.action,
                        dtensor::detail::cat("no rank can go on with ",
                                             sends == SendMode::blocking ? "blocking" : "asynchronous", " sends: ", waits));
  }
  return std::nullopt;
}

}  // namespace detail

/// Checks every rule and counts memory; never throws for a broken rule (see `violation`).
inline Inspection inspect(const Schedule& schedule, const ValidateOptions& options = {}) {
  constexpr const char* op = "pipeline::validate";
  schedule.layout.check(op);
  if (schedule.microbatches < 1)
    throw Error(op, dtensor::detail::cat("a schedule needs at least one micro-batch, got ", schedule.microbatches));
  if (int(schedule.actions.size()) != schedule.ranks())
    throw Error(op, dtensor::detail::cat("the schedule has action lists for ", schedule.actions.size(),
                                         " ranks, its layout ", schedule.ranks()));
  return {detail::first_violation(schedule, options.sends), detail::count_memory(schedule)};
}

/// The memory report of a valid schedule; the first broken rule is a dtensor::Error.
inline MemoryReport validate(const Schedule& schedule, const ValidateOptions& options = {}) {
  Inspection result = inspect(schedule, options);
  if (result.violation) throw Error("pipeline::validate", result.violation->message, result.violation->rank);
  return std::move(result.memory);
}

}  // namespace dtensor::parallel::pipeline
