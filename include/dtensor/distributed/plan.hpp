// dtensor/distributed/plan.hpp — turning a (from, to) pair of layouts into collectives.
//
//   constexpr auto plan = plan_redistribution(From::desc, To::desc);   // compile time
//   static_assert(plan.collectives() <= 2);
//   std::cout << describe(plan, {"dp", "tp"});
//
// A plan is a short list of steps, each on one mesh dimension (an all-reduce may span several
// adjacent ones, over their flattened group):
//
//   Shard(d)   -> Replicate   all_gather        Partial -> Replicate  all_reduce
//   Partial    -> Shard(d)    reduce_scatter    Shard(d) -> Shard(e)  all_to_all
//   Replicate  -> Shard(d)    take_chunk (local)
//   Replicate  -> Partial     replicate_to_partial (local)
//   Shard(d)   -> Partial     shard_to_partial (local)
//
// A step on mesh dimension i that gathers or scatters tensor dimension d is only correct when
// i is the innermost split of d (the ranks of i's group then hold consecutive pieces of one
// range); a new shard always becomes the innermost split. The planner searches the states
// reachable by such steps (each mesh dimension in its source, target or Replicate placement)
// for the cheapest path: fewest collectives first, then fewest bytes moved per rank (with a
// nominal group size), then fewest steps. The search is one constexpr function on plain
// values, so it runs at compile time for layout types and at run time for layouts known only
// then (a checkpoint saved with another layout).
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"
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

struct Step {
  StepKind kind = StepKind::take_chunk;
  int mesh_dim = 0;       // the mesh dimension (the first one, for a merged all_reduce)
  int mesh_dim_last = 0;  // == mesh_dim except for an all_reduce over adjacent dimensions
  PlacementDesc from{}, to{};

  constexpr bool is_collective() const {
    return kind == StepKind::all_gather || kind == StepKind::reduce_scatter || kind == StepKind::all_reduce ||
           kind == StepKind::all_to_all;
  }
};

template <std::size_t N>
struct Plan {
  static constexpr std::size_t capacity = 2 * N + 1;
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

/// Why (from, to) cannot be redistributed, or nullptr. Checked by static_assert for layout
/// types and by a throw for run-time layouts.
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
#define DTENSOR_MSG_PARTIAL_OP "Partial<a> to Partial<b> with a != b changes the value: reduce to Replicate or Shard first"
#define DTENSOR_MSG_SHARD_AVG "Shard to Partial<avg> has no meaning: a shard is not an average over ranks"

template <std::size_t N>
constexpr const char* redistribution_error(const LayoutDesc<N>& from, const LayoutDesc<N>& to) {
  if (changes_partial_op(from, to)) return DTENSOR_MSG_PARTIAL_OP;
  if (shard_to_partial_avg(from, to)) return DTENSOR_MSG_SHARD_AVG;
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

/// Bytes a rank moves in a step as a fraction of the whole tensor, with every group of the
/// nominal size K: the tie-breaker between plans with as many collectives.
template <std::size_t N>
constexpr double step_volume(const LayoutDesc<N>& l, const Step& s) {
  constexpr double K = 4;
  double v = 1;
  for (const auto& p : l.placements)
    if (p.is_shard()) v /= K;
  double k = 1;
  for (int i = s.mesh_dim; i <= s.mesh_dim_last; ++i) k *= K;
  switch (s.kind) {
    case StepKind::all_gather: return v * (k - 1);
    case StepKind::reduce_scatter:
    case StepKind::all_to_all: return v * (k - 1) / k;
    case StepKind::all_reduce: return 2 * v * (k - 1) / k;
    default: return 0;
  }
}

template <std::size_t N>
constexpr std::size_t search_capacity = N <= 2 ? 64 : N == 3 ? 512 : 4096;

}  // namespace detail

/// The cheapest correct plan from `from` to `to` (see the top of this file).
template <std::size_t N>
constexpr Plan<N> plan_redistribution(const LayoutDesc<N>& from, const LayoutDesc<N>& to) {
  if (const char* why = redistribution_error(from, to)) throw Error("redistribute", why);
  struct Node {
    LayoutDesc<N> state{};
    double cost = 0;
    int parent = -1;
    Step step{};
    bool done = false;
  };
  constexpr std::size_t cap = detail::search_capacity<N>;
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
    const LayoutDesc<N> st = cur.state;
    const double base = cur.cost;
    for (std::size_t i = 0; i < N; ++i) {
      const PlacementDesc candidates[] = {to.placements[i], PlacementDesc::replicate(), from.placements[i]};
      for (const auto& q : candidates) {
        Step s;
        if (!detail::make_step(st, i, q, s)) continue;
        const double c = base + (s.is_collective() ? 1000.0 : 0.0) + detail::step_volume(st, s) + 1e-6;
        relax(best, apply_step(st, s), s, c);
      }
      // Partials with one op on adjacent dimensions i..j reduce in one all_reduce.
      if (st.placements[i].is_partial())
        for (std::size_t j = i + 1; j < N && st.placements[j] == st.placements[i]; ++j) {
          Step s{StepKind::all_reduce, int(i), int(j), st.placements[i], PlacementDesc::replicate()};
          const double c = base + 1000.0 + detail::step_volume(st, s) + 1e-6;
          relax(best, apply_step(st, s), s, c);
        }
    }
  }

  // Walk back from the target to the source.
  std::size_t target = 0;
  while (!(nodes[target].done && nodes[target].state == to)) ++target;
  std::array<Step, Plan<N>::capacity> rev{};
  std::size_t len = 0;
  for (int n = int(target); nodes[std::size_t(n)].parent >= 0; n = nodes[std::size_t(n)].parent) {
    if (len == rev.size()) throw Error("redistribute", "plan longer than its capacity (a bug in the planner)");
    rev[len++] = nodes[std::size_t(n)].step;
  }
  Plan<N> p;
  p.from = from;
  p.to = to;
  p.size = len;
  for (std::size_t k = 0; k < len; ++k) p.steps[k] = rev[len - 1 - k];
  return p;
}

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
