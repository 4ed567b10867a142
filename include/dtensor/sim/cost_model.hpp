// dtensor/sim/cost_model.hpp — a step's time estimated from the rank reports of a dry run.
//
//   sim::Hardware h100 = sim::device("h100");              // sim/device.hpp: per-GPU figures
//   sim::Topology topo(Mesh::names, mesh_shape, h100);      // where each group's ranks sit
//   sim::collective_seconds(record, topo, record.group);    // on the group's links
//   auto est = sim::estimate_step(report, topo, pipeline::one_f_one_b(pp, m), /*stages_per_rank=*/1);
//   auto plan = sim::estimate_plan({{&report0, {0}}, {&report1, {1, 2}}}, topo, schedule);  // all classes
//   plan.step_seconds;  plan.slowest;  est.bubble_fraction;  est.exposed_communication_seconds;
//
// Compute, per op of the meta kernels' CostLog (a roofline):
//   time = max(FLOPs / (peak x efficiency), bytes moved / (HBM bandwidth x hbm_fraction))
// where a GEMM's efficiency depends on its shape through its arithmetic intensity I = FLOPs per
// byte moved: gemm_max_fraction x I / (I + gemm_half_intensity) (small or skinny GEMMs reach
// less of the peak than large square ones), times its wave efficiency (its output tiles over the
// device's SMs, the last wave partly empty), plus the device's fixed time per GEMM (the record's
// shape: gemm_wave_efficiency, op_seconds); fused attention runs at attention_fraction; every
// other op (pointwise, norms, the optimizer) at the fp32 vector peak, in practice bound by bytes.
// Communication: every collective costs steps x latency + bytes on the wire / (bandwidth of its
// link x link_fraction), with the ring algorithms' figures (comm_log.hpp wire_bytes): for a group
// of n ranks and a buffer of S bytes (the larger of input and output),
//   all-gather, reduce-scatter, all-to-all:  (n-1) latencies + (n-1)/n S / B
//   all-reduce:   the cheaper of ring 2(n-1) latencies + 2(n-1)/n S / B
//                 and tree (NCCL's double binary tree) 2 log2(n) latencies + 2(n-1)/n S / B
//   broadcast:    (n-1) latencies + S / B  (pipelined ring)
//   send, recv, send/recv: 1 latency + S / B
// on NVLink when every group of the label lies inside a node, the network otherwise (a ring or
// tree across nodes runs at its slowest hop). Where a group's ranks sit: the mesh is laid out
// row-major over the ranks, a node holds gpus_per_node consecutive ranks, and L is the fewest
// ranks of its own group any rank finds in its node (itself included; sim::GroupPlacement). An
// all-to-all across nodes (1 < L < n) sends each peer S/n: the L-1 local peers' shares over
// NVLink and the n-L others' over the network at once (NCCL posts all peers' sends and receives
// together), the rank with the fewest local peers last:
//   max((L-1) a_nvlink + (L-1)/n S / B_nvlink, (n-L) a_network + (n-L)/n S / B_network)
//
// What each collective is, and when it is paid (the overlap of each kind, stated once here):
//   gradient reduction  an all-reduce or reduce-scatter over data dimensions only (dp, fsdp,
//                       edp; and FSDP's "fsdp*cp") in any phase: once per step, after the last micro-batch (DDP's
//                       buckets, FSDP's reduce-scatter and ZeRO-1/2 all reduce the accumulated
//                       gradients then). It overlaps the last micro-batch's backward on this
//                       rank: exposed = max(0, time - that backward's compute); all of it
//                       under options.overlap_gradient_reduction = false (a published run's
//                       software that reduced after the backward). Under ZeRO
//                       (options.zero >= 1) an all-reduce is charged as the reduce-scatter it
//                       needs (a ZeRO rank keeps only its shard).
//   parameter gather    an all-gather over data dimensions in a micro-batch phase (ZeRO-3 /
//                       FSDP unshard, per unit as the schedule issues it): every micro-batch,
//                       prefetched behind that phase's compute (exposed past it).
//   context ring        a send/recv on "cp" (ring attention): behind the phase's compute.
//                       (These two hide only in a phase the program marked overlapped; the
//                       training plans mark forward and backward.)
//   everything else     exposed in full: tensor-parallel all-gathers / reduce-scatters (Megatron's
//                       TP+SP is not overlapped), context all-gathers and Ulysses all-to-alls,
//                       expert all-to-alls, pipeline sends, and every collective of a phase run
//                       once per step (the optimizer's, ZeRO's parameter sync).
//   expert all-to-all   (all_to_all / all_to_all_v on a group with "ep", or the node-level
//                       dispatch's "ep_across" / "ep_node") exposed, except under a
//                       schedule of overlapped pairs (DualPipeV: EstimateOptions::overlapped):
//                       there a forward and a full backward of two micro-batches run as a pair,
//                       each one's expert all-to-alls behind the other's compute, as DeepSeek-V3
//                       runs them (parallel/pipeline/simulate.hpp, Costs::pair_saving).
// Schedule: the phases named "forward", "backward" (or "backward_input" and "backward_weight")
// are one micro-batch on this rank's stages; their times less the once-per-step collectives,
// divided by the stages per rank, are the costs of the pipeline simulator
// (parallel/pipeline/simulate.hpp), per pipeline rank: estimate_plan takes the slowest class of
// every pipeline rank, so the makespan is the critical path across stages. A rank's step ends
// when its last action ends plus its once-per-step work; the step is the latest rank's.
//
// The calibration (struct Calibration, `calibration` below): five numbers, the same for every
// model, plan and device; three from published microbenchmarks, two fitted on a stated subset of
// the published rows, the rest held out (docs/dry-run.md). Device figures are the vendor's
// (sim/device.hpp); a power-limited device's compute_scale multiplies the GEMM and attention
// rates (Hardware::sustained_flops), fitted on that device's rows (sim::fit_device_scale).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/parallel/pipeline/simulate.hpp"
#include "dtensor/sim/device.hpp"
#include "dtensor/sim/report.hpp"

