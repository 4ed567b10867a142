// dtensor/kernels/host/common.hpp — what every host kernel shares: element-type concepts, the
// arithmetic types, argument checks.
//
//   template <FloatElement T> ...        // float, double, bfloat16
//   compute_t<T>                          // float for float/bfloat16, double for double
//   Stat                                  // double: per-row statistics (max, sums, mean, rstd, lse)
//   detail::check(ok, "layer_norm", "x ", to_string(x.shape()), " vs weight ", ...);
//
// Precision policy (why): the distributed ops must reproduce a one-rank run within 1e-5
// relative, and they split sums differently (partial sums all-reduced across ranks). Per-element
// math runs in compute_t<T>; every sum along a row (softmax denominators, norm moments, bias
// gradients, losses) accumulates in double, which makes those sums nearly independent of how
// they are split. Loop orders are fixed, so a kernel gives the same bits on every call.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "dtensor/core/bfloat16.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/shape.hpp"
#include "dtensor/core/tensor.hpp"

/// Marks a per-element formula that the CUDA kernels share with the host kernels (a plain
/// inline function when nvcc is not compiling).
#if defined(__CUDACC__)
#define DTENSOR_HOST_DEVICE __host__ __device__
#else
#define DTENSOR_HOST_DEVICE
#endif

namespace dtensor::kernels::host {

/// Floating-point element types the math kernels accept.
template <class T>
concept FloatElement = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bfloat16>;

/// The integer types ids and targets may have.
template <class T>
concept IndexElement = std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

/// The type per-element arithmetic runs in: bfloat16 computes in float and rounds once on store.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double,
                                     std::conditional_t<FloatElement<T>, float, T>>;

/// The type of saved per-row statistics and of row sums (see the policy above).
using Stat = double;

template <class T, std::size_t R>
using HostTensor = Tensor<T, R, host_space>;

namespace detail {

using dtensor::detail::check;

/// Product of the extents before the last one (the "rows" of a last-dimension kernel).
template <std::size_t R>
constexpr Extent leading_rows(const Shape<R>& s) {
  Extent n = 1;
  for (std::size_t i = 0; i + 1 < R; ++i) n *= s[i];
  return n;
}

/// Extents as [outer, n, inner] around dimension dim.
template <std::size_t R>
struct Around {
  Extent outer = 1, n = 1, inner = 1;
};
template <std::size_t R>
constexpr Around<R> around(const Shape<R>& s, std::size_t dim) {
  Around<R> a;
  for (std::size_t i = 0; i < R; ++i) {
    if (i < dim) a.outer *= s[i];
    else if (i == dim) a.n = s[i];
    else a.inner *= s[i];
  }
  return a;
}

template <std::size_t R>
inline void check_same_shape(const char* op, const char* a_name, const Shape<R>& a, const char* b_name,
                             const Shape<R>& b) {
  check(a == b, op, a_name, " ", to_string(a), " and ", b_name, " ", to_string(b), " must have the same extents");
}

template <std::size_t R>
inline void check_dim(const char* op, std::size_t dim, const Shape<R>& s) {
  check(dim < R, op, "dimension ", dim, " out of range for a tensor of extents ", to_string(s));
}

}  // namespace detail
}  // namespace dtensor::kernels::host
