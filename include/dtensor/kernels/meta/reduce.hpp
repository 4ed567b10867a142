// dtensor/kernels/meta/reduce.hpp — the meta twin of kernels/host/reduce.hpp: sum, mean, max over
// one dimension (kept, extent 1) and their backwards. One FLOP per input element forward, one
// per element of the gradient backward.
#pragma once

#include <cstdint>

#include "dtensor/kernels/generic/reduce.hpp"  // reduced_shape
#include "dtensor/kernels/meta/common.hpp"

namespace dtensor::kernels::meta {

template <class T, std::size_t R>
struct MaxResult {
  MetaTensor<T, R> values;
  MetaTensor<std::int64_t, R> indices;
};

namespace detail {
template <class T, std::size_t R>
MetaTensor<T, R> reduce(const char* op, const MetaTensor<T, R>& x, std::size_t dim) {
  const auto s = generic::reduced_shape(op, x.shape(), dim);
  cost(op, x.numel(), bytes<T>(x.numel()), bytes<T>(numel(s)));
  return result<T>(s);
}
template <class T, std::size_t R>
MetaTensor<T, R> broadcast_back(const char* op, const MetaTensor<T, R>& dy, const Shape<R>& x_shape, std::size_t /*dim*/,
                                std::int64_t extra_read = 0) {
  cost(op, numel(x_shape), bytes<T>(dy.numel()) + extra_read, bytes<T>(numel(x_shape)));
  return result<T>(x_shape);
}
}  // namespace detail

template <FloatElement T, std::size_t R>
MetaTensor<T, R> sum(const MetaTensor<T, R>& x, std::size_t dim) { return detail::reduce("sum", x, dim); }
template <FloatElement T, std::size_t R>
MetaTensor<T, R> mean(const MetaTensor<T, R>& x, std::size_t dim, Extent = -1) { return detail::reduce("mean", x, dim); }
template <FloatElement T, std::size_t R>
MaxResult<T, R> max(const MetaTensor<T, R>& x, std::size_t dim) {
  auto v = detail::reduce("max", x, dim);
  auto idx = MetaTensor<std::int64_t, R>::uninitialized(v.shape());
  return {std::move(v), std::move(idx)};
}
template <FloatElement T, std::size_t R>
MetaTensor<T, R> sum_backward(const MetaTensor<T, R>& dy, const Shape<R>& x_shape, std::size_t dim) {
  return detail::broadcast_back("sum_backward", dy, x_shape, dim);
}
template <FloatElement T, std::size_t R>
MetaTensor<T, R> mean_backward(const MetaTensor<T, R>& dy, const Shape<R>& x_shape, std::size_t dim, Extent = -1) {
  return detail::broadcast_back("mean_backward", dy, x_shape, dim);
}
template <FloatElement T, std::size_t R>
MetaTensor<T, R> max_backward(const MetaTensor<T, R>& dy, const MetaTensor<std::int64_t, R>& indices,
                              const Shape<R>& x_shape, std::size_t dim) {
  return detail::broadcast_back("max_backward", dy, x_shape, dim, detail::bytes<std::int64_t>(indices.numel()));
}
/// See host::max_backward_split.
template <FloatElement T, std::size_t R>
MetaTensor<T, R> max_backward_split(const MetaTensor<T, R>& dy, const MetaTensor<std::int64_t, R>& indices,
                                    const MetaTensor<T, R>& /*local_max*/, const MetaTensor<T, R>& /*global_max*/,
                                    const Shape<R>& x_shape, std::size_t dim) {
  return detail::broadcast_back("max_backward", dy, x_shape, dim,
                                detail::bytes<std::int64_t>(indices.numel()) + 2 * detail::bytes<T>(dy.numel()));
}

}  // namespace dtensor::kernels::meta
