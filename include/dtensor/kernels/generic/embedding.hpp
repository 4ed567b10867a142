// dtensor/kernels/generic/embedding.hpp — the extents of an embedding lookup and the argument
// checks of its backwards, for every memory space. (Ids in range are checked by the kernels
// that read them: they are values, not extents.)
#pragma once

#include <algorithm>
#include <cstddef>

#include "dtensor/kernels/generic/checks.hpp"

namespace dtensor::kernels::generic {

/// ids' extents followed by the row width d.
template <std::size_t R>
Shape<R + 1> embedding_out_shape(const Shape<R>& ids, Extent d) {
  Shape<R + 1> s{};
  std::copy(ids.begin(), ids.end(), s.begin());
  s[R] = d;
  return s;
}

template <class DT, class I, class DY>
void check_embedding_scatter(const char* op, const DT& dtable, const I& ids, const DY& dy) {
  check(dy.shape() == embedding_out_shape(ids.shape(), dtable.extent(1)), op, "dy ", to_string(dy.shape()),
        " does not match ids ", to_string(ids.shape()), " and table gradient ", to_string(dtable.shape()));
}
template <class DT, class I, class DY>
void check_embedding_backward(const DT& dtable, const I& ids, const DY& dy) {
  check_embedding_scatter("embedding_backward", dtable, ids, dy);
}
template <class DT, class I, class DY>
void check_embedding_shard_backward(const DT& dtable, const I& ids, const DY& dy, Extent /*row_begin*/) {
  check_embedding_scatter("embedding_shard_backward", dtable, ids, dy);
}

}  // namespace dtensor::kernels::generic
