// dtensor/sim/search.hpp — every plan of a model on a number of GPUs, ranked by the analytic
// estimate (sim/analytic.hpp), those that do not fit the device's memory left out.
//
//   sim::SearchSpace space{.gpus = 16384, .batch = 2048};
//   auto ranked = sim::search_plans(model, space, sim::device("h100"));  // fastest first
//   ranked[0].plan;  ranked[0].estimate.step_seconds;  ranked.size();
//   sim::why_slower(ranked[3], ranked[0]);   // "bubble +1.2 s (pp 32 ...)"
//
// Enumerated: tp in powers of two up to the NVLink domain dividing the heads (and a Llama's KV
// heads); cp in powers of two dividing seq / 2 (1 unless the sequence is long: up to 32) as a
// ring, all-gather of KV or Ulysses (heads a multiple of tp x cp); pp in powers of two and the
// divisors of the layers; dp = gpus / (tp cp pp), dividing the batch; micro-batch sizes 1, 2, 4,
// 8; schedules 1F1B, interleaved (v = 2, 4 where m is a multiple of pp; layers split unevenly
// as the dry run's stages do), ZB-H1 (m >= pp), ZB-V and DualPipeV (m >= 2 pp); DDP, ZeRO-1,
// ZeRO-3, and ZeRO-1/3 as HSDP (shards filling a node with the cp x tp ranks, or 2x, 4x that);
// for a MoE model (ModelShape::experts) every ep up to the experts dividing dp x cp (uneven
// experts over ep allowed: the busiest rank holds ceil(E / ep)); recompute none, selective,
// act, core_attn,norm,act, core_attn,norm,mlp or full (MoE: none, selective or full); SP
// whenever tp > 1. SearchSpace::exhaustive (the trainer's --plan auto, and plan_at_scale
// --search up to exhaustive_gpus GPUs) widens this to every divisor and micro-batch size,
// ZeRO-2 and every HSDP split, interleaved v = 2 only. `plan_at_scale --search` and
// `train_gpt --plan auto` dry-run the `finalists` best of this ranking and rank those by the dry
// run's estimate (examples/plan_rescore.hpp). Not enumerated: GPipe; ZeRO-2 outside the
// exhaustive space (ZeRO-1's time, more memory than ZeRO-3 saves).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/sim/analytic.hpp"

