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
#include "dtensor/kernels/generic/checks.hpp"

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

// The checks and extent arithmetic every space shares live in kernels/generic/checks.hpp.
using generic::around;
using generic::Around;
using generic::check;
using generic::check_dim;
using generic::check_same_shape;
using generic::leading_rows;

}  // namespace detail
}  // namespace dtensor::kernels::host
