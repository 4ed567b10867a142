// dtensor/models/llama.hpp — a Llama-style language model: models::GPT with the LlamaLayers policy.
//
//   models::GPTConfig cfg{.vocab = 96, .seq = 64, .dim = 128, .heads = 8, .layers = 2,
//                     .kv_heads = 2, .ffn = 344, .rope_theta = 500000};
//   models::Llama<float, Mesh> model(mesh, cfg);                              // no tensor parallelism
//   models::Llama<float, Mesh, parallel::MegatronPlan<true>> tp(mesh, cfg);   // TP + SP (parallel/gpt_plan.hpp)
//   auto [loss, saved] = model.forward(ids, targets);  model.backward(std::move(saved));   // as models::GPT
//
// Architecture (Llama 2/3): token embedding, no position table; pre-norm blocks
// h = x + attn(rms1(x)), y = h + swiglu(rms2(h)) with RMSNorm (nn/norm.hpp), grouped-query
// attention with rotary positions (nn/attention.hpp: cfg.kv_heads KV heads, cfg.rope_theta; 0
// means Llama 3's 500000) and the SwiGLU feed-forward of width cfg.ffn (nn/swiglu.hpp; 0:
// mlp_ratio * dim); final RMSNorm; LM head; no biases anywhere (cfg.bias is not read). The
// norms' epsilon is cfg.norm_eps.
//
// Everything else is models::GPT's: the parameter units ("embed" holds wte alone), the unit hooks
// that DDP and FSDP use, activation checkpointing, the parts a pipeline stage is cut from
// (pipeline::split of models::GptParts<T, Mesh, Plan, Id, models::LlamaLayers>), context parallelism
// (the rotary positions are nn::positions, the original indices under load balancing), and the
// plans: MegatronPlan<SP> splits the fused qkv and w13 column-wise and the out projection and w2
// row-wise, so its collectives are GPT's (parallel::megatron_tp_collectives); it needs
// kv_heads % tp == 0 and ffn % tp == 0 (clear errors otherwise). Initialisation as GPT's: every
// weight N(0, 0.02), the blocks' output projections (attention out, w2) N(0, 0.02 / sqrt(2 L)),
// norms 1, drawn whole from cfg.seed, so every plan and mesh starts from the same parameters.
#pragma once

#include <string>
#include <utility>

#include "dtensor/models/gpt.hpp"
#include "dtensor/nn/gqa_or_mla.hpp"
#include "dtensor/nn/swiglu.hpp"

namespace dtensor::models {

/// models::GPT's Layers policy for Llama blocks (see the top of this file).
struct LlamaLayers : DenseLayers {
  static constexpr double default_rope_theta = 500000.0;  // Llama 3
  static constexpr bool learned_positions = false;
  static constexpr nn::ExpertFfn expert_ffn = nn::ExpertFfn::swiglu;  // models::LlamaMoE's experts
  template <class T, class Mesh, class P>
  using norm = nn::RMSNorm<T, Mesh, P>;
  /// Grouped-query or (cfg.mla.kv_lora_rank > 0) multi-head latent attention, the plan's
  /// projections (qkv's style for MLA's q_b_proj and kv_b_proj, proj's for o_proj), the mesh's core.
  template <class T, class Mesh, class Plan>
  using attention = nn::GqaOrMla<T, Mesh, typename Plan::qkv, typename Plan::proj, parallel::attention_core_for<Mesh>>;
  template <class T, class Mesh, class Plan>
  using block = nn::TransformerBlock<T, Mesh, Plan, nn::SwiGLU<T, Mesh, typename Plan::fc1, typename Plan::fc2>,
                                     norm<T, Mesh, typename Plan::between>, attention<T, Mesh, Plan>>;

  /// Llama's blocks: no biases, rotary positions with Llama 3's base unless one is given.
  static nn::BlockConfig block_config(nn::BlockConfig c) {
    c.bias = false;
    if (c.rope_theta == 0) c.rope_theta = default_rope_theta;
    return c;
  }
  template <class Block, class Mesh>
  Block make_block(Extent /*layer*/, std::string name, const Mesh& mesh, const nn::BlockConfig& c,
                   std::uint64_t seed) const {
    return Block(std::move(name), mesh, block_config(c), seed);
  }
};

/// A Llama-style model (models::GPT with the LlamaLayers policy).
template <kernels::host::FloatElement T, MeshType Mesh, class Plan = nn::ReplicatedPlan, class Id = std::int32_t>
using Llama = GPT<T, Mesh, Plan, Id, LlamaLayers>;

}  // namespace dtensor::models

// The names these models had before models/ became their namespace (nn::GPT and so on): kept,
// so that code written against them compiles as before.
namespace dtensor::nn {
using models::Llama;
using models::LlamaLayers;
}  // namespace dtensor::nn
