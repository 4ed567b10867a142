// dtensor/kernels/generic/elementwise.hpp — the argument checks of the elementwise kernels and
// the broadcasting arithmetic every memory space's kernels share.
//
//   generic::broadcast_shape("add_broadcast", a, b)   // extents of a (op) b; throws if they do not broadcast
//   generic::broadcast_strides("sum_to", x, b)       // b's strides against x, 0 along broadcast dimensions
#pragma once

#include <cstddef>

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

/// The extents of a (op) b under broadcasting: same rank, each pair equal or one of them 1
/// (numpy broadcasting without rank promotion; reshape first to add leading 1s).
template <std::size_t R>
Shape<R> broadcast_shape(const char* op, const Shape<R>& a, const Shape<R>& b) {
  Shape<R> s{};
  for (std::size_t i = 0; i < R; ++i) {
    check(a[i] == b[i] || a[i] == 1 || b[i] == 1, op, "extents ", to_string(a), " and ", to_string(b),
          " do not broadcast");
    s[i] = a[i] == 1 ? b[i] : a[i];
  }
  return s;
}

/// For a broadcast operand of extents b against full extents x: b's strides with 0 where b is 1.
template <std::size_t R>
Shape<R> broadcast_strides(const char* op, const Shape<R>& x, const Shape<R>& b) {
  for (std::size_t i = 0; i < R; ++i)
    check(b[i] == x[i] || b[i] == 1, op, "extents ", to_string(b), " do not broadcast to ", to_string(x));
  Shape<R> st = row_major_strides(b);
  for (std::size_t i = 0; i < R; ++i)
    if (b[i] == 1 && x[i] != 1) st[i] = 0;
  return st;
}

template <std::size_t R>
void check_bias(const char* op, const Shape<R>& x, const Shape<1>& b) {
  check(b[0] == x[R - 1], op, "bias ", to_string(b), " does not match the last dimension of ", to_string(x));
}

template <class A, class B>
void check_add(const A& a, const B& b) { check_same_shape("add", "a", a.shape(), "b", b.shape()); }
template <class A, class B>
void check_sub(const A& a, const B& b) { check_same_shape("sub", "a", a.shape(), "b", b.shape()); }
template <class A, class B>
void check_mul(const A& a, const B& b) { check_same_shape("mul", "a", a.shape(), "b", b.shape()); }
template <class Y, class X, class... Alpha>
void check_add_(const Y& y, const X& x, const Alpha&...) { check_same_shape("add_", "y", y.shape(), "x", x.shape()); }
template <class Y, class X>
void check_mul_(const Y& y, const X& x) { check_same_shape("mul_", "y", y.shape(), "x", x.shape()); }

template <class X, class B>
void check_add_bias_(const X& x, const B& b) { check_bias("add_bias", x.shape(), b.shape()); }
template <class X, class B>
void check_add_bias(const X& x, const B& b) { check_bias("add_bias", x.shape(), b.shape()); }
template <class DB, class DY, class... Accumulate>
void check_bias_grad_into(const DB& db, const DY& dy, const Accumulate&...) {
  check_bias("bias_grad", dy.shape(), db.shape());
}

template <class A, class B>
void check_add_broadcast(const A& a, const B& b) { (void)broadcast_shape("add_broadcast", a.shape(), b.shape()); }
template <class A, class B>
void check_sub_broadcast(const A& a, const B& b) { (void)broadcast_shape("sub_broadcast", a.shape(), b.shape()); }
template <class A, class B>
void check_mul_broadcast(const A& a, const B& b) { (void)broadcast_shape("mul_broadcast", a.shape(), b.shape()); }
template <class DZ, std::size_t R>
void check_sum_to(const DZ& dz, const Shape<R>& shape) { (void)broadcast_strides("sum_to", dz.shape(), shape); }

}  // namespace dtensor::kernels::generic
