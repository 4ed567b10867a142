// dtensor/kernels/generic/reduce.hpp — the argument checks of the reductions over one dimension
// and their backwards, and the reduced extents every memory space's kernels share.
#pragma once

#include <cstddef>

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

/// s with extent 1 at dim (the reduction keeps the dimension).
template <std::size_t R>
Shape<R> reduced_shape(const char* op, const Shape<R>& s, std::size_t dim) {
  check_dim(op, dim, s);
  Shape<R> r = s;
  r[dim] = 1;
  return r;
}

template <std::size_t R>
void check_reduce_backward(const char* op, const Shape<R>& dy, const Shape<R>& x_shape, std::size_t dim) {
  check(dy == reduced_shape(op, x_shape, dim), op, "gradient ", to_string(dy), " is not the reduction over dimension ",
        dim, " of ", to_string(x_shape));
}

template <class X>
void check_sum(const X& x, std::size_t dim) { check_dim("sum", dim, x.shape()); }
template <class X, class... Divisor>
void check_mean(const X& x, std::size_t dim, const Divisor&...) { check_dim("mean", dim, x.shape()); }
template <class X>
void check_max(const X& x, std::size_t dim) {
  check_dim("max", dim, x.shape());
  check(x.extent(dim) > 0, "max", "cannot reduce over an empty dimension ", dim, " of ", to_string(x.shape()));
}

template <class DY, std::size_t R>
void check_sum_backward(const DY& dy, const Shape<R>& x_shape, std::size_t dim) {
  check_reduce_backward("sum_backward", dy.shape(), x_shape, dim);
}
template <class DY, std::size_t R, class... Divisor>
void check_mean_backward(const DY& dy, const Shape<R>& x_shape, std::size_t dim, const Divisor&...) {
  check_reduce_backward("mean_backward", dy.shape(), x_shape, dim);
}
template <class DY, class I, std::size_t R>
void check_max_backward(const DY& dy, const I& indices, const Shape<R>& x_shape, std::size_t dim) {
  const Shape<R> rs = reduced_shape("max_backward", x_shape, dim);
  check(dy.shape() == rs && indices.shape() == rs, "max_backward", "gradient ", to_string(dy.shape()),
        " and indices ", to_string(indices.shape()), " must be ", to_string(rs), " for input ", to_string(x_shape));
}
template <class DY, class I, class M, std::size_t R>
void check_max_backward_split(const DY& dy, const I& indices, const M& local_max, const M& global_max,
                              const Shape<R>& x_shape, std::size_t dim) {
  const Shape<R> rs = reduced_shape("max_backward", x_shape, dim);
  check(dy.shape() == rs && indices.shape() == rs && local_max.shape() == rs && global_max.shape() == rs,
        "max_backward", "gradient ", to_string(dy.shape()), ", indices ", to_string(indices.shape()), " and maxima ",
        to_string(local_max.shape()), ", ", to_string(global_max.shape()), " must be ", to_string(rs),
        " for input ", to_string(x_shape));
}

}  // namespace dtensor::kernels::generic
