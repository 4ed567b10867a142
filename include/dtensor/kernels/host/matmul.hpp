// dtensor/kernels/host/matmul.hpp — matrix products of host tensors (matmul, matmul_into, bmm,
// linear, linear_backward_input, linear_backward_weight): kernels/products.hpp over gemm.hpp.
//
//   auto c = kernels::host::matmul(a, b, /*trans_a=*/false, /*trans_b=*/true);   // a b^T
//   auto y = kernels::host::linear(x, w, &b);                                   // x w^T + b
//
// See kernels/products.hpp for every function's contract.
#pragma once

#include "dtensor/kernels/host/common.hpp"
#include "dtensor/kernels/host/elementwise.hpp"
#include "dtensor/kernels/host/gemm.hpp"
#include "dtensor/kernels/products.hpp"

namespace dtensor::kernels {

/// Host memory: gemm.hpp (CBLAS or the portable loop), one GEMM per batch entry.
template <>
struct SpaceGemm<host_space> {
  template <class T>
  static void gemm_batched(bool trans_a, bool trans_b, T alpha, const T* A, Extent stride_a, const T* B,
                           Extent stride_b, T beta, T* C, Extent stride_c, Extent batch, Extent m, Extent n, Extent k,
                           Extent lda, Extent ldb, Extent ldc) {
    for (Extent i = 0; i < batch; ++i)
      host::gemm<T>(trans_a, trans_b, alpha, A + i * stride_a, B + i * stride_b, beta, C + i * stride_c, m, n, k, lda,
                    ldb, ldc);
  }
  template <class T, std::size_t R>
  static void add_bias_(host::HostTensor<T, R>& y, const host::HostTensor<T, 1>& b) {
    host::add_bias_(y, b);
  }
  template <class T, std::size_t R>
  static void bias_grad_into(host::HostTensor<T, 1>& db, const host::HostTensor<T, R>& dy, bool accumulate) {
    host::bias_grad_into(db, dy, accumulate);
  }
};

namespace host {
using kernels::bmm;
using kernels::linear;
using kernels::linear_backward_input;
using kernels::linear_backward_weight;
using kernels::matmul;
using kernels::matmul_into;
namespace detail {
using kernels::detail::op_extents;
}  // namespace detail
}  // namespace host

}  // namespace dtensor::kernels
