// dtensor/models/gpt_config.hpp — a GPT's configuration as the key/value pairs a checkpoint
// stores and compares on resume.
//
//   models::config_of(cfg)      // {"dim": "16", "heads": "4", "layers": "2", ...}
//
// Only what decides the parameters' names and extents and their values' meaning is listed
// (not activation checkpointing, which changes neither): resuming with any of them different
// is an error (checkpoint/load.hpp).
#pragma once

#include <map>
#include <string>

#include "dtensor/models/gpt.hpp"

namespace dtensor::models {

inline std::map<std::string, std::string> config_of(const GPTConfig& c) {
  std::map<std::string, std::string> out{
      {"model", "gpt"},
      {"vocab", std::to_string(c.vocab)},
      {"seq", std::to_string(c.seq)},
      {"dim", std::to_string(c.dim)},
      {"heads", std::to_string(c.heads)},
      {"layers", std::to_string(c.layers)},
      {"mlp_ratio", std::to_string(c.mlp_ratio)},
      {"kv_heads", std::to_string(c.kv_heads)},  // grouped-query attention (models::Llama)
      {"ffn", std::to_string(c.ffn)},
      {"seed", std::to_string(c.seed)}};
  if (c.mla.enabled()) {  // multi-head latent attention (models::Llama): its parameters' extents
    out["q_lora_rank"] = std::to_string(c.mla.q_lora_rank);
    out["kv_lora_rank"] = std::to_string(c.mla.kv_lora_rank);
    out["qk_nope_head_dim"] = std::to_string(c.mla.qk_nope_head_dim);
    out["qk_rope_head_dim"] = std::to_string(c.mla.qk_rope_head_dim);
    out["v_head_dim"] = std::to_string(c.mla.v_head_dim);
  }
  return out;
}

}  // namespace dtensor::models

namespace dtensor::checkpoint {
using models::config_of;  // its name before models/ became a namespace
}  // namespace dtensor::checkpoint
