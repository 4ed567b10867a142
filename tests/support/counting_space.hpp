// tests/support/counting_space.hpp — a memory space added from outside the library, with only
// what docs/design.md ("Adding a memory space") lists: this one header declaring the space and
// its kernels. Nothing in include/dtensor names it; kernels::<name> (kernels/dispatch.hpp) runs
// the generic checks and then finds the kernels below by argument-dependent lookup, because
// Tensor<T, R, counting::space> makes namespace `counting` an associated namespace.
//
// counting::space is host memory that counts its allocations and kernel calls, so a test sees
// that the op chain really ran on it (and not on host tensors converted behind its back). Its
// kernels compute through host views of the same memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <string_view>

#include "dtensor/core/memory.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/kernels/elementwise.hpp"
#include "dtensor/kernels/matmul.hpp"
#include "dtensor/kernels/softmax.hpp"

namespace counting {

// ---------------------------------------------------------------- the declaring part

struct space {
  static constexpr std::string_view name = "counting";
  static constexpr bool host_accessible = true;
  static inline std::atomic<long> allocations{0};
  static inline std::atomic<long> kernel_calls{0};

  static void* allocate(std::size_t bytes) {
    if (bytes) ++allocations;
    return dtensor::host_space::allocate(bytes);
  }
  static void deallocate(void* p, std::size_t bytes) noexcept { dtensor::host_space::deallocate(p, bytes); }
  static void copy(void* dst, const void* src, std::size_t bytes) { dtensor::host_space::copy(dst, src, bytes); }
  static void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width,
                      std::size_t height) {
    dtensor::host_space::copy_2d(dst, dst_pitch, src, src_pitch, width, height);
  }
  static void zero(void* dst, std::size_t bytes) { dtensor::host_space::zero(dst, bytes); }
  template <class T>
  static void fill(T* dst, std::size_t n, T value) { dtensor::host_space::fill(dst, n, value); }
};
static_assert(dtensor::MemorySpace<space>);

template <class T, std::size_t R>
using Tensor = dtensor::Tensor<T, R, space>;

// ---------------------------------------------------------------- its kernels

namespace detail {
/// The same elements seen as a host tensor (no copy).
template <class T, std::size_t R>
dtensor::Tensor<T, R> host_view(const Tensor<T, R>& t) {
  return dtensor::Tensor<T, R>::view(const_cast<T*>(t.data()), t.shape());
}
/// A tensor of this space holding h's elements.
template <class T, std::size_t R>
Tensor<T, R> adopt(const dtensor::Tensor<T, R>& h) {
  auto t = Tensor<T, R>::uninitialized(h.shape());
  space::copy(t.data(), h.data(), h.bytes());
  return t;
}
}  // namespace detail

// The kernels trust their arguments: kernels::<name> checked them (kernels/generic/).
template <class T, std::size_t R>
Tensor<T, R> add_broadcast(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  ++space::kernel_calls;
  return detail::adopt(dtensor::kernels::host::add_broadcast(detail::host_view(a), detail::host_view(b)));
}
template <class T, std::size_t R>
Tensor<T, R> softmax(const Tensor<T, R>& x) {
  ++space::kernel_calls;
  return detail::adopt(dtensor::kernels::host::softmax(detail::host_view(x)));
}
template <class T, std::size_t R>
Tensor<T, R> softmax_backward(const Tensor<T, R>& y, const Tensor<T, R>& dy) {
  ++space::kernel_calls;
  return detail::adopt(dtensor::kernels::host::softmax_backward(detail::host_view(y), detail::host_view(dy)));
}

}  // namespace counting

/// The GEMM every product kernel (kernels/products.hpp: matmul, bmm, linear) runs on: host BLAS
/// on the same memory.
template <>
struct dtensor::kernels::SpaceGemm<counting::space> {
  template <class T, class... A>
  static void gemm_batched(A... a) {
    ++counting::space::kernel_calls;
    SpaceGemm<host_space>::template gemm_batched<T>(a...);
  }
};
