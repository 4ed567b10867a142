// dtensor/parallel/context_parallel.hpp — attention with the sequence split over the context
// dimension: ring attention (K/V rotate, split-phase), all-gather-KV, and Ulysses (all-to-all).
//
//   using Mesh = DeviceMesh<"cp">;                                  // or ("dp", "cp", "tp"), ...
//   using L = Layout<Shard<2>>;                                      // q, k, v [B, H, T, D]: T split on "cp"
//   parallel::ContextAttentionOptions o{.kind = parallel::ContextKind::ring, .load_balanced = true};
//   auto [out, saved] = parallel::context_attention(q, k, v, o);    // out [B, H, T, Dv], laid out like q
//   auto g = parallel::context_attention_backward(dout, q, k, v, out, saved, o);   // g.dq, g.dk, g.dv
//
// The result equals causal attention over the whole sequence (ops::attention of the gathered
// tensors), in the original order of positions: with load_balanced the tensors are stored in
// the head-tail order of parallel/context_layout.hpp and the causal mask is applied to the
// original positions. The head dimension is never split here; batch and heads may be split on
// other mesh dimensions (data, tensor) and are left alone.
//
// Collectives, all on the context group (size cp), per call:
//   ring       forward: cp−1 steps, each one send_recv of K and one of V to the next rank
//              (2·(cp−1) send_recv). With overlap (the default) step s+1's transfer is issued
//              before step s's attention and waited on after it (split-phase); the trace shows it.
//              backward: the same K/V rotation, plus the dK/dV accumulators travelling with
//              them: cp steps of one send_recv each for dK and dV, the last bringing each
//              chunk's gradient home (2·(cp−1) + 2·cp send_recv). An accumulator's transfer
//              overlaps the next step's attention, which works into a fresh buffer.
//   allgather  forward: K and V all-gathered (2 all_gather); backward: gathered again (memory
//              stays 1/cp between passes) and dK, dV reduce-scattered home (2 all_gather, 2
//              reduce_scatter), through redistribute.
//   ulysses    forward: q, k, v all-to-all from sequence-split to head-split, out back (4
//              all_to_all); backward: dout in, dq, dk, dv out (4 all_to_all). The local heads
//              (after any tensor-parallel split) must divide by cp. The head-split q, k, v, out
//              and lse are saved, so the backward does not send them again.
// KV-cached inference (ContextAttention::prefill / decode, for nn::SelfAttention::forward_cached
// and models::generate): the prompt runs as forward runs it and each rank keeps its own shard of
// K and V (ContextKvCache: the cache stays split, no rank holds all of it); a decode step issues
// three all_gather on the context group (the new q, k, v packed; the partial outputs; their
// log-sum-exps), attends the query to this rank's rows and merges by log-sum-exp; the new row
// joins the cache of the rank with the fewest rows (the lowest on ties).
// Memory: ring and ulysses hold O(T/cp) of K/V (ring: two chunks in flight); allgather holds
// all of K and V for the duration of the call.
// Any memory space: the local attention is kernels/attention_chunk.hpp over the space's
// attention kernels, and the packing for Ulysses is box copies of the space, so the same code
// runs on host, cuda and meta tensors (on meta it records the same collectives and the FLOPs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/kernels/attention_chunk.hpp"
#include "dtensor/kernels/repeat.hpp"
#include "dtensor/mesh/roles.hpp"
#include "dtensor/nn/attention.hpp"
#include "dtensor/nn/attention_core.hpp"
#include "dtensor/ops/attention.hpp"
#include "dtensor/parallel/context_layout.hpp"

