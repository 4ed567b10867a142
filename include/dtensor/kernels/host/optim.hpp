// dtensor/kernels/host/optim.hpp — the per-element optimizer updates and the squared norm that
// gradient clipping needs, on one tensor (a parameter's local piece or a flat buffer).
//
//   adamw_update(param, grad, exp_avg, exp_avg_sq, {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95,
//                                                   .eps = 1e-8, .weight_decay = 0.1, .step = t});
//   sgd_update(param, grad, momentum_buffer, {.lr = 0.1, .momentum = 0.9, .first_step = t == 0});
//   double sq = sum_squares(grad);            // sum of g^2 in double (all-reduce it, then sqrt)
//
// The math of torch.optim.AdamW / SGD in double, stored in T (as optim/adamw.hpp, optim/sgd.hpp):
// AdamW at step t >= 1: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps). SGD: g += wd p; with momentum,
// b = g on the first step else mu b + (1 - dampening) g, and g = nesterov ? g + mu b : b; p -= lr g.
// float AdamW runs in float (detail::adamw_float, as PyTorch's float AdamW), the bias corrections
// folded into the step size and the denominator as torch does; double and bfloat16 keep the
// double element function (the tests' oracle; the CUDA kernel shares it). AdamW runs in chunks
// (multiples of 64 elements) on a rank's intra-op threads (parallel.hpp): per element, so the
// same bits for any thread count; sum_squares, a sum, stays serial (vectorized in fixed lanes).
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "dtensor/kernels/host/simd.hpp"

#include "dtensor/kernels/generic/optim.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/parallel.hpp"

namespace dtensor::kernels::host {

using generic::AdamWStep;  // the settings of every space's updates (kernels/generic/optim.hpp)
using generic::SgdStep;

namespace detail {
/// One element of an AdamW step, in double (c1, c2: the bias corrections 1 - beta^t; decay:
/// 1 - lr wd). The CUDA kernel calls the same function.
DTENSOR_HOST_DEVICE inline void adamw_element(double& p, double& m, double& v, double g, const AdamWStep& s, double c1,
                                              double c2, double decay) {
  m = s.beta1 * m + (1 - s.beta1) * g;
  v = s.beta2 * v + (1 - s.beta2) * g * g;
  p = p * decay - s.lr * (m / c1) / (::sqrt(v / c2) + s.eps);
}

/// One element of an SGD step, in double (b: the momentum buffer, used when s.momentum > 0).
DTENSOR_HOST_DEVICE inline void sgd_element(double& p, double& b, double g, const SgdStep& s) {
  g += s.weight_decay * p;
  if (s.momentum > 0) {
    b = s.first_step ? g : s.momentum * b + (1 - s.dampening) * g;
    g = s.nesterov ? g + s.momentum * b : b;
  }
  p -= s.lr * g;
}

/// AdamW on float arrays in float, as torch.optim.AdamW computes float parameters (one fused pass,
/// vectorized by simd.hpp except the square root, which stays scalar without -fno-math-errno).
/// G: the gradient's type, float or a narrower one (bf16 gradient shards beside fp32 master
/// values), widened per element — exact, so the update is the one of the widened gradient.
template <class G>
void adamw_float(float* p, const G* g, float* m, float* v, Extent n, const AdamWStep& s, double c1, double c2,
                 double decay) {
  const float b1 = float(s.beta1), b2 = float(s.beta2), step_size = float(s.lr / c1), eps = float(s.eps);
  const float inv_sqrt_c2 = float(1.0 / std::sqrt(c2)), keep = float(decay);
  with_isa([&](auto) DTENSOR_SIMD_BODY {
    for (Extent i = 0; i < n; ++i) {
      const float gi = float(g[i]);
      const float mi = b1 * m[i] + (1.0f - b1) * gi;
      const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * keep - step_size * mi / (std::sqrt(vi) * inv_sqrt_c2 + eps);
    }
  });
}

}  // namespace detail

/// grad: in T, or in a narrower floating type G (widened per element, no buffer).
template <FloatElement T, FloatElement G, std::size_t R>
void adamw_update(HostTensor<T, R>& param, const HostTensor<G, R>& grad, HostTensor<T, R>& exp_avg,
                  HostTensor<T, R>& exp_avg_sq, const AdamWStep& s) {
  const double c1 = 1 - std::pow(s.beta1, double(s.step)), c2 = 1 - std::pow(s.beta2, double(s.step));
  const double decay = 1 - s.lr * s.weight_decay;
  T *p = param.data(), *m = exp_avg.data(), *v = exp_avg_sq.data();
  const G* g = grad.data();
  detail::parallel_for(param.numel(), detail::grain_for(8), [&](Extent i0, Extent i1) {
    if constexpr (std::is_same_v<T, float>) {
      detail::adamw_float(p + i0, g + i0, m + i0, v + i0, i1 - i0, s, c1, c2, decay);
    } else {
      for (Extent i = i0; i < i1; ++i) {
        double pi = double(p[i]), mi = double(m[i]), vi = double(v[i]);
        detail::adamw_element(pi, mi, vi, double(g[i]), s, c1, c2, decay);
        m[i] = T(mi);
        v[i] = T(vi);
        p[i] = T(pi);
      }
    }
  }, 64);
}

/// momentum_buffer is read and written only when s.momentum > 0 (it may be empty otherwise).
/// grad: in T or a narrower floating type (widened per element).
template <FloatElement T, FloatElement G, std::size_t R>
void sgd_update(HostTensor<T, R>& param, const HostTensor<G, R>& grad, HostTensor<T, R>& momentum_buffer,
                const SgdStep& s) {
  T* p = param.data();
  T* b = momentum_buffer.data();
  const G* g = grad.data();
  const bool momentum = s.momentum > 0;
  for (Extent i = 0, n = param.numel(); i < n; ++i) {
    double pi = double(p[i]), bi = momentum ? double(b[i]) : 0.0;
    detail::sgd_element(pi, bi, double(g[i]), s);
    if (momentum) b[i] = T(bi);
    p[i] = T(pi);
  }
}

/// Sum of x^2 in double. float and bfloat16 (widened: exact): chunk by chunk in simd.hpp's kLanes
/// partial sums (lane_dot), the chunks' sums added in order — the same bits on every ISA, and the
/// same for a bf16 tensor as for its values in float. Other types: in index order. (In index
/// order for every type it was one chain of dependent double adds: 2-5 % of a step, the gradient
/// norm of clipping.)
template <FloatElement T, std::size_t R>
double sum_squares(const HostTensor<T, R>& x) {
  const Extent n = x.numel();
  const T* p = x.data();
  double sq = 0;
  if constexpr (detail::float_rows<T>) {
    constexpr Extent chunk = 2048;
    float scratch[chunk];  // bf16 widened (float reads its own values in place)
    detail::with_isa([&](auto) DTENSOR_SIMD_BODY {
      for (Extent i0 = 0; i0 < n; i0 += chunk) {
        const long len = long(std::min(chunk, n - i0));
        const float* row = detail::float_row(p + i0, scratch, len);
        sq += detail::lane_dot(row, row, len);
      }
    });
  } else {
    for (Extent i = 0; i < n; ++i) sq += double(p[i]) * double(p[i]);
  }
  return sq;
}

}  // namespace dtensor::kernels::host
