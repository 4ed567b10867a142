// dtensor/parallel/gpt_plan.hpp — Megatron's tensor (and sequence) parallel plan for a transformer: the
// blocks of models::GPT, models::Llama and models::ViT, and any model built of nn::TransformerBlock.
//
//   models::GPT<float, DeviceMesh<"dp", "tp">, parallel::MegatronPlan<false>> tp(mesh, cfg);   // TP
//   models::GPT<float, DeviceMesh<"dp", "tp">, parallel::MegatronPlan<true>>  sp(mesh, cfg);   // TP + SP
//
// On the tensor dimension ("tp" below; any name with that role): qkv and fc1 column-wise (heads
// and hidden features split), the attention output projection and fc2 row-wise, the token
// embedding vocabulary-parallel, the LM head column-wise (logits split on the vocabulary) and the
// loss vocabulary-parallel (never gathering the logits). Without SP the residual stream [B, T, C]
// is Replicate there; with SP it is SeqSplit (the sequence) and the norms, residual adds and
// position embedding run on this rank's positions.
//
// Collectives per training step, with L blocks (each on the "tp" group unless said):
//                        forward                      backward
//   token embedding      AR (SP: RS)                  -   (SP: AG)
//   per block            2 AR (SP: 2 AG + 2 RS)       2 AR (SP: 4 AG + 2 RS)
//   LM head entry        -   (SP: AG)                 AR  (SP: AG + RS)
//   loss                 3 AR of one double per position   -
//   after backward       SP: sequence_parallel_grads, one AR per bucket (norms, row-wise biases, wpe)
//                        DataParallel: one AR on "dp" per bucket
//   clip_grad_norm       one AR of one double over "dp*tp"
// That is 4L + 5 all-reduces on "tp" without SP; 6L + 3 all-gathers, 4L + 2 reduce-scatters and
// 3 all-reduces (+ the SP buckets) with it. Under SP the column-wise Linears (qkv, fc1, LM head)
// save their input's sequence shard and gather it again in backward for the weight gradient
// (Megatron's trade: t times less saved input, one all-gather more each: nn/linear.hpp). Reporting the global loss (full_tensor) is one more
// all-reduce on "dp". Activation checkpointing repeats a block's forward collectives in backward.
#pragma once

#include "dtensor/parallel/tensor_parallel.hpp"
#include "dtensor/parallel/vocab_parallel.hpp"

namespace dtensor::parallel {

template <bool SP = false>
struct MegatronPlan {
  static constexpr std::string_view name = SP ? "megatron-tp-sp" : "megatron-tp";
  static constexpr bool sequence_parallel = SP;
  using between = between_regions<SP>;
  using qkv = ColwiseParallel<between>;
  using proj = RowwiseParallel<between>;
  using fc1 = ColwiseParallel<between>;
  using fc2 = RowwiseParallel<between>;
  using head = ColwiseParallel<between>;
  using wte = VocabParallel<between>;
  template <class T, class Mesh, class LogitsL>
  using loss = VocabParallelCrossEntropy<T, Mesh>;
};

/// Collectives one training step of models::GPT<_, _, MegatronPlan<SP>> issues in forward and
/// backward on "tp" (what the table above says), for tests and the trainer's summary.
struct TpCollectives {
  std::size_t all_reduce = 0, all_gather = 0, reduce_scatter = 0;
};
constexpr TpCollectives megatron_tp_collectives(bool sp, std::size_t layers) {
  if (sp) return {3, 6 * layers + 3, 4 * layers + 2};
  return {4 * layers + 5, 0, 0};
}

}  // namespace dtensor::parallel
