// dtensor/models/mla_flags.hpp — the command-line flags of DeepSeek's multi-head latent attention
// in the Llama blocks (nn/latent_attention.hpp): --kv-lora-rank N (> 0: MLA), --q-lora-rank,
// --qk-nope-dim, --qk-rope-dim, --v-head-dim; their rows of a flag table (train/flag_table.hpp),
// their checks and the nn::LatentAttentionConfig they make.
//
//   struct Options : train::cli::TrainerFlags, models::cli::MlaFlags { ... };
//   ... models::cli::mla_flag_rows<Options>() among the table's parts ...
//   models::cli::check_mla_flags(o, o.arch, o.kv_heads, o.generate > 0);   // after the parse: a UsageError
//   cfg.mla = models::cli::latent_attention_config(o);
#pragma once

#include <string>

#include "dtensor/nn/attention.hpp"
#include "dtensor/train/flag_table.hpp"
#include "dtensor/train/flags.hpp"

namespace dtensor::models::cli {

using namespace train::cli;

/// The flags' values (their meaning: mla_flag_rows); kv_lora_rank 0: no MLA.
struct MlaFlags {
  Extent q_lora_rank = 0, kv_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
};

template <class O>
FlagTable<O> mla_flag_rows() {
  static_assert(std::is_base_of_v<MlaFlags, O>);
  using M = MlaFlags;
  return {
      {"--kv-lora-rank", "N",
       "--arch llama: N > 0 makes attention DeepSeek's multi-head latent attention (MLA) with keys and values from "
       "an N-wide latent (DeepSeek-V3: 512); needs --qk-nope-dim, --qk-rope-dim and --v-head-dim",
       integer(&M::kv_lora_rank, 1)},
      {"--q-lora-rank", "N",
       "--kv-lora-rank: the queries' latent width (default 0: no query latent; DeepSeek-V3: 1536)",
       integer(&M::q_lora_rank, 1)},
      {"--qk-nope-dim", "N", "--kv-lora-rank: each head's query/key features without rotary positions (V3: 128)",
       integer(&M::qk_nope_dim, 1)},
      {"--qk-rope-dim", "N", "--kv-lora-rank: each head's rotary query/key features, even (V3: 64)",
       integer(&M::qk_rope_dim, 1)},
      {"--v-head-dim", "N", "--kv-lora-rank: each head's value features (V3: 128)", integer(&M::v_head_dim, 1)},
  };
}

/// The MLA flags against --arch, --kv-heads and --generate: a UsageError naming what is wrong.
inline void check_mla_flags(const MlaFlags& o, const std::string& arch, Extent kv_heads, bool generate = false) {
  auto str = [](long long n) { return std::to_string(n); };
  const bool shape_given = o.q_lora_rank > 0 || o.qk_nope_dim > 0 || o.qk_rope_dim > 0 || o.v_head_dim > 0;
  if (o.kv_lora_rank == 0) {
    if (shape_given)
      throw UsageError("--q-lora-rank, --qk-nope-dim, --qk-rope-dim and --v-head-dim need --kv-lora-rank (MLA)");
    return;
  }
  if (arch != "llama") throw UsageError("--kv-lora-rank (multi-head latent attention) needs --arch llama");
  if (o.qk_nope_dim == 0 || o.qk_rope_dim == 0 || o.v_head_dim == 0)
    throw UsageError("--kv-lora-rank " + str(o.kv_lora_rank) +
                     " needs --qk-nope-dim, --qk-rope-dim and --v-head-dim (each head's features)");
  if (o.qk_rope_dim % 2 != 0)
    throw UsageError("--qk-rope-dim " + str(o.qk_rope_dim) + " must be even (rotary positions turn feature pairs)");
  if (kv_heads != 0)
    throw UsageError("--kv-heads with --kv-lora-rank: multi-head latent attention has a key and value per head");
  // MLA's KV cache is the whole-sequence one; a trainer's stage meshes have a context dimension,
  // whose core keeps a split cache that MLA does not have yet (nn/latent_attention.hpp).
  if (generate)
    throw UsageError(
        "--generate with --kv-lora-rank: multi-head latent attention has no KV cache on the trainer's "
        "meshes (a context dimension) yet");
}

/// The attention shape of the flags (kv_lora_rank 0: none).
inline nn::LatentAttentionConfig latent_attention_config(const MlaFlags& o) {
  return {.q_lora_rank = o.q_lora_rank,
          .kv_lora_rank = o.kv_lora_rank,
          .qk_nope_head_dim = o.qk_nope_dim,
          .qk_rope_head_dim = o.qk_rope_dim,
          .v_head_dim = o.v_head_dim};
}

/// The run header's words for the blocks' attention (after the model's sizes): "; llama, MLA (...)",
/// "; llama (kv heads N)", or nothing for GPT's blocks.
inline std::string attention_words(const MlaFlags& o, const std::string& arch, Extent heads, Extent kv_heads) {
  if (arch == "gpt") return {};
  auto str = [](long long n) { return std::to_string(n); };
  if (o.kv_lora_rank > 0)
    return "; " + arch + ", MLA (q latent " + str(o.q_lora_rank) + ", kv latent " + str(o.kv_lora_rank) +
           ", head: " + str(o.qk_nope_dim) + " + " + str(o.qk_rope_dim) + " rotary, v " + str(o.v_head_dim) + ")";
  return "; " + arch + " (kv heads " + str(kv_heads ? kv_heads : heads) + ")";
}

}  // namespace dtensor::models::cli
