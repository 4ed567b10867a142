// dtensor/kernels/meta/elementwise.hpp — the meta twin of kernels/host/elementwise.hpp: add, sub,
// mul, scale, add_, mul_, scale_, fill_, add_bias(_), bias_grad(_into), broadcast_shape,
// add/sub/mul_broadcast, sum_to. One FLOP per output element (axpy: two), per summed element for
// the reductions.
#pragma once

#include "dtensor/kernels/generic/elementwise.hpp"  // broadcast_shape (extents only)
#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

using generic::broadcast_shape;

namespace detail {
template <class T, std::size_t R>
MetaTensor<T, R> zip(const char* op, const MetaTensor<T, R>& a, const MetaTensor<T, R>& /*b*/) {
  pointwise_cost<T>(op, a.numel(), 2);
  return result<T>(a.shape());
}
template <class T, std::size_t R>
MetaTensor<T, R> zip_broadcast(const char* op, const MetaTensor<T, R>& a, const MetaTensor<T, R>& b) {
  const Shape<R> s = broadcast_shape(op, a.shape(), b.shape());
  cost(op, numel(s), bytes<T>(a.numel() + b.numel()), bytes<T>(numel(s)));
  return result<T>(s);
}
}  // namespace detail

template <Element T, std::size_t R>
MetaTensor<T, R> add(const MetaTensor<T, R>& a, const MetaTensor<T, R>& b) { return detail::zip("add", a, b); }
template <Element T, std::size_t R>
MetaTensor<T, R> sub(const MetaTensor<T, R>& a, const MetaTensor<T, R>& b) { return detail::zip("sub", a, b); }
template <Element T, std::size_t R>
MetaTensor<T, R> mul(const MetaTensor<T, R>& a, const MetaTensor<T, R>& b) { return detail::zip("mul", a, b); }
template <Element T, std::size_t R>
MetaTensor<T, R> scale(const MetaTensor<T, R>& a, compute_t<T>) {
  detail::pointwise_cost<T>("scale", a.numel(), 1);
  return detail::result<T>(a.shape());
}
template <Element T, std::size_t R>
void add_(MetaTensor<T, R>& y, const MetaTensor<T, R>& /*x*/, compute_t<T> = compute_t<T>(1)) {
  detail::pointwise_cost<T>("add_", y.numel(), 2, 2);
}
template <Element T, std::size_t R>
void mul_(MetaTensor<T, R>& y, const MetaTensor<T, R>& /*x*/) {
  detail::pointwise_cost<T>("mul_", y.numel(), 2);
}
template <Element T, std::size_t R>
void scale_(MetaTensor<T, R>& y, compute_t<T>) {
  detail::pointwise_cost<T>("scale_", y.numel(), 1);
}
template <Element T, std::size_t R>
void fill_(MetaTensor<T, R>& y, T) {
  detail::cost("fill_", 0, 0, detail::bytes<T>(y.numel()));
}

template <Element T, std::size_t R>
void add_bias_(MetaTensor<T, R>& x, const MetaTensor<T, 1>& b) {
  detail::cost("add_bias", x.numel(), detail::bytes<T>(x.numel() + b.numel()), detail::bytes<T>(x.numel()));
}
template <Element T, std::size_t R>
MetaTensor<T, R> add_bias(MetaTensor<T, R> x, const MetaTensor<T, 1>& b) {
  add_bias_(x, b);
  return x;
}
template <FloatElement T, std::size_t R>
void bias_grad_into(MetaTensor<T, 1>& db, const MetaTensor<T, R>& dy, bool accumulate = false) {
  detail::cost("bias_grad", dy.numel(), detail::bytes<T>(dy.numel() + (accumulate ? db.numel() : 0)),
               detail::bytes<T>(db.numel()));
}
template <FloatElement T, std::size_t R>
MetaTensor<T, 1> bias_grad(const MetaTensor<T, R>& dy) {
  MetaTensor<T, 1> db(Shape<1>{dy.extent(R - 1)});
  bias_grad_into(db, dy);
  return db;
}

template <Element T, std::size_t R>
MetaTensor<T, R> add_broadcast(const MetaTensor<T, R>& a, const MetaTensor<T, R>& b) {
  return detail::zip_broadcast("add_broadcast", a, b);
}
template <Element T, std::size_t R>
MetaTensor<T, R> sub_broadcast(const MetaTensor<T, R>& a, const MetaTensor<T, R>& b) {
  return detail::zip_broadcast("sub_broadcast", a, b);
}
template <Element T, std::size_t R>
MetaTensor<T, R> mul_broadcast(const MetaTensor<T, R>& a, const MetaTensor<T, R>& b) {
  return detail::zip_broadcast("mul_broadcast", a, b);
}
template <FloatElement T, std::size_t R>
MetaTensor<T, R> sum_to(const MetaTensor<T, R>& dz, const Shape<R>& shape) {
  detail::cost("sum_to", dz.numel(), detail::bytes<T>(dz.numel()), detail::bytes<T>(numel(shape)));
  return detail::result<T>(shape);
}

}  // namespace dtensor::kernels::meta
