// dtensor/distributed/plan.hpp — turning a (from, to) pair of layouts into collectives.
//
//   constexpr auto plan = plan_redistribution(From::desc, To::desc);   // compile time
//   static_assert(plan.collectives() <= 2);
//   std::cout << describe(plan, {"dp", "tp"});
//   std::cout << plan.estimate(mesh.shape(), x.shape(), sizeof(float), LinkModel{}).to_string();
//
// A plan is a short list of steps, each on one mesh dimension or on a run of adjacent ones
// (one collective over their flattened group):
//
//   Shard(d)   -> Replicate   all_gather        Partial -> Replicate  all_reduce
//   Partial    -> Shard(d)    reduce_scatter    Shard(d) -> Shard(e)  all_to_all
//   Replicate  -> Shard(d)    take_chunk (local)
//   Replicate  -> Partial     replicate_to_partial (local)
//   Shard(d)   -> Partial     shard_to_partial (local)
//
// A step on mesh dimension i that gathers or scatters tensor dimension d is only correct when
// i is the innermost split of d (the ranks of i's group then hold consecutive pieces of one
// range); a new shard always becomes the innermost split. A step over a run i..j gathers when
// i..j are together the innermost splits of d, and scatters as the steps i, i+1, .., j would
// one after the other. The planner searches the states reachable by such steps (each mesh
// dimension in its source, target or Replicate placement) for the plan of least modelled time
// (see LinkModel below). The search is one constexpr function on plain values, so it runs at
// compile time for layout types and at run time for layouts known only then (a checkpoint
// saved with another layout).
//
// Mesh sizes are run-time values, so a plan is made for every mesh shape at once; the executor
// skips the steps whose group has one rank (they would move nothing).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/comm/comm_log.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/distributed/step_geometry.hpp"
#include "dtensor/placement/layout.hpp"

namespace dtensor {

enum class StepKind : std::uint8_t {
  all_gather,
  reduce_scatter,
  all_reduce,
  all_to_all,
  take_chunk,
  replicate_to_partial,
  shard_to_partial,
};

constexpr std::string_view name_of(StepKind k) {
  switch (k) {
    case StepKind::all_gather: return "all_gather";
    case StepKind::reduce_scatter: return "reduce_scatter";
    case StepKind::all_reduce: return "all_reduce";
    case StepKind::all_to_all: return "all_to_all";
    case StepKind::take_chunk: return "take_chunk";
    case StepKind::replicate_to_partial: return "replicate_to_partial";
    case StepKind::shard_to_partial: return "shard_to_partial";
  }
  return "?";
}

/// The collective a step kind issues (local kinds issue none: barrier stands for "none").
constexpr CollectiveKind collective_of(StepKind k) {
  switch (k) {
    case StepKind::all_gather: return CollectiveKind::all_gather;
    case StepKind::reduce_scatter: return CollectiveKind::reduce_scatter;
    case StepKind::all_reduce: return CollectiveKind::all_reduce;
    case StepKind::all_to_all: return CollectiveKind::all_to_all;
    default: return CollectiveKind::barrier;
  }
}

struct Step {
  StepKind kind = StepKind::take_chunk;
  int mesh_dim = 0;       // the first mesh dimension of the step's group
  int mesh_dim_last = 0;  // the last (== mesh_dim unless the step runs over flattened dimensions)
  PlacementDesc from{}, to{};  // the placement of every mesh dimension of the group, before and after

