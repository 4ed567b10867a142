// dtensor/ops/matmul_fp8.hpp — ops::matmul with both operands quantized to FP8 (per-tensor
// scales), the FP8 GEMM of FP8 training; and the local amax those scales come from.
//
//   float ax = ops::local_amax(x);                                   // max |x| of this rank's piece
//   auto y = ops::matmul_fp8<float8_e4m3, float8_e4m3, false, true>(x, sx, w, sw);   // ~ x w^T
//   auto dx = ops::matmul_fp8<float8_e5m2, float8_e4m3>(dy, sdy, w, sw);             // ~ dy w
//
// matmul_fp8<FA, FB, TA, TB>(a, sa, b, sb) is ops::matmul<TA, TB>(a, b) (the same shapes, the same
// sharding rules, the output in a's element type) with every element of a replaced by
// FA(a * sa) and of b by FB(b * sb) (core/float8.hpp: round to nearest even, satfinite), the
// products summed in fp32 and the sum multiplied by (1/sa)(1/sb): kernels/host/gemm_fp8.hpp,
// cuBLASLt's FP8 GEMM up to the fp32 summation order. The scales must be the same on every rank
// that holds a piece of the operand (nn::Linear's FP8 path max-reduces the amax first), so the
// result is the single-device one.
//
// Host memory only (the emulation); a GPU's FP8 GEMM is kernels/cuda/gemm_fp8.cuh, not wired
// here yet: another space is an Error at run time (so that models instantiated for the GPU
// still compile). No communication.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "dtensor/core/float8.hpp"
#include "dtensor/kernels/host/gemm_fp8.hpp"
#include "dtensor/ops/matmul.hpp"

namespace dtensor::ops {

namespace detail {
/// Throws: FP8 on a memory space other than the host's. (A plain function, not [[noreturn]], so
/// that the statement after its call is not "unreachable" to nvcc's front end.)
inline void fp8_host_only(const char* op) {
  throw Error(op,
              "FP8 runs on host memory only (the host emulation; the GPU's FP8 GEMM, "
              "kernels/cuda/gemm_fp8.cuh, is not wired into ops)");
}
}  // namespace detail

/// max |x| over this rank's piece (0 for an empty piece; NaN if it holds one). No communication.
template <FloatDTensor X>
float local_amax(const X& x) {
  if constexpr (std::is_same_v<typename X::space, host_space>) {
    const auto& l = x.to_local();
    return kernels::host::amax(l.data(), l.numel());
  } else {
    (void)x;
    detail::fp8_host_only("ops::local_amax");
    return 0.f;
  }
}

/// op(a) op(b) with a and b quantized to FA, FB by the scales sa, sb (see the synopsis).
template <kernels::host::Fp8Element FA, kernels::host::Fp8Element FB, bool TA = false, bool TB = false, FloatDTensor A,
          FloatDTensor B>
auto matmul_fp8(const A& a, float sa, const B& b, float sb) {
  using T = typename A::value_type;
  constexpr std::size_t RA = A::rank, RB = B::rank;
  using L = rules::matmul_t<typename A::layout, typename B::layout, TA, TB, RA, RB>;
  constexpr std::size_t RO = rules::matmul_rank<RA, RB, TA, TB>;
  const auto [global, local_shape] = detail::matmul_shapes<"matmul_fp8", TA, TB>(a, b);
  const auto& al = a.to_local();
  const auto& bl = b.to_local();
  if constexpr (std::is_same_v<typename A::space, host_space>) {
    dtensor::detail::check(std::isfinite(sa) && sa > 0 && std::isfinite(sb) && sb > 0, "matmul_fp8", a.mesh(),
                           "scales ", sa, ", ", sb, " are not finite and > 0 (a ", to_string(a.shape()), ", b ",
                           to_string(b.shape()), ")");
    // Each operand is the matrix [its leading extents flattened, its last extent], as in matmul.
    // (Rows from the leading extents: an empty piece, [B, T, 0], still has B T rows.)
    auto c = Tensor<T, RO, host_space>::uninitialized(local_shape);
    kernels::host::gemm_fp8_quantizing<FA, FB>(
        TA, TB, al.data(), kernels::detail::leading_rows(al.shape()), al.extent(RA - 1), sa, bl.data(),
        kernels::detail::leading_rows(bl.shape()), bl.extent(RB - 1), sb, c.data());
    return detail::make<T, RO, L>(a.mesh(), global, std::move(c));
  } else {
    (void)local_shape;
    detail::fp8_host_only("ops::matmul_fp8");
    return matmul<TA, TB>(a, b);  // not reached: the return type
  }
}

}  // namespace dtensor::ops
