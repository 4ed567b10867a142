// dtensor/ops/rules.hpp — the sharding rules of the ops: input layouts -> output layout, per
// mesh dimension, at compile time.
//
//   using Y = ops::rules::matmul_t<Layout<Shard<0>>, Layout<Replicate>, false, false>;  // Layout<Shard<0>>
//   constexpr auto r = ops::rules::Matmul{2, 2, false, false}({S(1), S(0)});           // r.out == P(sum)
//   ops::rules::outcome<ops::rules::Matmul{2, 2, false, false}, LA, LB>                 // whole layouts
//
// A rule is a constexpr function object on the placements of its operands on ONE mesh
// dimension: operator()(std::array<PlacementDesc, K>) -> DimRule {ok, out, source}. The engine
// (`apply_rule`) runs it on every mesh dimension of the operands' layouts and assembles the output
// layout; `layout_t` turns that value back into a Layout type. The same value functions render
// the rule tables of docs/ops.md (tests/unit/test_ops_docs.cpp), so docs and code cannot drift.
//
// Split order: when several mesh dimensions shard one tensor dimension, an operand's order
// (Layout<...>::ordered) carries over to the output (from the operand the rule names as
// `source`); two operands that pair their shards on a mesh dimension (the contracted dimension
// of a matmul, the same dimension of an add) must split in the same order.
//
// A layout with no rule does not compile: the op calls detail::require_rule, whose diagnostic
// names the op, the placements and the mesh dimension, e.g.
//   no_sharding_rule<Msg{"matmul has no rule for (Shard<0>, Shard<0>) on mesh dimension 0 (tp):
//   redistribute one operand first"}>
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dtensor/distributed/dtensor.hpp"  // replicated_layout
#include "dtensor/placement/layout.hpp"

namespace dtensor::ops::rules {

// ---------------------------------------------------------------- placements as values

inline constexpr PlacementDesc R = PlacementDesc::replicate();
constexpr PlacementDesc S(int d) { return PlacementDesc::shard(d); }
constexpr PlacementDesc P(ReduceOp op = ReduceOp::sum) { return PlacementDesc::partial(op); }

/// Partial<sum> and Partial<avg> commute with every linear map; max and min do not.
constexpr bool is_linear_partial(const PlacementDesc& p) {
  return p.is_partial() && (p.op == ReduceOp::sum || p.op == ReduceOp::avg);
}

/// The outcome of a rule on one mesh dimension.
struct DimRule {
  bool ok = false;
  PlacementDesc out{};
  int source = -1;  // the operand whose split order the output keeps (-1: none)
};
constexpr DimRule no_rule() { return {}; }
constexpr DimRule yields(PlacementDesc p, int source = -1) { return {true, p, p.is_shard() ? source : -1}; }

// ---------------------------------------------------------------- the rules, one mesh dimension

/// Pointwise with one operand (gelu, relu, silu, exp, and `linear` ones: scale). Shard and
/// Replicate pass through; Partial<sum|avg> only through linear maps.
struct Unary {
  bool linear = false;
  constexpr DimRule operator()(const std::array<PlacementDesc, 1>& p) const {
    const auto& x = p[0];
    if (x.is_shard()) return yields(x, 0);
    if (x.is_replicate()) return yields(R);
    if (linear && is_linear_partial(x)) return yields(x);
    return no_rule();
  }
};

/// Pointwise with two operands of the same rank, numpy broadcasting (extent 1) allowed.
/// kind add: a + b, a - b (linear in both); kind mul: a * b (linear in each separately).
/// (Shard<d>, Replicate) is allowed as a broadcast: the Replicate operand must have extent 1 in
/// d, which the op checks at run time.
struct Binary {
  enum Kind : int { add, mul } kind = add;
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &a = p[0], &b = p[1];
    if (a.is_shard() && a == b) return yields(a, 0);
    if (a.is_replicate() && b.is_replicate()) return yields(R);
    if (a.is_shard() && b.is_replicate()) return yields(a, 0);  // b broadcasts along a.dim
    if (a.is_replicate() && b.is_shard()) return yields(b, 1);  // a broadcasts along b.dim
    if (kind == add && is_linear_partial(a) && a == b) return yields(a);
    if (kind == mul && is_linear_partial(a) && b.is_replicate()) return yields(a);
    if (kind == mul && a.is_replicate() && is_linear_partial(b)) return yields(b);
    return no_rule();
  }
};

