// dtensor/kernels/generic/attention.hpp — the argument checks of the attention kernels (forward,
// backward, merging two key blocks), for every memory space. A space's own limits (the CUDA
// kernels' largest head dimension and grid) stay with its kernels.
#pragma once

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

template <class Q, class K, class V>
void check_attention_inputs(const char* op, const Q& q, const K& k, const V& v) {
  const auto &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  check(qs[0] == ks[0] && qs[1] == ks[1] && qs[3] == ks[3] && vs[0] == ks[0] && vs[1] == ks[1] && vs[2] == ks[2], op,
        "q ", to_string(qs), ", k ", to_string(ks), ", v ", to_string(vs),
        ": expected q[B,H,Tq,D], k[B,H,Tk,D], v[B,H,Tk,Dv]");
}

/// The backward's saved output, lse and dout against q [B, H, Tq, D] and v [B, H, Tk, Dv].
template <class Q, class V, class O, class L>
void check_attention_saved(const Q& q, const V& v, const O& out, const L& lse, const O& dout) {
  const Shape<4> os{q.extent(0), q.extent(1), q.extent(2), v.extent(3)};
  const Shape<3> ls{q.extent(0), q.extent(1), q.extent(2)};
  check(out.shape() == os && dout.shape() == os && lse.shape() == ls, "attention_backward", "out ",
        to_string(out.shape()), ", dout ", to_string(dout.shape()), ", lse ", to_string(lse.shape()), ": expected ",
        to_string(os), " and ", to_string(ls));
}

template <class Q, class K, class V, class... Options>
void check_attention(const Q& q, const K& k, const V& v, const Options&...) {
  check_attention_inputs("attention", q, k, v);
}
template <class Q, class K, class V, class O, class L, class... Options>
void check_attention_backward(const Q& q, const K& k, const V& v, const O& out, const L& lse, const O& dout,
                              const Options&...) {
  check_attention_inputs("attention_backward", q, k, v);
  check_attention_saved(q, v, out, lse, dout);
}
template <class O, class L>
void check_merge_attention_blocks(const O& out_a, const L& lse_a, const O& out_b, const L& lse_b) {
  const auto& s = out_a.shape();
  const Shape<3> ls{s[0], s[1], s[2]};
  check(out_b.shape() == s && lse_a.shape() == ls && lse_b.shape() == ls, "merge_attention_blocks", "out_a ",
        to_string(s), ", lse_a ", to_string(lse_a.shape()), ", out_b ", to_string(out_b.shape()), ", lse_b ",
        to_string(lse_b.shape()), ": blocks must have the same extents");
}

}  // namespace dtensor::kernels::generic