namespace dtensor::sim {

/// How well kernels and collectives reach a device's figures (docs/dry-run.md, "The calibration").
/// Three are set from published microbenchmarks and never fitted; two are fitted, by
/// sim::fit_calibration (sim/published_runs.hpp), on the published rows marked `fit` only, and
/// test_sim checks that the fit gives exactly these values. The other rows are held out.
struct Calibration {
  // Fitted (grid in sim::CalibrationGrid): the largest GEMMs' fraction of peak, within the range
  // cuBLAS reaches for large bf16 GEMMs, and the intensity (FLOP per byte moved) at which a GEMM
  // reaches half of it (small and skinny GEMMs reach less). Since a GEMM record carries its shape
  // (its waves over the SMs and the device's fixed time per GEMM price small GEMMs), the fit puts
  // the intensity term at 0 (it was 50 without them): the rows' GEMMs need no more than the shape
  // says; the curve is kept for records without a shape and for fits of other rows.
  double gemm_max_fraction = 0.87;
  double gemm_half_intensity = 0;
  // Measured, not fitted: fused attention forward and backward of the bf16 peak (FlashAttention-2
  // 0.34 and cuDNN 0.53 forward at 8K, head dim 128, on an H100: the FlashAttention-3 paper;
  // backward below forward); memory-bound kernels' fraction of HBM bandwidth (copy bandwidth);
  // a collective's bus bandwidth as a fraction of the link's (nccl-tests' busbw).
  double attention_fraction = 0.40;
  double hbm_fraction = 0.90;
  double link_fraction = 0.80;
};
inline constexpr Calibration calibration{};

/// Where a group's ranks sit (see the synopsis): its size, and the fewest of its ranks that one
/// of them finds in its own node (itself included) over every rank of the mesh. Every group of a
/// label lies inside a node when that is all of them; an all-to-all's slowest rank is the one
/// with the fewest local peers (the most bytes on the network).
struct GroupPlacement {
  int ranks = 1;
  int fewest_in_node = 1;
  bool inside_node() const noexcept { return fewest_in_node >= ranks; }
};

namespace detail {
/// The placement of the groups over the dimensions `in_group` of a row-major mesh `shape` on
/// nodes of `gpus_per_node` consecutive ranks. Two ranks share a group when their coordinates
/// agree off the group's dimensions, i.e. when their ranks less the group's coordinates times
/// their strides (the group's first rank) are equal. The count repeats every T ranks, T the
/// smallest stride x divisor of its dimension's size that whole nodes fill (a dimension of n
/// splits into n / k outer and k inner without changing any group, and nodes then nest in blocks
/// of T ranks whose outer coordinates are fixed), or the whole mesh: only [0, T) is counted.
inline GroupPlacement group_placement(const std::vector<int>& shape, const std::vector<bool>& in_group,
                                      int gpus_per_node) {
  const std::size_t dims = shape.size();
  std::vector<long long> stride(dims, 1);
  long long world = 1, period = 0;
  GroupPlacement out;
  for (std::size_t d = dims; d-- > 0;) {
    stride[d] = world;
    for (long long k = 1; period == 0 && k <= shape[d]; ++k)
      if (shape[d] % k == 0 && world * k % gpus_per_node == 0) period = world * k;
    world *= shape[d];
    if (in_group[d]) out.ranks *= shape[d];
  }
  if (period == 0) period = world;  // the mesh's own size (its last node may be partial)
  const auto first_of_group = [&](long long rank) {
    long long first = rank;
    for (std::size_t d = 0; d < dims; ++d)
      if (in_group[d]) first -= (rank / stride[d]) % shape[d] * stride[d];
    return first;
  };
  std::vector<long long> group_of(static_cast<std::size_t>(period));  // each rank's group's first rank
  for (long long r = 0; r < period; ++r) group_of[std::size_t(r)] = first_of_group(r);
  out.fewest_in_node = out.ranks;
  for (long long node = 0; node < period; node += gpus_per_node) {
    const long long end = std::min(node + gpus_per_node, period);
    for (long long r = node; r < end; ++r) {
      int in_node = 0;
      for (long long m = node; m < end; ++m) in_node += group_of[std::size_t(m)] == group_of[std::size_t(r)];
      out.fewest_in_node = std::min(out.fewest_in_node, in_node);
    }
  }
  return out;
}

/// The dimension names of a group label ("dp*tp" -> dp, tp).
inline std::vector<std::string_view> label_dims(std::string_view label) {
  std::vector<std::string_view> dims;
  std::size_t begin = 0;
  while (begin <= label.size()) {
    const std::size_t end = std::min(label.find('*', begin), label.size());
    dims.push_back(label.substr(begin, end - begin));
    begin = end + 1;
  }
  return dims;
}
}  // namespace detail

/// Where each group of a mesh sits and the links it uses, by the group's label ("tp", "dp*tp";
/// "world" is all). Placements are computed once per label and kept (not thread-safe).
class Topology {
 public:
  template <std::size_t N>
  Topology(const std::array<std::string_view, N>& names, const std::array<int, N>& shape, const Hardware& hw)
      : hardware_(hw) {
    hw.check("sim::Topology");
    add_dims(names, shape);
  }

