// dtensor/kernels/attention_chunk.hpp — attention of query pieces against key/value chunks
// that arrive one at a time (ring attention's local part), merged by log-sum-exp, in any memory
// space: built on the space-dispatched attention, attention_backward, merge_attention_blocks,
// add_ and fill_ (kernels/attention.hpp, kernels/elementwise.hpp) and box copies.
//
//   ChunkedAttention<double> fwd(q, q_pieces, opts);      // q [B,H,Tq,D]; q_pieces: runs of its positions
//   fwd.add_chunk(k1, v1, k1_pieces);  fwd.add_chunk(k2, v2, k2_pieces);   // any order
//   auto [out, lse] = std::move(fwd).result();            // == attention over all the chunks' keys
//
//   ChunkedAttentionBackward<double> bwd(q, out, lse, dout, q_pieces, opts);
//   auto [dk1, dv1] = bwd.chunk(k1, v1, k1_pieces);       // that chunk's gradients
//   auto dq = std::move(bwd).dq();                         // summed over the chunks seen
//
// A SeqPiece is a run of consecutive positions of the *original* sequence: where it starts in
// the local tensor's sequence dimension (dimension 2) and at which global position. A rank under
// causal load balancing stores two runs (a head and a tail chunk), so its positions are not one
// run: each (query piece, key piece) pair is one call of attention() with the pieces' global
// offsets (the causal mask is on global positions), and a pair whose keys all lie after its
// queries is skipped — that skipped work is what load balancing evens out. pairs() counts the
// (query, key) score entries actually computed under the mask: the attention FLOPs up to a factor.
// The backward needs the merged out and lse of the forward, which makes each pair's gradient
// exact on its own (kernels/host/attention.hpp).
// bfloat16: each pair's attention rounds its output (dq) to bf16 once; what is summed over the
// pairs — the merged output and dq — is kept in float (compute_t<T>) and rounded once at the end,
// so a sequence split over many chunks is not rounded once per chunk.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/kernels/attention.hpp"
#include "dtensor/kernels/cast.hpp"
#include "dtensor/kernels/elementwise.hpp"