/// x[..., C] + bias[C]: the bias is Replicate, or sharded like x's last dimension.
struct BiasAdd {
  int rank = 2;  // x's rank
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &x = p[0], &b = p[1];
    if (x.is_shard() && x.dim < rank - 1 && b.is_replicate()) return yields(x, 0);
    if (x.is_shard(rank - 1) && b.is_shard(0)) return yields(x, 0);
    if (x.is_replicate() && b.is_replicate()) return yields(R);
    if (is_linear_partial(x) && x == b) return yields(x);
    return no_rule();
  }
};

/// Sum over every dimension of dy[..., C] but the last (the gradient of a bias or of a norm's
/// weight): rows split across ranks give Partial<sum>; a split last dimension stays split.
struct SumRows {
  int rank = 2;  // dy's rank
  constexpr DimRule operator()(const std::array<PlacementDesc, 1>& p) const {
    const auto& g = p[0];
    if (g.is_shard(rank - 1)) return yields(S(0), 0);
    if (g.is_shard()) return yields(P());
    if (g.is_replicate()) return yields(R);
    if (is_linear_partial(g)) return yields(g);
    return no_rule();
  }
};

/// The adjoint of broadcasting an operand of layout q to dy's extents: dy split along a
/// dimension the operand broadcasts over (q Replicate) sums to Partial<sum>.
struct SumTo {
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &g = p[0], &q = p[1];
    if (g.is_shard() && q == g) return yields(g, 0);
    if (g.is_shard() && q.is_replicate()) return yields(P());
    if (g.is_shard()) return no_rule();
    if (g.is_replicate()) return yields(R);
    if (is_linear_partial(g) && (q.is_replicate() || q == g)) return yields(g);
    return no_rule();
  }
};

/// The gradient of an input x of a map that is linear in dy (the backward of gelu, of a norm,
/// of softmax, of attention): dy is split like x, or x is Replicate and dy is Replicate or
/// Partial (a Partial dy gives a Partial gradient).
struct LinearInGrad {
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &x = p[0], &g = p[1];
    if (x.is_shard() && g == x) return yields(x, 0);
    if (x.is_replicate() && (g.is_replicate() || is_linear_partial(g))) return yields(g);
    return no_rule();
  }
};

/// Reductions over dimension `dim` (kept with extent 1). sum and mean of a split dimension give
/// Partial<sum> (mean: each rank's sum divided by the GLOBAL extent, so uneven chunks are exact,
/// which Partial<avg> of local means would not be); max gives Partial<max>.
struct Reduce {
  enum Kind : int { sum, mean, max } kind = sum;
  int dim = 0;
  constexpr DimRule operator()(const std::array<PlacementDesc, 1>& p) const {
    const auto& x = p[0];
    if (x.is_shard(dim)) return yields(P(kind == max ? ReduceOp::max : ReduceOp::sum));
    if (x.is_shard()) return yields(x, 0);
    if (x.is_replicate()) return yields(R);
    if (kind != max && is_linear_partial(x)) return yields(x);
    if (kind == max && x.is_partial() && x.op == ReduceOp::max) return yields(x);
    return no_rule();
  }
};

/// The backward of a reduction over `dim`: dy broadcast back to x's extents. Where x was split
/// along dim the forward gave a Partial, whose gradient dy is Replicate: each rank takes its
/// chunk. operands: (x, dy).
struct ReduceBackward {
  int dim = 0;
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &x = p[0], &g = p[1];
    if (x.is_shard(dim)) return g.is_replicate() ? yields(x, 0) : no_rule();
    if (x.is_shard()) return g == x ? yields(x, 0) : no_rule();
    if (x.is_replicate()) return g.is_replicate() || is_linear_partial(g) ? yields(g) : no_rule();
    if (x.is_partial()) return g.is_replicate() ? yields(R) : no_rule();
    return no_rule();
  }
};

/// Row-wise ops over the last dimension (softmax, log-softmax; the x of layer_norm / rms_norm):
/// the last dimension must not be split, and Partial is not allowed (they are not linear).
/// Further operands (norm weight and bias) must be Replicate.
template <std::size_t K>
struct Rowwise {
  int rank = 2;
  constexpr DimRule operator()(const std::array<PlacementDesc, K>& p) const {
    for (std::size_t i = 1; i < K; ++i)
      if (!p[i].is_replicate()) return no_rule();
    if (p[0].is_shard() && p[0].dim < rank - 1) return yields(p[0], 0);
    if (p[0].is_replicate()) return yields(R);
    return no_rule();
  }
};