  /// A second factorization of the same ranks (an expert mesh: pp, edp, ep, tp), row-major over
  /// the world as the first; a label is looked up in the first factorization that has all its
  /// dimensions.
  template <std::size_t N>
  void add_dims(const std::array<std::string_view, N>& names, const std::array<int, N>& shape) {
    Factorization f;
    for (std::size_t d = 0; d < N; ++d) {
      if (shape[d] < 1)
        throw Error("sim::Topology", dtensor::detail::cat("mesh dimension '", names[d], "' of size ", shape[d]));
      f.names.emplace_back(names[d]);
      f.shape.push_back(shape[d]);
    }
    factorizations_.push_back(std::move(f));
  }

  /// Where the groups of `label` sit (see GroupPlacement).
  GroupPlacement placement(std::string_view label) const {
    for (const auto& [known, p] : placements_)
      if (known == label) return p;
    const GroupPlacement p = compute_placement(label);
    placements_.emplace_back(std::string(label), p);
    return p;
  }
  /// Whether every group of `label` lies inside a node.
  bool inside_node(std::string_view label) const { return placement(label).inside_node(); }
  /// The link of a group's ring, tree and point-to-point collectives: NVLink when every group of
  /// the label lies inside a node, else the network (a ring across nodes runs at its slowest hop).
  const Link& link(std::string_view label) const {
    return inside_node(label) ? hardware_.nvlink : hardware_.infiniband;
  }
  const Hardware& hardware() const noexcept { return hardware_; }

 private:
  struct Factorization {
    std::vector<std::string> names;
    std::vector<int> shape;
  };

