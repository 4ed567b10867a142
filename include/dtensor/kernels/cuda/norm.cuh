// dtensor/kernels/cuda/norm.cuh — the twin of kernels/host/norm.hpp on CudaTensor: layer_norm,
// rms_norm and their backwards over the last dimension. Statistics in double (Stat), two-pass
// moments, biased variance; one block per row, and the weight/bias gradients summed over rows
// in row order by one thread per column (deterministic).
#pragma once

#include "dtensor/kernels/cuda/column_sums.cuh"
#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/cuda/profile.cuh"
#include "dtensor/kernels/host/norm.hpp"  // the element formulas

namespace dtensor::kernels::cuda {

template <class T, std::size_t R>
struct NormForward {
  CudaTensor<T, R> y;
  CudaTensor<Stat, 1> mean;  // [rows]; empty for RMSNorm
  CudaTensor<Stat, 1> rstd;  // [rows]
};

template <class T, std::size_t R>
struct NormBackward {
  CudaTensor<T, R> dx;
  CudaTensor<T, 1> dweight;
  CudaTensor<T, 1> dbias;  // empty for RMSNorm
};

namespace detail {

/// mean == nullptr: RMSNorm.
template <class T>
__global__ void norm_forward_kernel(T* y, Stat* mean, Stat* rstd, const T* x, const T* w, const T* b, Extent rows,
                                    Extent n, double eps) {
  const Extent r = blockIdx.x;
  if (r >= rows) return;
  const T* xr = x + r * n;
  double mu = 0;
  if (mean) {
    double s = 0;
    for (Extent j = threadIdx.x; j < n; j += blockDim.x) s += double(xr[j]);
    mu = block_sum(s) / double(n);
  }
  double q = 0;
  for (Extent j = threadIdx.x; j < n; j += blockDim.x) q += (double(xr[j]) - mu) * (double(xr[j]) - mu);
  const double rs = 1.0 / ::sqrt(block_sum(q) / double(n) + eps);
  if (threadIdx.x == 0) {
    if (mean) mean[r] = mu;
    rstd[r] = rs;
  }
  for (Extent j = threadIdx.x; j < n; j += blockDim.x)
    y[r * n + j] = T((double(xr[j]) - mu) * rs * double(w[j]) + (b ? double(b[j]) : 0.0));
}

/// dx = rstd (g - [mean g] - xhat mean(g xhat)), g = dy w.
template <class T>
__global__ void norm_dx_kernel(T* dx, const T* x, const T* w, const Stat* mean, const Stat* rstd, const T* dy,
                               Extent rows, Extent n) {
  const Extent r = blockIdx.x;
  if (r >= rows) return;
  const T *xr = x + r * n, *gr = dy + r * n;
  const double mu = mean ? mean[r] : 0.0, rs = rstd[r];
  double sg = 0, sgx = 0;
  for (Extent j = threadIdx.x; j < n; j += blockDim.x) {
    const double g = double(gr[j]) * double(w[j]);
    sg += g;
    sgx += g * (double(xr[j]) - mu) * rs;
  }
  const double mg = mean ? block_sum(sg) / double(n) : 0.0;
  const double mgx = block_sum(sgx) / double(n);
  for (Extent j = threadIdx.x; j < n; j += blockDim.x) {
    const double g = double(gr[j]) * double(w[j]), xh = (double(xr[j]) - mu) * rs;
    dx[r * n + j] = T(rs * (g - mg - xh * mgx));
  }
}

/// The terms and the store of a norm's weight (and bias) gradient (column_sums.cuh):
/// dw[j] = sum_r dy[r, j] xhat[r, j]; db[j] = sum_r dy[r, j] (when db).
template <class T>
struct NormGradTerm {
  const T* x;
  const Stat* mean;  // null for RMSNorm
  const Stat* rstd;
  const T* dy;
  Extent n;
  __device__ ColumnSums<2> operator()(Extent r, Extent j) const {
    const double g = double(dy[r * n + j]);
    return {{g * (double(x[r * n + j]) - (mean ? mean[r] : 0.0)) * rstd[r], g}};
  }
};
template <class T>
struct NormGradStore {
  T* dw;
  T* db;  // null for RMSNorm
  __device__ void operator()(Extent j, const ColumnSums<2>& s) const {
    dw[j] = T(s.v[0]);
    if (db) db[j] = T(s.v[1]);
  }
};


template <class T, std::size_t R>
NormForward<T, R> norm_forward(const char* /*op*/, const CudaTensor<T, R>& x, const CudaTensor<T, 1>& w,
                               const CudaTensor<T, 1>* b, double eps) {
  const detail::ProfiledKernel profiled(KernelClass::norm);
  const Extent n = x.extent(R - 1), rows = leading_rows(x.shape());
  NormForward<T, R> f{CudaTensor<T, R>::uninitialized(x.shape()),
                      b ? CudaTensor<Stat, 1>::uninitialized(Shape<1>{rows}) : CudaTensor<Stat, 1>{},
                      CudaTensor<Stat, 1>::uninitialized(Shape<1>{rows})};
  if (rows * n == 0) return f;
  norm_forward_kernel<<<rows_grid(rows), block, 0, stream()>>>(f.y.data(), b ? f.mean.data() : nullptr, f.rstd.data(),
                                                               x.data(), w.data(), b ? b->data() : nullptr, rows, n, eps);
  launched("norm_forward_kernel");
  return f;
}

template <class T, std::size_t R>
NormBackward<T, R> norm_backward(const char* /*op*/, const CudaTensor<T, R>& x, const CudaTensor<T, 1>& w,
                                 const CudaTensor<Stat, 1>* mean, const CudaTensor<Stat, 1>& rstd,
                                 const CudaTensor<T, R>& dy) {
  const detail::ProfiledKernel profiled(KernelClass::norm);
  const Extent n = x.extent(R - 1), rows = leading_rows(x.shape());
  NormBackward<T, R> g{CudaTensor<T, R>::uninitialized(x.shape()), CudaTensor<T, 1>(Shape<1>{n}),
                       mean ? CudaTensor<T, 1>(Shape<1>{n}) : CudaTensor<T, 1>{}};
  if (rows * n == 0) return g;
  const Stat* mp = mean ? mean->data() : nullptr;
  norm_dx_kernel<<<rows_grid(rows), block, 0, stream()>>>(g.dx.data(), x.data(), w.data(), mp, rstd.data(), dy.data(),
                                                          rows, n);
  launched("norm_dx_kernel");
  column_sums<2>(rows, n, NormGradTerm<T>{x.data(), mp, rstd.data(), dy.data(), n},
                 NormGradStore<T>{g.dweight.data(), mean ? g.dbias.data() : nullptr}, "norm_backward (column_sums)");
  return g;
}

}  // namespace detail

template <FloatElement T, std::size_t R>
NormForward<T, R> layer_norm(const CudaTensor<T, R>& x, const CudaTensor<T, 1>& weight, const CudaTensor<T, 1>& bias,
                             double eps = 1e-5) {
  return detail::norm_forward("layer_norm", x, weight, &bias, eps);
}
template <FloatElement T, std::size_t R>
NormBackward<T, R> layer_norm_backward(const CudaTensor<T, R>& x, const CudaTensor<T, 1>& weight,
                                       const CudaTensor<Stat, 1>& mean, const CudaTensor<Stat, 1>& rstd,
                                       const CudaTensor<T, R>& dy) {
  return detail::norm_backward("layer_norm_backward", x, weight, &mean, rstd, dy);
}
template <FloatElement T, std::size_t R>
NormForward<T, R> rms_norm(const CudaTensor<T, R>& x, const CudaTensor<T, 1>& weight, double eps = 1e-6) {
  return detail::norm_forward<T, R>("rms_norm", x, weight, nullptr, eps);
}
template <FloatElement T, std::size_t R>
NormBackward<T, R> rms_norm_backward(const CudaTensor<T, R>& x, const CudaTensor<T, 1>& weight,
                                     const CudaTensor<Stat, 1>& rstd, const CudaTensor<T, R>& dy) {
  return detail::norm_backward<T, R>("rms_norm_backward", x, weight, nullptr, rstd, dy);
}

}  // namespace dtensor::kernels::cuda
