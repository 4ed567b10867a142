// dtensor/kernels/host/attention_chunk.hpp — attention of query pieces against key/value chunks
// that arrive one at a time (ring attention's local part), merged by log-sum-exp.
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
#pragma once

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "dtensor/kernels/host/attention.hpp"

namespace dtensor::kernels::host {

/// A run of positions: `size` positions from local index `local`, global position `global`.
struct SeqPiece {
  Extent local = 0;
  Extent global = 0;
  Extent size = 0;
};

namespace detail {
/// [A0, A1, S, inner...]: the product of the extents before and after the sequence dimension 2.
template <class T, std::size_t R>
std::pair<Extent, Extent> around_seq(const HostTensor<T, R>& x) {
  static_assert(R >= 3, "the sequence is dimension 2");
  Extent inner = 1;
  for (std::size_t d = 3; d < R; ++d) inner *= x.extent(d);
  return {x.extent(0) * x.extent(1), inner};
}
}  // namespace detail

/// Positions [begin, begin + size) of dimension 2, copied.
template <class T, std::size_t R>
HostTensor<T, R> slice_seq(const HostTensor<T, R>& x, Extent begin, Extent size) {
  detail::check(begin >= 0 && size >= 0 && begin + size <= x.extent(2), "slice_seq", "positions [", begin, ", ",
                begin + size, ") of ", to_string(x.shape()));
  auto shape = x.shape();
  shape[2] = size;
  auto out = HostTensor<T, R>::uninitialized(shape);
  const auto [outer, inner] = detail::around_seq(x);
  const Extent seq = x.extent(2);
  for (Extent o = 0; o < outer; ++o)
    std::copy_n(x.data() + (o * seq + begin) * inner, size * inner, out.data() + o * size * inner);
  return out;
}

/// Writes (or, with add, adds) src into positions [begin, begin + src's length) of dimension 2 of dst.
template <class T, std::size_t R>
void put_seq(HostTensor<T, R>& dst, Extent begin, const HostTensor<T, R>& src, bool add = false) {
  const Extent size = src.extent(2), seq = dst.extent(2);
  detail::check(begin >= 0 && begin + size <= seq && detail::around_seq(dst) == detail::around_seq(src), "put_seq",
                to_string(src.shape()), " at position ", begin, " of ", to_string(dst.shape()));
  const auto [outer, inner] = detail::around_seq(dst);
  for (Extent o = 0; o < outer; ++o) {
    T* to = dst.data() + (o * seq + begin) * inner;
    const T* from = src.data() + o * size * inner;
    if (add)
      for (Extent i = 0; i < size * inner; ++i) to[i] += from[i];
    else std::copy_n(from, size * inner, to);
  }
}

/// How many (query, key) scores a block of tq queries and tk keys computes under the mask.
inline Extent visible_pairs(const AttentionOptions& o, Extent tq, Extent tk) {
  Extent n = 0;
  for (Extent i = 0; i < tq; ++i) n += detail::visible_keys(o, i, tk);
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
template <class T, class F>
void for_each_interacting(const AttentionOptions& o, std::span<const SeqPiece> q_pieces, const HostTensor<T, 4>& k,
                          const HostTensor<T, 4>& v, std::span<const SeqPiece> k_pieces, F&& f) {
  for (const auto& kp : k_pieces) {
    HostTensor<T, 4> kb, vb;
    bool sliced = false;
    for (std::size_t i = 0; i < q_pieces.size(); ++i) {
      if (!pieces_interact(o, q_pieces[i], kp)) continue;
      if (!sliced) kb = slice_seq(k, kp.local, kp.size), vb = slice_seq(v, kp.local, kp.size), sliced = true;
      f(i, kp, kb, vb);
    }
  }
}
template <class T>
void check_pieces(const char* op, std::span<const SeqPiece> pieces, Extent seq) {
  Extent covered = 0;
  for (const auto& p : pieces) {
    check(p.size >= 0 && p.local >= 0 && p.local + p.size <= seq, op, "piece at local ", p.local, " of ", p.size,
          " positions outside a sequence of ", seq);
    covered += p.size;
  }
  check(covered == seq, op, "pieces cover ", covered, " of ", seq, " positions");
}
}  // namespace detail

/// The forward over key/value chunks given one at a time; see the top of the file.
template <AttentionElement T>
class ChunkedAttention {
 public:
  ChunkedAttention(const HostTensor<T, 4>& q, std::vector<SeqPiece> q_pieces, Extent value_dim,
                   const AttentionOptions& opts)
      : pieces_(std::move(q_pieces)), opts_(opts), shape_(q.shape()) {
    detail::check_pieces<T>("ChunkedAttention", pieces_, q.extent(2));
    shape_[3] = value_dim;
    for (const auto& p : pieces_) {
      q_.push_back(slice_seq(q, p.local, p.size));
      HostTensor<Stat, 3> lse = HostTensor<Stat, 3>::uninitialized(Shape<3>{shape_[0], shape_[1], p.size});
      std::fill_n(lse.data(), lse.numel(), detail::neg_inf);  // an empty block: merging ignores it
      acc_.push_back({HostTensor<T, 4>(Shape<4>{shape_[0], shape_[1], p.size, value_dim}), std::move(lse)});
    }
  }