  GroupPlacement compute_placement(std::string_view label) const {
    const auto names = detail::label_dims(label);
    for (const auto& f : factorizations_) {
      std::vector<bool> in_group(f.names.size(), label == "world");
      bool all_found = true;
      for (const auto name : names) {
        const auto it = std::find(f.names.begin(), f.names.end(), name);
        if (it == f.names.end()) all_found = false;
        else in_group[std::size_t(it - f.names.begin())] = true;
      }
      if (all_found || label == "world") return detail::group_placement(f.shape, in_group, hardware_.gpus_per_node);
    }
    for (const auto name : names) {
      const bool known = std::any_of(factorizations_.begin(), factorizations_.end(), [&](const Factorization& f) {
        return std::find(f.names.begin(), f.names.end(), name) != f.names.end();
      });
      if (!known)
        throw Error("sim::Topology", dtensor::detail::cat("group '", label, "' names no mesh dimension '", name, "'"));
    }
    throw Error("sim::Topology",
                dtensor::detail::cat("group '", label, "' mixes dimensions of two factorizations of the mesh"));
  }

  Hardware hardware_;
  std::vector<Factorization> factorizations_;
  mutable std::vector<std::pair<std::string, GroupPlacement>> placements_;
};

namespace detail {
/// Seconds of a collective whose bytes all cross `link` (the formulas of the synopsis).
inline double one_link_seconds(const CommRecord& r, const Link& link, const Calibration& cal) {
  const double n = r.group_size;
  const auto w = r.wire();
  const double bandwidth_term = double(std::max(w.sent, w.received)) / (link.bytes_per_second * cal.link_fraction);
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
}  // namespace detail

/// Seconds one collective takes on `link` (the formulas of the synopsis).
inline double collective_seconds(const CommRecord& r, const Link& link, const Calibration& cal = calibration) {
  if (r.group_size <= 1 || r.kind == CollectiveKind::split) return 0;
  return detail::one_link_seconds(r, link, cal);
}

/// Seconds one collective takes on the groups of `label` in `topology` (see the synopsis): an
/// all-to-all whose groups span nodes sends each local peer's share over NVLink and the others'
/// over the network at once; every other collective runs on Topology::link.
inline double collective_seconds(const CommRecord& r, const Topology& topology, std::string_view label,
                                 const Calibration& cal = calibration) {
  if (r.group_size <= 1 || r.kind == CollectiveKind::split) return 0;
  const GroupPlacement where = topology.placement(label);
  const bool all_to_all = r.kind == CollectiveKind::all_to_all || r.kind == CollectiveKind::all_to_all_v;
  const int peers = r.group_size - 1, local = std::min(where.fewest_in_node, r.group_size) - 1;
  if (!all_to_all || local == 0 || local == peers) return detail::one_link_seconds(r, topology.link(label), cal);
  const Hardware& hw = topology.hardware();
  const auto w = r.wire();
  const double bytes = double(std::max(w.sent, w.received)), remote = peers - local;
  const double nvlink =
      local * hw.nvlink.latency_seconds + bytes * local / peers / (hw.nvlink.bytes_per_second * cal.link_fraction);
  const double network = remote * hw.infiniband.latency_seconds +
                         bytes * remote / peers / (hw.infiniband.bytes_per_second * cal.link_fraction);
  return std::max(nvlink, network);
}

/// A GEMM's fraction of peak from its arithmetic intensity (FLOP per byte moved); 0 at intensity
/// 0 (no FLOPs), also when gemm_half_intensity is 0 (where 0 / 0 would be NaN).
inline double gemm_efficiency(double flops_per_byte, const Calibration& cal = calibration) {
  if (!(flops_per_byte > 0)) return 0;
  if (!(flops_per_byte < std::numeric_limits<double>::infinity())) return cal.gemm_max_fraction;
  return cal.gemm_max_fraction * flops_per_byte / (flops_per_byte + cal.gemm_half_intensity);
}

namespace detail {
/// Whether a record carries its GEMM's shape (the meta GEMM kernels' do; CostRecord).
inline bool has_gemm_shape(const kernels::meta::CostRecord& op) noexcept { return op.m > 0 && op.n > 0 && op.k > 0; }
}  // namespace detail

/// The share of a GEMM's SM time that computes (wave quantisation): its batch x ceil(m / tm) x
/// ceil(n / tn) output tiles (hw.gemm_tile) run sm_count at a time, so a last wave of r tiles
/// leaves sm_count - r SMs idle for a tile's time: tiles / (waves x sm_count). 1 for a record
/// without its shape. (An H100's 132 SMs: 1024^2 outputs are 32 tiles of 128 x 256, one wave at
/// 0.24; 8192^2 are 2,048 tiles, 16 waves at 0.97.)
inline double gemm_wave_efficiency(const kernels::meta::CostRecord& op, const Hardware& hw) {
  if (!detail::has_gemm_shape(op)) return 1;
  const auto [tm, tn] = hw.gemm_tile();
  const double tiles =
      double(std::max<std::int64_t>(op.batch, 1)) * double((op.m + tm - 1) / tm) * double((op.n + tn - 1) / tn);
  const double sms = std::max(hw.sm_count, 1), waves = std::ceil(tiles / sms);
  return tiles / (waves * sms);
}

/// Seconds one meta kernel takes (the roofline of the synopsis). A GEMM with its shape also runs
/// at its wave efficiency (gemm_wave_efficiency) and pays the device's fixed gemm_overhead_seconds:
/// the intensity curve says how well a tile's loop uses an SM, the waves how many SMs have a tile,
/// the overhead what a launch costs beside (docs/dry-run.md, "GEMM efficiency by shape").
inline double op_seconds(const kernels::meta::CostRecord& op, const Hardware& hw, const Calibration& cal = calibration) {
  const double flops = double(op.flops), bytes = double(op.bytes_read) + double(op.bytes_written);
  // An op without FLOPs (a GEMM with an empty dimension on a rank whose shard is empty, a copy)
  // takes its bytes' time only: its efficiency, intensity 0 / bytes, is 0, and 0 / 0 was NaN.
  if (!(flops > 0)) return bytes / (hw.hbm_bytes_per_second * cal.hbm_fraction);
  double flop_rate = hw.peak_fp32_flops;  // vector units: pointwise maps, reductions, the optimizer
  double overhead = 0;
  const double intensity = bytes > 0 ? flops / bytes : std::numeric_limits<double>::infinity();
  const bool gemm = op.op == "gemm", gemm_fp8 = !gemm && op.op == "gemm_fp8";
  // A record without its shape (a sum, a hand-made one) is no one launch: the curve alone.
  if ((gemm || gemm_fp8) && detail::has_gemm_shape(op)) overhead = hw.gemm_overhead_seconds;
  if (gemm) flop_rate = hw.sustained_flops() * gemm_efficiency(intensity, cal) * gemm_wave_efficiency(op, hw);
  else if (gemm_fp8) {
    // FP8 operands (nn::Linear under nn::Fp8Autocast): the FP8 tensor cores' peak, the same
    // curve of intensity (its bytes are one per operand element) and the device's compute_scale.
    if (!(hw.peak_fp8_flops > 0))
      throw Error("sim::op_seconds", dtensor::detail::cat("device '", hw.name,
                                                          "' has no FP8 tensor cores (peak_fp8_tflops 0): "
                                                          "an FP8 GEMM of ",
                                                          op.flops, " FLOPs cannot be timed"));
    flop_rate = hw.peak_fp8_flops * hw.compute_scale * gemm_efficiency(intensity, cal) * gemm_wave_efficiency(op, hw);
  } else if (op.op == "attention" || op.op == "attention_backward")
    flop_rate = hw.sustained_flops() * cal.attention_fraction;
  return std::max(flops / flop_rate, bytes / (hw.hbm_bytes_per_second * cal.hbm_fraction)) + overhead;
}

/// What a collective is, for when it is paid (see the synopsis).
enum class CommRole { gradient_reduction, parameter_gather, context_ring, exposed };

namespace detail {
inline bool is_microbatch_phase(std::string_view name) {
  return name == "forward" || name == "backward" || name == "backward_input" || name == "backward_weight";
}
inline bool is_data_dim(std::string_view d) { return d == "dp" || d == "fsdp" || d == "edp"; }
/// A MoE layer's count exchange, dispatch or combine (parallel/moe.hpp), forward or backward: on
/// "ep", or on the node-level dispatch's "ep_across" and "ep_node" (parallel/node_dispatch.hpp).
inline bool is_expert_all_to_all(const CommRecord& r) {
  if (r.kind != CollectiveKind::all_to_all && r.kind != CollectiveKind::all_to_all_v) return false;
  const auto dims = label_dims(r.group);
  return std::any_of(dims.begin(), dims.end(),
                     [](std::string_view d) { return d == "ep" || d == "ep_across" || d == "ep_node"; });
}
}  // namespace detail

/// Whether a phase's name is one that runs once per micro-batch (forward, backward and its halves).
using detail::is_microbatch_phase;

inline CommRole comm_role(const CommRecord& r, std::string_view phase) {
  const auto dims = detail::label_dims(r.group);
  // FSDP's shard group under context parallelism is "fsdp*cp" (parallel::FsdpShardDims): a data
  // group too, though "cp" alone (the attention's) is not.
  const bool data_only = r.group != "world" && std::any_of(dims.begin(), dims.end(), detail::is_data_dim) &&
                         std::all_of(dims.begin(), dims.end(), [](std::string_view d) { return detail::is_data_dim(d) || d == "cp"; });
  // A sum (or mean) outside a forward: a max or min is no gradient (FP8's amaxes), nor is
  // what a forward reduces; those are the step's own, exposed.
  const bool summing = r.op == ReduceOp::sum || r.op == ReduceOp::avg;
  if (data_only && summing && phase != "forward" &&
      (r.kind == CollectiveKind::all_reduce || r.kind == CollectiveKind::reduce_scatter))
    return CommRole::gradient_reduction;
  if (detail::is_microbatch_phase(phase)) {
    if (data_only && r.kind == CollectiveKind::all_gather) return CommRole::parameter_gather;
    if (r.group == "cp" && (r.kind == CollectiveKind::send_recv || r.kind == CollectiveKind::send ||
                            r.kind == CollectiveKind::recv))
      return CommRole::context_ring;
  }
  return CommRole::exposed;
}

/// Settings of an estimate that are not the device's.
struct EstimateOptions {
  int zero = 0;  // >= 1: a gradient all-reduce is charged as a reduce-scatter (the rank needs its shard)
  Calibration calibration = sim::calibration;
  // The backwards the schedule runs as an overlapped pair with the forward before them (DualPipeV:
  // pipeline::dual_pipe_v_overlapped, sorted): each pair's expert all-to-alls hide behind the
  // other half's compute (see the synopsis). Empty: no pairs.
  std::vector<parallel::pipeline::Action> overlapped = {};
  // The gradient reduction runs behind the last micro-batch's backward (DDP's buckets, FSDP);
  // false: after the backward, exposed in full (a published run's software, Megatron-LM of
  // 2021/22: sim::PlanShape and models::TrainingPlan's overlap_gradient_reduction).
  bool overlap_gradient_reduction = true;
};

/// The part of a step's gradient reduction (`reduction` seconds) not hidden: behind the last
/// micro-batch's backward compute on the rank when `overlapped`, else all of it. The dry run's
/// estimate and the analytic estimate both charge it so.
inline double exposed_gradient_reduction(double reduction, double last_backward_compute, bool overlapped) {
  return overlapped ? std::max(0.0, reduction - last_backward_compute) : reduction;
}

/// A phase's compute, communication and the part of that communication not hidden. For a
/// micro-batch phase, `communication` and `exposed` are per micro-batch; the gradient
/// reduction it issued is `gradient_reduction` (paid once per step).
struct PhaseTime {
  std::string name;
  double compute = 0, communication = 0, exposed = 0;
  double gradient_reduction = 0;
  double expert_all_to_all = 0;  // of exposed: what an overlapped pair can hide (see the synopsis)
  double total() const { return compute + exposed; }
};

inline PhaseTime phase_time(const PhaseReport& phase, const Topology& topology, const EstimateOptions& o = {}) {
  PhaseTime t;
  t.name = phase.name;
  const Hardware& hw = topology.hardware();
  for (const auto& op : phase.ops) t.compute += op_seconds(op, hw, o.calibration);
  double hidden = 0;  // communication that runs behind this phase's compute
  for (const auto& r : phase.collectives) {
    const CommRole role = comm_role(r, phase.name);
    CommRecord charged = r;
    if (role == CommRole::gradient_reduction && o.zero >= 1 && r.kind == CollectiveKind::all_reduce)
      charged.kind = CollectiveKind::reduce_scatter;
    const double seconds = collective_seconds(charged, topology, r.group, o.calibration);
    if (role == CommRole::gradient_reduction) {
      t.gradient_reduction += seconds;
      continue;
    }
    t.communication += seconds;
    // Prefetched gathers and ring steps hide only where the program marked the phase's compute
    // as able to run beside communication (Recorder::phase(name, overlapped)).
    if (role == CommRole::exposed || !phase.overlapped) t.exposed += seconds;
    else hidden += seconds;
    if (role == CommRole::exposed && detail::is_expert_all_to_all(r)) t.expert_all_to_all += seconds;
  }
  t.exposed += std::max(0.0, hidden - t.compute);
  return t;
}

struct StepEstimate {
  std::string name;
  std::vector<PhaseTime> phases;
  parallel::pipeline::Costs stage_costs;  // seconds per micro-batch per stage
  parallel::pipeline::Timeline timeline;  // the schedule with those costs (all pipeline ranks)
  int stages_per_rank = 1;                // pipeline stages on each rank (interleaved: v)
  int pipeline_rank = 0;
  double pipeline_seconds = 0;            // the schedule's makespan
  double bubble_fraction = 0;             // the schedule's mean idle share
  double gradient_reduction_seconds = 0;  // once per step, before overlap
  double once_per_step_seconds = 0;       // exposed after the schedule: gradient reduction + other phases
  double step_seconds = 0;                // this rank class's: its schedule end + once per step
  double compute_seconds = 0, communication_seconds = 0, exposed_communication_seconds = 0;  // per step
};

namespace detail {
/// One class's phases, stage costs and once-per-step figures (no schedule run yet).
inline StepEstimate class_estimate(const RankReport& report, const Topology& topology, int microbatches,
                                   int stages_per_rank, const EstimateOptions& o) {
  if (stages_per_rank < 1)
    throw Error("sim::estimate_step", dtensor::detail::cat("stages_per_rank ", stages_per_rank, " of ", report.name));
  StepEstimate est;
  est.name = report.name;
  est.stages_per_rank = stages_per_rank;
  auto& costs = est.stage_costs;
  costs = {0, 0, 0};
  double last_backward_compute = 0, other_phases = 0;
  for (const auto& ph : report.phases) {
    const PhaseTime t = phase_time(ph, topology, o);
    est.phases.push_back(t);
    const bool per_microbatch = is_microbatch_phase(ph.name);
    const double times = per_microbatch ? microbatches : 1;
    est.compute_seconds += t.compute * times;
    est.communication_seconds += t.communication * times + t.gradient_reduction;
    est.exposed_communication_seconds += t.exposed * times;
    est.gradient_reduction_seconds += t.gradient_reduction;
    const double per_stage = t.total() / stages_per_rank;
    const double hideable = o.overlapped.empty() ? 0 : t.expert_all_to_all / stages_per_rank;
    if (ph.name == "forward") costs.forward += per_stage, costs.forward_hideable += hideable;
    else if (ph.name == "backward" || ph.name == "backward_input")
      costs.backward_input += per_stage, costs.backward_hideable += hideable;
    else if (ph.name == "backward_weight") costs.backward_weight += per_stage;
    else other_phases += t.total();
    if (ph.name == "backward" || ph.name == "backward_input" || ph.name == "backward_weight")
      last_backward_compute += t.compute / stages_per_rank;  // the last micro-batch's last stage
  }
  // The gradient reduction runs behind the last micro-batch's backward (DDP buckets, FSDP),
  // unless the options say the software does not overlap it.
  const double exposed_reduction =
      exposed_gradient_reduction(est.gradient_reduction_seconds, last_backward_compute, o.overlap_gradient_reduction);
  est.exposed_communication_seconds += exposed_reduction;
  est.once_per_step_seconds = other_phases + exposed_reduction;
  return est;
}

inline void check_schedule_ranks(const parallel::pipeline::Schedule& schedule, int pipeline_rank, const std::string& name) {
  if (pipeline_rank < 0 || pipeline_rank >= schedule.ranks())
    throw Error("sim::estimate_plan", dtensor::detail::cat("class ", name, " is on pipeline rank ", pipeline_rank,
                                                           " of a schedule of ", schedule.ranks(), " ranks"));
}
}  // namespace detail

/// The step time of the rank class `report` under `schedule`, every pipeline rank as this one.
inline StepEstimate estimate_step(const RankReport& report, const Topology& topology,
                                  const parallel::pipeline::Schedule& schedule, int stages_per_rank = 1,
                                  const EstimateOptions& o = {}) {
  StepEstimate est = detail::class_estimate(report, topology, schedule.microbatches, stages_per_rank, o);
  est.timeline =
      parallel::pipeline::simulate(schedule, est.stage_costs, parallel::pipeline::SendMode::asynchronous, o.overlapped);
  if (!est.timeline.deadlock.empty())
    throw Error("sim::estimate_step", dtensor::detail::cat("the schedule deadlocks (", est.timeline.deadlock.size(),
                                                           " ranks stuck) for ", report.name));
  est.pipeline_seconds = est.timeline.makespan;
  est.bubble_fraction = est.timeline.bubble();
  est.exposed_communication_seconds -=
      parallel::pipeline::overlapped_pairs(schedule, est.pipeline_rank, o.overlapped) * est.stage_costs.pair_saving();
  est.step_seconds = est.pipeline_seconds + est.once_per_step_seconds;
  return est;
}

/// A rank class of a plan: its report and the pipeline ranks it stands for (the first is its
/// representative; more when pipeline ranks whose stages hold the same layers share a class).
struct ClassInput {
  const RankReport* report = nullptr;
  std::vector<int> pipeline_ranks{0};
};

/// The step of a whole plan: every class's estimate and the critical path across them.
struct PlanEstimate {
  std::vector<StepEstimate> classes;      // in input order; each with the plan's timeline
  parallel::pipeline::Timeline timeline;  // the schedule, each pipeline rank at its slowest class's costs
  double pipeline_seconds = 0, bubble_fraction = 0;
  double step_seconds = 0;                // the latest rank's end: the step
  std::size_t slowest = 0;                // the class that ends last
};

/// The plan's step (see the synopsis): per pipeline rank the slowest class's stage costs, the
/// schedule simulated with them, each class's end = its pipeline rank's last action + its
/// once-per-step work; the step is the latest end.
inline PlanEstimate estimate_plan(const std::vector<ClassInput>& inputs, const Topology& topology,
                                  const parallel::pipeline::Schedule& schedule, const EstimateOptions& o = {}) {
  constexpr const char* op = "sim::estimate_plan";
  if (inputs.empty()) throw Error(op, "no rank classes");
  PlanEstimate plan;
  const int v = schedule.layout.stages_per_rank;
  std::vector<parallel::pipeline::Costs> per_rank(std::size_t(schedule.ranks()), parallel::pipeline::Costs{0, 0, 0});
  std::vector<bool> covered(per_rank.size(), false);
  std::vector<std::vector<int>> ranks_of;  // per class
  for (const auto& in : inputs) {
    if (in.report == nullptr) throw Error(op, "a class without a report");
    if (in.pipeline_ranks.empty()) throw Error(op, dtensor::detail::cat("class ", in.report->name, " on no pipeline rank"));
    auto est = detail::class_estimate(*in.report, topology, schedule.microbatches, v, o);
    est.pipeline_rank = in.pipeline_ranks.front();
    for (const int r : in.pipeline_ranks) {
      detail::check_schedule_ranks(schedule, r, in.report->name);
      auto& c = per_rank[std::size_t(r)];
      c.forward = std::max(c.forward, est.stage_costs.forward);
      c.backward_input = std::max(c.backward_input, est.stage_costs.backward_input);
      c.backward_weight = std::max(c.backward_weight, est.stage_costs.backward_weight);
      c.forward_hideable = std::max(c.forward_hideable, est.stage_costs.forward_hideable);
      c.backward_hideable = std::max(c.backward_hideable, est.stage_costs.backward_hideable);
      covered[std::size_t(r)] = true;
    }
    plan.classes.push_back(std::move(est));
    ranks_of.push_back(in.pipeline_ranks);
  }
  for (std::size_t r = 0; r < covered.size(); ++r)
    if (!covered[r]) throw Error(op, dtensor::detail::cat("no rank class on pipeline rank ", r, " of ", covered.size()));
  plan.timeline =
      parallel::pipeline::simulate(schedule, per_rank, parallel::pipeline::SendMode::asynchronous, o.overlapped);
  if (!plan.timeline.deadlock.empty())
    throw Error(op, dtensor::detail::cat("the schedule deadlocks (", plan.timeline.deadlock.size(), " ranks stuck)"));
  plan.pipeline_seconds = plan.timeline.makespan;
  plan.bubble_fraction = plan.timeline.bubble();
  for (std::size_t i = 0; i < plan.classes.size(); ++i) {
    auto& est = plan.classes[i];
    double end = 0;  // the latest of the class's pipeline ranks
    for (const int r : ranks_of[i])
      for (const auto& a : plan.timeline.actions[std::size_t(r)])
        if (a.end > end) end = a.end, est.pipeline_rank = r;
    est.timeline = plan.timeline;
    est.pipeline_seconds = plan.pipeline_seconds;
    est.exposed_communication_seconds -=
        parallel::pipeline::overlapped_pairs(schedule, est.pipeline_rank, o.overlapped) * est.stage_costs.pair_saving();
    est.bubble_fraction = plan.timeline.idle_fraction(est.pipeline_rank);
    est.step_seconds = end + est.once_per_step_seconds;
    if (est.step_seconds > plan.step_seconds) {
      plan.step_seconds = est.step_seconds;
      plan.slowest = i;
    }
  }
  return plan;
}

}  // namespace dtensor::sim
