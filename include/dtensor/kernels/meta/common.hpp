// dtensor/kernels/meta/common.hpp — what every meta kernel shares: the tensor alias, the extent
// helpers of kernels/generic, and the cost record.
//
//   kernels::meta::MetaTensor<float, 2>           // Tensor<float, 2, meta_space>
//   detail::result<T>(shape)                      // an output tensor (no elements)
//   detail::cost("gelu", flops, bytes_read, bytes_written);
//   detail::gemm_cost("gemm", batch, m, n, k, bytes_read, bytes_written);  // 2 batch m n k FLOPs, the shape kept
//
// A meta kernel returns tensors of the extents the host twin returns and records its cost
// (kernels/meta/cost_log.hpp). Its arguments were checked by kernels::name (kernels/generic/, the
// same errors as on host for the same bad extents); values (ids, targets in range) are not
// checked: meta tensors have none.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtensor/core/meta_space.hpp"
#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/meta/cost_log.hpp"

namespace dtensor::kernels::meta {

using host::compute_t;
using host::FloatElement;
using host::IndexElement;
using host::Stat;

template <class T, std::size_t R>
using MetaTensor = Tensor<T, R, meta_space>;

namespace detail {

using host::detail::around;
using host::detail::check;
using host::detail::check_dim;
using host::detail::check_same_shape;
using host::detail::leading_rows;

template <class T, std::size_t R>
MetaTensor<T, R> result(const Shape<R>& shape) {
  return MetaTensor<T, R>::uninitialized(shape);
}

/// Bytes of n elements of T.
template <class T>
constexpr std::int64_t bytes(Extent n) {
  return std::int64_t(n) * std::int64_t(sizeof(T));
}

inline void cost(const char* op, std::int64_t flops, std::int64_t read, std::int64_t written) {
  CostLog::record(CostRecord{op, flops, read, written});
}

/// `batch` products of m x k by k x n (op "gemm" or "gemm_fp8"): 2 batch m n k FLOPs, and the
/// shape, which the cost model's wave quantisation reads (sim::op_seconds).
inline void gemm_cost(const char* op, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                      std::int64_t read, std::int64_t written) {
  CostLog::record(CostRecord{op, 2 * batch * m * n * k, read, written, m, n, k, batch});
}

/// A pointwise map of n elements of T reading `inputs` tensors of n and writing one.
template <class T>
void pointwise_cost(const char* op, Extent n, int inputs, std::int64_t flops_per_element = 1) {
  cost(op, flops_per_element * n, inputs * bytes<T>(n), bytes<T>(n));
}

}  // namespace detail
}  // namespace dtensor::kernels::meta
