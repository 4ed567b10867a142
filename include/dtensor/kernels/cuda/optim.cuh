// dtensor/kernels/cuda/optim.cuh — the twin of kernels/host/optim.hpp on CudaTensor: adamw_update,
// sgd_update (one thread per element through the host's per-element functions, in double) and sum_squares (in double:
// per-block tree sums over a fixed grid, then one block adds the partial sums; deterministic,
// not the host's bits). Not Thrust/CUB here: their kernels name ::cuda::std, which a translation
// unit with `using namespace dtensor;` (namespace dtensor::cuda) makes ambiguous in nvcc's stub.
// (kernels/cuda/embedding.cuh does include CUB's radix sort, which declares ::cuda: code that says
// `using namespace dtensor;` names dtensor's as `dtensor::cuda::`, as the benchmarks do.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/cuda/profile.cuh"
#include "dtensor/kernels/generic/optim.hpp"  // AdamWSegment, FusedAdamW
#include "dtensor/kernels/host/optim.hpp"     // AdamWStep, SgdStep, the element formulas

namespace dtensor::kernels::cuda {

using host::AdamWStep;
using host::SgdStep;

namespace detail {

template <class T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, Extent n, AdamWStep s, double c1, double c2) {
  const double decay = 1 - s.lr * s.weight_decay;
  for (Extent i = gidx(); i < n; i += gstride()) {
    double pi = double(p[i]), mi = double(m[i]), vi = double(v[i]);
    host::detail::adamw_element(pi, mi, vi, double(g[i]), s, c1, c2, decay);
    m[i] = T(mi);
    v[i] = T(vi);
    p[i] = T(pi);
  }
}

/// A block's share of a multi-tensor update: elements [begin, end) of segment `segment`.
struct AdamWChunk {
  Extent segment, begin, end;
};
/// Elements per chunk: a block of 256 threads walks 16 per thread (PyTorch's multi_tensor_apply
/// takes 65,536 per chunk; shorter here so that small models still fill the GPU).
inline constexpr Extent adamw_chunk = Extent(block) * 16;

/// One block per chunk; each element exactly as adamw_kernel's (the same function, in double).
template <class T, class G>
__global__ void adamw_segments_kernel(const generic::AdamWSegment<T, G>* segments, const AdamWChunk* chunks,
                                      AdamWStep s, double c1, double c2) {
  const AdamWChunk c = chunks[blockIdx.x];
  const generic::AdamWSegment<T, G> g = segments[c.segment];
  const double decay = 1 - s.lr * g.weight_decay;
  for (Extent i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    double pi = double(g.param[i]), mi = double(g.exp_avg[i]), vi = double(g.exp_avg_sq[i]);
    host::detail::adamw_element(pi, mi, vi, double(g.grad[i]), s, c1, c2, decay);
    g.exp_avg[i] = T(mi);
    g.exp_avg_sq[i] = T(vi);
    g.param[i] = T(pi);
  }
}

template <class T>
__global__ void sgd_kernel(T* p, const T* g, T* b, Extent n, SgdStep s) {
  const bool momentum = s.momentum > 0;
  for (Extent i = gidx(); i < n; i += gstride()) {
    double pi = double(p[i]), bi = momentum ? double(b[i]) : 0.0;
    host::detail::sgd_element(pi, bi, double(g[i]), s);
    if (momentum) b[i] = T(bi);
    p[i] = T(pi);
  }
}

inline constexpr unsigned sum_squares_blocks = 256;

/// partial[b] = sum of x^2 over the grid-stride slice of block b.
template <class T>
__global__ void sum_squares_kernel(double* partial, const T* x, Extent n) {
  double s = 0;
  for (Extent i = gidx(); i < n; i += gstride()) s += double(x[i]) * double(x[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
template <class D>
__global__ void sum_partials_kernel(D* out, const D* partial, unsigned count) {
  const double s = block_sum(threadIdx.x < count ? partial[threadIdx.x] : 0.0);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace detail

template <FloatElement T, std::size_t R>
void adamw_update(CudaTensor<T, R>& param, const CudaTensor<T, R>& grad, CudaTensor<T, R>& exp_avg,
                  CudaTensor<T, R>& exp_avg_sq, const AdamWStep& s) {
  const detail::ProfiledKernel profiled(KernelClass::optimizer);
  if (param.numel() == 0) return;
  const double c1 = 1 - std::pow(s.beta1, double(s.step)), c2 = 1 - std::pow(s.beta2, double(s.step));
  detail::adamw_kernel<<<detail::grid_for(param.numel()), detail::block, 0, detail::stream()>>>(
      param.data(), grad.data(), exp_avg.data(), exp_avg_sq.data(), param.numel(), s, c1, c2);
  detail::launched("adamw_kernel");
}

/// Every segment's AdamW update in one launch (s.weight_decay is each segment's): the segments and
/// a table of chunks copied to the device (one small host-to-device copy), then one block per chunk.
/// Each element is adamw_update's, so the result is the per-parameter launches' bit for bit.
template <FloatElement T, class G>
void adamw_update_segments(std::span<const generic::AdamWSegment<T, G>> segments, const AdamWStep& s) {
  const detail::ProfiledKernel profiled(KernelClass::optimizer);
  std::vector<detail::AdamWChunk> chunks;
  for (std::size_t k = 0; k < segments.size(); ++k)
    for (Extent b = 0; b < segments[k].n; b += detail::adamw_chunk)
      chunks.push_back({Extent(k), b, std::min(segments[k].n, b + detail::adamw_chunk)});
  if (chunks.empty()) return;
  detail::check(chunks.size() < (std::size_t(1) << 31), "cuda::adamw_update_segments", chunks.size(),
                " chunks exceed a grid");
  // One buffer: the segments, then the chunks (both trivially copyable; chunks 8-byte aligned).
  const std::size_t seg_bytes = segments.size() * sizeof(generic::AdamWSegment<T, G>);
  const std::size_t chunk_offset = (seg_bytes + 15) / 16 * 16;
  Tensor<std::uint8_t, 1> staged(Shape<1>{Extent(chunk_offset + chunks.size() * sizeof(detail::AdamWChunk))});
  std::memcpy(staged.data(), segments.data(), seg_bytes);
  std::memcpy(staged.data() + chunk_offset, chunks.data(), chunks.size() * sizeof(detail::AdamWChunk));
  const auto table = to_space<cuda_space>(staged);
  const double c1 = 1 - std::pow(s.beta1, double(s.step)), c2 = 1 - std::pow(s.beta2, double(s.step));
  detail::adamw_segments_kernel<<<unsigned(chunks.size()), detail::block, 0, detail::stream()>>>(
      reinterpret_cast<const generic::AdamWSegment<T, G>*>(table.data()),
      reinterpret_cast<const detail::AdamWChunk*>(table.data() + chunk_offset), s, c1, c2);
  detail::launched("adamw_segments_kernel");
}

template <FloatElement T, std::size_t R>
void sgd_update(CudaTensor<T, R>& param, const CudaTensor<T, R>& grad, CudaTensor<T, R>& momentum_buffer,
                const SgdStep& s) {
  const detail::ProfiledKernel profiled(KernelClass::optimizer);
  if (param.numel() == 0) return;
  detail::sgd_kernel<<<detail::grid_for(param.numel()), detail::block, 0, detail::stream()>>>(
      param.data(), grad.data(), momentum_buffer.data(), param.numel(), s);
  detail::launched("sgd_kernel");
}

/// Sum of x^2 in double (waits for the result: it is a host value).
template <FloatElement T, std::size_t R>
double sum_squares(const CudaTensor<T, R>& x) {
  const detail::ProfiledKernel profiled(KernelClass::optimizer);
  if (x.numel() == 0) return 0.0;
  static_assert(detail::sum_squares_blocks <= detail::block, "one block adds the partial sums");
  CudaTensor<double, 1> partial(Shape<1>{detail::sum_squares_blocks}), total(Shape<1>{1});
  detail::sum_squares_kernel<<<detail::sum_squares_blocks, detail::block, 0, detail::stream()>>>(partial.data(),
                                                                                                x.data(), x.numel());
  detail::launched("sum_squares_kernel");
  detail::sum_partials_kernel<<<1, detail::block, 0, detail::stream()>>>(total.data(), partial.data(),
                                                                         detail::sum_squares_blocks);
  detail::launched("sum_partials_kernel");
  return to_space<host_space>(total)[0];
}

}  // namespace dtensor::kernels::cuda

namespace dtensor::kernels::generic {
/// The GPU updates an AdamW step's parameters in one launch (kernels::cuda::adamw_update_segments).
template <>
struct FusedAdamW<cuda_space> {
  static constexpr bool available = true;
  template <class T, class G>
  static void update(std::span<const AdamWSegment<T, G>> segments, const AdamWStep& s) {
    kernels::cuda::adamw_update_segments(segments, s);
  }
};
}  // namespace dtensor::kernels::generic
