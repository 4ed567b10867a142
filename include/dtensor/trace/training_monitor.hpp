// dtensor/trace/training_monitor.hpp — what a trainer needs for --trace, --plot and the progress bar.
//
//   trace::TrainingMonitor monitor(world, {.trace_path = o.trace, .plot_path = o.plot,
//                                          .total_steps = o.steps, .tokens_per_step = B * T});
//   trace::trace_units(model);                          // optional: a span per model unit
//   for (int step = 1; step <= o.steps; ++step) {
//     { auto traced = monitor.step(step); ...forward, backward, optimizer... }
//     monitor.train_loss(step, loss);                   // the bar (rank 0) and the train curve
//     if (eval) monitor.validation_loss(step, val);     // a line (rank 0) and the validation curve
//     monitor.message("checkpoint saved");              // any other line (rank 0): above the bar
//   }
//   monitor.finish();                                   // collective: writes the trace and the plot
//
// Every rank keeps its own Trace and records the steps first_traced_step .. + traced_steps - 1
// (the first step, with its warm-up allocations, is left out by default); finish() merges the
// ranks' tracks on rank 0 through the communicator (trace/gather_trace.hpp), which works alike on
// the threads and MPI backends, and rank 0 writes the Chrome trace and the SVG plot and says
// where they went. Rank 0 alone prints: a bar on a terminal, plain lines elsewhere. Every line a
// trainer prints while the bar is up goes through message() (or validation_loss()), which puts it
// on a line of its own above the bar: a printf would run onto the bar's line.
#pragma once

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "dtensor/comm/communicator.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/trace/gather_trace.hpp"
#include "dtensor/trace/loss_plot.hpp"
#include "dtensor/trace/progress_bar.hpp"
#include "dtensor/trace/trace_scope.hpp"

namespace dtensor::trace {

struct MonitorOptions {
  std::string trace_path;      // empty: no trace
  std::string plot_path;       // empty: no plot
  int first_traced_step = 2;   // clamped to the last step when there are fewer
  int traced_steps = 3;
  int total_steps = 0;
  double tokens_per_step = 0;  // over all ranks
  int plain_every = 1;         // not a terminal: a line every this many steps
  bool progress = true;        // false: no bar; message() and validation_loss() print plain lines (rank 0)
  std::string plot_title = "loss";
};

class TrainingMonitor {
 public:
  /// While alive, the step is traced on this rank (when it is one of the traced steps).
  class StepScope {
   public:
    StepScope(Trace* trace, int rank, int step) {
      if (trace == nullptr) return;
      scope_.emplace(*trace, rank);
      span_.emplace("step " + std::to_string(step));
    }

   private:
    std::optional<TraceScope> scope_;  // declared first: the span ends before the scope
    std::optional<ComputeSpan> span_;
  };

  TrainingMonitor(CommPtr world, MonitorOptions o, std::ostream& out = std::cout)
      : world_(std::move(world)), o_(std::move(o)), out_(out) {
    if (!world_) throw Error("trace::TrainingMonitor", "needs a communicator");
    if (o_.total_steps < 1 || o_.traced_steps < 1 || o_.first_traced_step < 1)
      world_->fail("trace::TrainingMonitor",
                   dtensor::detail::cat("needs total_steps >= 1 (got ", o_.total_steps, "), traced_steps >= 1 (got ",
                                        o_.traced_steps, ") and first_traced_step >= 1 (got ", o_.first_traced_step,
                                        ")"));
    o_.first_traced_step = std::min(o_.first_traced_step, o_.total_steps);
    if (world_->rank() == 0 && o_.progress)
      bar_.emplace(out_, ProgressOptions{.total_steps = o_.total_steps,
                                         .tokens_per_step = o_.tokens_per_step,
                                         .plain_every = o_.plain_every});
    curves_[0].label = "train";
    curves_[1].label = "validation";
  }

  /// Opens step `step`: traced when --trace was given and the step is among the traced ones.
  StepScope step(int step) {
    const bool traced = !o_.trace_path.empty() && step >= o_.first_traced_step &&
                        step < o_.first_traced_step + o_.traced_steps;
    return StepScope(traced ? &trace_ : nullptr, world_->world_rank(), step);
  }
  /// Step `step` ended with the (global) training loss `loss`.
  void train_loss(int step, double loss) {
    curves_[0].steps.push_back(step);
    curves_[0].losses.push_back(loss);
    if (bar_) bar_->update(step, loss);
  }
  /// The validation loss measured after step `step`; `more` is added to the same line (rank 0).
  void validation_loss(int step, double loss, const std::string& more = {}) {
    curves_[1].steps.push_back(step);
    curves_[1].losses.push_back(loss);
    char text[96];
    std::snprintf(text, sizeof text, "step %4d  validation loss %.4f", step, loss);
    message(text + more);
  }
  /// A line of its own (rank 0; the other ranks print nothing), above the bar on a terminal.
  void message(const std::string& text) {
    if (bar_) bar_->message(text);
    else if (world_->rank() == 0) out_ << text << '\n' << std::flush;
  }
  /// Ends the bar; writes the trace (collective over the world) and the plot; rank 0 says where.
  void finish() {
    if (bar_) bar_->finish();
    if (!o_.trace_path.empty()) write_chrome_trace(trace_, *world_, o_.trace_path);
    if (world_->rank() != 0) return;
    if (!o_.trace_path.empty())
      out_ << "trace of steps " << o_.first_traced_step << ".."
           << std::min(o_.total_steps, o_.first_traced_step + o_.traced_steps - 1) << " written to " << o_.trace_path
           << " (open it in https://ui.perfetto.dev)\n";
    if (!o_.plot_path.empty()) {
      write_loss_plot(o_.plot_path, {curves_[0], curves_[1]}, {.title = o_.plot_title});
      out_ << "loss curves written to " << o_.plot_path << "\n";
    }
    out_ << std::flush;
  }

  const Trace& trace() const noexcept { return trace_; }

 private:
  CommPtr world_;
  MonitorOptions o_;
  std::ostream& out_;
  Trace trace_;
  std::optional<ProgressBar> bar_;
  LossCurve curves_[2];  // train, validation
};

}  // namespace dtensor::trace
