// examples/plan_auto.hpp — `train_gpt --plan auto --ranks N`: the fastest plan the trainer can run
// on N ranks for its model, chosen as `plan_at_scale --search` chooses (the analytic estimate,
// sim/analytic.hpp, then its best dry-run and ranked by the dry run's step:
// examples/plan_rescore.hpp via plan_auto_dry.cpp; docs/dry-run.md), printed with why, then trained.
//
//   examples::PlanModel m{.layers = 4, .heads = 4, .dim = 64, .seq = 32, .batch = 16};
//   auto choice = examples::choose_plan(m, 8, dtensor::sim::device("h100"));
//   choice.mesh;     // MeshFlags: pp, dp, fsdp, cp, tp, ep, zero, sp, schedule, microbatches
//   choice.report;   // the chosen plan and the runners-up, each with why it lost to the first
//
// Enumerated (sim::search_space with SearchSpace::exhaustive): every factorization ranks = pp x
// data x cp x tp with tp dividing the heads (and a Llama's KV heads), cp splitting the sequence
// in 2 cp load-balanced chunks as a ring, an all-gather of KV, or Ulysses (the heads a multiple
// of tp x cp), pp at most the layers; the data ranks either DDP (--dp) or ZeRO-1/2/3 (--fsdp),
// or HSDP (ZeRO over --fsdp shards, --dp replicas); micro-batches M dividing the batch with each
// micro-batch split evenly over the data ranks; 1F1B, interleaved (2 stages per rank, as the
// trainer runs it) where M is a multiple of pp, ZB-H1 (M >= pp), ZB-V and DualPipeV (M >= 2 pp);
// SP whenever tp > 1; with --experts, ep: any up to the experts dividing data x cp (unless --ep
// is given); recomputation none, selective, act, core_attn,norm,act, core_attn,norm,mlp or full
// (MoE: none, selective or full) unless --checkpoint or --recompute is given. Kept as given:
// --dtype, and --kv-lora-rank's MLA shape (charged by the estimate as the dry run builds it).
// The times are those of the device the estimate is for (H100 unless --plan-device;
// --plan-device-field NAME=VALUE sets one of its fields, sim/device.hpp), not of this machine's
// threads: the choice is what the plan would be on that hardware.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/models/mla_flags.hpp"
#include "dtensor/nn/recompute.hpp"
#include "dtensor/sim/search.hpp"
#include "flag_table.hpp"
#include "flags.hpp"

