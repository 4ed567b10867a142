// examples/plan_rescore.hpp — the analytic search's best plans dry-run (the real training step on
// meta space, models/training_plan.hpp) and ranked by the dry run's step: what
// `plan_at_scale --search` and `train_gpt --plan auto` (examples/plan_auto_dry.cpp) both rank by,
// so that for the same model and rank count they choose the same plan.
//
//   auto ranked = sim::search_plans(shape, space, hw);               // analytic, fastest first
//   auto finalists = examples::rescore(base, llama, bf16, ranked, 12, hw);
//   finalists[0].ranked.plan;  finalists[0].dry.step;  finalists[0].analytic_rank;
//
// Order: plans the dry run says fit first, then by the dry run's step (stable: equal steps keep
// the analytic order); a plan the dry run cannot run (its checks refuse it) last, with its error.
// This header instantiates the whole dry run (every model kind, both dtypes, with and without
// SP): it is compiled by host compilers only (plan_at_scale.cpp, plan_auto_dry.cpp), never by
// nvcc (the CUDA trainer links plan_auto_dry.cpp's object).
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "dtensor/models/training_plan.hpp"
#include "dtensor/sim/search.hpp"

namespace examples {

/// The search's plan as the dry run's TrainingPlan: `base` gives the model (and a MoE model's
/// configuration), `shape` how it is split.
inline dtensor::sim::TrainingPlan training_plan_of(dtensor::sim::TrainingPlan base, const dtensor::sim::PlanShape& shape) {
  const dtensor::nn::Recompute rc = shape.recomputes();
  base.model.checkpoint = rc.full;
  base.model.recompute = rc.full ? dtensor::nn::Recompute{} : rc;
  base.batch = shape.batch;
  base.microbatches = shape.microbatches();
  base.dp = shape.dp, base.tp = shape.tp, base.pp = shape.pp, base.cp = shape.cp, base.ep = shape.ep;
  base.zero = shape.zero, base.hsdp = shape.hsdp;
  base.schedule = shape.schedule;
  base.stages_per_rank = shape.stages_per_rank > 1 ? shape.stages_per_rank : 0;
  base.cp_kind = dtensor::parallel::parse_context_kind(shape.cp_kind);
  return base;
}

/// The dry run of a plan with the model's element type, blocks and sequence parallelism.
inline std::vector<dtensor::sim::PlanClass> dry_run_any(const dtensor::sim::TrainingPlan& p, bool llama, bool bf16, bool sp) {
  namespace sim = dtensor::sim;
  namespace nn = dtensor::nn;
  using ExpertMesh = dtensor::MetaMesh<"edp", "ep", "tp">;
  using bf = dtensor::bfloat16;
  auto run = [&]<class T, class Layers>() {
    return sp ? sim::dry_run_plan<T, Layers, true>(p) : sim::dry_run_plan<T, Layers, false>(p);
  };
  if (llama) return bf16 ? run.template operator()<bf, nn::LlamaLayers>() : run.template operator()<float, nn::LlamaLayers>();
  if (p.has_experts())
    return bf16 ? run.template operator()<bf, nn::MoELayers<bf, ExpertMesh>>()
                : run.template operator()<float, nn::MoELayers<float, ExpertMesh>>();
  return bf16 ? run.template operator()<bf, nn::DenseLayers>() : run.template operator()<float, nn::DenseLayers>();
}

/// What the dry run says of a plan: its step (sim::estimate_plan over every class), the most any
/// rank holds in the step (in-flight micro-batches included), which class, and the verdict.
struct DryScore {
  dtensor::sim::PlanEstimate estimate;
  double step = std::numeric_limits<double>::infinity();
  double memory = 0;
  std::size_t memory_class = 0;
  bool fits = false;
};

inline DryScore dry_score(const dtensor::sim::TrainingPlan& p, const std::vector<dtensor::sim::PlanClass>& classes,
                          const dtensor::sim::Hardware& hw) {
  namespace sim = dtensor::sim;
  std::vector<sim::ClassInput> inputs;
  for (const auto& c : classes) inputs.push_back({&c.report, c.pipeline_ranks});
  DryScore r;
  r.estimate = sim::estimate_plan(inputs, sim::plan_topology(p, hw), sim::detail::plan_schedule(p), {.zero = p.zero});
  r.step = r.estimate.step_seconds;
  for (std::size_t i = 0; i < classes.size(); ++i)
    if (classes[i].peak_in_flight > r.memory) r.memory = classes[i].peak_in_flight, r.memory_class = i;
  r.fits = sim::fits(r.memory, hw);
  return r;
}

struct Finalist {
  dtensor::sim::RankedPlan ranked;
  std::size_t analytic_rank = 0;  // 0-based, in the analytic ranking
  DryScore dry;
  std::string error;              // the dry run's refusal, if it refused the plan
};

/// The first `count` plans of `ranked` dry-run and ordered (see the top of this file). `base`:
/// the model (TrainingPlan::model, moe) the shapes split; `hw` the device (its fp32 flag is set
/// from `bf16`).
inline std::vector<Finalist> rescore(const dtensor::sim::TrainingPlan& base, bool llama, bool bf16,
                                     const std::vector<dtensor::sim::RankedPlan>& ranked, std::size_t count,
                                     dtensor::sim::Hardware hw) {
  hw.fp32 = !bf16;
  std::vector<Finalist> out;
  for (std::size_t i = 0; i < ranked.size() && out.size() < count; ++i) {
    Finalist f{ranked[i], i, {}, {}};
    const auto plan = training_plan_of(base, ranked[i].plan);
    try {
      dtensor::sim::check_plan(plan);
      f.dry = dry_score(plan, dry_run_any(plan, llama, bf16, ranked[i].plan.sp), hw);
    } catch (const dtensor::Error& e) {
      f.error = e.what();
    }
    out.push_back(std::move(f));
  }
  std::stable_sort(out.begin(), out.end(), [](const Finalist& a, const Finalist& b) {
    if (a.error.empty() != b.error.empty()) return a.error.empty();
    if (a.dry.fits != b.dry.fits) return a.dry.fits;
    return a.dry.step < b.dry.step;
  });
  return out;
}

}  // namespace examples
