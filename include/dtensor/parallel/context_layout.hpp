// dtensor/parallel/context_layout.hpp — how the sequence lies over the context dimension: the
// plain split, and the load-balanced (head-tail) permutation for causal attention.
//
//   auto order = parallel::load_balanced_order(/*seq=*/16, /*cp=*/2);  // 0..3, 12..15, 4..7, 8..11
//   auto ids_stored = parallel::load_balance(ids, /*dim=*/1, cp);       // before distributing
//   auto ids_back = parallel::undo_load_balance(full_tensor(x), 1, cp); // the original order
//   parallel::context_pieces(seq, cp, rank, /*balanced=*/true)          // what rank stores, as runs
//
// Under context parallelism the sequence is Shard<1> of [B, T, C] on the context dimension
// (torch.chunk's split of the *stored* order). With a causal mask a plain split gives the last
// rank the most work (its queries see every earlier key) and the first the least. Load
// balancing stores the sequence permuted so that the plain split gives rank r two runs of the
// original sequence: a head chunk and a tail chunk, chunks r and 2·cp−1−r of 2·cp when cp·2
// divides T (Megatron-Core's and PyTorch's head-tail layout). The permutation is data, applied
// to the batch once when it is distributed (load_balance) and undone on the full tensor
// (undo_load_balance); the DTensor's global index is the stored index, so full_tensor and
// redistribute keep working, and code that needs the original position (the causal mask, the
// position embedding) maps stored to original through context_pieces / load_balanced_order.
//
// Uneven lengths: rank r stores e_r = torch.chunk(T, cp)[r] positions (what Shard<1> gives it);
// its head run is the first ceil(e_r / 2) of them, its tail the rest. Heads lie in rank order at
// the start of the sequence, tails in reverse rank order at its end. Every rank computes every
// rank's pieces from (T, cp) alone, without communication.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/kernels/attention_chunk.hpp"
#include "dtensor/mesh/roles.hpp"
#include "dtensor/nn/context_options.hpp"
#include "dtensor/placement/chunk.hpp"

namespace dtensor::parallel {

using kernels::SeqPiece;

// ContextKind, name_of and parse_context_kind: nn/context_options.hpp (the attention module's
// configuration names them; the implementations are here and in context_parallel.hpp).
using nn::ContextKind;
using nn::name_of;
using nn::parse_context_kind;

/// The runs of the original sequence that context rank `rank` of `cp` stores, in stored order.
inline std::vector<SeqPiece> context_pieces(Extent seq, int cp, int rank, bool balanced) {
  if (seq < 0 || cp < 1 || rank < 0 || rank >= cp)
    throw Error("context_pieces", dtensor::detail::cat("sequence ", seq, ", context size ", cp, ", rank ", rank));
  const Range mine = chunk_range(seq, cp, rank);
  if (!balanced) return {SeqPiece{0, mine.begin, mine.size()}};
  const auto head_of = [&](int r) { return (chunk_range(seq, cp, r).size() + 1) / 2; };
  Extent heads_before = 0, heads_total = 0, tails_after = 0;
  for (int r = 0; r < cp; ++r) {
    const Extent h = head_of(r), t = chunk_range(seq, cp, r).size() - h;
    heads_total += h;
    if (r < rank) heads_before += h;
    if (r > rank) tails_after += t;
  }
  const Extent head = head_of(rank);
  return {SeqPiece{0, heads_before, head}, SeqPiece{head, heads_total + tails_after, mine.size() - head}};
}

/// order[p]: the original position of the token stored at position p (a permutation of 0..seq-1).
inline std::vector<Extent> load_balanced_order(Extent seq, int cp) {
  std::vector<Extent> order;
  order.reserve(std::size_t(seq));
  for (int r = 0; r < cp; ++r)
    for (const auto& p : context_pieces(seq, cp, r, true))
      for (Extent i = 0; i < p.size; ++i) order.push_back(p.global + i);
  return order;
}

/// The original index of each stored position of a sequence of `seq` on `mesh` (what
/// nn::positions takes): load_balanced_order on a mesh with a context dimension and load
/// balancing, else empty (stored order is the original order).
template <class Mesh>
std::vector<Extent> original_positions(const Mesh& mesh, Extent seq, bool load_balanced) {
  if (!has_role<Mesh, Role::context> || !load_balanced) return {};
  return load_balanced_order(seq, role_size<Role::context>(mesh));
}

namespace detail {
/// x with dimension `dim` permuted: stored[p] = original[order[p]] (forward) or its inverse.
/// The order is a few runs of consecutive positions (two per context rank), so the permutation
/// is one box copy per run, in any memory space.
template <class T, std::size_t R, class Space>
Tensor<T, R, Space> permute_dim(const Tensor<T, R, Space>& x, std::size_t dim, int cp, bool forward, const char* op) {
  if (dim >= R || cp < 1) throw Error(op, dtensor::detail::cat("dimension ", dim, " of ", to_string(x.shape()), ", context size ", cp));
  const auto order = load_balanced_order(x.extent(dim), cp);
  auto out = Tensor<T, R, Space>::uninitialized(x.shape());
  for (std::size_t p = 0; p < order.size();) {
    std::size_t end = p + 1;
    while (end < order.size() && order[end] == order[end - 1] + 1) ++end;
    const Extent stored = Extent(p), original = order[p], run = Extent(end - p);
    Shape<R> from{}, to{}, extent = x.shape();
    from[dim] = forward ? original : stored;
    to[dim] = forward ? stored : original;
    extent[dim] = run;
    copy_box(x, from, out, to, extent);
    p = end;
  }
  return out;
}
}  // namespace detail

/// The original order -> the stored (load-balanced) order along dimension `dim`.
template <class T, std::size_t R, class Space>
Tensor<T, R, Space> load_balance(const Tensor<T, R, Space>& x, std::size_t dim, int cp) {
  return detail::permute_dim(x, dim, cp, true, "load_balance");
}

/// The stored (load-balanced) order -> the original order along dimension `dim`.
template <class T, std::size_t R, class Space>
Tensor<T, R, Space> undo_load_balance(const Tensor<T, R, Space>& x, std::size_t dim, int cp) {
  return detail::permute_dim(x, dim, cp, false, "undo_load_balance");
}

}  // namespace dtensor::parallel
