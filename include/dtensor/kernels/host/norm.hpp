// dtensor/kernels/host/norm.hpp — LayerNorm and RMSNorm over the last dimension.
//
//   auto f = layer_norm(x, weight, bias, 1e-5);     // f.y, f.mean[rows], f.rstd[rows]
//   auto g = layer_norm_backward(x, weight, f.mean, f.rstd, dy);   // g.dx, g.dweight, g.dbias
//   auto f = rms_norm(x, weight, 1e-6);             // f.y, f.rstd[rows]  (f.mean unused, empty)
//   auto g = rms_norm_backward(x, weight, f.rstd, dy);             // g.dx, g.dweight (g.dbias empty)
//
// rows = the product of x's leading extents; statistics are kept in double (Stat). The weight
// and bias gradients are this shard's sums over its rows: under sequence or data parallelism the
// caller all-reduces them. Moments use the two-pass formula (mean, then centred squares) for
// accuracy; variance is the biased one, as in PyTorch. float LayerNorm runs vectorized
// (simd.hpp): per-element math in float, row sums in double over fixed lanes (detail::lane_dot);
// bfloat16 LayerNorm runs the same float code on rows widened to float and rounds its outputs
// once (the float kernel's result on the widened values, rounded; the plain loops had been 6-12 %
// of a bf16 step). The plain loops stay for double and RMSNorm (and are the tests' oracle).
// Intra-op threads (parallel.hpp): the forwards and dx run in blocks of rows; the weight and bias
// gradients, sums over rows, are split over columns instead, each column summed over all rows in
// row order — the serial sum, so the same bits for any thread count.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/parallel.hpp"
#include "dtensor/kernels/host/simd.hpp"

