// dtensor/models/published_dry_run.hpp — the published runs (sim/published_runs.hpp) timed by
// the dry run: each row's plan run once, the real training step on meta (models::dry_run_plan,
// with the row's software: fused or materialised attention, overlapped or exposed gradient
// reduction), and its records costed again by sim::estimate_plan under each calibration and
// compute_scale the fits try (the step is not run again: re-costing reads the reports).
//
//   auto rows = models::published_dry_runs(sim::published_runs(), dry_run);  // one dry run per row
//   sim::predict(rows[0]).ratio();                                     // the dry run's figure
//   sim::fit_calibration(sim::fit_rows(rows));  sim::leave_one_out(rows);
//
// The dry run itself is the caller's (`dry_run`, a DryRunner: models::dry_run_any, or the copy a
// program links, examples::dry_run_any), so that this header compiles no model's dry run.
// What plan_at_scale --published prints and test_sim's "the calibration is the fit" fits. A row
// whose plan the dry run's checks refuse (models::check_plan) is timed by the analytic
// estimate instead, and says why (TimedRun::dry_run_note): torchtitan's Float8 405B row, FP8
// with full recomputation, which the trainer refuses (a recomputed Linear would record its FP8
// amaxes twice: docs/fp8.md).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/models/training_plan.hpp"
#include "dtensor/sim/published_runs.hpp"

namespace dtensor::models {

/// Runs a plan's dry run with the model's blocks (`llama`), element type (`bf16`) and sequence
/// parallelism (`sp`): models::dry_run_any's signature.
using DryRunner = std::function<std::vector<PlanClass>(const TrainingPlan&, bool llama, bool bf16, bool sp)>;

/// A published row's plan as the dry run runs it.
inline TrainingPlan training_plan_of(const sim::PublishedRun& run) { return training_plan_of(run.model, run.plan); }

/// A row's dry run, kept to be costed again: the plan, its classes, its schedule, the device.
struct PublishedDryRun {
  TrainingPlan plan;
  std::vector<PlanClass> classes;
  parallel::pipeline::Schedule schedule;
  sim::Hardware hardware;
  double dry_run_seconds = 0;  // wall time of the dry run itself

  /// The step under `cal`, the device's compute_scale replaced by `compute_scale` when > 0.
  sim::PlanEstimate estimate(const sim::Calibration& cal = sim::calibration, double compute_scale = 0) const {
    sim::Hardware hw = hardware;
    if (compute_scale > 0) hw.compute_scale = compute_scale;
    return estimate_dry_run(plan, classes, hw, schedule, cal);
  }
};

/// The row's dry run by `dry_run` (throws what the dry run throws: a plan it refuses).
inline std::shared_ptr<const PublishedDryRun> dry_run_published(const sim::PublishedRun& run,
                                                                const DryRunner& dry_run) {
  const auto started = std::chrono::steady_clock::now();
  PublishedDryRun d{training_plan_of(run), {}, {}, run.hardware()};
  d.hardware.fp32 = !run.plan.bf16;
  check_plan(d.plan);
  d.classes = dry_run(d.plan, run.model.llama, run.plan.bf16, run.plan.sp);
  d.schedule = plan_schedule(d.plan);
  d.dry_run_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return std::make_shared<const PublishedDryRun>(std::move(d));
}

/// A row timed by its dry run (see the top of this file).
inline sim::TimedRun published_dry_run(const sim::PublishedRun& run, const DryRunner& dry_run) {
  try {
    check_plan(training_plan_of(run));
  } catch (const Error& e) {
    // A plan the dry run refuses (its checks): the analytic estimate stands in, saying why.
    auto r = sim::analytic_run(run);
    r.dry_run_note = e.what();
    return r;
  }
  const auto d = dry_run_published(run, dry_run);  // anything else it throws is the caller's
  sim::TimedRun r{run, {}, "dry run", ""};
  r.step = sim::detail::remembered(
      [d](const sim::Calibration& cal, double scale) { return d->estimate(cal, scale).step_seconds; });
  return r;
}

/// Every row timed by its dry run, each dry-run once.
inline std::vector<sim::TimedRun> published_dry_runs(const std::vector<sim::PublishedRun>& runs,
                                                     const DryRunner& dry_run) {
  std::vector<sim::TimedRun> out;
  for (const auto& r : runs) out.push_back(published_dry_run(r, dry_run));
  return out;
}

}  // namespace dtensor::models
