// dtensor/train/loop.hpp — the training loop, written once: steps first..last of a train::Trainer
// with timing, evaluation, checkpoints (save and resume), the training monitor (--trace, --plot,
// the progress bar), memory budgets, finite checks and what one step communicated.
//
//   train::FitOptions fo{.steps = 300, .eval_every = 50, .save_every = 100, .save_dir = "ckpt",
//                        .config = {{"model", "mine"}}, .tokens_per_step = double(B * T)};
//   train::FitData<decltype(trainer)> data;
//   data.batch = [&](int step) { return trainer.microbatches(inputs_of(step), targets_of(step)); };
//   data.evaluate = [&](int) { return trainer.evaluate(validation_batch); };
//   const train::FitReport r = train::fit(trainer, fo, data);   // every rank together
//   train::print_report(r);                                        // rank 0 prints (train/report.hpp)
//
// First, one all-gather: every rank's options must be the same (require_same_settings), else
// every rank throws, naming the option and the ranks.
// One step of fit(), every rank together:
//   1. data.batch(step) (every rank draws the same batch and keeps its micro-batches);
//   2. a barrier on the world (the mesh's root communicator), so the step is timed on all ranks
//      together; then Trainer::run_schedule and Trainer::update, timed;
//   3. the loss brought to every rank (Trainer::shared_loss: one all-reduce of one double on "pp");
//   4. with check_finite, the loss and this rank's parameters (no communication); the monitor's
//      bar (rank 0); data.evaluate every eval_every steps and after the last (the validation line
//      through the monitor, data.eval_note's text appended); a checkpoint every save_every steps
//      (Trainer::save: the step, the data position = the step, data.state()'s string).
// The first step is measured against the memory budgets (two all-reduces per active budget, in
// MemoryBudget::check_step); the second (or the only) step's ledger peak by tag and its
// collectives (a CommLog: by "kind on group", with bytes inside and across hosts) go to the report.
// After the last step: Trainer::finish (a replica sync's outer all-reduces land), the monitor's
// finish (with --trace: the traces gathered on rank 0), then two all-reduces (max) over the world
// bring the largest rank's step peaks and phase peaks (Trainer::memory) into every rank's report.
// Resuming (resume_dir) loads the checkpoint (Trainer::resume: collective), restores the data
// source from its saved state and continues after the saved step.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/settings_agreement.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/memory_ledger.hpp"
#include "dtensor/mesh/hosts.hpp"
#include "dtensor/optim/check_finite.hpp"
#include "dtensor/optim/memory_budget.hpp"
#include "dtensor/trace/training_monitor.hpp"
#include "dtensor/trace/unit_spans.hpp"
#include "dtensor/train/trainer.hpp"