namespace dtensor::kernels::host {

template <class T, std::size_t R>
struct NormForward {
  HostTensor<T, R> y;
  HostTensor<Stat, 1> mean;  // [rows]; empty for RMSNorm
  HostTensor<Stat, 1> rstd;  // [rows]: 1 / sqrt(var + eps), or 1 / sqrt(mean(x^2) + eps)
};

template <class T, std::size_t R>
struct NormBackward {
  HostTensor<T, R> dx;
  HostTensor<T, 1> dweight;
  HostTensor<T, 1> dbias;  // empty for RMSNorm
};

namespace detail {

// The per-row loops of float LayerNorm, with restrict-qualified pointers: without them GCC needs
// more run-time alias checks than it makes and leaves the loops scalar (seen in the profile).
DTENSOR_SIMD_INLINE void centre_row(const float* __restrict x, float mu, float* __restrict c, Extent n) {
  for (Extent j = 0; j < n; ++j) c[j] = x[j] - mu;
}
DTENSOR_SIMD_INLINE void affine_row(const float* __restrict c, float rs, const float* __restrict w,
                                    const float* __restrict b, float* __restrict y, Extent n) {
  for (Extent j = 0; j < n; ++j) y[j] = c[j] * rs * w[j] + b[j];
}
DTENSOR_SIMD_INLINE void norm_xhat_g_row(const float* __restrict x, const float* __restrict dy, const float* __restrict w,
                                         float mu, float rs, float* __restrict xhat, float* __restrict g, Extent n) {
  for (Extent j = 0; j < n; ++j) {
    xhat[j] = (x[j] - mu) * rs;
    g[j] = dy[j] * w[j];
  }
}
DTENSOR_SIMD_INLINE void norm_xhat_row(const float* __restrict x, float mu, float rs, float* __restrict xhat, Extent n) {
  for (Extent j = 0; j < n; ++j) xhat[j] = (x[j] - mu) * rs;
}
DTENSOR_SIMD_INLINE void norm_dw_db_row(const float* __restrict dy, const float* __restrict xhat, Stat* __restrict dw,
                                        Stat* __restrict db, Extent n) {
  for (Extent j = 0; j < n; ++j) {
    dw[j] += Stat(dy[j] * xhat[j]);
    db[j] += Stat(dy[j]);
  }
}
DTENSOR_SIMD_INLINE void norm_dx_row(const float* __restrict xhat, const float* __restrict g, float rs, float mg,
                                     float mgx, float* __restrict dx, Extent n) {
  for (Extent j = 0; j < n; ++j) dx[j] = rs * (g[j] - mg - xhat[j] * mgx);
}

/// LayerNorm forward of float rows, vectorized: per-element math in float (compute_t), the
/// mean and the centred second moment summed in double over lanes (simd.hpp lane_dot). bfloat16
/// rows (and the weight and bias) are widened to float, run the same float code and y is rounded
/// once: the float kernel's result on the widened values, rounded.
template <class T>
void layer_norm_float(const T* x, const T* w, const T* b, T* y, Stat* mean, Stat* rstd, Extent rows, Extent n,
                      double eps) {
  std::vector<float> weights(static_cast<std::size_t>(2 * n));  // used for bfloat16 only
  const float* wf = nullptr;
  const float* bf = nullptr;
  with_isa([&](auto) DTENSOR_SIMD_BODY {
    wf = float_row(w, weights.data(), n);
    bf = float_row(b, weights.data() + n, n);
  });
  parallel_for(rows, grain_for(4 * n), [&](Extent r0, Extent r1) {
    // the centred row; for bfloat16 also the widened x row and the float y row
    std::vector<float> scratch(static_cast<std::size_t>(3 * n));
    float* c = scratch.data();
    with_isa([&](auto) DTENSOR_SIMD_BODY {
      for (Extent r = r0; r < r1; ++r) {
        const float* xr = float_row(x + r * n, c + n, n);
        const Stat mu = lane_dot(xr, static_cast<const float*>(nullptr), n) / Stat(n);
        centre_row(xr, float(mu), c, n);
        const Stat rs = 1.0 / std::sqrt(lane_dot(c, c, n) / Stat(n) + eps);
        mean[r] = mu;
        rstd[r] = rs;
        float* yr = float_out(y + r * n, c + 2 * n);
        affine_row(c, float(rs), wf, bf, yr, n);
        round_row(yr, y + r * n, n);
      }
    });
  });
}

/// LayerNorm backward of float rows, vectorized (the formulas of norm_backward below): per-element
/// math in float; the row sums and the weight and bias gradients (sums over rows) in double.
/// bfloat16 rows are widened to float and the results rounded once, as in the forward.
/// On intra-op threads (parallel.hpp) dx runs in blocks of rows and the weight and bias gradients
/// in blocks of columns (xhat recomputed: the same float expression), each column's sum over the
/// rows in row order as in the one-pass serial loop — so the bits do not depend on the threads.
template <class T>
void layer_norm_backward_float(const T* x, const T* w, const Stat* mean, const Stat* rstd, const T* dy, T* dx,
                               T* dweight, T* dbias, Extent rows, Extent n) {
  std::vector<Stat> sums(static_cast<std::size_t>(2 * n), 0.0);
  Stat *dw = sums.data(), *db = dw + n;
  std::vector<float> weight(static_cast<std::size_t>(n));  // used for bfloat16 only
  const float* wf = nullptr;
  with_isa([&](auto) DTENSOR_SIMD_BODY { wf = float_row(w, weight.data(), n); });
  const bool split = intra_op_threads() > 1 && rows >= 2 * grain_for(6 * n);
  parallel_for(rows, grain_for(6 * n), [&](Extent r0, Extent r1) {
    // xhat and g; for bfloat16 also the widened x and dy rows and the float dx row
    std::vector<float> rows_buffer(static_cast<std::size_t>(5 * n));
    float *xhat = rows_buffer.data(), *g = xhat + n;
    with_isa([&](auto) DTENSOR_SIMD_BODY {
      for (Extent r = r0; r < r1; ++r) {
        const float rs = float(rstd[r]);
        const float* xr = float_row(x + r * n, g + n, n);
        const float* dyr = float_row(dy + r * n, g + 2 * n, n);
        norm_xhat_g_row(xr, dyr, wf, float(mean[r]), rs, xhat, g, n);
        if (!split) norm_dw_db_row(dyr, xhat, dw, db, n);
        const float mg = float(lane_dot(g, static_cast<const float*>(nullptr), n) / Stat(n));
        const float mgx = float(lane_dot(g, xhat, n) / Stat(n));
        float* dxr = float_out(dx + r * n, g + 3 * n);
        norm_dx_row(xhat, g, rs, mg, mgx, dxr, n);
        round_row(dxr, dx + r * n, n);
      }
    });
  });
  if (split)  // columns in blocks of 16 (a cache line of floats), every row in order
    parallel_for(
        n, std::max<Extent>(16, grain_for(2 * rows)),
        [&](Extent c0, Extent c1) {
          const Extent cols = c1 - c0;
          std::vector<float> xhat(static_cast<std::size_t>(3 * cols));  // and, for bfloat16, x and dy widened
          with_isa([&](auto) DTENSOR_SIMD_BODY {
            for (Extent r = 0; r < rows; ++r) {
              const float* xr = float_row(x + r * n + c0, xhat.data() + cols, cols);
              const float* dyr = float_row(dy + r * n + c0, xhat.data() + 2 * cols, cols);
              norm_xhat_row(xr, float(mean[r]), float(rstd[r]), xhat.data(), cols);
              norm_dw_db_row(dyr, xhat.data(), dw + c0, db + c0, cols);
            }
          });
        },
        16);
  for (Extent j = 0; j < n; ++j) {
    dweight[j] = T(float(dw[j]));
    dbias[j] = T(float(db[j]));
  }
}

/// The shared backward: xhat = (x - mean) * rstd (mean = 0 for RMSNorm), g = dy * w;
/// dx = rstd * (g - [mean(g)] - xhat * mean(g * xhat)); dw += dy * xhat; db += dy.
template <class T, std::size_t R>
NormBackward<T, R> norm_backward(const HostTensor<T, R>& x, const HostTensor<T, 1>& w, const HostTensor<Stat, 1>* mean,
                                 const HostTensor<Stat, 1>& rstd, const HostTensor<T, R>& dy) {
  const Extent n = x.extent(R - 1), rows = leading_rows(x.shape());
  NormBackward<T, R> out{HostTensor<T, R>::uninitialized(x.shape()), HostTensor<T, 1>(Shape<1>{n}), {}};
  std::vector<Stat> dw(std::size_t(n), 0.0), db(mean ? std::size_t(n) : 0, 0.0);
  // As layer_norm_backward_float: on intra-op threads dx by rows, dw and db by columns.
  const Extent grain = grain_for(6 * n);
  const bool split = intra_op_threads() > 1 && rows >= 2 * grain;
  parallel_for(rows, grain, [&](Extent r0, Extent r1) {
    std::vector<Stat> xhat(static_cast<std::size_t>(n));
    for (Extent r = r0; r < r1; ++r) {
      const T* xr = x.data() + r * n;
      const T* gr = dy.data() + r * n;
      const Stat mu = mean ? (*mean)[r] : 0.0, rs = rstd[r];
      Stat sum_g = 0, sum_gx = 0;
      for (Extent j = 0; j < n; ++j) {
        const Stat xh = (Stat(xr[j]) - mu) * rs, g = Stat(gr[j]) * Stat(w[j]);
        xhat[std::size_t(j)] = xh;
        sum_g += g;
        sum_gx += g * xh;
        if (split) continue;
        dw[std::size_t(j)] += Stat(gr[j]) * xh;
        if (mean) db[std::size_t(j)] += Stat(gr[j]);
      }
      const Stat mg = mean ? sum_g / Stat(n) : 0.0, mgx = sum_gx / Stat(n);
      for (Extent j = 0; j < n; ++j) {
        const Stat g = Stat(gr[j]) * Stat(w[j]);
        out.dx[r * n + j] = T(rs * (g - mg - xhat[std::size_t(j)] * mgx));
      }
    }
  });
  if (split)
    parallel_for(n, std::max<Extent>(16, grain_for(2 * rows)), [&](Extent c0, Extent c1) {
      for (Extent r = 0; r < rows; ++r) {
        const T* xr = x.data() + r * n;
        const T* gr = dy.data() + r * n;
        const Stat mu = mean ? (*mean)[r] : 0.0, rs = rstd[r];
        for (Extent j = c0; j < c1; ++j) {
          dw[std::size_t(j)] += Stat(gr[j]) * ((Stat(xr[j]) - mu) * rs);
          if (mean) db[std::size_t(j)] += Stat(gr[j]);
        }
      }
    }, 16);
  for (Extent j = 0; j < n; ++j) out.dweight[j] = T(dw[std::size_t(j)]);
  if (mean) {
    out.dbias = HostTensor<T, 1>::uninitialized(Shape<1>{n});
    for (Extent j = 0; j < n; ++j) out.dbias[j] = T(db[std::size_t(j)]);
  }
  return out;
}

}  // namespace detail

template <FloatElement T, std::size_t R>
NormForward<T, R> layer_norm(const HostTensor<T, R>& x, const HostTensor<T, 1>& weight, const HostTensor<T, 1>& bias,
                             double eps = 1e-5) {
  const Extent n = x.extent(R - 1), rows = detail::leading_rows(x.shape());
  NormForward<T, R> f{HostTensor<T, R>::uninitialized(x.shape()), HostTensor<Stat, 1>::uninitialized(Shape<1>{rows}),
                      HostTensor<Stat, 1>::uninitialized(Shape<1>{rows})};
  if constexpr (detail::float_rows<T>) {
    detail::layer_norm_float(x.data(), weight.data(), bias.data(), f.y.data(), f.mean.data(), f.rstd.data(), rows, n, eps);
    return f;
  }
  detail::parallel_for(rows, detail::grain_for(4 * n), [&](Extent r0, Extent r1) {
  for (Extent r = r0; r < r1; ++r) {
    const T* xr = x.data() + r * n;
    Stat mu = 0, var = 0;
    for (Extent j = 0; j < n; ++j) mu += Stat(xr[j]);
    mu /= Stat(n);
    for (Extent j = 0; j < n; ++j) var += (Stat(xr[j]) - mu) * (Stat(xr[j]) - mu);
    const Stat rs = 1.0 / std::sqrt(var / Stat(n) + eps);
    f.mean[r] = mu;
    f.rstd[r] = rs;
    for (Extent j = 0; j < n; ++j) f.y[r * n + j] = T((Stat(xr[j]) - mu) * rs * Stat(weight[j]) + Stat(bias[j]));
  }
  });
  return f;
}

template <FloatElement T, std::size_t R>
NormBackward<T, R> layer_norm_backward(const HostTensor<T, R>& x, const HostTensor<T, 1>& weight,
                                       const HostTensor<Stat, 1>& mean, const HostTensor<Stat, 1>& rstd,
                                       const HostTensor<T, R>& dy) {
  if constexpr (detail::float_rows<T>) {
    const Extent n = x.extent(R - 1);
    NormBackward<T, R> out{HostTensor<T, R>::uninitialized(x.shape()), HostTensor<T, 1>::uninitialized(Shape<1>{n}),
                           HostTensor<T, 1>::uninitialized(Shape<1>{n})};
    detail::layer_norm_backward_float(x.data(), weight.data(), mean.data(), rstd.data(), dy.data(), out.dx.data(),
                                      out.dweight.data(), out.dbias.data(), detail::leading_rows(x.shape()), n);
    return out;
  } else {
    return detail::norm_backward(x, weight, &mean, rstd, dy);
  }
}

template <FloatElement T, std::size_t R>
NormForward<T, R> rms_norm(const HostTensor<T, R>& x, const HostTensor<T, 1>& weight, double eps = 1e-6) {
  const Extent n = x.extent(R - 1), rows = detail::leading_rows(x.shape());
  NormForward<T, R> f{HostTensor<T, R>::uninitialized(x.shape()), {}, HostTensor<Stat, 1>::uninitialized(Shape<1>{rows})};
  detail::parallel_for(rows, detail::grain_for(3 * n), [&](Extent r0, Extent r1) {
    for (Extent r = r0; r < r1; ++r) {
      const T* xr = x.data() + r * n;
      Stat ms = 0;
      for (Extent j = 0; j < n; ++j) ms += Stat(xr[j]) * Stat(xr[j]);
      const Stat rs = 1.0 / std::sqrt(ms / Stat(n) + eps);
      f.rstd[r] = rs;
      for (Extent j = 0; j < n; ++j) f.y[r * n + j] = T(Stat(xr[j]) * rs * Stat(weight[j]));
    }
  });
  return f;
}

template <FloatElement T, std::size_t R>
NormBackward<T, R> rms_norm_backward(const HostTensor<T, R>& x, const HostTensor<T, 1>& weight,
                                     const HostTensor<Stat, 1>& rstd, const HostTensor<T, R>& dy) {
  return detail::norm_backward(x, weight, nullptr, rstd, dy);
}

}  // namespace dtensor::kernels::host
