// dtensor/parallel/pipeline/generate.hpp — GPipe, 1F1B and interleaved 1F1B schedules.
//
//   auto s = pipeline::one_f_one_b(4, 8);           // 4 ranks, 8 micro-batches
//   auto t = pipeline::interleaved_1f1b(4, 8, 2);   // 2 stages per rank, round-robin
//
// Each generator decides the order of computation on every rank and lets add_send_recv
// (communication.hpp) place the messages. With p ranks and m micro-batches:
//   GPipe          all m forwards, then all m backwards: m activations held at the peak.
//   1F1B           rank r runs p - 1 - r forwards ahead (warm-up), then alternates one forward
//                  and one backward, then drains: at most p - r activations held.
//   interleaved    Narayanan et al. 2021 (Megatron-LM): v stages per rank, stage c * p + r on rank
//                  r; micro-batches go through the v local stages in groups of p, which divides
//                  the warm-up bubble by v. Needs m to be a multiple of p.
// The idle fraction these reach with equal stage costs: (p - 1) / (m + p - 1) for GPipe and 1F1B,
// (p - 1) / (v * m + p - 1) interleaved (simulate.hpp measures it).
#pragma once

#include <algorithm>
#include <vector>

#include "dtensor/parallel/pipeline/communication.hpp"

namespace dtensor::parallel::pipeline {

namespace detail {

inline void check_sizes(const char* op, int ranks, int microbatches) {
  if (ranks < 1) throw Error(op, dtensor::detail::cat("a pipeline needs at least one rank, got ", ranks));
  if (microbatches < 1) throw Error(op, dtensor::detail::cat("a schedule needs at least one micro-batch, got ", microbatches));
}

}  // namespace detail

/// The stages of `layout` run by one micro-batch: each rank's forwards in stage order, then its
/// backwards in reverse; `split_backward` (a zero-bubble schedule's stages): every input gradient
/// (I) first, then every weight gradient (W), the W held back behind the I as those schedules do.
/// The dry run's step (train::TrainerOptions::one_microbatch, models/training_plan.hpp): one
/// micro-batch of the plan's schedule, whose other micro-batches the planner counts from the
/// schedule (validate.hpp) rather than runs.
inline Schedule one_microbatch(const StageLayout& layout, bool split_backward) {
  std::vector<std::vector<Action>> compute(std::size_t(layout.ranks));
  for (int rank = 0; rank < layout.ranks; ++rank) {
    std::vector<int> stages = layout.stages_of(rank);
    std::sort(stages.begin(), stages.end());
    auto& order = compute[std::size_t(rank)];
    for (int s : stages) order.push_back({s, ActionKind::forward, 0});
    for (auto s = stages.rbegin(); s != stages.rend(); ++s)
      order.push_back({*s, split_backward ? ActionKind::backward_input : ActionKind::backward, 0});
    if (split_backward)
      for (auto s = stages.rbegin(); s != stages.rend(); ++s) order.push_back({*s, ActionKind::backward_weight, 0});
  }
  return add_send_recv(layout, 1, compute);
}

/// `schedule`'s stages run by one micro-batch (above), its backward split into I and W when the
/// schedule splits it.
inline Schedule one_microbatch(const Schedule& schedule) {
  bool split = false;
  for (const auto& list : schedule.actions)
    for (const Action& a : list) split = split || a.kind == ActionKind::backward_weight;
  return one_microbatch(schedule.layout, split);
}

/// GPipe: every rank runs all forwards, then all backwards, micro-batches in order.
inline Schedule gpipe(int ranks, int microbatches) {
  detail::check_sizes("pipeline::gpipe", ranks, microbatches);
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(ranks));
  for (int rank = 0; rank < ranks; ++rank) {
    auto& order = compute[std::size_t(rank)];
    for (int mb = 0; mb < microbatches; ++mb) order.push_back({rank, ActionKind::forward, mb});
    for (int mb = 0; mb < microbatches; ++mb) order.push_back({rank, ActionKind::backward, mb});
  }
  return add_send_recv(StageLayout::looped(ranks), microbatches, compute);
}

/// 1F1B (PipeDream-flush): warm-up forwards, one forward one backward, cool-down backwards.
inline Schedule one_f_one_b(int ranks, int microbatches) {
  detail::check_sizes("pipeline::one_f_one_b", ranks, microbatches);
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(ranks));
  for (int rank = 0; rank < ranks; ++rank) {
    auto& order = compute[std::size_t(rank)];
    const int warmup = std::min(ranks - 1 - rank, microbatches);
    int forwards = 0, backwards = 0;
    while (forwards < warmup) order.push_back({rank, ActionKind::forward, forwards++});
    while (forwards < microbatches) {
      order.push_back({rank, ActionKind::forward, forwards++});
      order.push_back({rank, ActionKind::backward, backwards++});
    }
    while (backwards < microbatches) order.push_back({rank, ActionKind::backward, backwards++});
  }
  return add_send_recv(StageLayout::looped(ranks), microbatches, compute);
}

/// Interleaved 1F1B with `stages_per_rank` (v) round-robin stages per rank. v = 1 is 1F1B.
inline Schedule interleaved_1f1b(int ranks, int microbatches, int stages_per_rank) {
  constexpr const char* op = "pipeline::interleaved_1f1b";
  detail::check_sizes(op, ranks, microbatches);
  if (stages_per_rank < 1)
    throw Error(op, dtensor::detail::cat("needs at least one stage per rank, got v = ", stages_per_rank));
  if (stages_per_rank == 1) return one_f_one_b(ranks, microbatches);
  if (microbatches % ranks != 0)
    throw Error(op, dtensor::detail::cat("micro-batches go through the stages in groups of the ", ranks,
                                         " ranks: m = ", microbatches, " must be a multiple of p = ", ranks,
                                         " (and at least p)"));
  const int chunks = stages_per_rank;
  const int virtual_steps = chunks * microbatches;  // forwards (and backwards) per rank
  // The k-th forward of a rank runs local chunk (k / p) % v on micro-batch (k / (p v)) p + k % p:
  // p micro-batches through chunk 0, the same p through chunk 1, ... The k-th backward walks the
  // chunks in the opposite order.
  auto microbatch_of = [&](int k) { return (k / (ranks * chunks)) * ranks + k % ranks; };
  auto chunk_of = [&](int k) { return (k / ranks) % chunks; };
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(ranks));
  for (int rank = 0; rank < ranks; ++rank) {
    auto forward = [&](int k) { return Action{chunk_of(k) * ranks + rank, ActionKind::forward, microbatch_of(k)}; };
    auto backward = [&](int k) {
      return Action{(chunks - 1 - chunk_of(k)) * ranks + rank, ActionKind::backward, microbatch_of(k)};
    };
    // Megatron's warm-up: enough forwards that the first backward of the last chunk finds its
    // gradient ready, two more per rank closer to the start of the pipeline.
    const int warmup = std::min((ranks - 1 - rank) * 2 + (chunks - 1) * ranks, virtual_steps);
    auto& order = compute[std::size_t(rank)];
    int forwards = 0, backwards = 0;
    while (forwards < warmup) order.push_back(forward(forwards++));
    while (forwards < virtual_steps) {
      order.push_back(forward(forwards++));
      order.push_back(backward(backwards++));
    }
    while (backwards < virtual_steps) order.push_back(backward(backwards++));
  }
  return add_send_recv(StageLayout::looped(ranks, chunks), microbatches, compute);
}

}  // namespace dtensor::parallel::pipeline