  /// Attends every query piece to the keys of one chunk (k, v [B,H,Tk,D]; k_pieces cover Tk).
  void add_chunk(const HostTensor<T, 4>& k, const HostTensor<T, 4>& v, std::span<const SeqPiece> k_pieces) {
    detail::check_pieces<T>("ChunkedAttention::add_chunk", k_pieces, k.extent(2));
    detail::for_each_interacting(opts_, std::span<const SeqPiece>(pieces_), k, v, k_pieces,
                                 [&](std::size_t i, const SeqPiece& kp, const auto& kb, const auto& vb) {
                                   const auto o = detail::pair_options(opts_, pieces_[i], kp);
                                   auto f = attention(q_[i], kb, vb, o);
                                   acc_[i] = merge_attention_blocks(acc_[i].out, acc_[i].lse, f.out, f.lse);
                                   pairs_ += std::size_t(visible_pairs(o, pieces_[i].size, kp.size) * shape_[0] * shape_[1]);
                                 });
  }

  /// (query, key) scores computed so far, over all batches and heads.
  std::size_t pairs() const noexcept { return pairs_; }

  /// The merged output [B,H,Tq,Dv] and lse [B,H,Tq] in the local order of q.
  AttentionForward<T> result() && {
    AttentionForward<T> f{HostTensor<T, 4>::uninitialized(shape_),
                          HostTensor<Stat, 3>::uninitialized(Shape<3>{shape_[0], shape_[1], shape_[2]})};
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      put_seq(f.out, pieces_[i].local, acc_[i].out);
      put_seq(f.lse, pieces_[i].local, acc_[i].lse);
    }
    return f;
  }

 private:
  std::vector<SeqPiece> pieces_;
  AttentionOptions opts_;
  Shape<4> shape_;
  std::vector<HostTensor<T, 4>> q_;
  std::vector<AttentionForward<T>> acc_;
  std::size_t pairs_ = 0;
};

/// The backward over key/value chunks given one at a time; see the top of the file.
template <AttentionElement T>
class ChunkedAttentionBackward {
 public:
  ChunkedAttentionBackward(const HostTensor<T, 4>& q, const HostTensor<T, 4>& out, const HostTensor<Stat, 3>& lse,
                           const HostTensor<T, 4>& dout, std::vector<SeqPiece> q_pieces, const AttentionOptions& opts)
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
  std::pair<HostTensor<T, 4>, HostTensor<T, 4>> chunk(const HostTensor<T, 4>& k, const HostTensor<T, 4>& v,
                                                      std::span<const SeqPiece> k_pieces) {
    detail::check_pieces<T>("ChunkedAttentionBackward::chunk", k_pieces, k.extent(2));
    std::pair<HostTensor<T, 4>, HostTensor<T, 4>> g{HostTensor<T, 4>(k.shape()), HostTensor<T, 4>(v.shape())};
    detail::for_each_interacting(opts_, std::span<const SeqPiece>(pieces_), k, v, k_pieces,
                                 [&](std::size_t i, const SeqPiece& kp, const auto& kb, const auto& vb) {
                                   auto b = attention_backward(q_[i], kb, vb, out_[i], lse_[i], dout_[i],
                                                               detail::pair_options(opts_, pieces_[i], kp));
                                   put_seq(dq_, pieces_[i].local, b.dq, true);
                                   put_seq(g.first, kp.local, b.dk, true);
                                   put_seq(g.second, kp.local, b.dv, true);
                                 });
    return g;
  }

  HostTensor<T, 4> dq() && { return std::move(dq_); }

 private:
  std::vector<SeqPiece> pieces_;
  AttentionOptions opts_;
  HostTensor<T, 4> dq_;
  std::vector<HostTensor<T, 4>> q_, out_, dout_;
  std::vector<HostTensor<Stat, 3>> lse_;
};

}  // namespace dtensor::kernels::host
