// dtensor/kernels/meta/fp8.hpp — the FP8 recipe's kernels on meta tensors (a dry run of
// nn::Linear under nn::Fp8Autocast): what kernels/host/gemm_fp8.hpp's amax and
// gemm_fp8_quantizing cost, without values.
//
//   meta::amax<bfloat16>(n);                                       // op "amax": n elements read
//   meta::gemm_fp8_quantizing<bfloat16>(false, true, ra, ca, rb, cb);  // "quantize_fp8" + "gemm_fp8"
//
// The quantizing GEMM reads each operand in T and writes it as one byte per element (the host's
// quantize), then multiplies the one-byte operands (2 m n k FLOPs, op "gemm_fp8": the cost model
// times it at the device's FP8 peak, sim/cost_model.hpp; its shape kept) and writes C in T. A dry run has no
// values, so no scale: the Linear quantizes with 1 there (nn/linear.hpp).
#pragma once

#include <cstdint>

#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

/// max |x| over n elements of T: one read.
template <class T>
void amax(Extent n) {
  detail::cost("amax", std::int64_t(n), detail::bytes<T>(n), 0);
}

/// c = op(a) op(b), a [ra, ca] and b [rb, cb] in T quantized to one byte per element first
/// (kernels::host::gemm_fp8_quantizing's extents; the caller checked them).
template <class T>
void gemm_fp8_quantizing(bool ta, bool tb, Extent ra, Extent ca, Extent rb, Extent cb) {
  const Extent m = ta ? ca : ra, k = ta ? ra : ca, n = tb ? rb : cb;
  const Extent operands = ra * ca + rb * cb;
  detail::cost("quantize_fp8", std::int64_t(operands), detail::bytes<T>(operands), std::int64_t(operands));
  detail::gemm_cost("gemm_fp8", 1, std::int64_t(m), std::int64_t(n), std::int64_t(k), std::int64_t(m * k + k * n),
                    detail::bytes<T>(m * n));
}

}  // namespace dtensor::kernels::meta