namespace dtensor::kernels {

using host::AttentionOptions;
using host::Stat;

/// A run of positions: `size` positions from local index `local`, global position `global`.
struct SeqPiece {
  Extent local = 0;
  Extent global = 0;
  Extent size = 0;
};

namespace detail {
/// The box of positions [begin, begin + size) of dimension 2 of a tensor of extents `shape`.
template <std::size_t R>
std::pair<Shape<R>, Shape<R>> seq_box(const Shape<R>& shape, Extent begin, Extent size) {
  static_assert(R >= 3, "the sequence is dimension 2");
  Shape<R> offset{}, extent = shape;
  offset[2] = begin;
  extent[2] = size;
  return {offset, extent};
}
}  // namespace detail

/// Positions [begin, begin + size) of dimension 2, copied.
template <class T, std::size_t R, class Space>
Tensor<T, R, Space> slice_seq(const Tensor<T, R, Space>& x, Extent begin, Extent size) {
  host::detail::check(begin >= 0 && size >= 0 && begin + size <= x.extent(2), "slice_seq", "positions [", begin, ", ",
                      begin + size, ") of ", to_string(x.shape()));
  const auto [offset, extent] = detail::seq_box(x.shape(), begin, size);
  auto out = Tensor<T, R, Space>::uninitialized(extent);
  copy_box(x, offset, out, Shape<R>{}, extent);
  return out;
}

/// Writes (or, with add, adds) src into positions [begin, begin + src's length) of dimension 2 of dst.
template <class T, std::size_t R, class Space>
void put_seq(Tensor<T, R, Space>& dst, Extent begin, const Tensor<T, R, Space>& src, bool add = false) {
  const Extent size = src.extent(2);
  bool fits = begin >= 0 && begin + size <= dst.extent(2);
  for (std::size_t d = 0; d < R; ++d) fits = fits && (d == 2 || src.extent(d) == dst.extent(d));
  host::detail::check(fits, "put_seq", to_string(src.shape()), " at position ", begin, " of ", to_string(dst.shape()));
  const auto [offset, extent] = detail::seq_box(dst.shape(), begin, size);
  if (!add) return copy_box(src, Shape<R>{}, dst, offset, extent);
  auto sum = slice_seq(dst, begin, size);
  add_(sum, src);
  copy_box(sum, Shape<R>{}, dst, offset, extent);
}

/// How many (query, key) scores a block of tq queries and tk keys computes under the mask.
inline Extent visible_pairs(const AttentionOptions& o, Extent tq, Extent tk) {
  Extent n = 0;
  for (Extent i = 0; i < tq; ++i) n += host::detail::visible_keys(o, i, tk);
  return n;
}

namespace detail {
/// Whether a query piece sees any key of a key piece (false also for empty pieces).
inline bool pieces_interact(const AttentionOptions& o, const SeqPiece& q, const SeqPiece& k) {
  return q.size > 0 && k.size > 0 && (!o.causal || k.global <= q.global + q.size - 1);
}
inline AttentionOptions pair_options(AttentionOptions o, const SeqPiece& q, const SeqPiece& k) {
  o.q_offset = q.global;
  o.k_offset = k.global;
  return o;
}
/// f(i, k_piece, k_block, v_block) for every query piece i that sees some key of a key piece,
/// slicing each key piece (once) only when some query piece needs it.
template <class T, class Space, class F>
void for_each_interacting(const AttentionOptions& o, std::span<const SeqPiece> q_pieces, const Tensor<T, 4, Space>& k,
                          const Tensor<T, 4, Space>& v, std::span<const SeqPiece> k_pieces, F&& f) {
  for (const auto& kp : k_pieces) {
    Tensor<T, 4, Space> kb, vb;
    bool sliced = false;
    for (std::size_t i = 0; i < q_pieces.size(); ++i) {
      if (!pieces_interact(o, q_pieces[i], kp)) continue;
      if (!sliced) kb = slice_seq(k, kp.local, kp.size), vb = slice_seq(v, kp.local, kp.size), sliced = true;
      f(i, kp, kb, vb);
    }
  }
}
/// x converted to element type To (x itself when it has that type already).
template <class To, class T, std::size_t R, class Space>
Tensor<To, R, Space> converted(Tensor<T, R, Space> x) {
  if constexpr (std::is_same_v<To, T>) return x;
  else {
    auto y = Tensor<To, R, Space>::uninitialized(x.shape());
    cast_into(y, x);
    return y;
  }
}
template <class T>
void check_pieces(const char* op, std::span<const SeqPiece> pieces, Extent seq) {
  Extent covered = 0;
  for (const auto& p : pieces) {
    host::detail::check(p.size >= 0 && p.local >= 0 && p.local + p.size <= seq, op, "piece at local ", p.local, " of ",
                        p.size, " positions outside a sequence of ", seq);
    covered += p.size;
  }
  host::detail::check(covered == seq, op, "pieces cover ", covered, " of ", seq, " positions");
}
}  // namespace detail

/// The forward over key/value chunks given one at a time; see the top of the file.
template <class T, class Space = host_space>
class ChunkedAttention {
  using Local = Tensor<T, 4, Space>;
  using Acc = host::compute_t<T>;  // the merged output's type (float for bf16)
  using AccLocal = Tensor<Acc, 4, Space>;
  using Forward = decltype(attention(std::declval<const Local&>(), std::declval<const Local&>(),
                                     std::declval<const Local&>(), std::declval<const AttentionOptions&>()));
  using Merged = decltype(merge_attention_blocks(std::declval<const AccLocal&>(), std::declval<const Tensor<Stat, 3, Space>&>(),
                                                 std::declval<const AccLocal&>(), std::declval<const Tensor<Stat, 3, Space>&>()));

 public:
  ChunkedAttention(const Local& q, std::vector<SeqPiece> q_pieces, Extent value_dim, const AttentionOptions& opts)
      : pieces_(std::move(q_pieces)), opts_(opts), shape_(q.shape()) {
    detail::check_pieces<T>("ChunkedAttention", pieces_, q.extent(2));
    shape_[3] = value_dim;
    for (const auto& p : pieces_) {
      q_.push_back(slice_seq(q, p.local, p.size));
      auto lse = Tensor<Stat, 3, Space>::uninitialized(Shape<3>{shape_[0], shape_[1], p.size});
      fill_(lse, host::detail::neg_inf);  // an empty block: merging ignores it
      acc_.push_back({AccLocal(Shape<4>{shape_[0], shape_[1], p.size, value_dim}), std::move(lse)});
    }
  }

