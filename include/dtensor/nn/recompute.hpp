// dtensor/nn/recompute.hpp — which activations a transformer block recomputes in backward
// instead of keeping them from its forward (Megatron's --recompute-granularity/--recompute-modules).
//
//   auto r = nn::Recompute::parse("selective");        // Korthikanti's selective: the attention core
//   auto r = nn::Recompute::parse("norm,act");         // a list of modules
//   models::GPTConfig cfg{..., .recompute = r};            // every block (models/gpt.hpp)
//   block.set_recompute(r);                            // one nn::TransformerBlock
//
// full       the whole block: only its input is kept (nn::Checkpointed; GPTConfig::checkpoint).
// core_attn  the attention core (Korthikanti et al. 2022's selective recomputation): its output
//            and statistics are dropped and the core runs again from q, k, v in backward (its
//            collectives too under context parallelism). With fused attention there are no
//            s x s scores to save, so this keeps 2 s·b·h/t bytes less, not 5 a s² b/t.
// norm       the norms' outputs: the Linears after ln1 and ln2 keep nothing; the norm runs again
//            from its saved input in backward (2·2 s·b·h/t bytes under SP).
// act        the MLP's activation: GELU(h) (or SwiGLU's silu(gate)·up) is dropped and computed
//            again from h (8 s·b·h/t bytes for GELU at 4h).
// mlp        the whole feed-forward, dense or experts (Megatron's "mlp" / "moe"): only ln2's input
//            is kept; ln2 and the feed-forward run again in backward (an MoE's all-to-alls too).
// The bytes are per layer in bf16 with tensor + sequence parallelism of size t (docs/dry-run.md
// has the table, measured on the ledger). Recomputation issues the recomputed part's forward
// collectives again; the results are bit for bit those without it.
#pragma once

#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"

namespace dtensor::nn {

struct Recompute {
  bool full = false;       // the whole block (nn::Checkpointed)
  bool core_attn = false;  // attention's core (selective)
  bool norm = false;       // the norms' outputs
  bool act = false;        // the MLP activation
  bool mlp = false;        // the whole feed-forward (dense MLP or experts)

  /// Any per-module recomputation (what the block itself does; `full` is the wrapper's).
  bool modules() const noexcept { return core_attn || norm || act || mlp; }
  bool none() const noexcept { return !full && !modules(); }
  friend bool operator==(const Recompute&, const Recompute&) = default;

  /// "none", "full", "selective" (= core_attn, Korthikanti's), or a comma-separated list of
  /// core_attn, norm, act, mlp (Megatron's names accepted: layernorm, moe_act, moe, experts).
  static Recompute parse(std::string_view text) {
    Recompute r;
    if (text == "none") return r;
    if (text == "full") return r.full = true, r;
    if (text == "selective") return r.core_attn = true, r;
    if (text.empty()) throw Error("nn::Recompute::parse", "empty: expected none, full, selective or a list of " + names());
    while (!text.empty()) {
      const auto comma = text.find(',');
      const auto item = text.substr(0, comma);
      if (item == "full") r.full = true;
      else if (item == "core_attn") r.core_attn = true;
      else if (item == "norm" || item == "layernorm") r.norm = true;
      else if (item == "act" || item == "moe_act" || item == "mlp_act") r.act = true;
      else if (item == "mlp" || item == "moe" || item == "experts") r.mlp = true;
      else
        throw Error("nn::Recompute::parse", "unknown module \"" + std::string(item) + "\" in \"" + std::string(text) +
                                                "\": expected none, full, selective or a list of " + names());
      if (comma == std::string_view::npos) break;
      text.remove_prefix(comma + 1);
      if (text.empty()) throw Error("nn::Recompute::parse", "a trailing comma: expected a module after it");
    }
    return r;
  }

  /// The flag's spelling (parse(to_string()) == *this).
  std::string to_string() const {
    if (none()) return "none";
    std::string s;
    auto add = [&](bool on, const char* n) {
      if (on) s += (s.empty() ? "" : ","), s += n;
    };
    if (full && !modules()) return "full";
    if (core_attn && !full && !norm && !act && !mlp) return "selective";
    add(full, "full");
    add(core_attn, "core_attn");
    add(norm, "norm");
    add(act, "act");
    add(mlp, "mlp");
    return s;
  }

 private:
  static std::string names() { return "core_attn, norm, act, mlp (e.g. --recompute norm,act)"; }
};

}  // namespace dtensor::nn