namespace examples {

/// The trainer's model and step, as the choice needs them.
struct PlanModel {
  std::int64_t layers = 1, heads = 1, kv_heads = 0, dim = 1, ffn = 0, vocab = 256, seq = 2, batch = 1;
  bool llama = false, bf16 = false, checkpoint = false;
  bool fp8 = false;                    // --dtype fp8: the bf16 model with FP8 Linear GEMMs (bf16 true too)
  dtensor::nn::Recompute recompute{};  // --recompute; with --checkpoint: kept as given, else chosen
  std::int64_t experts = 0, topk = 2, moe_every = 1;  // --experts E > 0: MoE blocks (GPT)
  std::int64_t dense_first = 0;                       // --dense-first
  std::int64_t shared = 0;                            // --shared-experts
  std::int64_t groups = 1, topk_groups = 0;           // --expert-groups, --topk-groups (0: no limit)
  double capacity = 0;                                 // --capacity (0: dropless)
  int ep = 0;  // --ep given: kept; 0: chosen (any ep up to the experts dividing the token ranks)
  int ep_node_size = 0;  // --ep-node-size L: the node-level dispatch, nodes of gcd(ep, L) (sim::SearchSpace)
  dtensor::nn::LatentAttentionConfig mla{};  // --kv-lora-rank and its shape flags (models/mla_flags.hpp)
};

struct PlanChoice {
  MeshFlags mesh;
  dtensor::nn::Recompute recompute;  // what the blocks recompute (full: --checkpoint)
  dtensor::sim::RankedPlan best;
  std::size_t considered = 0, fitting = 0, dry_run = 0;
  double dry_step = 0;  // the chosen plan's step in the dry run
  std::string report;   // printed by rank 0 before training
};

/// The dry run's verdict on one of the analytic best (examples/plan_auto_dry.cpp).
struct DryRanked {
  std::size_t analytic_rank = 0;  // index into the analytic ranking
  double step = 0, memory = 0;
  bool fits = false;
  std::string error;  // the dry run refused the plan (its checks), ranked last
};

/// The first `finalists` of `ranked` dry-run (the real step on meta space) and ordered as
/// plan_at_scale --search orders them (examples/plan_rescore.hpp). Defined in plan_auto_dry.cpp:
/// host code only (the CUDA trainer links its object; nvcc never compiles the dry run).
std::vector<DryRanked> dry_rank(const PlanModel& m, const std::vector<dtensor::sim::RankedPlan>& ranked,
                                std::size_t finalists, const dtensor::sim::Hardware& hw);

/// How many of the analytic best --plan auto dry-runs (plan_at_scale --search's default too).
inline constexpr std::size_t plan_auto_finalists = 12;

/// The trainer's flags for an analytic plan (data ranks on --dp under DDP, on --fsdp under ZeRO,
/// split --dp replicas x --fsdp shards under HSDP).
inline MeshFlags mesh_of(const dtensor::sim::PlanShape& p) {
  MeshFlags f;
  f.pp = p.pp, f.cp = p.cp, f.tp = p.tp, f.ep = p.ep;
  f.dp = p.zero == 0 ? p.dp : p.hsdp;
  f.fsdp = p.zero == 0 ? 1 : p.dp / p.hsdp;
  f.zero = p.zero == 0 ? 1 : p.zero;  // the trainer's ZeRO-1 on one fsdp rank is DDP
  f.sp = p.tp > 1;
  f.cp_kind = dtensor::nn::parse_context_kind(p.cp_kind);
  f.schedule = p.schedule;
  f.microbatches = p.microbatches();
  return f;
}

inline std::string flags_of(const MeshFlags& f, const dtensor::nn::Recompute& rc = {}) {
  std::ostringstream s;
  s << "--pp " << f.pp << " --dp " << f.dp << " --fsdp " << f.fsdp << " --cp " << f.cp << " --tp " << f.tp;
  if (f.fsdp > 1) s << " --zero " << f.zero;
  if (f.cp > 1) s << " --cp-kind " << dtensor::nn::name_of(f.cp_kind);
  s << (f.sp ? " --sp" : " --no-sp") << " --schedule " << f.schedule << " --microbatches " << f.microbatches;
  if (f.ep > 1) s << " --ep " << f.ep;
  if (!rc.none()) s << " --recompute " << rc.to_string();
  return s.str();
}

/// The fastest plan for `ranks` (see the synopsis): sim::search_space over every factorization
/// (the space plan_at_scale --search enumerates up to sim::exhaustive_gpus GPUs), its
/// `finalists` best dry-run and ranked by the dry run's step. Throws dtensor::Error naming the
/// model, the ranks and the device when no plan is valid or none fits.
inline PlanChoice choose_plan(const PlanModel& m, int ranks, const dtensor::sim::Hardware& hw, std::size_t runners_up = 3,
                              std::size_t finalists = plan_auto_finalists) {
  namespace sim = dtensor::sim;
  constexpr const char* op = "train_gpt --plan auto";
  if (ranks < 1) throw dtensor::Error(op, examples::cat("--ranks ", ranks, ": need >= 1"));
  const sim::ModelShape shape = sim::with_mla(sim::ModelShape{.layers = m.layers,
                                                              .dim = m.dim,
                                                              .heads = m.heads,
                                                              .kv_heads = m.kv_heads,
                                                              .ffn = m.ffn,
                                                              .vocab = m.vocab,
                                                              .seq = m.seq,
                                                              .llama = m.llama,
                                                              .experts = m.experts,
                                                              .topk = m.topk,
                                                              .moe_every = m.moe_every,
                                                              .shared_experts = m.experts > 0 ? m.shared : 0,
                                                              .expert_groups = m.groups,
                                                              .topk_groups = m.topk_groups,
                                                              .dense_first = m.experts > 0 ? m.dense_first : 0},
                                              m.mla);
  sim::SearchSpace space{.gpus = ranks,
                         .batch = m.batch,
                         .bf16 = m.bf16,
                         .exhaustive = true,
                         .ep = m.ep,
                         .ep_node_size = m.ep_node_size,
                         .fp8 = m.fp8};
  // Recomputation: as given (--checkpoint, --recompute), else each of the search's choices.
  if (m.checkpoint || !m.recompute.none()) {
    space.recompute = m.recompute;
    if (m.checkpoint) space.recompute->full = true;
  }
  PlanChoice out;
  const auto result = sim::search_space(shape, space, hw);
  out.considered = result.considered;
  const auto& ranked = result.ranked;
  if (out.considered == 0)
    throw dtensor::Error(op, examples::cat("no plan for ", ranks, " ranks: --heads ", m.heads, ", --seq ", m.seq,
                                                  ", --layers ", m.layers, ", --batch ", m.batch, ", --ep ", m.ep,
                                                  " admit no factorization pp x data x cp x tp"));
  if (ranked.empty())
    throw dtensor::Error(op, examples::cat("none of the ", out.considered, " plans for ", ranks, " ranks fits ",
                                                  hw.name, " memory (", hw.memory_bytes / 1e9,
                                                  " GB less the reserve): a smaller model or more ranks"));
  out.fitting = ranked.size();
  // The analytic best re-ranked by the dry run, as plan_at_scale --search ranks them.
  const auto dry = dry_rank(m, ranked, finalists, hw);
  out.dry_run = dry.size();
  const bool dry_ran = !dry.empty() && dry.front().error.empty();  // else the analytic ranking decides
  const std::size_t first = dry_ran ? dry.front().analytic_rank : 0;
  out.best = ranked[first];
  out.dry_step = dry_ran ? dry.front().step : out.best.estimate.step_seconds;
  out.mesh = mesh_of(out.best.plan);
  out.recompute = out.best.plan.recomputes();
  std::ostringstream s;
  s.precision(4);
  s << "plan auto: " << out.fitting << " of " << out.considered << " plans for " << ranks << " ranks fit " << hw.name
    << " (ranked by the dry run's step of the " << out.dry_run
    << " analytic best, as plan_at_scale --search; docs/dry-run.md); the fastest:\n  "
    << flags_of(out.mesh, out.recompute) << "  (" << sim::describe(out.best.plan) << "): step " << out.dry_step
    << " s on " << hw.name << " (analytic " << out.best.estimate.step_seconds << " s, #" << first + 1 << "), memory "
    << (dry_ran ? dry.front().memory : out.best.estimate.memory_bytes) / 1e9 << " GB\n";
  for (std::size_t i = 1; i < dry.size() && i <= runners_up; ++i) {
    const auto& r = ranked[dry[i].analytic_rank];
    s << "  #" << i + 1 << " " << flags_of(mesh_of(r.plan), r.plan.recomputes()) << ": ";
    if (!dry[i].error.empty()) s << "not dry-run (" << dry[i].error << ")\n";
    else
      s << "+" << dry[i].step - out.dry_step << " s in the dry run" << (dry[i].fits ? "" : ", does not fit")
        << "; analytic " << sim::why_slower(r, out.best) << "\n";
  }
  out.report = s.str();
  return out;
}

/// --plan auto's flags (plan_report: what rank 0 prints about the choice).
struct PlanFlags {
  std::string plan, plan_device = "h100", plan_report;
  std::vector<std::string> plan_device_fields;  // --plan-device-field NAME=VALUE, in order
  int plan_ranks = 0;
};

/// Their rows of train_gpt's flag table, after a heading.
template <class O>
FlagTable<O> plan_auto_rows() {
  using P = PlanFlags;
  return {
      {"", "",
       "--plan auto (examples/plan_auto.hpp, docs/dry-run.md): the mesh flags (not given) and the recomputation "
       "(unless --checkpoint/--recompute) chosen for N ranks by the dry run's cost model for the device, printed "
       "with why, then trained:"},
      {"--plan", "auto", "choose the plan", text(&P::plan)},
      {"--ranks", "N", "the ranks to plan for", integer(&P::plan_ranks, 1, dtensor::threads::max_ranks)},
      {"--plan-device", "h100|h100-500w|h200|a100", "the device the cost model's times are for (default h100)",
       text(&P::plan_device)},
      {"--plan-device-field", "NAME=VALUE", "one of the device's fields (sim/device.hpp); repeatable",
       append(&P::plan_device_fields)},
  };
}

/// train_gpt's --plan auto: when o.plan is "auto", replaces o's mesh flags by the choice for
/// --ranks (else the MPI launcher's world size) and keeps the report for rank 0 to print.
/// `given`: the flags the command line gave; auto chooses the mesh flags (all but --ep, kept
/// when given), so the first other one given is an error.
template <class Options>
void apply_plan_auto(Options& o, const std::vector<std::string>& given) {
  std::string mesh_flag;
  for (const auto& a : given)
    if (a != "--ep" && mesh_flag.empty() && is_mesh_flag<Options>(a)) mesh_flag = a;
  const bool ep_given = std::find(given.begin(), given.end(), "--ep") != given.end();
  if (o.plan.empty()) {
    if (o.plan_ranks != 0) throw UsageError("--ranks is for --plan auto (otherwise the mesh flags give the ranks)");
    if (!o.plan_device_fields.empty()) throw UsageError("--plan-device-field is for --plan auto");
    return;
  }
  if (o.plan != "auto") throw UsageError("--plan is auto (the only plan it chooses), got '" + o.plan + "'");
  if (!mesh_flag.empty())
    throw UsageError("--plan auto chooses the mesh flags itself, drop " + mesh_flag + " (or --plan auto)");
  int ranks = o.plan_ranks;
  if (ranks == 0 && o.backend == "mpi")  // the launcher's world size, before MPI starts
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"})
      if (const char* v = std::getenv(var); v != nullptr && ranks == 0) ranks = examples::mesh_flag(var, v);
  if (ranks == 0) throw UsageError("--plan auto needs --ranks N: the ranks (threads) to plan for");
  dtensor::sim::Hardware hw;
  try {
    hw = dtensor::sim::device(o.plan_device);
  } catch (const dtensor::Error& e) {
    throw UsageError(std::string("--plan-device: ") + e.what());
  }
  for (const auto& field : o.plan_device_fields) {  // --plan-device-field NAME=VALUE (sim/device.hpp's fields)
    const auto eq = field.find('=');
    if (eq == std::string::npos) throw UsageError("--plan-device-field " + field + ": expected NAME=VALUE");
    try {
      dtensor::sim::set_device_field(hw, field.substr(0, eq), field.substr(eq + 1));
      hw.check("--plan-device-field");
    } catch (const dtensor::Error& e) {
      throw UsageError(std::string("--plan-device-field: ") + e.what());
    }
  }
  const PlanModel m{.layers = o.layers,
                    .heads = o.heads,
                    .kv_heads = o.kv_heads,
                    .dim = o.dim,
                    .ffn = o.ffn,
                    .vocab = std::max<std::int64_t>(256, o.vocab),  // the characters' bound, or --vocab
                    .seq = o.seq,
                    .batch = o.batch,
                    .llama = o.arch == "llama",
                    .bf16 = o.dtype == "bf16" || o.dtype == "fp8",
                    .checkpoint = o.checkpoint,
                    .fp8 = o.dtype == "fp8",
                    .recompute = o.recompute,
                    .experts = o.experts,
                    .topk = o.topk,
                    .moe_every = o.moe_every,
                    .dense_first = o.dense_first,
                    .shared = o.shared,
                    .groups = o.groups,
                    .topk_groups = o.topk_groups,
                    .capacity = o.capacity,
                    .ep = ep_given ? o.ep : 0,
                    .ep_node_size = o.ep_node_size,
                    .mla = dtensor::models::cli::latent_attention_config(o)};
  try {
    const PlanChoice choice = choose_plan(m, ranks, hw);
    static_cast<MeshFlags&>(o) = choice.mesh;  // ep included: the choice's (or the one given)
    if (o.ep_node_size > 0) o.ep_node_size = choice.best.plan.ep_node_size;  // nodes of gcd(ep, L)
    if (choice.recompute.full) o.checkpoint = true;
    else o.recompute = choice.recompute;
    o.plan_report = choice.report;
  } catch (const dtensor::Error& e) {
    throw UsageError(e.what());
  }
}

}  // namespace examples
