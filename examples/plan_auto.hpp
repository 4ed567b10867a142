// examples/plan_auto.hpp — `train_gpt --plan auto --ranks N`: the fastest plan the trainer can run
// on N ranks for its model, chosen by the cost model of the dry run (sim/analytic.hpp, the
// estimate plan_at_scale --search ranks with; docs/dry-run.md), printed with why, then trained.
//
//   examples::PlanModel m{.layers = 4, .heads = 4, .dim = 64, .seq = 32, .batch = 16};
//   auto choice = examples::choose_plan(m, 8, dtensor::sim::device("h100"));
//   choice.mesh;     // MeshFlags: pp, dp, fsdp, cp, tp, zero, sp, schedule, microbatches (ep kept)
//   choice.report;   // the chosen plan and the runners-up, each with why it lost to the first
//
// Enumerated: every factorization ranks = pp x data x cp x tp with tp dividing the heads (and a
// Llama's KV heads), cp splitting the sequence in 2 cp load-balanced chunks as a ring, an
// all-gather of KV, or Ulysses (the heads a multiple of tp x cp), pp at most the layers; the
// data ranks either DDP (--dp) or ZeRO-1/2/3 (--fsdp), or HSDP (ZeRO over --fsdp shards, --dp
// replicas); micro-batches M dividing the batch with each micro-batch split evenly over the data
// ranks; 1F1B, interleaved (2 stages per rank, as the trainer runs it) where M is a multiple of
// pp, ZB-H1 (M >= pp), ZB-V and DualPipeV (M >= 2 pp); SP whenever tp > 1; recomputation none,
// selective, act, core_attn,norm,act, core_attn,norm,mlp or full unless --checkpoint or
// --recompute is given. Kept as given: --dtype, --ep (the estimate has no experts: the token
// ranks must be a multiple of it). The times are those of the device the estimate is for (H100
// unless --plan-device; --plan-device-field NAME=VALUE sets one of its fields, sim/device.hpp),
// not of this machine's threads: the choice is what the plan would be on that hardware.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/sim/search.hpp"
#include "flags.hpp"