namespace dtensor::parallel {

// The options (what the attention module's configuration carries): nn/context_options.hpp.
using nn::ContextAttentionOptions;
using nn::ContextEvent;

/// What the backward needs besides q, k, v and out. The log-sum-exp is this rank's [B, H, T/cp]
/// in stored order (ring, allgather); under Ulysses the head-split tensors in original order.
template <class T, class Space = host_space>
struct ContextAttentionSaved {
  Tensor<kernels::Stat, 3, Space> lse;
  Tensor<T, 4, Space> q, k, v, out;  // ulysses only: [B, H/cp, T, D]
  std::size_t pairs = 0;             // (query, key) scores this rank computed in forward
  auto tensors() { return std::tie(lse, q, k, v, out); }  // what an activation offload moves (nn/activation_offload.hpp)
};

template <class O>
struct ContextAttentionResult {
  O out;
  ContextAttentionSaved<typename O::value_type, typename O::space> saved;
};

/// The index of the mesh's context dimension, or Mesh::ndim when it has none.
template <class Mesh>
inline constexpr std::size_t context_dim = role_dim<Mesh, Role::context>;

/// The size of the mesh's context dimension (1 without one).
template <class Mesh>
int context_size(const Mesh& mesh) {
  return role_size<Role::context>(mesh);
}

namespace detail {

/// Layout L with placement P on mesh dimension I.
template <class L, std::size_t I, class P>
struct replace_placement;
template <class Order, class... Ps, std::size_t I, class P>
struct replace_placement<BasicLayout<Order, Ps...>, I, P> {
  template <std::size_t... J>
  static auto make(std::index_sequence<J...>)
      -> BasicLayout<Order, std::conditional_t<J == I, P, std::tuple_element_t<J, std::tuple<Ps...>>>...>;
  using type = decltype(make(std::index_sequence_for<Ps...>{}));
};
template <class L, std::size_t I, class P>
using replace_placement_t = typename replace_placement<L, I, P>::type;

/// q, k, v: [B, H, T, D], T split on the context dimension and on no other.
template <class Q>
constexpr bool context_split_sequence() {
  using Mesh = typename Q::mesh_type;
  constexpr std::size_t cp = context_dim<Mesh>;
  if constexpr (cp == Mesh::ndim) return false;
  else {
    for (std::size_t i = 0; i < Mesh::ndim; ++i)
      if (Q::layout::desc.placements[i].is_shard(2) != (i == cp)) return false;
    return !Q::layout::desc.has_partial();
  }
}

inline Extent repeat_of(const ContextAttentionOptions& o) { return Extent(o.kv_repeat); }

/// x [B, K, T, D] with every head repeated for the query heads it serves (o.kv_repeat > 1).
template <class T, class Space>
Tensor<T, 4, Space> repeated_heads(const Tensor<T, 4, Space>& x, const ContextAttentionOptions& o) {
  return kernels::repeat_interleave(x, 1, repeat_of(o));
}
/// The gradient of repeated_heads: dx [B, H, T, D] summed over each KV head's query heads.
template <class T, class Space>
Tensor<T, 4, Space> summed_heads(const Tensor<T, 4, Space>& dx, const ContextAttentionOptions& o) {
  return o.kv_repeat > 1 ? kernels::repeat_interleave_backward(dx, 1, repeat_of(o)) : dx;
}

template <class Q, class K, class V>
void check_context_attention(const char* op, const Q& q, const K& k, const V& v, const ContextAttentionOptions& o) {
  static_assert(std::is_same_v<Q, K> && std::is_same_v<Q, V>, "context attention: q, k and v must have one type");
  static_assert(Q::rank == 4 && kernels::host::FloatElement<typename Q::value_type>,
                "context attention: q, k, v are [B, H, T, D] of a floating-point type");
  static_assert(context_split_sequence<Q>(),
                "context attention: the mesh needs a context dimension (Role::context, \"cp\") and q, k, v must be "
                "Shard<2> (the sequence) on it and on no other mesh dimension, and not Partial");
  const auto &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  const Extent repeat = repeat_of(o);
  if (!(repeat >= 1 && qs[0] == ks[0] && qs[1] == ks[1] * repeat && qs[2] == ks[2] && qs[3] == ks[3] &&
        vs[0] == ks[0] && vs[1] == ks[1] && vs[2] == ks[2]))
    q.mesh().comm().fail(op, dtensor::detail::cat("q ", to_string(qs), ", k ", to_string(ks), ", v ", to_string(vs),
                                                  ", kv_repeat ", o.kv_repeat,
                                                  ": expected q [B, H, T, D], k [B, H / kv_repeat, T, D] and v [B, H / "
                                                  "kv_repeat, T, Dv]"));
}

inline kernels::host::AttentionOptions kernel_options(const ContextAttentionOptions& o, Extent head_dim) {
  return {.causal = o.causal, .scale = o.scale != 0 ? o.scale : 1.0 / std::sqrt(double(std::max<Extent>(1, head_dim)))};
}

inline void note(const ContextAttentionOptions& o, ContextEvent::Kind k, int step) {
  if (o.trace) o.trace->push_back({k, step});
}

/// Each context rank's pieces, indexed by rank.
inline std::vector<std::vector<SeqPiece>> all_pieces(Extent seq, int cp, bool balanced) {
  std::vector<std::vector<SeqPiece>> out;
  for (int r = 0; r < cp; ++r) out.push_back(context_pieces(seq, cp, r, balanced));
  return out;
}

/// The pieces of all ranks as runs of the gathered (stored-order) sequence.
inline std::vector<SeqPiece> gathered_pieces(Extent seq, int cp, bool balanced) {
  std::vector<SeqPiece> out;
  for (int r = 0; r < cp; ++r)
    for (auto p : context_pieces(seq, cp, r, balanced)) {
      p.local += chunk_range(seq, cp, r).begin;
      out.push_back(p);
    }
  return out;
}

template <class T, class Space>
using Local4 = Tensor<T, 4, Space>;

/// A [B, H, len, D] tensor with the same B, H, D as x.
template <class T, class Space>
Local4<T, Space> with_length(const Local4<T, Space>& x, Extent len) {
  return Local4<T, Space>::uninitialized(Shape<4>{x.extent(0), x.extent(1), len, x.extent(3)});
}

template <class T, class Space>
std::span<const T> view(const Local4<T, Space>& x) { return {x.data(), std::size_t(x.numel())}; }
template <class T, class Space>
std::span<T> view(Local4<T, Space>& x) { return {x.data(), std::size_t(x.numel())}; }

// Tags keep the four streams of a ring step apart.
inline constexpr int tag_k = 0x6b, tag_v = 0x76, tag_dk = 0x646b, tag_dv = 0x6476;

/// The K/V rotation of a ring: step s holds the chunk of rank (r − s) mod cp; advance() makes
/// the next one current. issue() starts the transfer (to rank r+1, from rank r−1).
template <class T, class Space>
struct KvRing {
  Communicator& comm;
  Extent seq;
  Local4<T, Space> k, v, next_k, next_v;
  Work wk, wv;