/// A matrix product with dimension roles, shared by matmul (leading dimensions flattened into
/// rows) and bmm (leading dimensions are batch): see `Matmul` and `Bmm` below.
/// Role of each operand dimension: M (rows of op(a)), N (columns of op(b)), K (contracted,
/// with a position), B (batch, with a position); `out` is the output dimension of M/N/B.
struct Role {
  enum Kind : int { none, m, n, k, batch } kind = none;
  int pos = 0;   // position within a contracted or batch group (pairs a with b)
  int out = -1;  // output dimension (m, n, batch)
};
template <int MaxRank = 8>
struct Roles {
  std::array<Role, MaxRank> a{}, b{};
};

/// Shared per-mesh-dimension rule of the matrix products.
template <class Rs>
constexpr DimRule contraction(const Rs& roles, const std::array<PlacementDesc, 2>& p) {
  const auto &a = p[0], &b = p[1];
  if (a.is_replicate() && b.is_replicate()) return yields(R);
  if (is_linear_partial(a) && b.is_replicate()) return yields(a);
  if (a.is_replicate() && is_linear_partial(b)) return yields(b);
  if (a.is_shard() && b.is_replicate()) {
    const Role r = roles.a[std::size_t(a.dim)];
    return r.kind == Role::m ? yields(S(r.out), 0) : no_rule();
  }
  if (a.is_replicate() && b.is_shard()) {
    const Role r = roles.b[std::size_t(b.dim)];
    return r.kind == Role::n ? yields(S(r.out), 1) : no_rule();
  }
  if (a.is_shard() && b.is_shard()) {
    const Role ra = roles.a[std::size_t(a.dim)], rb = roles.b[std::size_t(b.dim)];
    if (ra.kind == Role::k && rb.kind == Role::k && ra.pos == rb.pos) return yields(P());
    if (ra.kind == Role::batch && rb.kind == Role::batch && ra.pos == rb.pos) return yields(S(ra.out), 0);
  }
  return no_rule();
}

/// matmul<TA, TB>(a, b): each operand is a matrix whose rows may be a group of leading
/// dimensions, flattened (x[B, T, C] is [B*T, C]). a of rank ra is [lead_a..., last_a] and
/// op(a) = a or a^T; likewise b. The output is [rows of op(a)..., columns of op(b)...], of rank
/// matmul_rank(ra, rb, ta, tb). The contracted groups must have the same number of dimensions.
struct Matmul {
  int ra = 2, rb = 2;
  bool ta = false, tb = false;

  /// Leading-group sizes: rows of op(a), contracted of a, contracted of b, columns of op(b).
  constexpr int a_rows() const { return ta ? 1 : ra - 1; }
  constexpr int a_contracted() const { return ta ? ra - 1 : 1; }
  constexpr int b_contracted() const { return tb ? 1 : rb - 1; }
  constexpr int b_cols() const { return tb ? rb - 1 : 1; }
  constexpr int out_rank() const { return a_rows() + b_cols(); }
  constexpr bool valid() const { return ra >= 2 && rb >= 2 && a_contracted() == b_contracted(); }

  constexpr Roles<> roles() const {
    Roles<> r;
    // a: the group [0, ra-1) and the last dimension; which is rows and which is contracted.
    for (int d = 0; d < ra; ++d) {
      const bool in_lead = d < ra - 1;
      const bool is_rows = ta ? !in_lead : in_lead;
      if (is_rows) r.a[std::size_t(d)] = {Role::m, 0, ta ? 0 : d};
      else r.a[std::size_t(d)] = {Role::k, ta ? d : 0, -1};
    }
    for (int d = 0; d < rb; ++d) {
      const bool in_lead = d < rb - 1;
      const bool is_cols = tb ? in_lead : !in_lead;
      if (is_cols) r.b[std::size_t(d)] = {Role::n, 0, a_rows() + (tb ? d : 0)};
      else r.b[std::size_t(d)] = {Role::k, tb ? 0 : d, -1};
    }
    return r;
  }
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const { return contraction(roles(), p); }
};

