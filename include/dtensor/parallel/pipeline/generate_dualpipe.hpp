// dtensor/parallel/pipeline/generate_dualpipe.hpp — DualPipeV (DeepSeek-V3's DualPipe cut in half,
// PyTorch's ScheduleDualPipeV): two stages per rank in the V shape, the steady state pairing the
// forward of one chunk with the full backward of the other.
//
//   auto s = pipeline::dual_pipe_v(4, 10);   // 4 ranks, 8 stages, 10 micro-batches (m >= 2p)
//
// Rank r holds stage r (on the way down the V, "chunk 0") and stage 2p - 1 - r (on the way up,
// "chunk 1"). Its compute order, in eight phases (the same as PyTorch's, so that its golden CSV
// dualpipev_4rank_10mb.csv reads back as this generator's order, tests/unit/test_pipeline_schedule.cpp):
//   1. 2 (p - 1 - r) forwards of chunk 0 (filling the way down);
//   2. r + 1 pairs F(chunk 0), F(chunk 1);
//   3. p - 1 - r times I(chunk 1), the oldest pending W, F(chunk 1): zero-bubble steps while the
//      first gradients come back;
//   4. m - 2p + r + 1 times the pair [F(chunk 0); B(chunk 1)] then [F(chunk 1); B(chunk 0)] —
//      PyTorch writes each bracket as one `(..;..)OVERLAP_F_B` cell (the forward of one
//      micro-batch overlapped with the backward of another); the last rank runs its first pair
//      as two plain actions;
//   5. p - 1 - r times B(chunk 1), [F(chunk 1); B(chunk 0)];
//   6. r + 1 pairs B(chunk 1), B(chunk 0), switching from full backwards to input-only ones
//      halfway (before the chunk-1 backward on odd ranks, after it on even ranks), so that the
//      weight gradients of the tail fill the drain;
//   7. p - 1 - r times the oldest pending W, then a backward of chunk 0 (I once switched);
//   8. the remaining r + 1 pending W's.
// Weight gradients are queued in the order of their I's and run oldest first, whichever chunk.
// The executor runs actions one after another, so an overlapped pair is its forward then its
// backward: the same dependencies, without the overlap (which needs two streams). Like PyTorch,
// it needs m >= 2p micro-batches (every phase above is then non-empty where it must be).
#pragma once

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "dtensor/parallel/pipeline/generate.hpp"

namespace dtensor::parallel::pipeline {

namespace detail {

/// One rank's DualPipeV compute order; counters per (stage, kind) as PyTorch keeps them. The
/// backwards of its overlapped pairs [F; B] are appended to `paired` when given.
inline std::vector<Action> dual_pipe_v_rank(int ranks, int microbatches, int rank,
                                            std::vector<Action>* paired = nullptr) {
  const int down = rank, up = 2 * ranks - 1 - rank;
  std::vector<Action> order;
  // next[stage slot][0: forward, 1: backward (B or I)]; a B counts as its I and its W at once.
  int forward_next[2] = {0, 0}, backward_next[2] = {0, 0};
  auto slot = [&](int stage) { return stage == down ? 0 : 1; };
  std::deque<std::pair<int, int>> pending_weights;  // (stage, micro-batch) of I's without their W yet
  auto forward = [&](int stage) { order.push_back({stage, ActionKind::forward, forward_next[slot(stage)]++}); };
  auto backward = [&](int stage, bool input_only) {
    const int mb = backward_next[slot(stage)]++;
    order.push_back({stage, input_only ? ActionKind::backward_input : ActionKind::backward, mb});
    if (input_only) pending_weights.emplace_back(stage, mb);
  };
  auto paired_backward = [&](int stage) {  // [F; B]: the forward just run, overlapped with this B
    backward(stage, false);
    if (paired != nullptr) paired->push_back(order.back());
  };
  auto oldest_weight = [&] {
    if (pending_weights.empty()) return;
    order.push_back({pending_weights.front().first, ActionKind::backward_weight, pending_weights.front().second});
    pending_weights.pop_front();
  };

  const int behind = ranks - 1 - rank;  // ranks after this one
  for (int i = 0; i < 2 * behind; ++i) forward(down);                        // 1
  for (int i = 0; i < rank + 1; ++i) forward(down), forward(up);             // 2
  for (int i = 0; i < behind; ++i) backward(up, true), oldest_weight(), forward(up);  // 3
  const int steady = microbatches - 2 * ranks + rank + 1;                    // 4
  for (int i = 0; i < steady; ++i) {
    forward(down);
    if (i == 0 && behind == 0) backward(up, false);  // the last rank's first pair: two plain actions
    else paired_backward(up);
    forward(up), paired_backward(down);
  }
  for (int i = 0; i < behind; ++i) backward(up, false), forward(up), paired_backward(down);  // 5
  bool input_only = false;                                                   // 6
  const int drain = rank + 1;
  for (int i = 0; i < drain; ++i) {
    if (i == drain / 2 && rank % 2 == 1) input_only = true;
    backward(up, input_only);
    if (i == drain / 2 && rank % 2 == 0) input_only = true;
    backward(down, input_only);
  }
  for (int i = 0; i < behind; ++i) oldest_weight(), backward(down, input_only);  // 7
  while (!pending_weights.empty()) oldest_weight();                              // 8
  return order;
}

inline void check_dual_pipe_v(const char* op, int ranks, int microbatches) {
  check_sizes(op, ranks, microbatches);
  if (microbatches < 2 * ranks)
    throw Error(
        op, dtensor::detail::cat("DualPipeV needs at least as many micro-batches as stages: m = ", microbatches,
                                 " < 2p = ", 2 * ranks, " (", ranks, " ranks, 2 stages each; PyTorch refuses it too)"));
}

}  // namespace detail

/// DualPipeV on `ranks` ranks (2 stages each, V shape) over `microbatches` >= 2 * ranks.
inline Schedule dual_pipe_v(int ranks, int microbatches) {
  detail::check_dual_pipe_v("pipeline::dual_pipe_v", ranks, microbatches);
  std::vector<std::vector<Action>> compute;
  for (int rank = 0; rank < ranks; ++rank) compute.push_back(detail::dual_pipe_v_rank(ranks, microbatches, rank));
  return add_send_recv(StageLayout::v_shape(ranks), microbatches, compute);
}

/// The backwards DualPipeV runs overlapped with the forward just before them (the [F; B] pairs,
/// PyTorch's OVERLAP_F_B cells), every rank's, sorted: what pipeline::simulate overlaps.
inline std::vector<Action> dual_pipe_v_overlapped(int ranks, int microbatches) {
  detail::check_dual_pipe_v("pipeline::dual_pipe_v_overlapped", ranks, microbatches);
  std::vector<Action> paired;
  for (int rank = 0; rank < ranks; ++rank) (void)detail::dual_pipe_v_rank(ranks, microbatches, rank, &paired);
  std::sort(paired.begin(), paired.end());
  return paired;
}

}  // namespace dtensor::parallel::pipeline
