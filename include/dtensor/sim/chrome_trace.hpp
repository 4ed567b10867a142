// dtensor/sim/chrome_trace.hpp — the estimated step of one rank class as a Chrome trace.
//
//   auto est = sim::estimate_step(report, topology, schedule);      // sim/cost_model.hpp
//   std::ofstream("step.json") << sim::chrome_trace(est, /*pipeline_rank=*/0, report.name);
//   // open in chrome://tracing or ui.perfetto.dev
//
// Track "compute" holds what the schedule runs on that pipeline rank (F, B, I, W per
// micro-batch, from the simulated timeline), then the once-per-step phases; track
// "communication" holds each of those spans' communication, from its start (a span's exposed
// part is what runs past its compute). Times in microseconds, as the format wants. A plain JSON
// writer: trace/ (real runs) is not needed.
#pragma once

#include <cstddef>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"
#include "dtensor/core/json.hpp"
#include "dtensor/sim/cost_model.hpp"

namespace dtensor::sim {

using dtensor::detail::json_string;

/// The Chrome trace (JSON) of `est` on pipeline rank `pipeline_rank` (see the synopsis).
inline std::string chrome_trace(const StepEstimate& est, int pipeline_rank, std::string_view name) {
  if (pipeline_rank < 0 || std::size_t(pipeline_rank) >= est.timeline.actions.size())
    throw Error("sim::chrome_trace", dtensor::detail::cat("pipeline rank ", pipeline_rank, " of a schedule of ",
                                                          est.timeline.actions.size(), " ranks"));
  std::ostringstream s;
  bool first = true;
  auto span = [&](std::string_view label, int track, double start, double seconds) {
    if (seconds <= 0) return;
    s << (first ? "\n" : ",\n") << "{\"name\":" << json_string(label) << ",\"ph\":\"X\",\"pid\":0,\"tid\":"
      << track << ",\"ts\":" << start * 1e6 << ",\"dur\":" << seconds * 1e6 << "}";
    first = false;
  };
  auto phase_named = [&](std::string_view phase) -> const PhaseTime* {
    for (const auto& p : est.phases)
      if (p.name == phase) return &p;
    return nullptr;
  };
  s << std::setprecision(12) << "{\"traceEvents\":[";
  s << "\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":" << json_string(name) << "}}";
  s << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"compute\"}}";
  s << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"communication\"}}";
  first = false;
  for (const auto& timed : est.timeline.actions[std::size_t(pipeline_rank)]) {
    if (!parallel::pipeline::is_compute(timed.action.kind)) continue;
    const std::string label = parallel::pipeline::to_string(timed.action);
    span(label, 0, timed.start, timed.end - timed.start);
    const char* phase = timed.action.kind == parallel::pipeline::ActionKind::forward ? "forward"
                        : timed.action.kind == parallel::pipeline::ActionKind::backward_weight ? "backward_weight"
                        : phase_named("backward_input") ? "backward_input"
                                                        : "backward";
    if (const PhaseTime* p = phase_named(phase))
      span(label + " communication", 1, timed.start, p->communication / est.stages_per_rank);
  }
  double at = est.pipeline_seconds;
  for (const auto& p : est.phases) {
    if (detail::is_microbatch_phase(p.name)) continue;
    span(p.name, 0, at, p.total());
    span(p.name + " communication", 1, at, p.communication);
    at += p.total();
  }
  s << "\n]}\n";
  return s.str();
}

}  // namespace dtensor::sim
