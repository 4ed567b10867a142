// dtensor/sim/serving.hpp — what a rank holds to serve a model (models::generate with its KV
// cache) under tensor and pipeline parallelism: weights and KV cache for batch x context.
//
//   sim::ModelShape m{.layers = 80, .dim = 8192, .heads = 64, .kv_heads = 8, .ffn = 28672, .vocab = 128256,
//                     .seq = 8192, .llama = true};
//   auto s = sim::serving_memory(m, {.batch = 8, .context = 8192, .tp = 8, .pp = 2, .bytes = 2});
//   s.weights; s.kv_cache; s.kv_per_token; s.total;   // bytes on the busiest rank
//   plan_at_scale --arch llama ... --tp 8 --pp 2 --serve 8,8192 --dtype bf16   // prints it
//
// Per rank of the busiest pipeline stage (the first ceil(layers / pp) blocks, the embedding on
// the first stage and the final norm and head on the last: with pp = 1 one rank has all):
//   weights   = the blocks' matrices / tp (Megatron's column/row split: qkv, proj, fc1/w13, fc2/w2)
//               + the column-wise biases / tp (qkv, fc1) + the row-wise biases and norms whole
//               + the embedding's and head's vocab x dim / tp (vocab-parallel) + the position
//               table and final norm whole (tp dividing vocab, heads and ffn: exact);
//   KV cache  = 2 (keys, values) x blocks on the stage x kv_heads / tp x head_dim x bytes per
//               token (nn::SelfAttention::KvCache: rotated keys and values of the KV heads, not
//               repeated; kv_heads % tp == 0 as the model requires), times batch x context.
// Activations of a decode step (one position) are O(batch x dim) and not counted; the prefill's
// are a forward's (the training dry run's forward peak). test_llama checks weights and KV cache
// against a real nn::GPT / nn::Llama under TP 2: its local parameters and its caches after a
// generation.
#pragma once

#include <algorithm>
#include <cstdint>

#include "dtensor/core/error.hpp"
#include "dtensor/sim/analytic.hpp"

namespace dtensor::sim {

struct ServingShape {
  std::int64_t batch = 1;    // sequences decoded together
  std::int64_t context = 1;  // positions cached per sequence (prompt + generated, at most the model's seq)
  int tp = 1, pp = 1;
  double bytes = 2;          // per element of weights and cache (bf16: 2, f32: 4)
};

struct ServingMemory {
  double weights = 0;       // on the busiest rank
  double kv_per_token = 0;  // one position of one sequence, this rank's layers and heads
  double kv_cache = 0;      // kv_per_token x batch x context
  double total = 0;         // weights + kv_cache
  std::int64_t layers = 0;  // blocks on the busiest stage
};

inline ServingMemory serving_memory(const ModelShape& m, const ServingShape& s) {
  constexpr const char* op = "sim::serving_memory";
  if (s.tp < 1 || s.pp < 1 || s.batch < 1 || s.context < 1 || s.bytes <= 0)
    throw Error(op, dtensor::detail::cat("tp ", s.tp, ", pp ", s.pp, ", batch ", s.batch, ", context ", s.context,
                                         ", bytes ", s.bytes, ": all must be positive"));
  if (m.kv() % s.tp != 0 || m.layers < s.pp)
    throw Error(op, dtensor::detail::cat(m.kv(), " KV heads over tp ", s.tp, " (must divide), ", m.layers,
                                         " layers over pp ", s.pp, " (at least one each)"));
  if (s.context > m.seq)
    throw Error(op, dtensor::detail::cat("context ", s.context, " is beyond the model's ", m.seq, " positions"));
  const double h = double(m.dim), kvd = double(m.kv() * m.head_dim()), f = double(m.width()), v = double(m.vocab);
  const double matrices = m.llama ? h * (h + 2 * kvd) + h * h + 3 * h * f : h * (h + 2 * kvd) + h * h + 2 * h * f;
  // Column-wise biases split with their rows (qkv, fc1); row-wise biases and norms whole.
  const double vectors = m.llama ? 2 * h : (h + 2 * kvd + f) / s.tp + 6 * h;
  ServingMemory r;
  r.layers = (m.layers + s.pp - 1) / s.pp;
  const double embed = v * h / s.tp + (m.llama ? 0 : double(m.seq) * h);
  const double head = v * h / s.tp + (m.llama ? h : 2 * h);
  const double ends = s.pp == 1 ? embed + head : std::max(embed, head);
  r.weights = (double(r.layers) * (matrices / s.tp + vectors) + ends) * s.bytes;
  r.kv_per_token = 2.0 * double(r.layers) * (kvd / s.tp) * s.bytes;
  r.kv_cache = r.kv_per_token * double(s.batch) * double(s.context);
  r.total = r.weights + r.kv_cache;
  return r;
}

}  // namespace dtensor::sim
