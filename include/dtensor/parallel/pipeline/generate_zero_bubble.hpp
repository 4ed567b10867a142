// dtensor/parallel/pipeline/generate_zero_bubble.hpp — zero-bubble schedules (Qi et al. 2023):
// the backward split into I (gradient of the input, on the critical path) and W (gradient of the
// weights, needed only by the optimizer), and W's moved into what would be idle time.
//
//   auto h1 = pipeline::zero_bubble_h1(4, 8);  // one stage per rank, 1F1B's activation memory
//   auto v = pipeline::zero_bubble_v(4, 8);    // V shape: rank r holds stages r and 2p - 1 - r
//
// ZB-H1: rank r runs 1F1B's warm-up plus one forward (p - r forwards), then repeats: the input
// gradient of the oldest micro-batch, a weight gradient, the next forward. The first p - 1 - r
// weight gradients are put off to the end, where the later ranks of 1F1B would idle while
// gradients travel back to rank 0. With F = I = W the idle time per rank falls from 1F1B's
// 3 (p - 1) units to p - 1 units, a third, with the same p - r activations held (plus at most
// p - r pending W contexts, which are smaller).
// ZB-V: two stages per rank in a V, so the last stage sits on rank 0 next to the first; the
// forward warm-up fills the V, then each rank alternates F, I, W on its two stages. With
// F = I = W and m >= 2p it is nearly bubble free.
#pragma once

#include <algorithm>
#include <vector>

#include "dtensor/parallel/pipeline/generate.hpp"

namespace dtensor::parallel::pipeline {

/// ZB-H1 with one stage per rank.
inline Schedule zero_bubble_h1(int ranks, int microbatches) {
  detail::check_sizes("pipeline::zero_bubble_h1", ranks, microbatches);
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(ranks));
  for (int rank = 0; rank < ranks; ++rank) {
    auto& order = compute[std::size_t(rank)];
    const int warmup = std::min(ranks - rank, microbatches);
    const int postponed = rank;
    int forwards = 0, inputs = 0, weights = 0;
    while (forwards < warmup) order.push_back({rank, ActionKind::forward, forwards++});
    while (inputs < microbatches) {
      order.push_back({rank, ActionKind::backward_input, inputs++});
      if (inputs > postponed && weights < inputs) order.push_back({rank, ActionKind::backward_weight, weights++});
      if (forwards < microbatches) order.push_back({rank, ActionKind::forward, forwards++});
    }
    while (weights < microbatches) order.push_back({rank, ActionKind::backward_weight, weights++});
  }
  return add_send_recv(StageLayout::looped(ranks), microbatches, compute);
}

/// ZB-V: two stages per rank in the V shape.
inline Schedule zero_bubble_v(int ranks, int microbatches) {
  detail::check_sizes("pipeline::zero_bubble_v", ranks, microbatches);
  const StageLayout layout = StageLayout::v_shape(ranks);
  // The phases below assume at least 2p - 1 micro-batches; with fewer, the order is made for
  // 2p - 1 and the actions of micro-batches that do not exist are dropped, which keeps every
  // dependency of the others.
  const int planned = std::max(microbatches, 2 * ranks - 1);
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(ranks));
  for (int rank = 0; rank < ranks; ++rank) {
    const int down = rank;                  // first chunk: stage r, on the way down the V
    const int up = 2 * ranks - 1 - rank;    // second chunk: stage 2p - 1 - r, on the way up
    int forward_down = 0, forward_up = 0, input_down = 0, input_up = 0, weight_down = 0, weight_up = 0;
    std::vector<Action> order;
    auto add = [&](int stage, ActionKind kind, int& counter) { order.push_back({stage, kind, counter++}); };
    // Warm-up: fill the way down, then alternate so that the way up starts as soon as it can.
    for (int i = 0; i < 2 * (ranks - rank) - 1; ++i) add(down, ActionKind::forward, forward_down);
    for (int i = 0; i < rank; ++i) {
      add(up, ActionKind::forward, forward_up);
      add(down, ActionKind::forward, forward_down);
    }
    for (int i = 0; i < ranks - rank; ++i) {
      add(up, ActionKind::forward, forward_up);
      add(up, ActionKind::backward_input, input_up);
      add(up, ActionKind::backward_weight, weight_up);
    }
    // Steady state: F, I, W on each chunk in turn.
    while (forward_up < forward_down || forward_down < planned) {
      if (forward_down < planned) add(down, ActionKind::forward, forward_down);
      add(down, ActionKind::backward_input, input_down);
      add(down, ActionKind::backward_weight, weight_down);
      add(up, ActionKind::forward, forward_up);
      add(up, ActionKind::backward_input, input_up);
      add(up, ActionKind::backward_weight, weight_up);
    }
    // Cool-down: the remaining input gradients first (they are on the critical path), the weight
    // gradients in the time they leave.
    for (int i = 0; i < rank; ++i) {
      add(down, ActionKind::backward_input, input_down);
      add(up, ActionKind::backward_input, input_up);
    }
    for (int i = 0; i < ranks - rank; ++i) {
      add(down, ActionKind::backward_input, input_down);
      add(down, ActionKind::backward_weight, weight_down);
    }
    while (weight_up < input_up) add(up, ActionKind::backward_weight, weight_up);
    while (weight_down < input_down) add(down, ActionKind::backward_weight, weight_down);
    for (const Action& action : order)
      if (action.microbatch < microbatches) compute[std::size_t(rank)].push_back(action);
  }
  return add_send_recv(layout, microbatches, compute);
}

}  // namespace dtensor::parallel::pipeline