namespace dtensor::sim {

struct SearchSpace {
  std::int64_t gpus = 1;
  std::int64_t batch = 1;  // global batch, sequences
  bool bf16 = true;
  int max_cp = 32;
  bool keep_unfit = false;  // also return the plans that do not fit (estimate.fits false), ranked with the rest
  // The dimensions beyond the basic ones, each on unless turned off (test_sim compares with and without):
  bool hsdp = true;               // ZeRO inside the data ranks of a node, replicated across (HSDP)
  bool cp_kinds = true;           // the all-gather and Ulysses context kinds beside the ring
  bool zero_bubble = true;        // ZB-H1, ZB-V and DualPipeV beside 1F1B and interleaved
  bool recompute_modules = true;  // selective and per-module recomputation beside none and full
  // The trainer's space (examples/plan_auto.hpp; plan_at_scale --search on up to
  // exhaustive_gpus GPUs): every divisor of the GPUs for tp, cp and pp (not only powers of two),
  // every micro-batch size dividing a data rank's sequences, ZeRO-2 beside 0, 1, 3, and every
  // HSDP split; interleaved with 2 stages per rank only (what the trainer runs).
  bool exhaustive = false;
  std::optional<nn::Recompute> recompute{};  // given (train_gpt --checkpoint / --recompute): only this one
  int ep = 0;                                // a MoE model's expert parallelism: 0 every ep, else only this one
  // The node-level dispatch with nodes of L expert ranks (PlanShape::ep_node_size; 0: one stage):
  // a plan of ep expert ranks gets nodes of gcd(ep, L), and plans whose nodes would hold no
  // expert are left out.
  int ep_node_size = 0;
  bool bf16_moments = false;                 // DDP in bf16: AdamW in bf16 on the values (PlanShape::bf16_moments)
  bool fp8 = false;                          // FP8 Linear GEMMs (PlanShape::fp8; bf16 needed)
};

/// plan_at_scale --search and train_gpt --plan auto enumerate the exhaustive space up to this many GPUs.
inline constexpr std::int64_t exhaustive_gpus = 16;

struct RankedPlan {
  PlanShape plan;
  AnalyticEstimate estimate;
};

namespace detail {
inline std::vector<int> powers_of_two_upto(std::int64_t limit) {
  std::vector<int> v;
  for (std::int64_t x = 1; x <= limit && x <= (1 << 30); x *= 2) v.push_back(int(x));
  return v;
}

/// The recomputation choices, least first: none; Korthikanti's selective (the attention core);
/// the MLP activation; core_attn,norm,act; core_attn,norm,mlp; full (nn/recompute.hpp's table:
/// 34, 32, 26, 20, 12 and 2 units of s b h / t bytes per layer under SP). Each trades memory for
/// the forward work it repeats; the search keeps every choice that fits, so a plan recomputes
/// only where a faster variant does not fit.
inline std::vector<nn::Recompute> recompute_choices(bool modules) {
  std::vector<nn::Recompute> out{nn::Recompute{}};
  if (modules)
    for (const char* spec : {"selective", "act", "core_attn,norm,act", "core_attn,norm,mlp"}) out.push_back(nn::Recompute::parse(spec));
  out.push_back(nn::Recompute::parse("full"));
  return out;
}

/// Whether `a` recomputes nothing that `b` does not (full recomputes everything; mlp the act).
inline bool repeats_no_more(const nn::Recompute& a, const nn::Recompute& b) {
  if (b.full) return true;
  if (a.full) return false;
  return (!a.core_attn || b.core_attn) && (!a.norm || b.norm) && (!a.mlp || b.mlp) && (!a.act || b.act || b.mlp);
}

inline std::vector<int> divisors_of(std::int64_t n) {
  std::vector<int> v;
  for (std::int64_t d = 1; d <= n && d <= (1 << 30); ++d)
    if (n % d == 0) v.push_back(int(d));
  return v;
}

/// A pipeline schedule and its stages per rank.
struct ScheduleChoice {
  const char* name;
  int v;
};
}  // namespace detail

/// The plans of a search, fastest first, and how many were estimated.
struct SearchResult {
  std::vector<RankedPlan> ranked;
  std::size_t considered = 0;
};

/// Every plan of the space and its estimate, fitting ones (all with keep_unfit) fastest first;
/// no error when none fits (search_plans throws then).
inline SearchResult search_space(const ModelShape& m, const SearchSpace& space, const Hardware& hw,
                                 const Calibration& cal = calibration) {
  constexpr const char* op = "sim::search_plans";
  if (space.gpus < 1 || space.batch < 1)
    throw Error(op, dtensor::detail::cat("gpus ", space.gpus, ", batch ", space.batch, ": need >= 1"));
  check_model_sizes(m, space.batch, op);
  const bool all = space.exhaustive;
  std::vector<int> pps;
  if (all) {
    for (int d : detail::divisors_of(space.gpus))
      if (d <= m.layers) pps.push_back(d);
  } else {
    pps = detail::powers_of_two_upto(m.layers);
    for (std::int64_t d = 1; d <= m.layers; ++d)
      if (m.layers % d == 0) pps.push_back(int(d));
  }
  std::sort(pps.begin(), pps.end());
  pps.erase(std::unique(pps.begin(), pps.end()), pps.end());
  // MoE blocks recompute none, selective or full here (nn/recompute.hpp: norm is refused on them,
  // act changes nothing in them).
  std::vector<nn::Recompute> recomputes;
  if (space.recompute) recomputes = {*space.recompute};
  else if (m.moe()) recomputes = {nn::Recompute{}, nn::Recompute::parse("selective"), nn::Recompute::parse("full")};
  else recomputes = detail::recompute_choices(space.recompute_modules);
  // FP8 runs no full or mlp recomputation (PlanShape::fp8).
  if (space.fp8) std::erase_if(recomputes, [](const nn::Recompute& r) { return r.full || r.mlp; });
  const std::int64_t kv = m.kv();
  const std::vector<int> tps = all ? detail::divisors_of(std::min<std::int64_t>(space.gpus, m.heads))
                                   : detail::powers_of_two_upto(std::min<std::int64_t>(hw.gpus_per_node, m.heads));
  const std::vector<int> cps = all ? detail::divisors_of(space.gpus) : detail::powers_of_two_upto(space.max_cp);
  SearchResult result;
  auto& out = result.ranked;
  std::size_t& considered = result.considered;
  for (int tp : tps) {
    if (m.heads % tp != 0 || (m.llama && kv % tp != 0) || space.gpus % tp != 0) continue;
    for (int cp : cps) {
      if (cp > 1 && m.seq % (2 * cp) != 0) continue;
      std::vector<const char*> cp_kinds{"ring"};
      if (cp > 1 && space.cp_kinds) {
        cp_kinds.push_back("allgather");
        if (m.heads % (std::int64_t(tp) * cp) == 0) cp_kinds.push_back("ulysses");
      }
      for (int pp : pps) {
        const std::int64_t model_ranks = std::int64_t(tp) * cp * pp;
        if (space.gpus % model_ranks != 0) continue;
        const std::int64_t dp = space.gpus / model_ranks;
        if (dp > (1 << 30) || space.batch % dp != 0) continue;
        // HSDP replicas: the shards fill a node with the cp x tp ranks (then 2x, 4x that), short
        // of dp; exhaustive: every split of dp into replicas x shards (shards >= 2).
        std::vector<int> replicas{1};
        if (all) {
          for (int r : detail::divisors_of(dp))
            if (r > 1 && r < dp) replicas.push_back(r);
        } else if (space.hsdp)
          for (std::int64_t shards = std::max<std::int64_t>(2, hw.gpus_per_node / (std::int64_t(tp) * cp)), k = 0;
               k < 3 && shards < dp; shards *= 2, ++k)
            if (dp % shards == 0) replicas.push_back(int(dp / shards));
        // A MoE model's expert parallelism: any ep up to the experts dividing the token ranks.
        std::vector<int> eps{1};
        if (m.moe()) {
          eps.clear();
          for (int e : detail::divisors_of(dp * cp))
            if (e <= m.experts && (space.ep == 0 || e == space.ep)) eps.push_back(e);
        } else if (space.ep > 1) continue;
        std::vector<std::int64_t> sizes{1, 2, 4, 8};
        if (all) sizes.clear();
        if (all)
          for (std::int64_t b = 1; b <= space.batch / dp; ++b) sizes.push_back(b);
        for (std::int64_t b : sizes) {
          if ((space.batch / dp) % b != 0) continue;
          const int mb = int(space.batch / dp / b);
          std::vector<detail::ScheduleChoice> schedules{{"1f1b", 1}};
          if (pp > 1) {
            for (int v : {2, 4})
              if (mb % pp == 0 && std::int64_t(pp) * v <= m.layers && (v == 2 || !all)) schedules.push_back({"interleaved", v});
            if (space.zero_bubble) {
              if (mb >= pp) schedules.push_back({"zb", 1});
              if (mb >= 2 * pp && 2 * std::int64_t(pp) <= m.layers) schedules.push_back({"zbv", 2}), schedules.push_back({"dualpipev", 2});
            }
          }
          for (const auto& sched : schedules)
            for (const char* cp_kind : cp_kinds)
              for (int zero : {0, 1, 2, 3}) {
                // ZeRO shards over dp x cp (parallel::FsdpShardDims): at dp 1 it has nothing to
                // shard only without context parallelism (torchtitan's FSDP 1 x CP 8 is a plan).
                if ((zero > 0 && dp == 1 && cp == 1) || (zero == 2 && !all)) continue;
                for (int hsdp : replicas) {
                  if (hsdp > 1 && zero == 0) continue;
                  for (int ep : eps) {
                    const int node = space.ep_node_size > 0 && m.moe() ? std::gcd(ep, space.ep_node_size) : 0;
                    if (node > 0 && !parallel::nodes_own_experts(m.experts, ep, node)) continue;
                    std::vector<nn::Recompute> fitting;  // of this plan, so far
                    for (const auto& rc : recomputes) {
                      // A choice that repeats all the work of one that fits (and more) is slower: left out.
                      if (!space.keep_unfit && std::any_of(fitting.begin(), fitting.end(), [&](const nn::Recompute& f) {
                            return detail::repeats_no_more(f, rc);
                          }))
                        continue;
                      PlanShape p{.batch = space.batch,
                                  .microbatch = b,
                                  .dp = int(dp),
                                  .tp = tp,
                                  .pp = pp,
                                  .cp = cp,
                                  .ep = ep,
                                  .ep_node_size = node,
                                  .zero = zero,
                                  .sp = tp > 1,
                                  .recompute = rc.full,
                                  .recompute_modules = rc,
                                  .hsdp = hsdp,
                                  .schedule = sched.name,
                                  .stages_per_rank = sched.v,
                                  .cp_kind = cp_kind,
                                  .bf16 = space.bf16,
                                  .bf16_moments = space.bf16_moments,
                                  .fp8 = space.fp8};
                      ++considered;
                      auto est = analytic_estimate(m, p, hw, cal, space.keep_unfit);
                      if (est.fits) fitting.push_back(rc);
                      if (est.fits || space.keep_unfit) out.push_back({std::move(p), est});
                    }
                  }
                }
              }
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const RankedPlan& a, const RankedPlan& b) {
    return a.estimate.step_seconds < b.estimate.step_seconds;
  });
  return result;
}

/// Every plan of the space that fits, fastest first (see the synopsis). Throws when none fits.
inline std::vector<RankedPlan> search_plans(const ModelShape& m, const SearchSpace& space, const Hardware& hw,
                                            const Calibration& cal = calibration) {
  auto result = search_space(m, space, hw, cal);
  if (std::none_of(result.ranked.begin(), result.ranked.end(), [](const RankedPlan& r) { return r.estimate.fits; }))
    throw Error("sim::search_plans",
                dtensor::detail::cat("no plan of ", result.considered, " for ", m.params() / 1e9, "B parameters on ",
                                     space.gpus, " x ", hw.name, " (", hw.memory_bytes / 1e9,
                                     " GB each, less the reserve) with batch ", space.batch, " fits"));
  return std::move(result.ranked);
}

/// "tp 8+sp cp 4 (ulysses) pp 16 dp 128, micro-batch 1 x 16, interleaved v2, HSDP 16 x ZeRO-3, recompute selective";
/// bf16 DDP "DDP + fp32 master" (sim::as_run), or "DDP (bf16 moments)" when asked.
inline std::string describe(const PlanShape& p) {
  std::ostringstream s;
  s << "tp " << p.tp << (p.sp ? "+sp" : "") << " cp " << p.cp;
  if (p.cp > 1 && p.cp_kind != "ring") s << " (" << p.cp_kind << ")";
  s << " pp " << p.pp << " dp " << p.dp;
  if (p.ep > 1) s << " ep " << p.ep;
  if (p.ep_node_size > 0) s << " (nodes of " << p.ep_node_size << ")";
  s << ", micro-batch " << p.microbatch << " x " << p.microbatches() << ", " << p.schedule;
  if (p.schedule == "interleaved") s << " v" << p.stages_per_rank;
  s << ", " << (p.hsdp > 1 ? "HSDP " + std::to_string(p.hsdp) + " x " : std::string())
    << (p.zero == 0 ? std::string("DDP") : "ZeRO-" + std::to_string(p.zero));
  if (p.zero == 0 && p.bf16) s << (p.bf16_moments ? " (bf16 moments)" : " + fp32 master");
  const auto rc = p.recomputes();
  if (rc.full && !rc.modules()) s << ", recompute";
  else if (!rc.none()) s << ", recompute " << rc.to_string();
  if (p.fp8) s << ", FP8 GEMMs";
  return s.str();
}

/// Why `slower` loses to `best`: the term of the analytic estimate that grew most, with both values.
namespace detail {
/// One term of an analytic step, for two plans side by side.
struct StepTerm {
  const char* name;
  double mine, theirs;
};
/// The terms of `a`'s analytic step beside `b`'s (what why_slower and compare_plans report).
inline std::vector<StepTerm> step_terms(const RankedPlan& a, const RankedPlan& b) {
  const auto& x = a.estimate;
  const auto& y = b.estimate;
  return {
      {"compute (all micro-batches)", x.compute_per_microbatch * a.plan.microbatches() - x.recompute_seconds,
       y.compute_per_microbatch * b.plan.microbatches() - y.recompute_seconds},
      {"recomputation", x.recompute_seconds, y.recompute_seconds},
      {"pipeline bubble", x.bubble_seconds, y.bubble_seconds},
      {"tensor-parallel communication", x.tp_seconds, y.tp_seconds},
      {"context-parallel communication", x.cp_seconds, y.cp_seconds},
      {"pipeline sends", x.pp_seconds, y.pp_seconds},
      {"ZeRO-3 gathers", x.gather_seconds, y.gather_seconds},
      {"expert all-to-alls", x.ep_seconds, y.ep_seconds},
      {"gradient reduction (exposed)", x.gradient_reduction, y.gradient_reduction},
      {"optimizer + parameter sync", x.optimizer + x.parameter_sync, y.optimizer + y.parameter_sync},
  };
}
}  // namespace detail

inline std::string why_slower(const RankedPlan& slower, const RankedPlan& best) {
  const auto terms = detail::step_terms(slower, best);
  const detail::StepTerm* worst = &terms[0];
  for (const auto& t : terms)
    if (t.mine - t.theirs > worst->mine - worst->theirs) worst = &t;
  std::ostringstream s;
  s.precision(3);
  const double gap = slower.estimate.step_seconds - best.estimate.step_seconds;  // < 0 where a dry run reordered them
  s << (gap >= 0 ? "+" : "") << gap << " s; most from " << worst->name << " ("
    << worst->mine << " s vs " << worst->theirs << " s)";
  return s.str();
}

/// Every term of `a`'s analytic step beside `b`'s, and the memory of both: the per-phase account of
/// why `a` ranks where it does (`plan_at_scale --search --rank-of`). One line per term:
/// "  pipeline bubble          1.460 s   0.282 s   +1.178 s".
inline std::string compare_plans(const RankedPlan& a, const RankedPlan& b) {
  const auto& x = a.estimate;
  const auto& y = b.estimate;
  auto terms = detail::step_terms(a, b);
  terms.push_back({"step", x.step_seconds, y.step_seconds});
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(3);
  for (const auto& t : terms) {
    s << "  " << t.name << std::string(32 - std::min<std::size_t>(31, std::string_view(t.name).size()), ' ') << t.mine
      << " s  " << t.theirs << " s  " << (t.mine >= t.theirs ? "+" : "") << t.mine - t.theirs << " s\n";
  }
  s.precision(2);
  s << "  memory (states + activations + logits)  " << x.memory_bytes / 1e9 << " GB (" << x.model_states / 1e9 << " + "
    << x.activations / 1e9 << " + " << x.logits / 1e9 << ")  " << y.memory_bytes / 1e9 << " GB (" << y.model_states / 1e9
    << " + " << y.activations / 1e9 << " + " << y.logits / 1e9 << ")\n";
  return s.str();
}

}  // namespace dtensor::sim
