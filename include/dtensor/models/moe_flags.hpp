// dtensor/models/moe_flags.hpp — a MoE model's command-line flags: --experts E (0: dense MLPs),
// --topk, --capacity, --shared-experts, --moe-every, --dense-first, group-limited routing (--expert-groups,
// --topk-groups) and the node-level dispatch (--ep-node-size); their rows of a flag table (train/flag_table.hpp), their
// checks against the mesh (--ep dividing the token ranks, a capacity CP can keep) and the
// models::MoELayersConfig they make (models/moe_gpt.hpp).
//
//   struct Options : train::cli::TrainerFlags, models::cli::MoEFlags { ... };
//   ... models::cli::moe_flag_rows<Options>() among the table's parts (train::cli::joined_rows) ...
//   models::cli::check_moe_flags(o, o, o.layers);   // after the parse: a UsageError naming the flags
#pragma once

#include <string>

#include "dtensor/models/moe_gpt.hpp"
#include "dtensor/nn/moe_blocks.hpp"
#include "dtensor/train/flag_table.hpp"
#include "dtensor/train/flags.hpp"

namespace dtensor::models::cli {

using namespace train::cli;

/// The flags' values (their meaning and defaults: moe_flag_rows).
struct MoEFlags {
  Extent experts = 0, topk = 2, moe_every = 1;  // 0 experts: dense MLPs
  Extent dense_first = 0;                       // the first blocks dense (DeepSeek-V3's first 3)
  Extent shared = 0;                            // shared experts (DeepSeek's)
  Extent groups = 1, topk_groups = 0;           // group-limited routing (nn/router.hpp); 0: no limit
  int ep_node_size = 0;                         // the node-level dispatch's "ep" ranks per node; 0: one stage
  double capacity = 0;                          // 0: dropless
  bool tuned = false;                           // a flag below --experts given
};

template <class O>
FlagTable<O> moe_flag_rows() {
  static_assert(std::is_base_of_v<MoEFlags, O>);
  using M = MoEFlags;
  return {
      {"--experts", "E",
       "E > 0: MoE blocks of E experts (default 0: dense MLPs), split over --ep ranks (dividing dp x fsdp x cp; any "
       "E: 5 over 2 is 3 + 2)",
       integer(&M::experts, 0)},
      {"--topk", "K", "--experts: top-K routing (default 2)", marking(integer(&M::topk, 1), &M::tuned)},
      {"--capacity", "F", "--experts: the capacity factor (default dropless; with --cp > 1 at least E / K)",
       marking(positive(&M::capacity), &M::tuned)},
      {"--shared-experts", "N",
       "--experts: N shared experts, one feed-forward of N x the experts' width every token passes (default 0)",
       marking(integer(&M::shared, 1), &M::tuned)},
      {"--moe-every", "N", "--experts: every N-th block a MoE block (default 1: all)",
       marking(integer(&M::moe_every, 1), &M::tuned)},
      {"--dense-first", "N", "--experts: the first N blocks dense, whatever --moe-every (default 0; DeepSeek-V3: 3)",
       marking(integer(&M::dense_first, 0), &M::tuned)},
      {"--expert-groups", "G",
       "--experts: G groups of E / G consecutive experts for --topk-groups (default 1; G = --ep: a group per "
       "expert rank)",
       marking(integer(&M::groups, 1), &M::tuned)},
      {"--topk-groups", "M",
       "--experts: each token routed within its M best --expert-groups (DeepSeek's node-limited routing; default: "
       "all groups)",
       marking(integer(&M::topk_groups, 1), &M::tuned)},
      {"--ep-node-size", "L",
       "--experts: the node-level dispatch (DeepSeek-V3's), the --ep ranks seen as nodes of L consecutive ones: a "
       "token crosses to another node once per node its choices reach, then is forwarded inside it (default 0: one "
       "row per token and expert rank over --ep)",
       marking(integer(&M::ep_node_size, 1), &M::tuned)},
  };
}

/// --experts over the mesh's --ep and the model's `layers`.
inline void check_moe_flags(const MoEFlags& o, const MeshFlags& mesh, Extent layers) {
  auto str = [](long long n) { return std::to_string(n); };
  if (o.experts == 0 && mesh.ep != 1) throw UsageError("--ep " + str(mesh.ep) + " needs --experts");
  // A MoE flag without experts would be ignored: the user meant a MoE model and trains a dense one.
  if (o.experts == 0 && o.tuned)
    throw UsageError(
        "--topk, --moe-every, --dense-first, --capacity, --shared-experts, --expert-groups, --topk-groups and "
        "--ep-node-size have no effect without --experts E");
  if (o.experts == 0) return;
  if (o.topk > o.experts) throw UsageError("--topk " + str(o.topk) + " exceeds --experts " + str(o.experts));
  if (o.experts % o.groups != 0)
    throw UsageError("--expert-groups " + str(o.groups) + " does not divide --experts " + str(o.experts));
  if (o.topk_groups > o.groups)
    throw UsageError("--topk-groups " + str(o.topk_groups) + " exceeds --expert-groups " + str(o.groups));
  if (o.topk_groups > 0 && o.topk > o.topk_groups * (o.experts / o.groups))
    throw UsageError("--topk " + str(o.topk) + " exceeds the " + str(o.topk_groups * (o.experts / o.groups)) +
                     " experts of --topk-groups " + str(o.topk_groups) + " groups of " + str(o.experts / o.groups));
  if (o.moe_every > layers)  // no block would be a MoE: a dense model under a MoE banner
    throw UsageError("--moe-every " + str(o.moe_every) + " exceeds --layers " + str(layers) +
                     ": no block would have experts");
  if (o.dense_first >= layers || nn::moe_block_count(layers, o.moe_every, o.dense_first) < 1)
    throw UsageError("--dense-first " + str(o.dense_first) + " with --moe-every " + str(o.moe_every) + " of --layers " +
                     str(layers) + ": no block would have experts");
  // The experts' ranks factor the ranks that split the tokens: data x context. Any --experts over
  // --ep: they split like an uneven Shard (5 over 2: 3 + 2; parallel/experts.hpp).
  const int token_ranks = mesh.dp * mesh.fsdp * mesh.cp;
  if (token_ranks % mesh.ep != 0)
    throw UsageError("--ep " + str(mesh.ep) +
                     " does not divide the token ranks --dp x --fsdp x --cp = " + str(token_ranks));
  if (o.ep_node_size > 0) {  // the node-level dispatch: nodes of L "ep" ranks, each owning an expert
    if (mesh.ep % o.ep_node_size != 0)
      throw UsageError("--ep-node-size " + str(o.ep_node_size) + " does not divide --ep " + str(mesh.ep));
    try {
      parallel::check_nodes_own_experts(o.experts, mesh.ep, o.ep_node_size);
    } catch (const Error& e) {
      throw UsageError("--ep-node-size " + str(o.ep_node_size) + ": " + e.what());
    }
  }
  // Under CP a capacity that can drop a choice is refused (nn/router.hpp): it is per whole sequence.
  if (mesh.cp > 1 && o.capacity > 0 && o.capacity * double(o.topk) / double(o.experts) < 1.0)
    throw UsageError(
        "--capacity with --cp > 1: capacity groups are whole sequences, split over the context ranks; "
        "use dropless routing (no --capacity) or a factor of at least --experts / --topk");
}

/// The MoE blocks of the flags (the router's z-loss 1e-3).
inline models::MoELayersConfig moe_layers_config(const MoEFlags& o) {
  models::MoELayersConfig mc;
  mc.router.experts = o.experts;
  mc.router.topk = o.topk;
  mc.router.z_loss_coeff = 1e-3;
  mc.router.groups = o.groups;
  mc.router.topk_groups = o.topk_groups;
  if (o.capacity > 0) mc.router.capacity_factor = o.capacity;
  mc.every = o.moe_every;
  mc.dense_first = o.dense_first;
  mc.shared = o.shared;
  mc.node_size = o.ep_node_size;
  return mc;
}

/// The stages' Layers policy of the flags: MoE blocks on the expert mesh over the stage's ranks
/// (--experts over --ep, moe_layers_config), or the dense ones (DenseLayers, LlamaLayers).
template <class Layers, class StageMesh>
Layers layers_of(const StageMesh& stage_mesh, const MeshFlags& mesh, const MoEFlags& moe) {
  if constexpr (requires { typename Layers::ExpertMesh; })
    return Layers(parallel::make_expert_mesh<typename Layers::ExpertMesh>(stage_mesh, mesh.ep), moe_layers_config(moe));
  else return Layers{};
}

}  // namespace dtensor::models::cli