  constexpr bool is_collective() const {
    return kind == StepKind::all_gather || kind == StepKind::reduce_scatter || kind == StepKind::all_reduce ||
           kind == StepKind::all_to_all;
  }
  /// The number of ranks in the step's group on a mesh of this shape.
  template <std::size_t N>
  constexpr int group_size(const std::array<int, N>& mesh_shape) const {
    int n = 1;
    for (int i = mesh_dim; i <= mesh_dim_last; ++i) n *= mesh_shape[std::size_t(i)];
    return n;
  }
};

/// Under Partial<sum> made from a replica, the rank at coordinate 0 of the mesh dimension keeps
/// the values and the others hold zeros (the sum over ranks is then the replica); under
/// Partial<avg|max|min> every rank keeps them. The rule of replicate_to_partial and of distribute.
constexpr bool replica_keeps_values(PlacementDesc partial, int coordinate) {
  return !(partial.op == ReduceOp::sum && coordinate != 0);
}

/// The link a plan's time is modelled on: each collective costs `latency_s` plus the bytes one
/// rank sends (wire_bytes) over `bytes_per_s`.
struct LinkModel {
  double latency_s = 20e-6;     // a small collective between processes on one host (MPI, gloo)
  double bytes_per_s = 10e9;    // a shared-memory or NVLink-class link
  constexpr double seconds(std::size_t wire) const { return latency_s + double(wire) / bytes_per_s; }
};

namespace detail {
/// What the planner assumes when it costs plans at compile time, before extents and mesh sizes
/// are known: every mesh dimension of size 2 (the smallest that moves anything; larger sizes
/// shrink the pieces faster, which rewards many small collectives the real latency does not
/// repay) and a tensor of 4 MiB on LinkModel{}. At 4 MiB a collective's latency weighs as
/// much as 200 KB moved, so the planner takes fewer bytes over fewer collectives when the
/// bytes saved are a sizeable fraction of the tensor (a reduce-scatter over an all-reduce),
/// and fewer collectives when the bytes are equal (one all-gather over a flattened group).
inline constexpr int planning_group_size = 2;
inline constexpr double planning_tensor_bytes = 4.0 * (1 << 20);
/// Breaks ties between plans of equal modelled time in favour of fewer steps.
inline constexpr double seconds_per_local_step = 1e-9;
}  // namespace detail

/// One step of a plan as Plan::estimate models it for given extents.
struct StepEstimate {
  Step step;
  int group_size = 1;
  WireBytes wire;
  double seconds = 0;
};

struct PlanEstimate {
  std::vector<StepEstimate> steps;
  WireBytes wire;       // sums over the steps
  double seconds = 0;
  int collectives = 0;  // those with a group of more than one rank

  /// "2 collective(s), sent 1536 B, received 1536 B, 41.2 us" and one line per step.
  std::string to_string() const {
    std::string s = std::to_string(collectives) + " collective(s), sent " + std::to_string(wire.sent) +
                    " B, received " + std::to_string(wire.received) + " B, " + std::to_string(seconds * 1e6) + " us\n";
    for (const auto& e : steps)
      s += "  " + std::string(name_of(e.step.kind)) + " over " + std::to_string(e.group_size) + " rank(s): sent " +
           std::to_string(e.wire.sent) + " B, received " + std::to_string(e.wire.received) + " B, " +
           std::to_string(e.seconds * 1e6) + " us\n";
    return s;
  }
};

/// The layout after a step.
template <std::size_t N>
constexpr LayoutDesc<N> apply_step(LayoutDesc<N> l, const Step& s) {
  for (int i = s.mesh_dim; i <= s.mesh_dim_last; ++i) {
    const auto m = std::size_t(i);
    if (s.to.is_shard()) {
      l.placements[m] = PlacementDesc::replicate();  // leave d's order as it is, then append
      l.priority[m] = l.next_priority(s.to.dim);
    } else {
      l.priority[m] = 0;
    }
    l.placements[m] = s.to;
  }
  return l;
}

template <std::size_t N>
struct Plan {
  static constexpr std::size_t capacity = 4 * N + 1;
  LayoutDesc<N> from{}, to{};
  std::array<Step, capacity> steps{};
  std::size_t size = 0;

  constexpr const Step* begin() const { return steps.data(); }
  constexpr const Step* end() const { return steps.data() + size; }
  constexpr std::size_t collectives() const {
    std::size_t n = 0;
    for (const auto& s : *this) n += s.is_collective();
    return n;
  }
  constexpr std::size_t count(StepKind k) const {
    std::size_t n = 0;
    for (const auto& s : *this) n += (s.kind == k);
    return n;
  }

