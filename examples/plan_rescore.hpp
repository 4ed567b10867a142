// examples/plan_rescore.hpp — the analytic search's best plans dry-run (the real training step on
// meta space, models/training_plan.hpp) and ranked by the dry run's step: what
// `plan_at_scale --search` and `train_gpt --plan auto` (examples/plan_auto_dry.cpp) both rank by,
// so that for the same model and rank count they choose the same plan.
//
//   auto ranked = sim::search_plans(shape, space, hw);               // analytic, fastest first
//   auto r = examples::rescore(base, llama, bf16, ranked, 12, hw);
//   r.finalists[0].ranked.plan;  r.finalists[0].dry.step;  r.finalists[0].analytic_rank;
//   r.dropped_unfit;  r.skipped;                                   // what it left out, and why
//
// Order: by the dry run's step (stable: equal steps keep the analytic order). A plan the dry run
// says does not fit, or refuses (its checks), is dropped and the next of the analytic ranking
// taken instead, at most 3 x `count` plans dry-run in all: no finalist is a plan its own dry run
// rejects (Rescored::dropped_unfit, dropped_refused count them; the last refusal is kept). Where
// the dry run holds more than the analytic estimate said (sim/analytic.hpp leaves out what the
// dry run's ledger sees, e.g. ZeRO's communication buffers), the plans after a drop are taken
// first if their analytic memory times the largest ratio dry run / analytic of a dropped plan
// fits (the next plans are mostly variants of the dropped one), the others after them while the
// budget lasts (Rescored::skipped: those never dry-run). When none of those fits, the rest of the
// ranking is dry-run in order, past the budget, until one fits: a search whose first 3 x `count`
// plans all fail their dry run still returns a plan its dry run accepts, not the analytic first.
// This header instantiates the whole dry run (every model kind, both dtypes, with and without
// SP): it is compiled by host compilers only (plan_at_scale.cpp, plan_auto_dry.cpp), never by
// nvcc (the CUDA trainer links plan_auto_dry.cpp's object).
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "dtensor/models/training_plan.hpp"
#include "dtensor/sim/search.hpp"

