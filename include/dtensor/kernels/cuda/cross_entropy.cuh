// dtensor/kernels/cuda/cross_entropy.cuh — the twin of kernels/host/cross_entropy.hpp on
// CudaTensor: cross_entropy, cross_entropy_backward and the vocabulary-parallel pieces
// (vocab_parallel_ce_max / _sum_exp / _target_logit / _loss / _backward), with the host's recipe
// (row max, sums of exps in double, probabilities as exp(x - lse)). Row statistics are one block
// per row; the loss (a double on the host, as the host twin returns) sums the rows' terms on the
// host in row order, so it is the host twin's sum of the same terms.
#pragma once

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/cuda/profile.cuh"
#include "dtensor/kernels/cuda/softmax.cuh"
#include "dtensor/kernels/host/cross_entropy.hpp"  // vocab_parallel_ce_loss on the host copies

namespace dtensor::kernels::cuda {

struct CrossEntropyForward {
  double loss = 0;          // mean over rows
  CudaTensor<Stat, 1> lse;  // [N]
};

namespace detail {

template <class T>
__global__ void ce_row_max_kernel(Stat* out, const T* x, Extent rows, Extent v) {
  const Extent r = blockIdx.x;
  if (r >= rows) return;
  double m = neg_inf;
  for (Extent j = threadIdx.x; j < v; j += blockDim.x) m = fmax(m, double(x[r * v + j]));
  m = block_max(m);
  if (threadIdx.x == 0) out[r] = m;
}

template <class T>
__global__ void ce_row_sum_exp_kernel(Stat* out, const T* x, const Stat* shift, Extent rows, Extent v) {
  const Extent r = blockIdx.x;
  if (r >= rows) return;
  const double m = shift[r];
  double s = 0;
  if (m != neg_inf)
    for (Extent j = threadIdx.x; j < v; j += blockDim.x) s += ::exp(double(x[r * v + j]) - m);
  s = block_sum(s);
  if (threadIdx.x == 0) out[r] = s;
}

/// The target's logit when it lies in [v0, v0 + v), else 0; negative or (strict) out-of-range
/// targets are reported.
template <class T, class Id>
__global__ void ce_target_kernel(Stat* out, const T* x, const Id* targets, Extent rows, Extent v, Extent v0,
                                 bool strict, unsigned long long* bad) {
  for (Extent r = gidx(); r < rows; r += gstride()) {
    const Extent t = Extent(targets[r]), j = t - v0;
    if (t < 0 || (strict && (j < 0 || j >= v))) report_bad(bad, r);
    out[r] = (j >= 0 && j < v) ? double(x[r * v + j]) : 0.0;
  }
}

template <class S>
__global__ void ce_lse_kernel(S* lse, const S* m, const S* s, Extent rows) {
  for (Extent r = gidx(); r < rows; r += gstride()) lse[r] = m[r] == neg_inf ? neg_inf : m[r] + ::log(s[r]);
}

/// d[i, j] = (exp(x - lse_i) - [v0 + j == target_i]) * scale; lse_i from lse, or from (max, sum).
template <class T, class Id>
__global__ void ce_backward_kernel(T* d, const T* x, const Id* targets, const Stat* lse, const Stat* m, const Stat* s,
                                   Extent rows, Extent v, Extent v0, double scale) {
  for (Extent e = gidx(); e < rows * v; e += gstride()) {
    const Extent r = e / v, j = e % v;
    const double l = lse ? lse[r] : (m[r] == neg_inf ? neg_inf : m[r] + ::log(s[r]));
    const double onehot = (Extent(targets[r]) - v0 == j) ? 1.0 : 0.0;
    d[e] = T((::exp(double(x[e]) - l) - onehot) * scale);
  }
}

template <class T, class Id>
CudaTensor<Stat, 1> target_logit(const char* op, const CudaTensor<T, 2>& logits, const CudaTensor<Id, 1>& targets,
                                 Extent v0, bool strict) {
  const Extent n = logits.extent(0), v = logits.extent(1);
  auto t = CudaTensor<Stat, 1>::uninitialized(Shape<1>{n});
  if (n == 0) return t;
  BadValueFlag bad;
  ce_target_kernel<<<grid_for(n), block, 0, stream()>>>(t.data(), logits.data(), targets.data(), n, v, v0, strict,
                                                        bad.data());
  launched("ce_target_kernel");
  const Extent at = bad.position();
  check(at < 0, op, "target in row ", at, strict ? " out of range [0, " : " negative (vocabulary [0, ", v, "))");
  return t;
}

template <class T, class Id>
CudaTensor<T, 2> ce_backward(const CudaTensor<T, 2>& logits, const CudaTensor<Id, 1>& targets, Extent v0,
                             const Stat* lse, const Stat* m, const Stat* s, double scale) {
  auto d = CudaTensor<T, 2>::uninitialized(logits.shape());
  if (d.numel() == 0) return d;
  ce_backward_kernel<<<grid_for(d.numel()), block, 0, stream()>>>(d.data(), logits.data(), targets.data(), lse, m, s,
                                                                  logits.extent(0), logits.extent(1), v0, scale);
  launched("ce_backward_kernel");
  return d;
}

}  // namespace detail

template <FloatElement T>
CudaTensor<Stat, 1> vocab_parallel_ce_max(const CudaTensor<T, 2>& logits) {
  const detail::ProfiledKernel profiled(KernelClass::cross_entropy);
  const Extent n = logits.extent(0);
  auto m = CudaTensor<Stat, 1>::uninitialized(Shape<1>{n});
  if (n == 0) return m;
  detail::ce_row_max_kernel<<<detail::rows_grid(n), detail::block, 0, detail::stream()>>>(m.data(), logits.data(), n,
                                                                                          logits.extent(1));
  detail::launched("ce_row_max_kernel");
  return m;
}

template <FloatElement T>
CudaTensor<Stat, 1> vocab_parallel_ce_sum_exp(const CudaTensor<T, 2>& logits, const CudaTensor<Stat, 1>& global_max) {
  const detail::ProfiledKernel profiled(KernelClass::cross_entropy);
  const Extent n = logits.extent(0);
  auto s = CudaTensor<Stat, 1>::uninitialized(Shape<1>{n});
  if (n == 0) return s;
  detail::ce_row_sum_exp_kernel<<<detail::rows_grid(n), detail::block, 0, detail::stream()>>>(
      s.data(), logits.data(), global_max.data(), n, logits.extent(1));
  detail::launched("ce_row_sum_exp_kernel");
  return s;
}

template <FloatElement T, IndexElement Id>
CudaTensor<Stat, 1> vocab_parallel_ce_target_logit(const CudaTensor<T, 2>& logits, const CudaTensor<Id, 1>& targets,
                                                   Extent v0) {
  const detail::ProfiledKernel profiled(KernelClass::cross_entropy);
  return detail::target_logit("vocab_parallel_ce_target_logit", logits, targets, v0, false);
}

/// The mean loss from the all-reduced pieces, computed on the host from copies (one value).
inline double vocab_parallel_ce_loss(const CudaTensor<Stat, 1>& global_max, const CudaTensor<Stat, 1>& global_sum,
                                     const CudaTensor<Stat, 1>& target_logit, Extent mean_over = -1) {
  return host::vocab_parallel_ce_loss(to_space<host_space>(global_max), to_space<host_space>(global_sum),
                                      to_space<host_space>(target_logit), mean_over);
}

template <FloatElement T, IndexElement Id>
CudaTensor<T, 2> vocab_parallel_ce_backward(const CudaTensor<T, 2>& logits, const CudaTensor<Id, 1>& targets, Extent v0,
                                            const CudaTensor<Stat, 1>& global_max,
                                            const CudaTensor<Stat, 1>& global_sum, double dloss = 1.0,
                                            Extent mean_over = -1) {
  const detail::ProfiledKernel profiled(KernelClass::cross_entropy);
  const Extent d = host::detail::mean_divisor(logits.extent(0), mean_over);
  return detail::ce_backward(logits, targets, v0, nullptr, global_max.data(), global_sum.data(),
                             d > 0 ? dloss / double(d) : 0.0);
}

template <FloatElement T, IndexElement Id>
CrossEntropyForward cross_entropy(const CudaTensor<T, 2>& logits, const CudaTensor<Id, 1>& targets,
                                  Extent mean_over = -1) {
  const detail::ProfiledKernel profiled(KernelClass::cross_entropy);
  const auto t = detail::target_logit("cross_entropy", logits, targets, 0, true);
  const auto m = vocab_parallel_ce_max(logits);
  const auto s = vocab_parallel_ce_sum_exp(logits, m);
  CrossEntropyForward f{vocab_parallel_ce_loss(m, s, t, mean_over), CudaTensor<Stat, 1>::uninitialized(m.shape())};
  if (m.numel() > 0) {
    detail::ce_lse_kernel<<<detail::grid_for(m.numel()), detail::block, 0, detail::stream()>>>(f.lse.data(), m.data(),
                                                                                               s.data(), m.numel());
    detail::launched("ce_lse_kernel");
  }
  return f;
}

template <FloatElement T, IndexElement Id>
CudaTensor<T, 2> cross_entropy_backward(const CudaTensor<T, 2>& logits, const CudaTensor<Id, 1>& targets,
                                        const CudaTensor<Stat, 1>& lse, double dloss = 1.0, Extent mean_over = -1) {
  const detail::ProfiledKernel profiled(KernelClass::cross_entropy);
  const Extent d = host::detail::mean_divisor(logits.extent(0), mean_over);
  return detail::ce_backward(logits, targets, 0, lse.data(), nullptr, nullptr, d > 0 ? dloss / double(d) : 0.0);
}

}  // namespace dtensor::kernels::cuda
