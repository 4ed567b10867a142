// dtensor/sim/cost_model.hpp — a step's time estimated from a rank report.
//
//   sim::Hardware h100;                                   // defaults: H100 SXM, see below
//   sim::Topology topo(Mesh::names, mesh_shape, h100);    // which mesh dims are inside a node
//   sim::collective_seconds(record, topo.link(record.group));
//   auto est = sim::estimate_step(report, topo, h100, pipeline::one_f_one_b(pp, m), /*stages_per_rank=*/1);
//   est.step_seconds;  est.bubble_fraction;  est.exposed_communication_seconds;
//
// Compute: a phase's FLOPs (kernels/meta CostLog) over peak FLOP/s times an efficiency.
// Communication: every collective costs steps x latency + bytes on the wire / bandwidth of its
// link, with the ring algorithms' figures (comm_log.hpp wire_bytes): for a group of n ranks and a
// buffer of S bytes (the larger of input and output),
//   all-gather, reduce-scatter, all-to-all:  (n-1) latencies + (n-1)/n S / B
//   all-reduce:   the cheaper of ring 2(n-1) latencies + 2(n-1)/n S / B
//                 and tree (NCCL's double binary tree) 2 log2(n) latencies + 2(n-1)/n S / B
//   broadcast:    (n-1) latencies + S / B  (pipelined ring)
//   send, recv, send/recv: 1 latency + S / B
// A group's link is NVLink when all its mesh dimensions lie inside a node, InfiniBand otherwise;
// the dimensions inside a node are the innermost ones while their product is at most
// gpus_per_node (a mesh is laid out row-major over the ranks, nodes holding consecutive ranks).
// Overlap: the communication of a phase the program marked overlapped (Recorder::phase) hides
// behind that phase's compute, so only max(0, communication - compute) is exposed; in other
// phases all of it is.
// Schedule: the phases named "forward", "backward" (or "backward_input" and "backward_weight")
// are one micro-batch on this rank's stages; their times, divided by the stages per rank, are
// the costs of the pipeline simulator (parallel/pipeline/simulate.hpp), whose makespan over the
// schedule is the pipeline's time (bubbles included). Every other phase runs once per step,
// after it (the optimizer step, a gradient reduction that is not overlapped).
//
// Defaults (H100 SXM, documented in docs/dry-run.md): 989e12 dense bf16 FLOP/s; efficiency 0.4
// (the 38-43 % MFU the Llama 3 report gives for its 16K-GPU runs); nodes of 8 GPUs; NVLink 4
// 450e9 B/s per direction per GPU; InfiniBand 400 Gb/s per GPU = 50e9 B/s; latencies 3 us
// (NVLink) and 6 us (InfiniBand), the order nccl-tests shows for small messages. All are inputs.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/parallel/pipeline/simulate.hpp"
#include "dtensor/sim/report.hpp"

namespace dtensor::sim {

/// One class of link, per GPU and direction.
struct Link {
  double latency_seconds = 0;
  double bytes_per_second = 1;
};

struct Hardware {
  double peak_flops = 989e12;  // H100 SXM, dense bf16
  double efficiency = 0.4;     // achieved / peak for the model's compute
  int gpus_per_node = 8;
  Link nvlink{3e-6, 450e9};
  Link infiniband{6e-6, 50e9};

  void check(const char* op) const {
    if (!(peak_flops > 0) || !(efficiency > 0 && efficiency <= 1) || gpus_per_node < 1 ||
        !(nvlink.bytes_per_second > 0) || !(infiniband.bytes_per_second > 0) || nvlink.latency_seconds < 0 ||
        infiniband.latency_seconds < 0)
      throw Error(op, dtensor::detail::cat("hardware: peak ", peak_flops, " FLOP/s, efficiency ", efficiency, ", ",
                                  gpus_per_node, " GPUs per node, bandwidths ", nvlink.bytes_per_second, " / ",
                                  infiniband.bytes_per_second,
                                  " B/s: need positive figures, efficiency in (0, 1], latencies >= 0"));
  }
};

/// Which mesh dimensions lie inside a node (see the synopsis).
template <std::size_t N>
std::array<bool, N> dims_inside_node(const std::array<int, N>& shape, int gpus_per_node) {
  std::array<bool, N> inside{};
  long long product = 1;
  for (std::size_t d = N; d-- > 0;) {
    product *= shape[d];
    if (product > gpus_per_node) break;
    inside[d] = true;
  }
  return inside;
}

/// The link each group of a mesh uses, by the group's label ("tp", "dp*tp"; "world" is all).
class Topology {
 public:
  template <std::size_t N>
  Topology(const std::array<std::string_view, N>& names, const std::array<int, N>& shape, const Hardware& hw)
      : hardware_(hw) {
    hw.check("sim::Topology");
    add_dims(names, shape);
  }

  /// The dimensions of a second factorization of the same ranks (an expert mesh: pp, edp, ep,
  /// tp), row-major over the world as the first: those whose names are new join the lookup.
  template <std::size_t N>
  void add_dims(const std::array<std::string_view, N>& names, const std::array<int, N>& shape) {
    const auto inside = dims_inside_node(shape, hardware_.gpus_per_node);
    for (std::size_t d = 0; d < N; ++d)
      if (std::none_of(dims_.begin(), dims_.end(), [&](const Dim& dim) { return dim.name == names[d]; }))
        dims_.push_back({std::string(names[d]), inside[d]});
  }

