// dtensor/kernels/meta/gemm.hpp — the matrix products of kernels/products.hpp on meta tensors
// (through SpaceGemm<meta_space>): matmul, matmul_into, bmm, linear and its backwards check
// extents and record 2 m n k FLOPs per product (op "gemm", with its shape: batch, m, n, k), the
// operands read once (C too when beta != 0) and C written once.
#pragma once

#include "dtensor/kernels/meta/common.hpp"
#include "dtensor/kernels/meta/elementwise.hpp"
#include "dtensor/kernels/products.hpp"

namespace dtensor::kernels {

template <>
struct SpaceGemm<meta_space> {
  template <class T>
  static void gemm_batched(bool, bool, T, const T*, Extent, const T*, Extent, T beta, T*, Extent, Extent batch, Extent m,
                           Extent n, Extent k, Extent, Extent, Extent) {
    meta::detail::gemm_cost("gemm", batch, m, n, k,
                            meta::detail::bytes<T>(batch * (m * k + k * n + (beta != T(0) ? m * n : 0))),
                            meta::detail::bytes<T>(batch * m * n));
  }
  template <class T, std::size_t R>
  static void add_bias_(meta::MetaTensor<T, R>& y, const meta::MetaTensor<T, 1>& b) {
    meta::add_bias_(y, b);
  }
  template <class T, std::size_t R>
  static void bias_grad_into(meta::MetaTensor<T, 1>& db, const meta::MetaTensor<T, R>& dy, bool accumulate) {
    meta::bias_grad_into(db, dy, accumulate);
  }
};

}  // namespace dtensor::kernels
