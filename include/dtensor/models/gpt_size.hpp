// dtensor/models/gpt_size.hpp — how many parameters a GPT config has, before building it: a
// program's memory check (every parameter's value, gradient and AdamW moments exist at least once
// over the ranks) fails at once for a model that cannot fit, instead of allocating for minutes.
//
//   const long double n = models::approx_parameter_count(cfg, /*experts=*/4, /*moe_every=*/1);
//
// The weight matrices and the embeddings (the norms' and biases' vectors, a fraction of a percent,
// are left out: a lower bound). In long double: a huge config's count does not overflow.
#pragma once

#include "dtensor/models/gpt.hpp"
#include "dtensor/nn/moe_blocks.hpp"

namespace dtensor::models {

/// The parameters of models::GPTConfig `cfg`: per block the attention's 4 dim x dim projections (GQA's
/// smaller KV ones counted whole; multi-head latent attention's five matrices, cfg.mla) and an MLP of 2 dim x ffn matrices (`experts` of them in every
/// `moe_every`-th block after the first `dense_first` when experts > 0), and the token and position tables.
inline long double approx_parameter_count(const models::GPTConfig& cfg, Extent experts = 0, Extent moe_every = 1,
                                          Extent dense_first = 0) {
  const long double d = (long double)cfg.dim, layers = (long double)cfg.layers;
  const long double ffn = cfg.ffn > 0 ? (long double)cfg.ffn : (long double)cfg.mlp_ratio * d;
  const long double moe_layers =
      experts > 0 ? (long double)nn::moe_block_count(cfg.layers, moe_every, dense_first) : 0.0L;
  const long double mlps = (layers - moe_layers) + moe_layers * (experts > 0 ? (long double)experts : 1.0L);
  const auto& m = cfg.mla;
  const long double heads = (long double)cfg.heads, qk = (long double)(m.qk_nope_head_dim + m.qk_rope_head_dim);
  const long double q =
      m.q_lora_rank > 0 ? d * (long double)m.q_lora_rank + (long double)m.q_lora_rank * heads * qk : d * heads * qk;
  const long double attention =
      m.enabled() ? q + d * (long double)(m.kv_lora_rank + m.qk_rope_head_dim) +
                        (long double)m.kv_lora_rank * heads * (long double)(m.qk_nope_head_dim + m.v_head_dim) +
                        heads * (long double)m.v_head_dim * d
                  : 4.0L * d * d;
  return layers * attention + mlps * 2.0L * d * ffn + ((long double)cfg.vocab + (long double)cfg.seq) * d;
}

}  // namespace dtensor::models