  int owner(int step) const { return (comm.rank() - step + 2 * comm.size()) % comm.size(); }
  void issue(int step) {  // the transfer that brings step `step`'s chunk
    const int n = comm.size(), r = comm.rank();
    const Extent len = chunk_range(seq, n, owner(step)).size();
    next_k = with_length(k, len);
    next_v = with_length(v, len);
    wk = comm.send_recv_async<T>(view(k), (r + 1) % n, view(next_k), (r - 1 + n) % n, tag_k);
    wv = comm.send_recv_async<T>(view(v), (r + 1) % n, view(next_v), (r - 1 + n) % n, tag_v);
  }
  void advance() {
    wk.wait();
    wv.wait();
    k = std::move(next_k);
    v = std::move(next_v);
  }
};

// ---------------------------------------------------------------- Ulysses' all-to-alls

/// [B, H, e_r, D] (this rank's positions, all local heads) -> [B, H/cp, T, D] (head block r of
/// every position, stored order). One all_to_all; uneven chunks travel padded to ceil(T/cp).
template <class T, class Space>
Local4<T, Space> sequence_to_heads(const Local4<T, Space>& x, Communicator& comm, Extent seq) {
  const int n = comm.size();
  const Extent heads = x.extent(1) / n, pad = chunk_range(seq, n, 0).size(), mine = x.extent(2);
  const Shape<4> block{x.extent(0), heads, pad, x.extent(3)};
  const std::size_t block_bytes = std::size_t(numel(block)) * sizeof(T);
  Tensor<T, 1, Space> send(Shape<1>{numel(block) * n}), recv(Shape<1>{numel(block) * n});
  for (int j = 0; j < n; ++j) {
    Local4<T, Space> piece(block);
    copy_box(x, Shape<4>{0, heads * j, 0, 0}, piece, Shape<4>{}, Shape<4>{block[0], heads, mine, block[3]});
    Space::copy(send.data() + numel(block) * j, piece.data(), block_bytes);
  }
  comm.all_to_all<T>(std::span<const T>(send.span()), recv.span());
  Local4<T, Space> out(Shape<4>{block[0], heads, seq, block[3]});
  for (int j = 0; j < n; ++j) {
    auto piece = Local4<T, Space>::uninitialized(block);
    Space::copy(piece.data(), recv.data() + numel(block) * j, block_bytes);
    const Range got = chunk_range(seq, n, j);
    copy_box(piece, Shape<4>{}, out, Shape<4>{0, 0, got.begin, 0}, Shape<4>{block[0], heads, got.size(), block[3]});
  }
  return out;
}

/// The inverse: [B, H/cp, T, D] -> [B, H, e_r, D]. One all_to_all.
template <class T, class Space>
Local4<T, Space> heads_to_sequence(const Local4<T, Space>& x, Communicator& comm, Extent seq) {
  const int n = comm.size(), r = comm.rank();
  const Extent heads = x.extent(1), pad = chunk_range(seq, n, 0).size();
  const Shape<4> block{x.extent(0), heads, pad, x.extent(3)};
  const std::size_t block_bytes = std::size_t(numel(block)) * sizeof(T);
  Tensor<T, 1, Space> send(Shape<1>{numel(block) * n}), recv(Shape<1>{numel(block) * n});
  for (int j = 0; j < n; ++j) {
    const Range to = chunk_range(seq, n, j);
    Local4<T, Space> piece(block);
    copy_box(x, Shape<4>{0, 0, to.begin, 0}, piece, Shape<4>{}, Shape<4>{block[0], heads, to.size(), block[3]});
    Space::copy(send.data() + numel(block) * j, piece.data(), block_bytes);
  }
  comm.all_to_all<T>(std::span<const T>(send.span()), recv.span());
  const Extent mine = chunk_range(seq, n, r).size();
  auto out = Local4<T, Space>::uninitialized(Shape<4>{block[0], heads * n, mine, block[3]});
  for (int j = 0; j < n; ++j) {
    auto piece = Local4<T, Space>::uninitialized(block);
    Space::copy(piece.data(), recv.data() + numel(block) * j, block_bytes);
    copy_box(piece, Shape<4>{}, out, Shape<4>{0, heads * j, 0, 0}, Shape<4>{block[0], heads, mine, block[3]});
  }
  return out;
}

template <class Q>
void check_ulysses_heads(const char* op, const Q& q, int cp) {
  if (q.to_local().extent(1) % cp != 0)
    q.mesh().comm().fail(op, dtensor::detail::cat("Ulysses splits this rank's ", q.to_local().extent(1), " heads (of ",
                                                  q.extent(1), ") over the context dimension of size ", cp,
                                                  ": they must divide evenly (heads % (tp * cp) == 0)"));
}

/// Head-split, stored order -> original order (and back), when the stored order is balanced.
template <class T, class Space>
Local4<T, Space> to_original(Local4<T, Space> x, int cp, bool balanced) {
  return balanced ? undo_load_balance(x, 2, cp) : x;
}
template <class T, class Space>
Local4<T, Space> to_stored(Local4<T, Space> x, int cp, bool balanced) {
  return balanced ? load_balance(x, 2, cp) : x;
}

/// What both passes need: the context group, its size and this rank's place, the global
/// sequence length and the kernel's options (the scale from the global head dimension).
struct ContextCall {
  Communicator& comm;
  int size, rank;
  Extent seq;
  kernels::host::AttentionOptions opts;
};
template <class Q>
ContextCall context_call(const Q& q, const ContextAttentionOptions& o) {
  Communicator& comm = q.mesh().group(context_dim<typename Q::mesh_type>, context_dim<typename Q::mesh_type>);
  return {comm, comm.size(), comm.rank(), q.extent(2), kernel_options(o, q.extent(3))};
}

}  // namespace detail

/// Attention over the whole sequence with q, k, v split on the context dimension; see the top.
template <class Q, class K, class V>
ContextAttentionResult<Q> context_attention(const Q& q, const K& k, const V& v, const ContextAttentionOptions& o = {}) {
  detail::check_context_attention("context_attention", q, k, v, o);
  using T = typename Q::value_type;
  using Space = typename Q::space;
  constexpr std::size_t cp_dim = context_dim<typename Q::mesh_type>;
  const auto [comm, n, r, seq, opts] = detail::context_call(q, o);
  const Shape<4> global{q.extent(0), q.extent(1), seq, v.extent(3)};
  ContextAttentionSaved<T, Space> saved;

  if (o.kind == ContextKind::ulysses) {
    detail::check_ulysses_heads("context_attention", q, n);
    // The heads are split over the context ranks: K/V repeated first, so each rank has its query heads' keys.
    // Structured bindings are captured through init-captures: clang before 16 cannot name them
    // in a lambda (C++20's P1091 came later there).
    const auto heads_of = [&, &comm = comm, seq = seq, n = n](const Tensor<T, 4, Space>& x) {
      return detail::to_original(detail::sequence_to_heads(x, comm, seq), n, o.load_balanced);
    };
    saved.q = heads_of(q.to_local());
    saved.k = heads_of(o.kv_repeat > 1 ? detail::repeated_heads(k.to_local(), o) : k.to_local());
    saved.v = heads_of(o.kv_repeat > 1 ? detail::repeated_heads(v.to_local(), o) : v.to_local());
    auto f = kernels::attention(saved.q, saved.k, saved.v, opts);
    saved.pairs = std::size_t(kernels::visible_pairs(opts, seq, seq) * saved.q.extent(0) * saved.q.extent(1));
    auto out = detail::heads_to_sequence(detail::to_stored(f.out, n, o.load_balanced), comm, seq);
    saved.out = std::move(f.out);
    saved.lse = std::move(f.lse);
    return {ops::detail::make<T, 4, typename Q::layout>(q.mesh(), global, std::move(out)), std::move(saved)};
  }

  if (n == 1) {  // one context rank holds the whole sequence in original order: one kernel call, no pieces
    // (the chunked path would copy q into a piece, merge the result with an empty block and copy it
    // back: the same values, bit for bit, at the cost of three copies of the output; issue 32)
    auto f = o.kv_repeat > 1 ? kernels::attention(q.to_local(), detail::repeated_heads(k.to_local(), o),
                                                  detail::repeated_heads(v.to_local(), o), opts)
                             : kernels::attention(q.to_local(), k.to_local(), v.to_local(), opts);  // no copy of k, v
    saved.pairs = std::size_t(kernels::visible_pairs(opts, seq, seq) * q.to_local().extent(0) * q.to_local().extent(1));
    saved.lse = std::move(f.lse);
    return {ops::detail::make<T, 4, typename Q::layout>(q.mesh(), global, std::move(f.out)), std::move(saved)};
  }
  kernels::ChunkedAttention<T, Space> acc(q.to_local(), context_pieces(seq, n, r, o.load_balanced), v.extent(3), opts);
  const auto add_chunk = [&](const Tensor<T, 4, Space>& kc, const Tensor<T, 4, Space>& vc, const auto& pieces) {
    if (o.kv_repeat > 1) acc.add_chunk(detail::repeated_heads(kc, o), detail::repeated_heads(vc, o), pieces);
    else acc.add_chunk(kc, vc, pieces);
  };
  if (o.kind == ContextKind::allgather) {
    using Gathered = detail::replace_placement_t<typename Q::layout, cp_dim, Replicate>;
    const auto kg = redistribute<Gathered>(k), vg = redistribute<Gathered>(v);
    add_chunk(kg.to_local(), vg.to_local(), detail::gathered_pieces(seq, n, o.load_balanced));
  } else {
    const auto pieces = detail::all_pieces(seq, n, o.load_balanced);
    detail::KvRing<T, Space> ring{comm, seq, k.to_local(), v.to_local(), {}, {}, {}, {}};
    for (int step = 0; step < n; ++step) {
      const bool more = step + 1 < n;
      if (more && o.overlap) ring.issue(step + 1), detail::note(o, ContextEvent::issue, step + 1);
      detail::note(o, ContextEvent::compute, step);
      add_chunk(ring.k, ring.v, pieces[std::size_t(ring.owner(step))]);
      if (!more) break;
      if (!o.overlap) ring.issue(step + 1), detail::note(o, ContextEvent::issue, step + 1);
      ring.advance();
      detail::note(o, ContextEvent::wait, step + 1);
    }
  }
  saved.pairs = acc.pairs();
  auto f = std::move(acc).result();
  saved.lse = std::move(f.lse);
  return {ops::detail::make<T, 4, typename Q::layout>(q.mesh(), global, std::move(f.out)), std::move(saved)};
}

/// {dq, dk, dv} (laid out like q) of context_attention, given dout and the forward's q, k, v,
/// out and saved state, and the same options.
template <class DO, class Q, class K, class V, class O>
ops::AttentionGrads<Q> context_attention_backward(const DO& dout, const Q& q, const K& k, const V& v, const O& out,
                                                  const ContextAttentionSaved<typename Q::value_type, typename Q::space>& saved,
                                                  const ContextAttentionOptions& o = {}) {
  detail::check_context_attention("context_attention_backward", q, k, v, o);
  static_assert(std::is_same_v<DO, Q> && std::is_same_v<O, Q>, "context_attention_backward: dout and out are laid out like q");
  using T = typename Q::value_type;
  using Space = typename Q::space;
  constexpr std::size_t cp_dim = context_dim<typename Q::mesh_type>;
  const auto [comm, n, r, seq, opts] = detail::context_call(q, o);
  if (dout.shape() != out.shape() || out.shape()[2] != seq)
    comm.fail("context_attention_backward", dtensor::detail::cat("dout ", to_string(dout.shape()), ", out ",
                                                                 to_string(out.shape()), ": pass this forward's output"));
  const auto make = [&](Tensor<T, 4, Space> local, const Shape<4>& shape) {
    return ops::detail::make<T, 4, typename Q::layout>(q.mesh(), shape, std::move(local));
  };

  if (o.kind == ContextKind::ulysses) {
    if (saved.q.numel() != numel(Shape<4>{q.to_local().extent(0), q.to_local().extent(1) / n, seq, q.extent(3)}))
      comm.fail("context_attention_backward", "the saved state is not a Ulysses forward's (options differ?)");
    auto dh = detail::to_original(detail::sequence_to_heads(dout.to_local(), comm, seq), n, o.load_balanced);
    auto g = kernels::attention_backward(saved.q, saved.k, saved.v, saved.out, saved.lse, dh, opts);
    const auto back = [&, &comm = comm, seq = seq, n = n](Tensor<T, 4, Space> x) {  // init-captures: see above
      return detail::heads_to_sequence(detail::to_stored(std::move(x), n, o.load_balanced), comm, seq);
    };
    auto dq = back(std::move(g.dq));
    auto dk = detail::summed_heads(back(std::move(g.dk)), o);
    auto dv = detail::summed_heads(back(std::move(g.dv)), o);
    return {make(std::move(dq), q.shape()), make(std::move(dk), k.shape()), make(std::move(dv), v.shape())};
  }

  if (saved.lse.shape() != Shape<3>{q.to_local().extent(0), q.to_local().extent(1), q.to_local().extent(2)})
    comm.fail("context_attention_backward", dtensor::detail::cat("saved lse ", to_string(saved.lse.shape()),
                                                                 ": not this forward's (options differ?)"));
  if (n == 1) {  // one context rank: one kernel call, as in the forward
    if (o.kv_repeat == 1) {
      auto g = kernels::attention_backward(q.to_local(), k.to_local(), v.to_local(), out.to_local(), saved.lse,
                                           dout.to_local(), opts);
      return {make(std::move(g.dq), q.shape()), make(std::move(g.dk), k.shape()), make(std::move(g.dv), v.shape())};
    }
    auto g = kernels::attention_backward(q.to_local(), detail::repeated_heads(k.to_local(), o),
                                         detail::repeated_heads(v.to_local(), o), out.to_local(), saved.lse,
                                         dout.to_local(), opts);
    return {make(std::move(g.dq), q.shape()), make(detail::summed_heads(g.dk, o), k.shape()),
            make(detail::summed_heads(g.dv, o), v.shape())};
  }
  kernels::ChunkedAttentionBackward<T, Space> bwd(q.to_local(), out.to_local(), saved.lse, dout.to_local(),
                                                 context_pieces(seq, n, r, o.load_balanced), opts);
  // One chunk's {dk, dv} in its KV heads (summed over the query heads each one served).
  const auto chunk_grads = [&](const Tensor<T, 4, Space>& kc, const Tensor<T, 4, Space>& vc, const auto& pieces) {
    if (o.kv_repeat == 1) return bwd.chunk(kc, vc, pieces);
    auto [dk, dv] = bwd.chunk(detail::repeated_heads(kc, o), detail::repeated_heads(vc, o), pieces);
    return std::pair{detail::summed_heads(dk, o), detail::summed_heads(dv, o)};
  };
  if (o.kind == ContextKind::allgather) {
    using Gathered = detail::replace_placement_t<typename Q::layout, cp_dim, Replicate>;
    using Summed = detail::replace_placement_t<typename Q::layout, cp_dim, Partial<>>;
    const auto kg = redistribute<Gathered>(k), vg = redistribute<Gathered>(v);
    auto [dk_all, dv_all] = chunk_grads(kg.to_local(), vg.to_local(), detail::gathered_pieces(seq, n, o.load_balanced));
    auto dk = redistribute<typename Q::layout>(ops::detail::make<T, 4, Summed>(q.mesh(), k.shape(), std::move(dk_all)));
    auto dv = redistribute<typename Q::layout>(ops::detail::make<T, 4, Summed>(q.mesh(), v.shape(), std::move(dv_all)));
    return {make(std::move(bwd).dq(), q.shape()), std::move(dk), std::move(dv)};
  }

  // Ring: K/V rotate as in the forward; each chunk's dK/dV accumulator travels one step behind
  // them, so that after cp steps it arrives back at the chunk's owner.
  const auto pieces = detail::all_pieces(seq, n, o.load_balanced);
  detail::KvRing<T, Space> ring{comm, seq, k.to_local(), v.to_local(), {}, {}, {}, {}};
  detail::Local4<T, Space> acc_k, acc_v, in_k, in_v;  // acc: being sent; in: arriving
  Work acc_work_k, acc_work_v;
  for (int step = 0; step < n; ++step) {
    const bool more = step + 1 < n;
    if (more && o.overlap) ring.issue(step + 1);
    auto [dk, dv] = chunk_grads(ring.k, ring.v, pieces[std::size_t(ring.owner(step))]);
    if (step > 0) {  // the accumulator of this chunk, from the rank that held it last step
      acc_work_k.wait();
      acc_work_v.wait();
      kernels::put_seq(dk, 0, in_k, true);
      kernels::put_seq(dv, 0, in_v, true);
    }
    if (n == 1) {  // one rank: its own chunk, nothing to send
      in_k = std::move(dk);
      in_v = std::move(dv);
      break;
    }
    acc_k = std::move(dk);
    acc_v = std::move(dv);
    // Send it on; what arrives is the chunk this rank holds next (step + 1), or at the last
    // step its own chunk's finished gradient.
    const int next_owner = ring.owner(step + 1);
    const Extent len = chunk_range(seq, n, next_owner).size();
    in_k = detail::with_length(acc_k, len);
    in_v = detail::with_length(acc_v, len);
    acc_work_k = comm.template send_recv_async<T>(detail::view(acc_k), (r + 1) % n, detail::view(in_k), (r - 1 + n) % n, detail::tag_dk);
    acc_work_v = comm.template send_recv_async<T>(detail::view(acc_v), (r + 1) % n, detail::view(in_v), (r - 1 + n) % n, detail::tag_dv);
    if (!more) break;
    if (!o.overlap) ring.issue(step + 1);
    ring.advance();
  }
  acc_work_k.wait();
  acc_work_v.wait();
  return {make(std::move(bwd).dq(), q.shape()), make(std::move(in_k), k.shape()), make(std::move(in_v), v.shape())};
}

/// What a context-parallel KV cache holds on one rank (nn::SelfAttention::KvCache's `split`
/// under ContextAttention): this rank's own rows of K and V (rotated, the KV heads, not
/// repeated), never the whole cache. The rows are in no particular order: a decoded position
/// attends to all of them without a mask (every cached position is earlier), so their original
/// positions are not needed. `rows` is every context rank's row count, the same on every rank
/// (computed, never sent): where the next decoded row goes (ContextAttention::decode).
template <class T, class Space = host_space>
struct ContextKvCache {
  Tensor<T, 4, Space> k, v;   // [B_local, K_local, rows[this rank], D]
  std::vector<Extent> rows;   // rows held by each context rank; empty before the prefill
};

namespace detail {

/// Heads [begin, begin + size) (dimension 1) of x, copied.
template <class T, class Space>
Local4<T, Space> slice_heads(const Local4<T, Space>& x, Extent begin, Extent size) {
  Shape<4> from{0, begin, 0, 0}, extent = x.shape();
  extent[1] = size;
  auto out = Local4<T, Space>::uninitialized(extent);
  copy_box(x, from, out, Shape<4>{}, extent);
  return out;
}

/// x, y, z side by side on dimension 1 (heads): one buffer for one collective.
template <class T, class Space>
Local4<T, Space> concat_heads(const Local4<T, Space>& x, const Local4<T, Space>& y, const Local4<T, Space>& z) {
  Shape<4> s = x.shape();
  s[1] = x.extent(1) + y.extent(1) + z.extent(1);
  auto out = Local4<T, Space>::uninitialized(s);
  Extent at = 0;
  for (const auto* p : {&x, &y, &z}) {
    copy_box(*p, Shape<4>{}, out, Shape<4>{0, at, 0, 0}, p->shape());
    at += p->extent(1);
  }
  return out;
}

/// x followed by `row` on dimension 2 (positions).
template <class T, class Space>
Local4<T, Space> append_rows(const Local4<T, Space>& x, const Local4<T, Space>& row) {
  auto out = with_length(x, x.extent(2) + row.extent(2));
  kernels::put_seq(out, 0, x);
  kernels::put_seq(out, x.extent(2), row);
  return out;
}

}  // namespace detail

/// The attention core (nn/attention_core.hpp) of a mesh with a context dimension: ring,
/// all-gather-KV or Ulysses attention (options.context.kind) with the module's mask and KV-head
/// sharing. What nn::SelfAttention is given on such a mesh — by the models, or by whoever builds
/// the attention (attention_core_for below) — so that nn/ never names this file.
struct ContextAttention {
  static constexpr bool splits_sequence = true;
  template <class T, class Space>
  using Saved = ContextAttentionSaved<T, Space>;