/// bmm<TA, TB>(a, b): a[batch..., m, k] b[batch..., k, n] (last two dimensions transposed by
/// TA / TB), the same batch dimensions in both; output [batch..., m, n].
struct Bmm {
  int rank = 3;
  bool ta = false, tb = false;
  constexpr Roles<> roles() const {
    Roles<> r;
    const int nb = rank - 2;
    for (int d = 0; d < nb; ++d) r.a[std::size_t(d)] = r.b[std::size_t(d)] = {Role::batch, d, d};
    r.a[std::size_t(nb + (ta ? 1 : 0))] = {Role::m, 0, nb};
    r.a[std::size_t(nb + (ta ? 0 : 1))] = {Role::k, 0, -1};
    r.b[std::size_t(nb + (tb ? 1 : 0))] = {Role::k, 0, -1};
    r.b[std::size_t(nb + (tb ? 0 : 1))] = {Role::n, 0, nb + 1};
    return r;
  }
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const { return contraction(roles(), p); }
};

/// embedding(weight[V, C], ids[...]) -> [..., C]: ids split (data / sequence parallel), the
/// vocabulary split (Partial<sum>: an id outside a rank's rows gives zeros), or the embedding
/// dimension split.
struct Embedding {
  int ids_rank = 1;
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &w = p[0], &ids = p[1];
    if (w.is_replicate() && ids.is_shard()) return yields(ids, 1);
    if (w.is_replicate() && ids.is_replicate()) return yields(R);
    if (w.is_shard(0) && ids.is_replicate()) return yields(P());
    if (w.is_shard(1) && ids.is_replicate()) return yields(S(ids_rank), 0);
    return no_rule();
  }
};

/// The weight gradient of embedding: operands (weight, ids, dy).
struct EmbeddingBackward {
  int ids_rank = 1;
  constexpr DimRule operator()(const std::array<PlacementDesc, 3>& p) const {
    const auto &w = p[0], &ids = p[1], &g = p[2];
    if (w.is_replicate() && ids.is_shard() && g == ids) return yields(P());
    if (w.is_replicate() && ids.is_replicate() && (g.is_replicate() || is_linear_partial(g))) return yields(g);
    if (w.is_shard(0) && ids.is_replicate() && g.is_replicate()) return yields(w, 0);
    if (w.is_shard(1) && ids.is_replicate() && g.is_shard(ids_rank)) return yields(w, 0);
    return no_rule();
  }
};

/// cross_entropy(logits[N, V], targets[N]) -> the mean loss, a [1] tensor. Rows split: each
/// rank's sum over its rows divided by the global N, Partial<sum>. A split vocabulary needs
/// global statistics (loss parallel, parallel/), not an op.
struct CrossEntropy {
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &l = p[0], &t = p[1];
    if (l.is_shard(0) && t.is_shard(0)) return yields(P());
    if (l.is_replicate() && t.is_replicate()) return yields(R);
    return no_rule();
  }
};

/// attention(q, k, v), each [B, H, T, D]: batch or heads split the same way in all three.
/// A split sequence is context parallelism (parallel/), not an op.
struct Attention {
  constexpr DimRule operator()(const std::array<PlacementDesc, 3>& p) const {
    const auto &q = p[0], &k = p[1], &v = p[2];
    if ((q.is_shard(0) || q.is_shard(1)) && k == q && v == q) return yields(q, 0);
    if (q.is_replicate() && k.is_replicate() && v.is_replicate()) return yields(R);
    return no_rule();
  }
};

/// The gradients of q, k, v: operands (q, dout); linear in dout.
using AttentionBackward = LinearInGrad;

/// transpose of dimensions d0 and d1: pure data movement, every placement carries over.
struct Transpose {
  int d0 = 0, d1 = 1;
  constexpr DimRule operator()(const std::array<PlacementDesc, 1>& p) const {
    const auto& x = p[0];
    if (x.is_shard(d0)) return yields(S(d1), 0);
    if (x.is_shard(d1)) return yields(S(d0), 0);
    return yields(x, 0);
  }
};

/// split / concat along `dim`: that dimension must not be split across ranks.
struct AlongDim {
  int dim = 0;
  constexpr DimRule operator()(const std::array<PlacementDesc, 1>& p) const {
    if (p[0].is_shard(dim)) return no_rule();
    return yields(p[0], 0);
  }
};

/// reshape to an explicitly given layout: the kinds must correspond (Shard to Shard — which
/// dimension is checked at run time —, Replicate to Replicate, Partial to the same Partial).
/// operands: (input, requested output).
struct Reshape {
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &x = p[0], &y = p[1];
    if (x.is_shard() && y.is_shard()) return yields(y, 0);
    if (x.kind == y.kind && !x.is_shard() && x == y) return yields(y);
    return no_rule();
  }
};