namespace dtensor::train {

/// The collectives of one step by "kind on group" (e.g. "all_reduce on pp"): (count, bytes).
using CommSummary = std::map<std::string, std::pair<std::size_t, std::size_t>>;

/// How fit() runs (the Trainer's own options say what one step is).
struct FitOptions {
  int steps = 0;       // the last step, counted from the run's very first (a resumed run continues to it); >= 1
  int eval_every = 1;  // data.evaluate after every this many steps, and after the last; >= 1
  int save_every = 0;  // 0: no checkpoints; else one after every this many steps, into save_dir
  std::string save_dir{};
  std::string resume_dir{};                     // non-empty: load this checkpoint first and continue after its step
  std::map<std::string, std::string> config{};  // saved with each checkpoint; a resumed one must match it
  bool allow_finished = false;       // a checkpoint at or past `steps` (or steps 0): steps_run 0, not an error
  double tokens_per_step = 0;        // over all ranks: the report's tokens/s and the bar's
  bool check_finite = false;         // after each step: the loss and this rank's parameters finite, else an Error
  std::string trace_path{};          // a Chrome trace of the second step and two more (trace::TrainingMonitor)
  std::string plot_path{};           // the loss curves as an SVG
  bool progress_bar = true;          // false: a line "step N  loss X" per step on rank 0 instead of the bar
  std::vector<std::string> hosts{};  // host_names(mesh.root()) under a process backend: bytes split inside/across hosts
  optim::MemoryBudget host_budget{.space = "host"};  // checked over the first step (inactive: bytes 0)
  optim::MemoryBudget device_budget{.space = "cuda"};
  // A ledger this rank opened before building the trainer: the step peaks count everything the
  // rank held since. Null: what the trainer holds (Trainer::held_by_tag) plus what fit() allocates.
  const MemoryLedger* rank_ledger = nullptr;
};

/// Where the batches come from, and what the program adds (only `batch` is required).
template <class Tr>
struct FitData {
  using Microbatches = typename Tr::Microbatches;
  using Stats = parallel::pipeline::StepStats;    // the last training step's (its pipeline idle time)
  std::function<Microbatches(int step)> batch{};  // step's micro-batches (Trainer::microbatches)
  std::function<double(int step)> evaluate{};     // the validation loss after `step`, every rank together
  std::function<std::string(int step, const Stats&)> eval_note{};  // appended to the validation line
  std::function<std::string()> state{};               // the data's state, saved with a checkpoint (e.g. an RNG's)
  std::function<bool(const std::string&)> restore{};  // on resume, what state() gave; false: not valid
};

/// What fit() did. Per rank, except where it says the largest rank's (reduced inside fit()).
struct FitReport {
  int rank = 0;  // this rank in the world (print_report prints on rank 0)
  int first_step = 1, last_step = 0, steps_run = 0;
  bool resumed = false;
  std::vector<double> losses;                      // each step's training loss (every rank), first_step..last_step
  std::vector<std::pair<int, double>> validation;  // (step, loss) of each evaluation
  double first_loss = 0, train_loss = 0, val_loss = 0;
  double elapsed = 0;                        // seconds in the timed steps (schedule and update)
  double tokens_per_second = 0;              // tokens_per_step * steps_run / elapsed
  double first_step_seconds = 0;             // the first timed step's (one-time set-up: cuDNN graphs, GEMM heuristics)
  double tokens_per_second_after_first = 0;  // the steps after the first (0 with one step)
  std::string space;                         // the memory space of the model: "host", "cuda"
  int peak_step = 0;                     // the step whose peaks and collectives are reported (the second, or the only)
  std::vector<std::int64_t> step_peaks;  // by MemoryTag, then all tags at once: the largest rank's peak in peak_step
  std::vector<MemoryPhase> phases;       // Trainer::memory(), each figure the largest rank's
  CommSummary collectives;               // this rank's collectives of peak_step
  CommSummary host_split;                // per line of collectives: (bytes inside a host, bytes across hosts)
  int hosts = 1;                         // the hosts the mesh spans (FitOptions::hosts)
};

namespace detail {
/// This rank's peak bytes during `step` (a ledger scope around one step, inside `rank`, the rank's
/// own since it began), by tag and then in total: what the rank held when the step began plus
/// the most the step added at once.
inline std::vector<std::int64_t> rank_step_peaks(const MemoryLedger& rank, const MemoryLedger& step,
                                                 std::string_view space) {
  std::vector<std::int64_t> peaks(memory_tag_count + 1);
  for (std::size_t t = 0; t < memory_tag_count; ++t)
    peaks[t] = rank.current(space, MemoryTag(t)) - step.current(space, MemoryTag(t)) + step.peak(space, MemoryTag(t));
  peaks[memory_tag_count] = rank.current(space) - step.current(space) + step.peak(space);
  return peaks;
}

inline void check_fit_options(const FitOptions& o) {
  if (o.steps < (o.allow_finished ? 0 : 1))
    throw Error("train::fit", std::string("needs steps >= ") + (o.allow_finished ? "0" : "1") +
                                  " (the last step), got " + std::to_string(o.steps));
  if (o.eval_every < 1)
    throw Error("train::fit",
                "needs eval_every >= 1 (evaluate after every that many steps), got " + std::to_string(o.eval_every));
  if (o.save_every < 0)
    throw Error("train::fit", "needs save_every >= 0 (0: no checkpoints), got " + std::to_string(o.save_every));
  if (o.save_every > 0 && o.save_dir.empty())
    throw Error("train::fit",
                "save_every " + std::to_string(o.save_every) + " needs a save_dir to write the checkpoints to");
}
}  // namespace detail

/// A short note for the validation line: the pipeline's idle fraction of the last step.
inline std::string idle_note(const parallel::pipeline::StepStats& stats) {
  char idle[64];
  std::snprintf(idle, sizeof idle, "  pipeline idle %.3f (counted slots, rank 0)", stats.idle_fraction());
  return idle;
}

/// Trains `trainer` through steps first..o.steps (see the top of this file); every rank of the
/// trainer's mesh together, with the same options. A dtensor::Error naming "train::fit" for bad
/// options or a checkpoint that cannot be resumed (on every rank alike).
template <class Tr>
FitReport fit(Tr& trainer, const FitOptions& o, const FitData<Tr>& data) {
  using Mesh = typename Tr::Mesh;
  const Mesh& mesh = trainer.mesh();
  const CommPtr& world = mesh.root_ptr();
  // First, every rank's options against the others' (one all-gather; comm/settings_agreement.hpp):
  // a rank told to run more steps, or to save or evaluate at other steps, would otherwise wait in
  // a collective the others never reach. Then the checks, alike on every rank.
  require_same_settings(*world, "train::fit",
                        {{"steps", std::to_string(o.steps)},
                         {"eval_every", std::to_string(o.eval_every)},
                         {"save_every", std::to_string(o.save_every)},
                         {"save_dir", o.save_dir},
                         {"resume_dir", o.resume_dir},
                         {"allow_finished", std::to_string(int(o.allow_finished))},
                         {"check_finite", std::to_string(int(o.check_finite))},
                         {"trace_path", o.trace_path},
                         {"plot_path", o.plot_path},
                         {"evaluate", std::to_string(int(bool(data.evaluate)))}});
  detail::check_fit_options(o);
  if (!data.batch) throw Error("train::fit", "needs data.batch, the step's micro-batches");
  const std::string space(Tr::Space::name);
  // This rank's allocations from here on (its thread's): the step's peak by tag is reported
  // against what the rank held when the step began (o.rank_ledger's, or the trainer's and ours).
  MemoryLedger since_fit;
  const auto held_at_start = trainer.held_by_tag();
  const std::int64_t held_total_at_start = trainer.held_total();
  FitReport r;
  r.rank = world->rank();
  r.space = space;
  r.step_peaks.assign(memory_tag_count + 1, 0);

  // ---- resume: the trainer's state, then the data source's
  if (!o.resume_dir.empty()) {
    const checkpoint::TrainingMeta meta = trainer.resume(o.resume_dir, o.config);
    if (meta.data_position != std::uint64_t(meta.step) || (data.restore && !data.restore(meta.rng_state)))
      throw Error("train::fit",
                  "the checkpoint at " + o.resume_dir + " has no valid data position or batch generator state");
    // Compared as saved (int64), before narrowing: a step past int's range must not wrap.
    if (meta.step < 0)
      throw Error("train::fit", "the checkpoint at " + o.resume_dir + " records step " + std::to_string(meta.step) +
                                    ": a step count is never negative");
    if (meta.step >= o.steps && !o.allow_finished)
      throw Error("train::fit", "the checkpoint at " + o.resume_dir + " is at step " + std::to_string(meta.step) +
                                    ": nothing left to train up to --steps " + std::to_string(o.steps) +
                                    " (the total)");
    r.first_step = int(std::min<std::int64_t>(meta.step, o.steps)) + 1;
    r.resumed = true;
    if (r.rank == 0) std::printf("resumed from %s at step %lld\n", o.resume_dir.c_str(), (long long)meta.step);
  }
  if (r.first_step > o.steps) return r;  // nothing to train (allow_finished)
  r.last_step = o.steps;
  r.peak_step = std::min(r.first_step + 1, o.steps);  // the first builds the optimizer state

  // Across machines: a collective's group crosses hosts or not (mesh/hosts.hpp).
  const auto placed =
      mesh_hosts(mesh, o.hosts.empty() ? std::vector<std::string>(std::size_t(world->size()), "") : o.hosts);
  r.hosts = placed.count;
  trace::TrainingMonitor monitor(world, {.trace_path = o.trace_path,
                                         .plot_path = o.plot_path,
                                         .first_traced_step = r.peak_step,  // after a resume too
                                         .total_steps = o.steps,
                                         .tokens_per_step = o.tokens_per_step,
                                         .progress = o.progress_bar});
  auto save_checkpoint = [&](int step) {
    const checkpoint::TrainingMeta meta{.step = step,
                                        .data_position = std::uint64_t(step),
                                        .rng_state = data.state ? data.state() : std::string(),
                                        .config = o.config};
    trainer.save(o.save_dir, meta);
    char saved[32];
    std::snprintf(saved, sizeof saved, "step %4d", step);
    monitor.message(std::string(saved) + "  checkpoint saved to " + o.save_dir);  // rank 0, above the bar
  };
  if (!o.trace_path.empty())  // a span per unit; after FSDP has set its hooks
    for (auto& stage : trainer.stages()) trace::trace_units(stage);

  for (int step = r.first_step; step <= o.steps; ++step) {
    const auto batch = data.batch(step);
    world->barrier();  // time the step on all ranks together
    const auto t0 = std::chrono::steady_clock::now();
    parallel::pipeline::StepStats stats;
    // The memory budgets: this rank's allocations over the first step (steps are alike).
    const bool budget_step = step == r.first_step && (o.host_budget.active() || o.device_budget.active());
    const std::int64_t host_before = o.host_budget.held(), device_before = o.device_budget.held();
    const bool peak_step = step == r.peak_step;
    std::optional<MemoryLedger> step_ledger;
    if (budget_step || peak_step) step_ledger.emplace();
    {
      auto traced = monitor.step(step);
      CommLog log;
      stats = trainer.run_schedule(batch);  // the schedule, then the gradient syncs over dp, fsdp, cp, tp (and edp)
      trainer.update();  // the replica sync, clipping, the optimizer, the outer sync when due, ZeRO-1/2's all-gather
      if (peak_step)
        for (const auto& c : log.records()) {
          const auto key = std::string(name_of(c.kind)) + " on " + c.group;
          auto& e = r.collectives[key];
          ++e.first;
          e.second += c.bytes;
          if (placed.count > 1) {
            // A mesh group's label names its dimensions; the pipeline's sends and receives go to
            // a peer on the world communicator, whose host is known directly.
            std::optional<bool> crosses = crosses_hosts(mesh, o.hosts, c.group);
            if (!crosses && c.group == "world" && c.peer >= 0 && std::size_t(c.peer) < o.hosts.size())
              crosses = o.hosts[std::size_t(c.peer)] != o.hosts[std::size_t(world->rank())];
            if (crosses) (*crosses ? r.host_split[key].second : r.host_split[key].first) += c.bytes;
          }
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.elapsed += seconds;
    if (step == r.first_step) r.first_step_seconds = seconds;
    if (budget_step) {  // not timed
      o.host_budget.check_step(*world, *step_ledger, host_before, "a larger budget, or less held in the step");
      o.device_budget.check_step(*world, *step_ledger, device_before, "a larger budget, or less held in the step");
    }
    if (peak_step) {
      r.step_peaks = detail::rank_step_peaks(o.rank_ledger ? *o.rank_ledger : since_fit, *step_ledger, space);
      if (!o.rank_ledger) {
        for (std::size_t t = 0; t < memory_tag_count; ++t) r.step_peaks[t] += held_at_start[t];
        r.step_peaks[memory_tag_count] += held_total_at_start;
      }
    }
    r.train_loss = trainer.shared_loss(stats);  // not timed
    r.losses.push_back(r.train_loss);
    if (step == r.first_step) r.first_loss = r.train_loss;
    if (o.check_finite) {
      optim::check_finite_loss(r.train_loss, step);
      optim::check_finite(trainer.params(), step, "parameter", world->rank());
    }
    monitor.train_loss(step, r.train_loss);  // the bar (rank 0) and the curve
    if (!o.progress_bar) {
      char line[64];
      std::snprintf(line, sizeof line, "step %4d  loss %.4f", step, r.train_loss);
      monitor.message(line);
    }
    if (data.evaluate && (step % o.eval_every == 0 || step == o.steps)) {
      r.val_loss = data.evaluate(step);
      r.validation.emplace_back(step, r.val_loss);
      // One line, through the monitor: on a terminal it goes above the bar, not onto it.
      monitor.validation_loss(step, r.val_loss, data.eval_note ? data.eval_note(step, stats) : std::string());
    }
    if (o.save_every > 0 && step % o.save_every == 0) save_checkpoint(step);
  }
  trainer.finish();  // a replica sync's outer all-reduces still in flight land before the end
  monitor.finish();
  r.steps_run = o.steps - r.first_step + 1;
  r.tokens_per_second = r.elapsed > 0 ? o.tokens_per_step * r.steps_run / r.elapsed : 0;
  if (r.steps_run > 1 && r.elapsed > r.first_step_seconds)
    r.tokens_per_second_after_first = o.tokens_per_step * (r.steps_run - 1) / (r.elapsed - r.first_step_seconds);
  // Each rank's own step peak by tag, the largest over the ranks (one all-reduce).
  world->all_reduce(std::span<std::int64_t>(r.step_peaks), ReduceOp::max);
  // The trainer's own peaks by phase and tag (Trainer::memory), the largest rank's (one all-reduce).
  std::vector<std::int64_t> phase_peaks;
  for (const auto& ph : trainer.memory()) {
    phase_peaks.insert(phase_peaks.end(), ph.peak.begin(), ph.peak.end());
    phase_peaks.push_back(ph.total);
  }
  world->all_reduce(std::span<std::int64_t>(phase_peaks), ReduceOp::max);
  for (std::size_t ph = 0; ph < trainer.memory().size(); ++ph) {
    MemoryPhase p{trainer.memory()[ph].name};
    const auto* peaks = phase_peaks.data() + ph * (memory_tag_count + 1);
    std::copy(peaks, peaks + memory_tag_count, p.peak.begin());
    p.total = peaks[memory_tag_count];
    r.phases.push_back(std::move(p));
  }
  return r;
}

}  // namespace dtensor::train