  /// The bytes each step sends and receives on the rank at mesh coordinate `coord` (every
  /// rank of a group moves as many: uneven chunks travel padded; by default the first rank,
  /// whose pieces are the largest) for a tensor of extents `global` with elements of
  /// `element_bytes`, and the modelled time on `link`. Steps on groups of one rank count
  /// nothing, as the executor skips them. CommLog::wire() of running the plan agrees.
  template <std::size_t R>
  PlanEstimate estimate(const std::array<int, N>& mesh_shape, const Shape<R>& global, std::size_t element_bytes,
                        const LinkModel& link = {}, const std::array<int, N>& coord = {}) const {
    PlanEstimate e;
    LayoutDesc<N> state = from;
    for (const Step& s : *this) {
      const LayoutDesc<N> next = apply_step(state, s);
      StepEstimate one{s, s.group_size(mesh_shape), {}, 0};
      if (s.is_collective() && one.group_size > 1) {
        const auto g = detail::step_geometry(state, next, s.mesh_dim, s.mesh_dim_last, mesh_shape, coord, global);
        one.wire = wire_bytes(collective_of(s.kind), g.collective_elements(s.kind == StepKind::all_reduce) * element_bytes,
                              one.group_size);
        one.seconds = link.seconds(one.wire.sent);
        e.wire.sent += one.wire.sent;
        e.wire.received += one.wire.received;
        e.seconds += one.seconds;
        ++e.collectives;
      }
      e.steps.push_back(one);
      state = next;
    }
    return e;
  }
};

template <std::size_t N>
constexpr bool changes_partial_op(const LayoutDesc<N>& from, const LayoutDesc<N>& to) {
  for (std::size_t i = 0; i < N; ++i)
    if (from.placements[i].is_partial() && to.placements[i].is_partial() && from.placements[i].op != to.placements[i].op)
      return true;
  return false;
}
template <std::size_t N>
constexpr bool shard_to_partial_avg(const LayoutDesc<N>& from, const LayoutDesc<N>& to) {
  for (std::size_t i = 0; i < N; ++i)
    if (from.placements[i].is_shard() && to.placements[i].is_partial() && to.placements[i].op == ReduceOp::avg)
      return true;
  return false;
}

namespace detail {
inline constexpr const char* partial_op_message =
    "Partial<a> to Partial<b> with a != b changes the value: reduce to Replicate or Shard first";
inline constexpr const char* shard_avg_message =
    "Shard to Partial<avg> has no meaning: a shard is not an average over ranks";
}  // namespace detail

/// Why (from, to) cannot be redistributed, or nullptr. Checked by static_assert for layout
/// types (see redistribute) and by a throw for run-time layouts (plan_redistribution).
template <std::size_t N>
constexpr const char* redistribution_error(const LayoutDesc<N>& from, const LayoutDesc<N>& to) {
  if (changes_partial_op(from, to)) return detail::partial_op_message;
  if (shard_to_partial_avg(from, to)) return detail::shard_avg_message;
  return nullptr;
}

namespace detail {

/// The step that turns placement `from` into `to` on mesh dimension i of `l`, or false when
/// no single step can (a gather or scatter on a dimension that is not the innermost split).
template <std::size_t N>
constexpr bool make_step(const LayoutDesc<N>& l, std::size_t i, PlacementDesc to, Step& out) {
  const PlacementDesc from = l.placements[i];
  if (from == to) return false;
  out = Step{StepKind::take_chunk, int(i), int(i), from, to};
  if (from.is_shard() && !l.is_innermost(i)) return false;
  switch (from.kind) {
    case PlacementKind::shard:
      if (to.is_replicate()) out.kind = StepKind::all_gather;
      else if (to.is_shard()) out.kind = StepKind::all_to_all;
      else if (to.op == ReduceOp::avg) return false;
      else out.kind = StepKind::shard_to_partial;
      return true;
    case PlacementKind::replicate:
      out.kind = to.is_shard() ? StepKind::take_chunk : StepKind::replicate_to_partial;
      return true;
    case PlacementKind::partial:
      if (to.is_partial()) return false;
      out.kind = to.is_shard() ? StepKind::reduce_scatter : StepKind::all_reduce;
      return true;
  }
  return false;
}

/// One collective over the flattened run i..j (j > i) that does what the same kind of step on
/// each of its dimensions would: an all-gather of Shard(d) when i..j are together the innermost
/// splits of d, a reduce-scatter of one Partial to Shard(d) (i splits first, j last), or an
/// all-reduce of one Partial. False when the run does not qualify.
template <std::size_t N>
constexpr bool make_merged_step(const LayoutDesc<N>& l, std::size_t i, std::size_t j, PlacementDesc to, Step& out) {
  const PlacementDesc from = l.placements[i];
  for (std::size_t m = i + 1; m <= j; ++m)
    if (!(l.placements[m] == from)) return false;
  out = Step{StepKind::all_reduce, int(i), int(j), from, to};
  if (from.is_shard() && to.is_replicate()) {
    for (std::size_t m = i; m <= j; ++m)
      for (std::size_t k = 0; k < N; ++k)
        if ((k < i || k > j) && l.placements[k] == from && l.splits_before(m, k)) return false;
    out.kind = StepKind::all_gather;
    return true;
  }
  if (!from.is_partial()) return false;
  if (to.is_shard()) out.kind = StepKind::reduce_scatter;
  else if (!to.is_replicate()) return false;
  return true;
}

/// The modelled seconds of a step from layout `l` on the planning mesh and tensor (above).
template <std::size_t N>
constexpr double planning_seconds(const LayoutDesc<N>& l, const Step& s) {
  if (!s.is_collective()) return seconds_per_local_step;
  double piece = planning_tensor_bytes;  // this rank's piece before the step
  for (const auto& p : l.placements)
    if (p.is_shard()) piece /= planning_group_size;
  double n = 1;
  for (int i = s.mesh_dim; i <= s.mesh_dim_last; ++i) n *= planning_group_size;
  // wire_bytes' fractions of the collective's larger buffer: the gathered result for an
  // all-gather, the piece for the others.
  const double size = s.kind == StepKind::all_gather ? piece * n : piece;
  const double fraction = (s.kind == StepKind::all_reduce ? 2 : 1) * (n - 1) / n;
  const LinkModel link{};
  return link.latency_s + size * fraction / link.bytes_per_s + seconds_per_local_step;
}

/// The number of collectives PyTorch DTensor's greedy planner (_gen_transform_infos) issues
/// for (from, to) on a mesh with every dimension larger than one: one transform per mesh
/// dimension, first from the innermost outwards (replicating a dimension whose outer nested
/// shards differ from the target's), then outwards-in for what is left. A large number where
/// PyTorch refuses the pair (Shard to Partial). The planner never issues more than this.
template <std::size_t N>
constexpr std::size_t greedy_collectives(const LayoutDesc<N>& from, const LayoutDesc<N>& to) {
  auto current = from.placements;
  std::size_t count = 0;
  bool refused = false;
  auto transform = [&](std::size_t i, PlacementDesc target) {
    const PlacementDesc was = current[i];
    if (target.is_partial()) refused = refused || !was.is_replicate();  // Replicate -> Partial is local
    else if (!(target.is_shard() && was.is_replicate())) ++count;       // Replicate -> Shard is local
    current[i] = target;
  };
  bool sharded = false;
  for (const auto& p : from.placements) sharded = sharded || p.is_shard();
  if (sharded)
    for (std::size_t i = N; i-- > 0;) {
      PlacementDesc target = to.placements[i];
      if (target.is_shard())
        for (std::size_t j = 0; j < i; ++j)
          if (current[j].is_shard(target.dim) != to.placements[j].is_shard(target.dim)) target = PlacementDesc::replicate();
      if (!(current[i] == target)) transform(i, target);
    }
  for (std::size_t i = 0; i < N; ++i)
    if (!(current[i] == to.placements[i])) transform(i, to.placements[i]);
  return refused ? 4 * N : count;
}

template <std::size_t N>
constexpr std::size_t search_capacity = N <= 2 ? 64 : N == 3 ? 512 : 4096;

/// The plan of least cost from `from` to `to`, where a step costs its modelled seconds plus
/// `seconds_per_collective` if it is a collective (see plan_redistribution).
template <std::size_t N>
constexpr Plan<N> search_plan(const LayoutDesc<N>& from, const LayoutDesc<N>& to, double seconds_per_collective) {
  struct Node {
    LayoutDesc<N> state{};
    double cost = 0;
    int parent = -1;
    Step step{};
    bool done = false;
  };
  constexpr std::size_t cap = search_capacity<N>;
  std::array<Node, cap> nodes{};
  std::size_t count = 1;
  nodes[0].state = from;

  auto relax = [&](int parent, const LayoutDesc<N>& next, const Step& s, double c) {
    for (std::size_t n = 0; n < count; ++n)
      if (nodes[n].state == next) {
        if (!nodes[n].done && c < nodes[n].cost) nodes[n] = Node{next, c, parent, s, false};
        return;
      }
    if (count == cap) throw Error("redistribute", "plan search exceeded its state budget");
    nodes[count++] = Node{next, c, parent, s, false};
  };

  for (;;) {
    int best = -1;
    for (std::size_t n = 0; n < count; ++n)
      if (!nodes[n].done && (best < 0 || nodes[n].cost < nodes[std::size_t(best)].cost)) best = int(n);
    if (best < 0) throw Error("redistribute", "no plan found (a bug in the planner)");
    Node& cur = nodes[std::size_t(best)];
    cur.done = true;
    if (cur.state == to) break;
    const LayoutDesc<N> state = cur.state;
    const double base = cur.cost;
    auto try_step = [&](const Step& s) {
      const double c = planning_seconds(state, s) + (s.is_collective() ? seconds_per_collective : 0.0);
      relax(best, apply_step(state, s), s, base + c);
    };
    for (std::size_t i = 0; i < N; ++i) {
      // Its target, Replicate, or for a Replicate dimension the Partial of a neighbour, so
      // that Partials separated by it reduce in one all-reduce over the run.
      PlacementDesc candidates[] = {to.placements[i], PlacementDesc::replicate(), PlacementDesc::replicate(),
                                    PlacementDesc::replicate()};
      if (state.placements[i].is_replicate()) {
        if (i > 0 && state.placements[i - 1].is_partial()) candidates[2] = state.placements[i - 1];
        if (i + 1 < N && state.placements[i + 1].is_partial()) candidates[3] = state.placements[i + 1];
      }
      for (const auto& target : candidates) {
        Step s;
        if (make_step(state, i, target, s)) try_step(s);
        for (std::size_t j = i + 1; j < N; ++j)
          if (make_merged_step(state, i, j, target, s)) try_step(s);
      }
    }
  }

  // Walk back from the target to the source.
  std::size_t target = 0;
  while (!(nodes[target].done && nodes[target].state == to)) ++target;
  std::array<Step, Plan<N>::capacity> reversed{};
  std::size_t length = 0;
  for (int n = int(target); nodes[std::size_t(n)].parent >= 0; n = nodes[std::size_t(n)].parent) {
    if (length == reversed.size()) throw Error("redistribute", "plan longer than its capacity (a bug in the planner)");
    reversed[length++] = nodes[std::size_t(n)].step;
  }
  Plan<N> p;
  p.from = from;
  p.to = to;
  p.size = length;
  for (std::size_t k = 0; k < length; ++k) p.steps[k] = reversed[length - 1 - k];
  return p;
}

}  // namespace detail

/// The plan of least modelled time from `from` to `to` (see the top of this file), unless that
/// takes more collectives than PyTorch's greedy planner would: then the plan of fewest
/// collectives, and of least modelled time among those. (Least time at the nominal sizes can
/// mean many small collectives, which real sizes and latencies rarely repay.)
template <std::size_t N>
constexpr Plan<N> plan_redistribution(const LayoutDesc<N>& from, const LayoutDesc<N>& to) {
  if (const char* why = redistribution_error(from, to)) throw Error("redistribute", why);
  const Plan<N> fastest = detail::search_plan(from, to, 0.0);
  if (fastest.collectives() <= detail::greedy_collectives(from, to)) return fastest;
  return detail::search_plan(from, to, 1.0);  // a second per collective outweighs any modelled time
}

/// plan_redistribution of two layout types, evaluated once per pair: the plan search is a
/// constant evaluation that redistribute, its agreement check and distribute_replicated would
/// otherwise each repeat (clang repeats it per use).
template <class From, class To>
inline constexpr Plan<From::mesh_ndim> layout_plan = plan_redistribution(From::desc, To::desc);

/// One line per step: "all_gather on tp (mesh dim 1): S(0) -> R".
template <std::size_t N>
std::string describe(const Plan<N>& plan, const std::array<std::string_view, N>& mesh_names) {
  std::string s = to_string(plan.from) + " -> " + to_string(plan.to) + ": ";
  if (plan.size == 0) return s + "nothing to do\n";
  s += std::to_string(plan.size) + " step(s), " + std::to_string(plan.collectives()) + " collective(s)\n";
  int k = 1;
  for (const auto& st : plan) {
    std::string dims;
    for (int i = st.mesh_dim; i <= st.mesh_dim_last; ++i)
      dims += (i > st.mesh_dim ? "*" : "") + std::string(mesh_names[std::size_t(i)]);
    s += "  " + std::to_string(k++) + ". " + std::string(name_of(st.kind)) + " on " + dims + ": " +
         to_string(st.from) + " -> " + to_string(st.to) + (st.is_collective() ? "" : "  (local)") + "\n";
  }
  return s;
}

}  // namespace dtensor
