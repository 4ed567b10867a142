// dtensor/kernels/generic/norm.hpp — the argument checks of LayerNorm and RMSNorm over the last
// dimension and their backwards, for every memory space.
#pragma once

#include <cstddef>
#include <string>

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

/// The parameters (weight, and bias when there is one) match the last dimension of x.
template <std::size_t R>
void check_norm(const char* op, const Shape<R>& x, const Shape<1>& w, const Shape<1>* b) {
  check(w[0] == x[R - 1] && (!b || (*b)[0] == x[R - 1]), op, "x ", to_string(x), ", weight ", to_string(w),
        b ? ", bias " + to_string(*b) : std::string(), ": parameters must match the last dimension");
}

/// dy has x's extents and the saved statistics one entry per row.
template <std::size_t R>
void check_norm_backward(const char* op, const Shape<R>& x, const Shape<R>& dy, const Shape<1>* mean,
                         const Shape<1>& rstd) {
  const Extent rows = leading_rows(x);
  check(x == dy && rstd[0] == rows && (!mean || (*mean)[0] == rows), op, "x ", to_string(x), ", dy ", to_string(dy),
        ", saved statistics ", to_string(rstd), " (expected [", rows, "])");
}

template <class X, class W, class B, class... Eps>
void check_layer_norm(const X& x, const W& weight, const B& bias, const Eps&...) {
  const Shape<1> b = bias.shape();
  check_norm("layer_norm", x.shape(), weight.shape(), &b);
}
template <class X, class W, class S, class DY>
void check_layer_norm_backward(const X& x, const W& weight, const S& mean, const S& rstd, const DY& dy) {
  const Shape<1> m = mean.shape();
  check_norm("layer_norm_backward", x.shape(), weight.shape(), nullptr);
  check_norm_backward("layer_norm_backward", x.shape(), dy.shape(), &m, rstd.shape());
}
template <class X, class W, class... Eps>
void check_rms_norm(const X& x, const W& weight, const Eps&...) {
  check_norm("rms_norm", x.shape(), weight.shape(), nullptr);
}
template <class X, class W, class S, class DY>
void check_rms_norm_backward(const X& x, const W& weight, const S& rstd, const DY& dy) {
  check_norm("rms_norm_backward", x.shape(), weight.shape(), nullptr);
  check_norm_backward("rms_norm_backward", x.shape(), dy.shape(), nullptr, rstd.shape());
}

}  // namespace dtensor::kernels::generic