namespace examples {

/// The trainer's model and step, as the choice needs them.
struct PlanModel {
  std::int64_t layers = 1, heads = 1, kv_heads = 0, dim = 1, ffn = 0, vocab = 256, seq = 2, batch = 1;
  bool llama = false, bf16 = false, checkpoint = false;
  dtensor::nn::Recompute recompute{};  // --recompute; with --checkpoint: kept as given, else chosen
  int ep = 1;  // kept: the token ranks (data x cp) must be a multiple of it
};

struct PlanChoice {
  MeshFlags mesh;
  dtensor::nn::Recompute recompute;  // what the blocks recompute (full: --checkpoint)
  dtensor::sim::RankedPlan best;
  std::size_t considered = 0, fitting = 0;
  std::string report;  // printed by rank 0 before training
};

namespace detail {
inline std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

/// The trainer's flags for an analytic plan (data ranks on --dp under DDP, on --fsdp under ZeRO,
/// split --dp replicas x --fsdp shards under HSDP).
inline MeshFlags mesh_of(const dtensor::sim::PlanShape& p, int ep) {
  MeshFlags f;
  f.pp = p.pp, f.cp = p.cp, f.tp = p.tp, f.ep = ep;
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
}  // namespace detail

/// The fastest plan for `ranks` (see the synopsis); throws dtensor::Error naming the model, the
/// ranks and the device when no plan is valid or none fits.
inline PlanChoice choose_plan(const PlanModel& m, int ranks, const dtensor::sim::Hardware& hw, std::size_t runners_up = 3) {
  namespace sim = dtensor::sim;
  constexpr const char* op = "train_gpt --plan auto";
  if (ranks < 1) throw dtensor::Error(op, dtensor::detail::cat("--ranks ", ranks, ": need >= 1"));
  const sim::ModelShape shape{.layers = m.layers, .dim = m.dim, .heads = m.heads, .kv_heads = m.kv_heads, .ffn = m.ffn,
                              .vocab = m.vocab, .seq = m.seq, .llama = m.llama};
  const std::int64_t kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  PlanChoice out;
  std::vector<sim::RankedPlan> ranked;
  // Recomputation: as given (--checkpoint, --recompute), else each of the search's choices.
  const bool given = m.checkpoint || !m.recompute.none();
  std::vector<dtensor::nn::Recompute> recomputes{m.recompute};
  if (m.checkpoint) recomputes.front().full = true;
  if (!given) recomputes = sim::detail::recompute_choices(true);
  for (const int tp : detail::divisors(ranks)) {
    if (m.heads % tp != 0 || (m.llama && kv % tp != 0)) continue;
    for (const int cp : detail::divisors(ranks / tp)) {
      if (cp > 1 && m.seq % (2 * cp) != 0) continue;
      for (const int pp : detail::divisors(ranks / (tp * cp))) {
        if (pp > m.layers) continue;
        const int data = ranks / (tp * cp * pp);
        if ((std::int64_t(data) * cp) % m.ep != 0) continue;
        for (std::int64_t mb = 1; mb <= m.batch; ++mb) {
          if (m.batch % mb != 0 || (m.batch / mb) % data != 0) continue;
          std::vector<std::pair<const char*, int>> schedules{{"1f1b", 1}};
          if (pp > 1) {
            if (mb % pp == 0 && m.layers >= 2 * std::int64_t(pp)) schedules.push_back({"interleaved", 2});
            if (mb >= pp) schedules.push_back({"zb", 1});
            if (mb >= 2 * pp && m.layers >= 2 * std::int64_t(pp)) schedules.push_back({"zbv", 2}), schedules.push_back({"dualpipev", 2});
          }
          std::vector<const char*> cp_kinds{"ring"};
          if (cp > 1) {
            cp_kinds.push_back("allgather");
            if (m.heads % (std::int64_t(tp) * cp) == 0) cp_kinds.push_back("ulysses");
          }
          for (const auto& [schedule, v] : schedules)
            for (const char* cp_kind : cp_kinds)
              for (const int zero : {0, 1, 2, 3}) {
                if (zero > 0 && data == 1) continue;
                for (const int hsdp : detail::divisors(data)) {
                  if (hsdp > 1 && (zero == 0 || hsdp == data)) continue;  // HSDP: replicas of ZeRO shards
                  std::vector<dtensor::nn::Recompute> fitting;  // recomputing more than one of them only costs time
                  for (const auto& rc : recomputes) {
                    if (std::any_of(fitting.begin(), fitting.end(),
                                    [&](const dtensor::nn::Recompute& f) { return sim::detail::repeats_no_more(f, rc); }))
                      continue;
                    sim::PlanShape p{.batch = m.batch, .microbatch = m.batch / mb / data, .dp = data, .tp = tp, .pp = pp,
                                     .cp = cp, .zero = zero, .sp = tp > 1, .recompute = rc.full, .recompute_modules = rc,
                                     .hsdp = hsdp, .schedule = schedule, .stages_per_rank = v, .cp_kind = cp_kind,
                                     .bf16 = m.bf16};
                    ++out.considered;
                    auto est = sim::analytic_estimate(shape, p, hw);
                    if (est.fits) fitting.push_back(rc), ranked.push_back({std::move(p), est});
                  }
                }
              }
        }
      }
    }
  }
  if (out.considered == 0)
    throw dtensor::Error(op, dtensor::detail::cat("no plan for ", ranks, " ranks: --heads ", m.heads, ", --seq ", m.seq,
                                                  ", --layers ", m.layers, ", --batch ", m.batch, ", --ep ", m.ep,
                                                  " admit no factorization pp x data x cp x tp"));
  if (ranked.empty())
    throw dtensor::Error(op, dtensor::detail::cat("none of the ", out.considered, " plans for ", ranks, " ranks fits ",
                                                  hw.name, " memory (", hw.memory_bytes / 1e9,
                                                  " GB less the reserve): a smaller model or more ranks"));
  // Fastest first; among equal estimates the fewer pipeline and context ranks (simpler plans).
  std::stable_sort(ranked.begin(), ranked.end(), [](const sim::RankedPlan& a, const sim::RankedPlan& b) {
    return a.estimate.step_seconds < b.estimate.step_seconds;
  });
  out.fitting = ranked.size();
  out.best = ranked.front();
  out.mesh = detail::mesh_of(out.best.plan, m.ep);
  out.recompute = out.best.plan.recomputes();
  std::ostringstream s;
  s.precision(4);
  s << "plan auto: " << out.fitting << " of " << out.considered << " plans for " << ranks << " ranks fit " << hw.name
    << " (ranked by sim::analytic_estimate, not dry-run; docs/dry-run.md); the fastest:\n  "
    << detail::flags_of(out.mesh, out.recompute) << "  ("
    << sim::describe(out.best.plan) << "): step " << out.best.estimate.step_seconds << " s on " << hw.name
    << ", MFU " << 100 * out.best.estimate.mfu << " %, memory " << out.best.estimate.memory_bytes / 1e9 << " GB\n";
  for (std::size_t i = 1; i < ranked.size() && i <= runners_up; ++i)
    s << "  #" << i + 1 << " " << detail::flags_of(detail::mesh_of(ranked[i].plan, m.ep), ranked[i].plan.recomputes()) << ": "
      << sim::why_slower(ranked[i], ranked.front()) << "\n";
  out.report = s.str();
  return out;
}


/// train_gpt's --plan auto: when o.plan is "auto", replaces o's mesh flags by the choice for
/// --ranks (else the MPI launcher's world size) and keeps the report for rank 0 to print.
/// `mesh_flag` is the first mesh flag the command line gave ("" if none): auto chooses them all.
template <class Options>
void apply_plan_auto(Options& o, const std::string& mesh_flag) {
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
  const PlanModel m{.layers = o.layers, .heads = o.heads, .kv_heads = o.kv_heads, .dim = o.dim, .ffn = o.ffn,
                    .vocab = 256, .seq = o.seq, .batch = o.batch, .llama = o.arch == "llama", .bf16 = o.dtype == "bf16",
                    .checkpoint = o.checkpoint, .recompute = o.recompute, .ep = o.ep};
  try {
    const PlanChoice choice = choose_plan(m, ranks, hw);
    static_cast<MeshFlags&>(o) = choice.mesh;
    if (choice.recompute.full) o.checkpoint = true;
    else o.recompute = choice.recompute;
    o.plan_report = choice.report;
  } catch (const dtensor::Error& e) {
    throw UsageError(e.what());
  }
}

}  // namespace examples