  /// Whether every mesh dimension of the group `label` lies inside a node.
  bool inside_node(std::string_view label) const {
    if (label == "world") {
      for (const auto& d : dims_)
        if (!d.inside) return false;
      return true;
    }
    std::size_t begin = 0;
    while (begin <= label.size()) {
      const std::size_t end = std::min(label.find('*', begin), label.size());
      const std::string_view name = label.substr(begin, end - begin);
      const auto it = std::find_if(dims_.begin(), dims_.end(), [&](const Dim& d) { return d.name == name; });
      if (it == dims_.end())
        throw Error("sim::Topology", dtensor::detail::cat("group '", label, "' names no mesh dimension '", name, "'"));
      if (!it->inside) return false;
      begin = end + 1;
    }
    return true;
  }
  const Link& link(std::string_view label) const {
    return inside_node(label) ? hardware_.nvlink : hardware_.infiniband;
  }
  const Hardware& hardware() const noexcept { return hardware_; }

 private:
  struct Dim {
    std::string name;
    bool inside = false;
  };
  Hardware hardware_;
  std::vector<Dim> dims_;
};

/// Seconds one collective takes on `link` (the formulas of the synopsis).
inline double collective_seconds(const CommRecord& r, const Link& link) {
  const double n = r.group_size;
  if (r.group_size <= 1 || r.kind == CollectiveKind::split) return 0;
  const auto w = r.wire();
  const double bandwidth_term = double(std::max(w.sent, w.received)) / link.bytes_per_second;
  const double alpha = link.latency_seconds;
  switch (r.kind) {
    case CollectiveKind::all_reduce:
      return std::min(2 * (n - 1), 2 * std::ceil(std::log2(n))) * alpha + bandwidth_term;
    case CollectiveKind::send:
    case CollectiveKind::recv:
    case CollectiveKind::send_recv: return alpha + bandwidth_term;
    case CollectiveKind::barrier: return std::ceil(std::log2(n)) * alpha;
    default: return (n - 1) * alpha + bandwidth_term;
  }
}

/// A phase's compute, communication and the part of that communication not hidden.
struct PhaseTime {
  std::string name;
  double compute = 0, communication = 0, exposed = 0;
  double total() const { return compute + exposed; }
};

inline PhaseTime phase_time(const PhaseReport& phase, const Topology& topology) {
  PhaseTime t;
  t.name = phase.name;
  const Hardware& hw = topology.hardware();
  t.compute = double(phase.flops()) / (hw.peak_flops * hw.efficiency);
  for (const auto& r : phase.collectives) t.communication += collective_seconds(r, topology.link(r.group));
  t.exposed = phase.overlapped ? std::max(0.0, t.communication - t.compute) : t.communication;
  return t;
}

struct StepEstimate {
  std::vector<PhaseTime> phases;
  parallel::pipeline::Costs stage_costs;  // seconds per micro-batch per stage
  parallel::pipeline::Timeline timeline;  // the schedule with those costs
  int stages_per_rank = 1;                // pipeline stages on each rank (interleaved: v)
  double pipeline_seconds = 0;            // the schedule's makespan
  double bubble_fraction = 0;             // the schedule's mean idle share
  double once_per_step_seconds = 0;       // the phases outside the schedule
  double step_seconds = 0;
  double compute_seconds = 0, communication_seconds = 0, exposed_communication_seconds = 0;  // per step
};

namespace detail {
inline bool is_microbatch_phase(std::string_view name) {
  return name == "forward" || name == "backward" || name == "backward_input" || name == "backward_weight";
}
}  // namespace detail

/// The step time of the rank class `report` under `schedule` (see the synopsis).
inline StepEstimate estimate_step(const RankReport& report, const Topology& topology,
                                  const parallel::pipeline::Schedule& schedule, int stages_per_rank = 1) {
  if (stages_per_rank < 1)
    throw Error("sim::estimate_step", dtensor::detail::cat("stages_per_rank ", stages_per_rank, " of ", report.name));
  StepEstimate est;
  est.stages_per_rank = stages_per_rank;
  auto& costs = est.stage_costs;
  costs = {0, 0, 0};
  for (const auto& ph : report.phases) {
    const PhaseTime t = phase_time(ph, topology);
    est.phases.push_back(t);
    const double per_stage = t.total() / stages_per_rank;
    const double microbatches = detail::is_microbatch_phase(ph.name) ? schedule.microbatches : 1;
    est.compute_seconds += t.compute * microbatches;
    est.communication_seconds += t.communication * microbatches;
    est.exposed_communication_seconds += t.exposed * microbatches;
    if (ph.name == "forward") costs.forward += per_stage;
    else if (ph.name == "backward" || ph.name == "backward_input") costs.backward_input += per_stage;
    else if (ph.name == "backward_weight") costs.backward_weight += per_stage;
    else est.once_per_step_seconds += t.total();
  }
  est.timeline = parallel::pipeline::simulate(schedule, costs);
  if (!est.timeline.deadlock.empty())
    throw Error("sim::estimate_step", dtensor::detail::cat("the schedule deadlocks (", est.timeline.deadlock.size(),
                                                  " ranks stuck) for ", report.name));
  est.pipeline_seconds = est.timeline.makespan;
  est.bubble_fraction = est.timeline.bubble();
  est.step_seconds = est.pipeline_seconds + est.once_per_step_seconds;
  return est;
}

}  // namespace dtensor::sim