/// The gradient of reshape: (input x, dy) -> x's shard dimensions, dy's Replicate / Partial.
struct ReshapeBackward {
  constexpr DimRule operator()(const std::array<PlacementDesc, 2>& p) const {
    const auto &x = p[0], &g = p[1];
    if (x.is_shard() && g.is_shard()) return yields(x, 0);
    if (x.is_replicate() && (g.is_replicate() || is_linear_partial(g))) return yields(g);
    if (x.is_partial() && g.is_replicate()) return yields(R);
    return no_rule();
  }
};

// ---------------------------------------------------------------- the engine: all mesh dimensions

template <std::size_t N>
struct Outcome {
  bool ok = true;
  int failed_dim = -1;      // the first mesh dimension without a rule
  bool order_ok = true;     // paired shards split in the same order
  int order_dim = -1;
  LayoutDesc<N> out{};
};

/// Runs `rule` on every mesh dimension of the operand layouts.
template <class Rule, std::size_t N, std::size_t K>
constexpr Outcome<N> apply_rule(const Rule& rule, const std::array<LayoutDesc<N>, K>& in) {
  Outcome<N> o;
  for (std::size_t i = 0; i < N; ++i) {
    std::array<PlacementDesc, K> p{};
    for (std::size_t j = 0; j < K; ++j) p[j] = in[j].placements[i];
    const DimRule r = rule(p);
    if (!r.ok) {
      o.ok = false;
      o.failed_dim = int(i);
      return o;
    }
    o.out.placements[i] = r.out;
    o.out.priority[i] = r.source >= 0 ? in[std::size_t(r.source)].priority[i] : int(i);
    // Operands sharded on the same mesh dimension are paired by the rule: same split order.
    for (std::size_t j = 0; j < K; ++j)
      for (std::size_t l = j + 1; l < K; ++l)
        if (p[j].is_shard() && p[l].is_shard() && in[j].outer_mask(i) != in[l].outer_mask(i) && o.order_ok) {
          o.order_ok = false;
          o.order_dim = int(i);
        }
  }
  return o;
}

/// The mesh rank of the first of an op's layouts (an op's layouts share one mesh).
template <LayoutType L0, LayoutType...>
inline constexpr std::size_t first_mesh_ndim = L0::mesh_ndim;

template <auto Rule, LayoutType... L>
inline constexpr auto outcome = apply_rule(Rule, std::array<LayoutDesc<first_mesh_ndim<L...>>, sizeof...(L)>{L::desc...});

// ---------------------------------------------------------------- values back to types

namespace detail {

template <PlacementDesc P>
struct placement_type {
  using type = Replicate;
};
template <PlacementDesc P>
  requires(P.kind == PlacementKind::shard)
struct placement_type<P> {
  using type = Shard<P.dim>;
};
template <PlacementDesc P>
  requires(P.kind == PlacementKind::partial)
struct placement_type<P> {
  using type = Partial<P.op>;
};

/// Mesh dimensions sorted by split priority (ties by index): the ShardOrder of a layout.
template <std::size_t N>
constexpr std::array<int, N> split_order(const LayoutDesc<N>& l) {
  std::array<int, N> o{};
  for (std::size_t i = 0; i < N; ++i) o[i] = int(i);
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t j = i + 1; j < N; ++j)
      if (l.splits_before(std::size_t(o[j]), std::size_t(o[i]))) std::swap(o[i], o[j]);
  return o;
}

/// Whether the left-to-right default order gives the same layout (then the type is Layout<...>,
/// which is what users spell).
template <std::size_t N>
constexpr bool default_order(const LayoutDesc<N>& l) {
  LayoutDesc<N> d = l;
  for (std::size_t i = 0; i < N; ++i) d.priority[i] = int(i);
  return d == l;
}

template <auto Desc, class Seq>
struct layout_of;
template <auto Desc, std::size_t... I>
struct layout_of<Desc, std::index_sequence<I...>> {
  static constexpr auto order = split_order(Desc);
  using type = std::conditional_t<default_order(Desc), Layout<typename placement_type<Desc.placements[I]>::type...>,
                                  BasicLayout<ShardOrder<order[I]...>, typename placement_type<Desc.placements[I]>::type...>>;
};

}  // namespace detail