  static ContextAttentionOptions options(const nn::AttentionCoreOptions& o) {
    auto c = o.context;
    c.causal = o.causal;
    c.kv_repeat = o.kv_repeat;
    return c;
  }
  template <class H>
  static auto forward(const H& q, const H& k, const H& v, const nn::AttentionCoreOptions& o) {
    auto r = context_attention(q, k, v, options(o));
    return nn::AttentionCoreResult<decltype(r.out), decltype(r.saved)>{std::move(r.out), std::move(r.saved)};
  }
  template <class H, class S>
  static auto backward(const H& dout, const H& q, const H& k, const H& v, const H& out, const S& saved,
                       const nn::AttentionCoreOptions& o) {
    return context_attention_backward(dout, q, k, v, out, saved, options(o));
  }
  template <class Mesh>
  static std::vector<Extent> original_order(const Mesh& mesh, Extent seq, const nn::AttentionCoreOptions& o) {
    return original_positions(mesh, seq, o.context.load_balanced);
  }

  // ---- KV-cached inference (nn::SelfAttention::forward_cached) --------------------------------
  template <class T, class Space>
  using KvCache = ContextKvCache<T, Space>;

  /// The prompt (an empty cache): forward's attention (ring, all-gather or Ulysses, causal, in
  /// stored order), and this rank keeps its own shard of K and V as its cache: the cache stays
  /// split over the context ranks as the prompt was (torch.chunk of the stored order).
  template <class H>
  static H prefill(const H& q, const H& k, const H& v, KvCache<typename H::value_type, typename H::space>& cache,
                   const nn::AttentionCoreOptions& o) {
    auto out = forward(q, k, v, o).out;
    const auto [comm, n, r, seq, opts] = detail::context_call(q, options(o));
    cache.k = k.to_local();
    cache.v = v.to_local();
    cache.rows.assign(std::size_t(n), 0);
    for (int j = 0; j < n; ++j) cache.rows[std::size_t(j)] = chunk_range(seq, n, j).size();
    return out;
  }