  /// Attends every query piece to the keys of one chunk (k, v [B,H,Tk,D]; k_pieces cover Tk).
  void add_chunk(const Local& k, const Local& v, std::span<const SeqPiece> k_pieces) {
    detail::check_pieces<T>("ChunkedAttention::add_chunk", k_pieces, k.extent(2));
    detail::for_each_interacting(opts_, std::span<const SeqPiece>(pieces_), k, v, k_pieces,
                                 [&](std::size_t i, const SeqPiece& kp, const auto& kb, const auto& vb) {
                                   const auto o = detail::pair_options(opts_, pieces_[i], kp);
                                   auto f = attention(q_[i], kb, vb, o);
                                   acc_[i] = merge_attention_blocks(acc_[i].out, acc_[i].lse,
                                                                    detail::converted<Acc>(std::move(f.out)), f.lse);
                                   pairs_ += std::size_t(visible_pairs(o, pieces_[i].size, kp.size) * shape_[0] * shape_[1]);
                                 });
  }

  /// (query, key) scores computed so far, over all batches and heads.
  std::size_t pairs() const noexcept { return pairs_; }

  /// The merged output [B,H,Tq,Dv] and lse [B,H,Tq] in the local order of q.
  Forward result() && {
    Forward f{Local::uninitialized(shape_), Tensor<Stat, 3, Space>::uninitialized(Shape<3>{shape_[0], shape_[1], shape_[2]})};
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      put_seq(f.out, pieces_[i].local, detail::converted<T>(std::move(acc_[i].out)));
      put_seq(f.lse, pieces_[i].local, acc_[i].lse);
    }
    return f;
  }

 private:
  std::vector<SeqPiece> pieces_;
  AttentionOptions opts_;
  Shape<4> shape_;
  std::vector<Local> q_;
  std::vector<Merged> acc_;
  std::size_t pairs_ = 0;
};

/// The backward over key/value chunks given one at a time; see the top of the file.
template <class T, class Space = host_space>
class ChunkedAttentionBackward {
  using Local = Tensor<T, 4, Space>;
  using Lse = Tensor<Stat, 3, Space>;
  using AccLocal = Tensor<host::compute_t<T>, 4, Space>;  // dq summed over the chunks (float for bf16)

 public:
  ChunkedAttentionBackward(const Local& q, const Local& out, const Lse& lse, const Local& dout,
                           std::vector<SeqPiece> q_pieces, const AttentionOptions& opts)
      : pieces_(std::move(q_pieces)), opts_(opts), dq_(q.shape()) {
    detail::check_pieces<T>("ChunkedAttentionBackward", pieces_, q.extent(2));
    for (const auto& p : pieces_) {
      q_.push_back(slice_seq(q, p.local, p.size));
      out_.push_back(slice_seq(out, p.local, p.size));
      lse_.push_back(slice_seq(lse, p.local, p.size));
      dout_.push_back(slice_seq(dout, p.local, p.size));
    }
  }

  /// {dk, dv} of one chunk (this rank's queries' share); adds the chunk's share of dq.
  std::pair<Local, Local> chunk(const Local& k, const Local& v, std::span<const SeqPiece> k_pieces) {
    detail::check_pieces<T>("ChunkedAttentionBackward::chunk", k_pieces, k.extent(2));
    std::pair<Local, Local> g{Local(k.shape()), Local(v.shape())};
    detail::for_each_interacting(opts_, std::span<const SeqPiece>(pieces_), k, v, k_pieces,
                                 [&](std::size_t i, const SeqPiece& kp, const auto& kb, const auto& vb) {
                                   auto b = attention_backward(q_[i], kb, vb, out_[i], lse_[i], dout_[i],
                                                               detail::pair_options(opts_, pieces_[i], kp));
                                   put_seq(dq_, pieces_[i].local, detail::converted<host::compute_t<T>>(std::move(b.dq)), true);
                                   put_seq(g.first, kp.local, b.dk, true);
                                   put_seq(g.second, kp.local, b.dv, true);
                                 });
    return g;
  }

  Local dq() && { return detail::converted<T>(std::move(dq_)); }

 private:
  std::vector<SeqPiece> pieces_;
  AttentionOptions opts_;
  AccLocal dq_;
  std::vector<Local> q_, out_, dout_;
  std::vector<Lse> lse_;
};

}  // namespace dtensor::kernels