/// The Layout type of a layout value (canonical: Layout<...> whenever the order is the default).
template <auto Desc>
using layout_t = typename detail::layout_of<Desc, std::make_index_sequence<Desc.placements.size()>>::type;

/// The output layout of `Rule` on layouts L... (the replicated layout when there is no rule, so
/// that an op whose rule failed reports that one error and no follow-on ones).
template <auto Rule, LayoutType... L>
using result_t = std::conditional_t<outcome<Rule, L...>.ok, layout_t<outcome<Rule, L...>.out>,
                                    replicated_layout<first_mesh_ndim<L...>>>;

// ---------------------------------------------------------------- the rule metafunctions of each op

template <LayoutType LA, LayoutType LB, bool TA = false, bool TB = false, std::size_t RA = 2, std::size_t RB = 2>
using matmul_t = result_t<Matmul{int(RA), int(RB), TA, TB}, LA, LB>;
template <std::size_t RA, std::size_t RB, bool TA, bool TB>
inline constexpr std::size_t matmul_rank = std::size_t(Matmul{int(RA), int(RB), TA, TB}.out_rank());
template <LayoutType LA, LayoutType LB, bool TA = false, bool TB = false, std::size_t Rank = 3>
using bmm_t = result_t<Bmm{int(Rank), TA, TB}, LA, LB>;
template <LayoutType L>
using unary_t = result_t<Unary{false}, L>;
template <LayoutType L>
using linear_unary_t = result_t<Unary{true}, L>;
template <LayoutType LA, LayoutType LB>
using add_t = result_t<Binary{Binary::add}, LA, LB>;
template <LayoutType LA, LayoutType LB>
using mul_t = result_t<Binary{Binary::mul}, LA, LB>;
template <LayoutType LX, LayoutType LBias, std::size_t Rank>
using bias_add_t = result_t<BiasAdd{int(Rank)}, LX, LBias>;
template <LayoutType LDy, std::size_t Rank>
using sum_rows_t = result_t<SumRows{int(Rank)}, LDy>;
template <LayoutType LDy, LayoutType LOperand>
using sum_to_t = result_t<SumTo{}, LDy, LOperand>;
template <LayoutType LX, LayoutType LDy>
using linear_in_grad_t = result_t<LinearInGrad{}, LX, LDy>;
template <LayoutType L, int Dim>
using sum_t = result_t<Reduce{Reduce::sum, Dim}, L>;
template <LayoutType L, int Dim>
using mean_t = result_t<Reduce{Reduce::mean, Dim}, L>;
template <LayoutType L, int Dim>
using max_t = result_t<Reduce{Reduce::max, Dim}, L>;
template <LayoutType LX, LayoutType LDy, int Dim>
using reduce_backward_t = result_t<ReduceBackward{Dim}, LX, LDy>;
template <LayoutType L, std::size_t Rank>
using softmax_t = result_t<Rowwise<1>{int(Rank)}, L>;
template <LayoutType LX, LayoutType LW, LayoutType LB, std::size_t Rank>
using layer_norm_t = result_t<Rowwise<3>{int(Rank)}, LX, LW, LB>;
template <LayoutType LX, LayoutType LW, std::size_t Rank>
using rms_norm_t = result_t<Rowwise<2>{int(Rank)}, LX, LW>;
template <LayoutType LW, LayoutType LIds, std::size_t IdsRank>
using embedding_t = result_t<Embedding{int(IdsRank)}, LW, LIds>;
template <LayoutType LW, LayoutType LIds, LayoutType LDy, std::size_t IdsRank>
using embedding_grad_t = result_t<EmbeddingBackward{int(IdsRank)}, LW, LIds, LDy>;
template <LayoutType LLogits, LayoutType LTargets>
using cross_entropy_t = result_t<CrossEntropy{}, LLogits, LTargets>;
template <LayoutType LQ, LayoutType LK, LayoutType LV>
using attention_t = result_t<Attention{}, LQ, LK, LV>;
template <LayoutType L, int D0, int D1>
using transpose_t = result_t<Transpose{D0, D1}, L>;
template <LayoutType L, int Dim>
using along_dim_t = result_t<AlongDim{Dim}, L>;
template <LayoutType LX, LayoutType LY>
using reshape_t = result_t<Reshape{}, LX, LY>;
template <LayoutType LX, LayoutType LDy>
using reshape_grad_t = result_t<ReshapeBackward{}, LX, LDy>;

}  // namespace dtensor::ops::rules
