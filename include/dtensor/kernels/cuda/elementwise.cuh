// dtensor/kernels/cuda/elementwise.cuh — the twin of kernels/host/elementwise.hpp on CudaTensor:
// add, sub, mul, scale, add_, mul_, scale_, fill_, add_bias(_), bias_grad(_into), and the
// broadcasting ops add/sub/mul_broadcast with their adjoint sum_to (one thread per output
// element; sum_to walks the broadcast positions of its element in row-major order, in double,
// as the host does, so it is deterministic).
#pragma once

#include <algorithm>
#include <cstdint>

#include "dtensor/kernels/cuda/column_sums.cuh"
#include "dtensor/kernels/cuda/common.cuh"
#include "dtensor/kernels/host/elementwise.hpp"  // broadcast_shape, broadcast_strides (extents only)

namespace dtensor::kernels::cuda {

namespace detail {

struct Add { template <class C> __device__ C operator()(C a, C b) const { return a + b; } };
struct Sub { template <class C> __device__ C operator()(C a, C b) const { return a - b; } };
struct Mul { template <class C> __device__ C operator()(C a, C b) const { return a * b; } };
template <class C>
struct Axpy {
  C alpha;
  __device__ C operator()(C a, C b) const { return a + alpha * b; }
};

/// 16 bytes of consecutive elements, loaded and stored as one word: a thread of map/zip handles a
/// pack (8 bf16, 4 floats, 2 doubles) where every buffer is 16-byte aligned. With one 2-byte
/// element per thread a GPT-2-sized bf16 GELU moved ~1.1 TB/s of the H200's ~4.3 (92 us a call;
/// docs/benchmarks.md). The math per element is the same, so are the bits.
template <class T>
struct alignas(16) Pack16 {
  static constexpr int size = 16 / int(sizeof(T));
  T v[size];
};
inline bool aligned16(const void* p) { return alignment_of(p) >= 16; }

/// out[i] = f(a[i], b[i]) in compute_t<T> (out may be a).
template <class T, class F>
__global__ void zip_kernel(T* out, const T* a, const T* b, Extent n, F f) {
  using C = compute_t<T>;
  for (Extent i = gidx(); i < n; i += gstride()) out[i] = T(f(C(a[i]), C(b[i])));
}
template <class T, class F>
__global__ void zip_packed_kernel(T* out, const T* a, const T* b, Extent packs, F f) {
  using C = compute_t<T>;
  using P = Pack16<T>;
  for (Extent p = gidx(); p < packs; p += gstride()) {
    const P x = reinterpret_cast<const P*>(a)[p], y = reinterpret_cast<const P*>(b)[p];
    P r;
#pragma unroll
    for (int j = 0; j < P::size; ++j) r.v[j] = T(f(C(x.v[j]), C(y.v[j])));
    reinterpret_cast<P*>(out)[p] = r;
  }
}
template <class T, class F>
void zip(T* out, const T* a, const T* b, Extent n, F f) {
  if (n == 0) return;
  Extent done = 0;
  if (aligned16(out) && aligned16(a) && aligned16(b) && n >= Pack16<T>::size) {
    const Extent packs = n / Pack16<T>::size;
    zip_packed_kernel<<<grid_for(packs), block, 0, stream()>>>(out, a, b, packs, f);
    launched("zip_packed_kernel");
    done = packs * Pack16<T>::size;
  }
  if (done == n) return;
  zip_kernel<<<grid_for(n - done), block, 0, stream()>>>(out + done, a + done, b + done, n - done, f);
  launched("zip_kernel");
}

/// out[i] = f(x[i]) in compute_t<T>.
template <class T, class F>
__global__ void map_kernel(T* out, const T* x, Extent n, F f) {
  using C = compute_t<T>;
  for (Extent i = gidx(); i < n; i += gstride()) out[i] = T(f(C(x[i])));
}
template <class T, class F>
__global__ void map_packed_kernel(T* out, const T* x, Extent packs, F f) {
  using C = compute_t<T>;
  using P = Pack16<T>;
  for (Extent p = gidx(); p < packs; p += gstride()) {
    const P a = reinterpret_cast<const P*>(x)[p];
    P r;
#pragma unroll
    for (int j = 0; j < P::size; ++j) r.v[j] = T(f(C(a.v[j])));
    reinterpret_cast<P*>(out)[p] = r;
  }
}
template <class T, class F>
void map(T* out, const T* x, Extent n, F f) {
  if (n == 0) return;
  Extent done = 0;
  if (aligned16(out) && aligned16(x) && n >= Pack16<T>::size) {
    const Extent packs = n / Pack16<T>::size;
    map_packed_kernel<<<grid_for(packs), block, 0, stream()>>>(out, x, packs, f);
    launched("map_packed_kernel");
    done = packs * Pack16<T>::size;
  }
  if (done == n) return;
  map_kernel<<<grid_for(n - done), block, 0, stream()>>>(out + done, x + done, n - done, f);
  launched("map_kernel");
}

template <class C>
struct Scale {
  C alpha;
  __device__ C operator()(C v) const { return alpha * v; }
};

/// x[r, j] += b[j]: threads along a row's columns (coalesced), blocks down the rows, b[j] read
/// once per thread. No per-element index division: with one (i % n), a GPT-2-sized bf16 bias add
/// took 57 us on an H200, about twice its memory traffic (docs/benchmarks.md).
template <class T>
__global__ void add_bias_kernel(T* x, const T* b, Extent n, Extent rows) {
  using C = compute_t<T>;
  const Extent j = Extent(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const C bj = C(b[j]);
  for (Extent r = blockIdx.y; r < rows; r += gridDim.y) x[r * n + j] = T(C(x[r * n + j]) + bj);
}
/// The same over 16-byte packs of a row (rows of a multiple of 16 bytes, aligned buffers).
template <class T>
__global__ void add_bias_packed_kernel(T* x, const T* b, Extent row_packs, Extent rows) {
  using C = compute_t<T>;
  using P = Pack16<T>;
  const Extent j = Extent(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= row_packs) return;
  const P bj = reinterpret_cast<const P*>(b)[j];
  for (Extent r = blockIdx.y; r < rows; r += gridDim.y) {
    P* at = reinterpret_cast<P*>(x) + r * row_packs + j;
    P v = *at;
#pragma unroll
    for (int e = 0; e < P::size; ++e) v.v[e] = T(C(v.v[e]) + C(bj.v[e]));
    *at = v;
  }
}

/// The terms and the store of a bias gradient (column_sums.cuh): db[j] (+)= sum over rows of dy[r, j].
template <class T>
struct BiasGradTerm {
  const T* dy;
  Extent n;
  __device__ ColumnSums<1> operator()(Extent r, Extent j) const { return {{Stat(dy[r * n + j])}}; }
};
template <class T>
struct BiasGradStore {
  T* db;
  bool accumulate;
  __device__ void operator()(Extent j, const ColumnSums<1>& s) const {
    db[j] = T(accumulate ? Stat(db[j]) + s.v[0] : s.v[0]);
  }
};

}  // namespace detail

template <Element T, std::size_t R>
CudaTensor<T, R> add(const CudaTensor<T, R>& a, const CudaTensor<T, R>& b) {
  auto out = CudaTensor<T, R>::uninitialized(a.shape());
  detail::zip(out.data(), a.data(), b.data(), a.numel(), detail::Add{});
  return out;
}
template <Element T, std::size_t R>
CudaTensor<T, R> sub(const CudaTensor<T, R>& a, const CudaTensor<T, R>& b) {
  auto out = CudaTensor<T, R>::uninitialized(a.shape());
  detail::zip(out.data(), a.data(), b.data(), a.numel(), detail::Sub{});
  return out;
}
template <Element T, std::size_t R>
CudaTensor<T, R> mul(const CudaTensor<T, R>& a, const CudaTensor<T, R>& b) {
  auto out = CudaTensor<T, R>::uninitialized(a.shape());
  detail::zip(out.data(), a.data(), b.data(), a.numel(), detail::Mul{});
  return out;
}
template <Element T, std::size_t R>
CudaTensor<T, R> scale(const CudaTensor<T, R>& a, compute_t<T> alpha) {
  auto out = CudaTensor<T, R>::uninitialized(a.shape());
  detail::map(out.data(), a.data(), a.numel(), detail::Scale<compute_t<T>>{alpha});
  return out;
}
/// y += alpha * x.
template <Element T, std::size_t R>
void add_(CudaTensor<T, R>& y, const CudaTensor<T, R>& x, compute_t<T> alpha = compute_t<T>(1)) {
  detail::zip(y.data(), y.data(), x.data(), y.numel(), detail::Axpy<compute_t<T>>{alpha});
}
template <Element T, std::size_t R>
void mul_(CudaTensor<T, R>& y, const CudaTensor<T, R>& x) {
  detail::zip(y.data(), y.data(), x.data(), y.numel(), detail::Mul{});
}
template <Element T, std::size_t R>
void scale_(CudaTensor<T, R>& y, compute_t<T> alpha) {
  detail::map(y.data(), y.data(), y.numel(), detail::Scale<compute_t<T>>{alpha});
}
template <Element T, std::size_t R>
void fill_(CudaTensor<T, R>& y, T value) {
  cuda_space::fill(y.data(), std::size_t(y.numel()), value);
}

/// x[..., n] += b[n] in place.
template <Element T, std::size_t R>
void add_bias_(CudaTensor<T, R>& x, const CudaTensor<T, 1>& b) {
  if (x.numel() == 0) return;
  const Extent n = b.extent(0), rows = x.numel() / n;
  const unsigned row_blocks = unsigned(std::min<Extent>(rows, 4096));
  constexpr Extent pack = detail::Pack16<T>::size;
  if (n % pack == 0 && detail::aligned16(x.data()) && detail::aligned16(b.data())) {
    const Extent row_packs = n / pack;
    const unsigned threads = unsigned(std::min<Extent>(detail::block, (row_packs + 31) / 32 * 32));
    const dim3 grid(unsigned((row_packs + threads - 1) / threads), row_blocks);
    detail::add_bias_packed_kernel<<<grid, threads, 0, detail::stream()>>>(x.data(), b.data(), row_packs, rows);
    detail::launched("add_bias_packed_kernel");
    return;
  }
  const dim3 grid(unsigned((n + detail::block - 1) / detail::block), row_blocks);
  detail::add_bias_kernel<<<grid, detail::block, 0, detail::stream()>>>(x.data(), b.data(), n, rows);
  detail::launched("add_bias_kernel");
}
template <Element T, std::size_t R>
CudaTensor<T, R> add_bias(CudaTensor<T, R> x, const CudaTensor<T, 1>& b) {
  add_bias_(x, b);
  return x;
}

/// db (+)= sum of dy[..., n] over every leading index.
template <FloatElement T, std::size_t R>
void bias_grad_into(CudaTensor<T, 1>& db, const CudaTensor<T, R>& dy, bool accumulate = false) {
  const Extent n = db.extent(0);
  if (n == 0) return;
  detail::column_sums<1>(detail::leading_rows(dy.shape()), n, detail::BiasGradTerm<T>{dy.data(), n},
                         detail::BiasGradStore<T>{db.data(), accumulate}, "bias_grad (column_sums)");
}
template <FloatElement T, std::size_t R>
CudaTensor<T, 1> bias_grad(const CudaTensor<T, R>& dy) {
  CudaTensor<T, 1> db(Shape<1>{dy.extent(R - 1)});
  bias_grad_into(db, dy);
  return db;
}

namespace detail {

/// Where an operand's element for output position i is: i itself (its extents are the output's),
/// i % period (it broadcasts over leading dimensions only: a bias, a position table), or at its
/// strides (any other broadcast; offset_of's division per dimension is what the first two save:
/// 81 us of a GPT-2-sized residual add's ~20 us of memory traffic on an H200, docs/benchmarks.md).
struct BroadcastAt {
  enum Kind : int { same, period, strided } kind = strided;
  Extent period_ = 1;
  __device__ Extent operator()(Extent i, const Dims& out_dims, const Dims& strides) const {
    return kind == same ? i : kind == period ? i % period_ : offset_of(i, out_dims, strides);
  }
};
template <std::size_t R>
BroadcastAt broadcast_at(const Shape<R>& out, const Shape<R>& operand) {
  if (operand == out) return {BroadcastAt::same};
  // Leading extents 1, then the output's trailing ones: a period of the trailing block.
  std::size_t d = 0;
  while (d < R && operand[d] == 1 && out[d] != 1) ++d;
  for (std::size_t e = d; e < R; ++e)
    if (operand[e] != out[e]) return {BroadcastAt::strided};
  Extent period = 1;
  for (std::size_t e = d; e < R; ++e) period *= out[e];
  return {BroadcastAt::period, period};
}

/// out[i] = f(a[at_a(i)], b[at_b(i)]) over the output's extents; strides 0 along broadcast dims.
template <class T, class F>
__global__ void zip_broadcast_kernel(T* out, const T* a, const T* b, Extent n, Dims out_dims, Dims a_strides,
                                     Dims b_strides, BroadcastAt at_a, BroadcastAt at_b, F f) {
  using C = compute_t<T>;
  for (Extent i = gidx(); i < n; i += gstride())
    out[i] = T(f(C(a[at_a(i, out_dims, a_strides)]), C(b[at_b(i, out_dims, b_strides)])));
}

/// out[j] = sum of dz over the positions that broadcast to j (`sum_dims`: the extents summed
/// over, 1 elsewhere; `dz_strides` their strides in dz).
template <class T>
__global__ void sum_to_kernel(T* out, const T* dz, Extent n, Dims out_dims, Dims out_in_dz, Dims sum_dims,
                              Dims dz_strides, Extent per_output) {
  for (Extent j = gidx(); j < n; j += gstride()) {
    const Extent base = offset_of(j, out_dims, out_in_dz);
    double acc = 0;
    for (Extent k = 0; k < per_output; ++k) acc += double(dz[base + offset_of(k, sum_dims, dz_strides)]);
    out[j] = T(acc);
  }
}

template <class T, std::size_t R, class F>
CudaTensor<T, R> zip_broadcast(const char* op, const CudaTensor<T, R>& a, const CudaTensor<T, R>& b, F f) {
  const Shape<R> s = host::broadcast_shape(op, a.shape(), b.shape());
  const Shape<R> sa = host::detail::broadcast_strides(op, s, a.shape()), sb = host::detail::broadcast_strides(op, s, b.shape());
  auto out = CudaTensor<T, R>::uninitialized(s);
  if (out.numel() == 0) return out;
  zip_broadcast_kernel<<<grid_for(out.numel()), block, 0, stream()>>>(
      out.data(), a.data(), b.data(), out.numel(), dims_of(s, row_major_strides(s)), dims_of(s, sa), dims_of(s, sb),
      broadcast_at(s, a.shape()), broadcast_at(s, b.shape()), f);
  launched("zip_broadcast_kernel");
  return out;
}

}  // namespace detail

/// a + b with broadcasting (host::broadcast_shape: same rank, each pair equal or one of them 1).
template <Element T, std::size_t R>
CudaTensor<T, R> add_broadcast(const CudaTensor<T, R>& a, const CudaTensor<T, R>& b) {
  return detail::zip_broadcast("add_broadcast", a, b, detail::Add{});
}
template <Element T, std::size_t R>
CudaTensor<T, R> sub_broadcast(const CudaTensor<T, R>& a, const CudaTensor<T, R>& b) {
  return detail::zip_broadcast("sub_broadcast", a, b, detail::Sub{});
}
template <Element T, std::size_t R>
CudaTensor<T, R> mul_broadcast(const CudaTensor<T, R>& a, const CudaTensor<T, R>& b) {
  return detail::zip_broadcast("mul_broadcast", a, b, detail::Mul{});
}

/// The adjoint of broadcasting to dz's extents: sums dz over the dimensions where `shape` is 1.
template <FloatElement T, std::size_t R>
CudaTensor<T, R> sum_to(const CudaTensor<T, R>& dz, const Shape<R>& shape) {
  auto out = CudaTensor<T, R>::uninitialized(shape);
  if (out.numel() == 0) return out;
  const Shape<R> dz_strides = row_major_strides(dz.shape());
  Shape<R> summed{}, out_in_dz{};
  Extent per_output = 1;
  for (std::size_t d = 0; d < R; ++d) {
    const bool broadcast = shape[d] == 1 && dz.extent(d) != 1;
    summed[d] = broadcast ? dz.extent(d) : 1;
    out_in_dz[d] = broadcast ? 0 : dz_strides[d];
    per_output *= summed[d];
  }
  detail::sum_to_kernel<<<detail::grid_for(out.numel()), detail::block, 0, detail::stream()>>>(
      out.data(), dz.data(), out.numel(), detail::dims_of(shape, row_major_strides(shape)),
      detail::dims_of(shape, out_in_dz), detail::dims_of(summed, row_major_strides(summed)),
      detail::dims_of(summed, dz_strides), per_output);
  detail::launched("sum_to_kernel");
  return out;
}

}  // namespace dtensor::kernels::cuda