namespace examples {

/// The dry run of a plan with the model's element type, blocks and sequence parallelism. Defined
/// in plan_auto_dry.cpp, the one translation unit that instantiates the dry run of every model
/// (train_gpt, train_gpt_cuda and plan_at_scale link its object: CI's time).
std::vector<dtensor::models::PlanClass> dry_run_any(const dtensor::models::TrainingPlan& p, bool llama, bool bf16,
                                                    bool sp);

/// What the dry run says of a plan: its step (sim::estimate_plan over every class), the most any
/// rank holds in the step (in-flight micro-batches included), which class, the most any rank
/// holds while the trainer is built (the "parameters" phase: the model drawn as shards, FSDP,
/// the optimizer), which class, and the verdict: both must fit (a plan that cannot be built
/// does not fit, whatever its step holds).
struct DryScore {
  dtensor::sim::PlanEstimate estimate;
  double step = std::numeric_limits<double>::infinity();
  double memory = 0;
  std::size_t memory_class = 0;
  double construction = 0;
  std::size_t construction_class = 0;
  bool step_fits = false, construction_fits = false;
  bool fits = false;  // step_fits && construction_fits
};

inline DryScore dry_score(const dtensor::models::TrainingPlan& p,
                          const std::vector<dtensor::models::PlanClass>& classes, const dtensor::sim::Hardware& hw) {
  namespace sim = dtensor::sim;
  DryScore r;
  r.estimate = dtensor::models::estimate_dry_run(p, classes, hw);
  r.step = r.estimate.step_seconds;
  for (std::size_t i = 0; i < classes.size(); ++i) {
    if (classes[i].peak_in_flight > r.memory) r.memory = classes[i].peak_in_flight, r.memory_class = i;
    const double built = double(classes[i].report.construction_peak_total());
    if (built > r.construction) r.construction = built, r.construction_class = i;
  }
  r.step_fits = sim::fits(r.memory, hw);
  r.construction_fits = sim::fits(r.construction, hw);
  r.fits = r.step_fits && r.construction_fits;
  return r;
}

struct Finalist {
  dtensor::sim::RankedPlan ranked;
  std::size_t analytic_rank = 0;  // 0-based, in the analytic ranking
  DryScore dry;
  std::string error;              // the dry run's refusal, if it refused the plan
};

/// What rescore found: the fitting finalists, fastest first, and what it dropped.
struct Rescored {
  std::vector<Finalist> finalists;
  std::size_t dry_run = 0;         // plans dry-run in all (finalists and dropped)
  std::size_t dropped_unfit = 0;   // the dry run's memory verdict: does not fit
  std::size_t dropped_refused = 0; // the dry run refused the plan (its checks)
  std::size_t skipped = 0;         // deferred (analytic memory x memory_ratio does not fit) and never dry-run
  double memory_ratio = 1;         // the largest dry run / analytic memory of a dropped plan
  std::string last_refusal;        // the last refusal's message
};

/// The first `count` plans of `ranked` that fit in their dry run, ordered (see the top of this
/// file). `base`: the model (TrainingPlan::model, moe) the shapes split; `hw` the device (its fp32
/// flag is set from `bf16`).
inline Rescored rescore(const dtensor::models::TrainingPlan& base, bool llama, bool bf16,
                        const std::vector<dtensor::sim::RankedPlan>& ranked, std::size_t count,
                        dtensor::sim::Hardware hw) {
  hw.fp32 = !bf16;
  Rescored out;
  const std::size_t tries = 3 * count;
  std::vector<bool> tried(ranked.size(), false);
  const auto dry_run_one = [&](std::size_t i) {
    tried[i] = true;
    Finalist f{ranked[i], i, {}, {}};
    const auto plan = dtensor::models::training_plan_of(base, ranked[i].plan);
    ++out.dry_run;
    try {
      dtensor::sim::check_plan(plan);
      f.dry = dry_score(plan, dry_run_any(plan, llama, bf16, ranked[i].plan.sp), hw);
    } catch (const dtensor::Error& e) {
      ++out.dropped_refused;
      out.last_refusal = e.what();
      return;
    }
    if (!f.dry.fits) {
      ++out.dropped_unfit;
      if (ranked[i].estimate.memory_bytes > 0)
        out.memory_ratio = std::max(out.memory_ratio, f.dry.memory / ranked[i].estimate.memory_bytes);
      return;
    }
    out.finalists.push_back(std::move(f));
  };
  // First the plans the analytic memory, scaled by what the drops so far showed, says fit; then,
  // while the budget lasts, the deferred ones in analytic order (the scaling is a guess).
  std::vector<std::size_t> deferred;
  for (std::size_t i = 0; i < ranked.size() && out.finalists.size() < count && out.dry_run < tries; ++i) {
    if (!dtensor::sim::fits(ranked[i].estimate.memory_bytes * out.memory_ratio, hw)) deferred.push_back(i);
    else dry_run_one(i);
  }
  out.skipped = deferred.size();
  for (std::size_t k = 0; k < deferred.size() && out.finalists.size() < count && out.dry_run < tries; ++k, --out.skipped)
    dry_run_one(deferred[k]);
  // None of them fits in its dry run: go on down the analytic ranking, past the budget, until one
  // does, rather than hand back a plan its own dry run rejects (or one never dry-run at all).
  for (std::size_t i = 0; count > 0 && i < ranked.size() && out.finalists.empty(); ++i)
    if (!tried[i]) {
      if (std::find(deferred.begin(), deferred.end(), i) != deferred.end()) --out.skipped;
      dry_run_one(i);
    }
  std::stable_sort(out.finalists.begin(), out.finalists.end(),
                   [](const Finalist& a, const Finalist& b) { return a.dry.step < b.dry.step; });
  return out;
}

}  // namespace examples