  /// One new position (q, k, v [B, *, 1, *], Shard<2> on the context dimension: the context rank
  /// that holds the row has it, the others none). Collectives on the context group, per call:
  /// one all_gather of the new q, k and v (packed on the heads: every context rank gets the
  /// query), then one all_gather of the partial outputs and one of their log-sum-exps (one row
  /// per rank). Each rank attends the query to its own cached rows (no mask: all are earlier),
  /// and the partial results are merged by log-sum-exp (kernels::merge_attention_blocks, as ring
  /// attention merges its blocks) on the rank that holds the output row. The new key and value
  /// go to ONE rank: the one with the fewest rows, the lowest such rank on ties (after a prefill
  /// of T the last ranks of torch.chunk's split come first), so the caches stay within one row
  /// of each other. The output is laid out like q (a local slice of the row, no communication).
  template <class H>
  static H decode(const H& q, const H& k, const H& v, KvCache<typename H::value_type, typename H::space>& cache,
                  const nn::AttentionCoreOptions& o) {
    using T = typename H::value_type;
    using Space = typename H::space;
    using L = typename H::layout;
    using Acc = kernels::host::compute_t<T>;
    constexpr std::size_t cp_dim = context_dim<typename H::mesh_type>;
    using Gathered = detail::replace_placement_t<L, cp_dim, Replicate>;
    constexpr const char* op = "ContextAttention::decode";
    const auto c = options(o);
    detail::check_context_attention(op, q, k, v, c);
    const auto [comm, n, r, seq, opts_unused] = detail::context_call(q, c);
    if (seq != 1 || cache.rows.size() != std::size_t(n) || v.extent(3) != q.extent(3))
      comm.fail(op, dtensor::detail::cat("q ", to_string(q.shape()), ", v ", to_string(v.shape()), ", a cache of ",
                                         cache.rows.size(), " context ranks (", n,
                                         " expected): one new position after a prefill, v's head size q's"));
    const Extent hq = q.to_local().extent(1), hk = k.to_local().extent(1), dh = q.extent(3);
    // 1. the new position's q, k, v on every context rank: one all-gather of the three, packed.
    const Shape<4> packed_shape{q.extent(0), q.extent(1) + 2 * k.extent(1), 1, dh};
    const auto all = redistribute<Gathered>(ops::detail::make<T, 4, L>(
                                                q.mesh(), packed_shape,
                                                detail::concat_heads(q.to_local(), k.to_local(), v.to_local())))
                         .to_local();
    const auto ql = detail::slice_heads(all, 0, hq);
    // 2. the new row joins the cache of the rank with the fewest rows (the lowest on ties).
    const auto owner = std::size_t(std::min_element(cache.rows.begin(), cache.rows.end()) - cache.rows.begin());
    if (owner == std::size_t(r)) {
      cache.k = detail::append_rows(cache.k, detail::slice_heads(all, hq, hk));
      cache.v = detail::append_rows(cache.v, detail::slice_heads(all, hq + hk, hk));
    }
    ++cache.rows[owner];
    // 3. the query against this rank's rows: no mask, all of them are earlier (or the row itself).
    auto kopts = detail::kernel_options(c, dh);
    kopts.causal = false;
    const Shape<3> lse_shape{ql.extent(0), ql.extent(1), 1};
    detail::Local4<T, Space> out;
    Tensor<kernels::Stat, 3, Space> lse;
    if (cache.k.extent(2) > 0) {
      auto f = c.kv_repeat > 1 ? kernels::attention(ql, detail::repeated_heads(cache.k, c), detail::repeated_heads(cache.v, c), kopts)
                               : kernels::attention(ql, cache.k, cache.v, kopts);
      out = std::move(f.out);
      lse = std::move(f.lse);
    } else {  // no rows here: an empty block, which the merge ignores
      out = detail::Local4<T, Space>(Shape<4>{ql.extent(0), hq, 1, dh});
      lse = Tensor<kernels::Stat, 3, Space>::uninitialized(lse_shape);
      kernels::fill_(lse, kernels::host::detail::neg_inf);
    }
    // 4. every rank's partial result to every rank (one row each), merged where the row lives.
    const auto outs = redistribute<Gathered>(ops::detail::make<T, 4, L>(
                                                 q.mesh(), Shape<4>{q.extent(0), q.extent(1), n, dh}, std::move(out)))
                          .to_local();
    const auto lses = redistribute<Gathered>(ops::detail::make<kernels::Stat, 3, L>(
                                                 q.mesh(), Shape<3>{q.extent(0), q.extent(1), n}, std::move(lse)))
                          .to_local();
    detail::Local4<T, Space> mine(Shape<4>{ql.extent(0), hq, q.to_local().extent(2), dh});
    if (q.to_local().extent(2) == 1) {
      Tensor<Acc, 4, Space> empty(Shape<4>{ql.extent(0), hq, 1, dh});  // the merge's start: no keys yet
      auto empty_lse = Tensor<kernels::Stat, 3, Space>::uninitialized(lse_shape);
      kernels::fill_(empty_lse, kernels::host::detail::neg_inf);
      auto m = kernels::merge_attention_blocks(empty, empty_lse, kernels::detail::converted<Acc>(kernels::slice_seq(outs, 0, 1)),
                                               kernels::slice_seq(lses, 0, 1));
      for (int j = 1; j < n; ++j)
        m = kernels::merge_attention_blocks(m.out, m.lse, kernels::detail::converted<Acc>(kernels::slice_seq(outs, j, 1)),
                                            kernels::slice_seq(lses, j, 1));
      mine = kernels::detail::converted<T>(std::move(m.out));
    }
    return ops::detail::make<T, 4, L>(q.mesh(), q.shape(), std::move(mine));
  }
};

/// The attention core a mesh needs: ContextAttention with a context dimension, else nn::LocalAttention.
template <class Mesh>
using attention_core_for = std::conditional_t<has_role<Mesh, Role::context>, ContextAttention, nn::LocalAttention>;

/// Self-attention with a plan's projections (Plan::qkv, Plan::proj) and the core the mesh needs:
/// what the models give their blocks (nn::TransformerBlock's Attention).
template <class T, class Mesh, class Plan>
using PlanAttention = nn::SelfAttention<T, Mesh, typename Plan::qkv, typename Plan::proj, attention_core_for<Mesh>>;

}  // namespace dtensor::parallel
